"""The one base of the errors the foundation raises on purpose: a config that does not load, a database that does not
answer, a button or a repository refused, an unknown session."""

from __future__ import annotations


class ChatopsError(Exception):
    """Every error chatops raises on purpose."""
