"""The one base of the errors mm_core raises: `except CoreError` catches every failure the core means (a model call
that failed, a lease taken over, a tool refusing, a turn already running), and nothing else."""

from __future__ import annotations


class CoreError(Exception):
    """Every error the agent core raises on purpose."""
