"""The one base of the errors slackio raises on purpose: a workspace the app is not installed in."""

from __future__ import annotations


class SlackioError(Exception):
    """Every error slackio raises on purpose."""
