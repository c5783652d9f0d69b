"""The one base of the errors the workers raise on purpose: git failing, a workspace that cannot be prepared, a file
refused, nothing to push."""

from __future__ import annotations


class WorkerError(Exception):
    """Every error the workers raise on purpose."""
