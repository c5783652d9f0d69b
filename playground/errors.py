"""The one base of the errors the playground raises on purpose (its Slack emulator's errors, the page's)."""

from __future__ import annotations


class PlaygroundError(Exception):
    """Every error the playground raises on purpose."""
