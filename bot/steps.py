"""What an earlier attempt at the same request did: a request carried out again after its bot died (bot.requests)
looks a step up before it takes it, and keeps it once taken, so that the step happens once (the root message of
`/mm PROMPT`, the run of `/mm job run`)."""

from __future__ import annotations

from typing import Protocol


class Steps(Protocol):
    def done(self, step: str) -> str | None:
        """What the step did (a ts, an id), or None when no attempt took it."""
        ...

    async def keep(self, step: str, value: str) -> None:
        """The step is taken: kept in the request's record (while this bot still holds the request)."""
        ...


class NoSteps:
    """For a command carried out without a record (no replay will ask)."""

    def done(self, step: str) -> str | None:
        return None

    async def keep(self, step: str, value: str) -> None:
        return None
