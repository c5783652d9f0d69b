"""The one base of the errors `mm-bot`'s commands raise on purpose."""

from __future__ import annotations


class CommandError(Exception):
    """Every error a command raises on purpose."""
