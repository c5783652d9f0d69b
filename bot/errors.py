"""The one base of the errors the bot raises on purpose: a database silent before the ack, a claim lost, a port
taken, Socket Mode refused."""

from __future__ import annotations


class BotError(Exception):
    """Every error the bot raises on purpose."""
