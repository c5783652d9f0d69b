"""What an earlier attempt at the same request did: a request carried out again after its bot died (bot.requests)
finds the steps that attempt took, and takes each of them once.

- A change in the database is `take`n with the step kept in the same transaction (the decision of a click, a
  stop, a job paused): a replay finds the step and goes on to what was left — the message to show, the session
  to enqueue, the announcement — instead of finding the change made and saying "already".
- A post is made once (`post`): right before it, the claim is checked (a bot that stalled past its claim stops
  there, ClaimLost); the post carries message metadata naming the request and the step, and a replay looks for
  it in the channel or thread before posting again (the bot may have died between the post and keeping its ts).
  What remains: a bot that stalls after that check and before Slack has the post, while a replica takes the
  request over, looks and posts its own — two posts; nothing but an idempotency key in Slack's API could close
  it.
- An ephemeral or a slash command's answer cannot be looked for: those are said at least once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from sqlalchemy import Connection, Engine

from slackio.slack_client import outage
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.bot.steps")

# The metadata of a post made for a request's step (Slack's message metadata: an event type and a payload).
POSTED = "mm_request_step"
# How far back a replay looks for what an earlier attempt posted (messages, the channel's newest first).
LOOKED_AT = 200


class Steps(Protocol):
    def done(self, step: str) -> str | None:
        """What the step did (a ts, an id, an outcome), or None when no attempt took it."""
        ...

    async def keep(self, step: str, value: str) -> None:
        """The step is taken: kept in the request's record (while this bot still holds the request)."""
        ...

    async def take(self, step: str, change: Callable[[Connection], str]) -> str:
        """`change` (a database change, on the connection given) and the step kept with its outcome, in one
        transaction, while this bot holds the request; the outcome an earlier attempt kept, without changing
        anything again."""
        ...

    async def post(self, slack: SlackOut, step: str, channel: str, text: str, thread_ts: str | None = None) -> str:
        """A message posted once for this request (its ts), however often the request is carried out."""
        ...

    @property
    def key(self) -> str | None:
        """The request's unique key (chatops.requests), for what records a change under it; None without one."""
        ...


class NoSteps:
    """For a command carried out without a record (no replay will ask)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def done(self, step: str) -> str | None:
        return None

    async def keep(self, step: str, value: str) -> None:
        return None

    async def take(self, step: str, change: Callable[[Connection], str]) -> str:
        def run() -> str:
            with self.engine.begin() as conn:
                return change(conn)

        return await asyncio.to_thread(run)

    async def post(self, slack: SlackOut, step: str, channel: str, text: str, thread_ts: str | None = None) -> str:
        return (await slack.post(channel, text, thread_ts=thread_ts))["ts"]

    @property
    def key(self) -> str | None:
        return None


def mark(request_id: int, step: str) -> dict[str, Any]:
    """The metadata a request's post carries, so that a replay finds it."""
    return {"event_type": POSTED, "event_payload": {"request": str(request_id), "step": step}}


async def find_posted(
    slack: SlackOut, channel: str, thread_ts: str | None, marked: dict[str, Any], oldest: float
) -> str | None:
    """The ts of a message in the channel (or the thread) carrying `marked`, posted since `oldest` (a Unix time);
    None when there is none among the newest LOOKED_AT."""
    client = slack.client
    if thread_ts is None:
        answer = await client.conversations_history(
            channel=channel, oldest=f"{oldest:.6f}", limit=LOOKED_AT, include_all_metadata=True
        )
    else:
        answer = await client.conversations_replies(
            channel=channel, ts=thread_ts, oldest=f"{oldest:.6f}", limit=LOOKED_AT, include_all_metadata=True
        )
    for message in answer.get("messages") or []:
        if isinstance(message, dict) and message.get("metadata") == marked:
            return str(message.get("ts"))
    return None


@asynccontextmanager
async def courtesy(what: str) -> AsyncIterator[None]:
    """A Web API call whose failure changes nothing that matters (an ephemeral, an edit that shows a decision):
    logged and passed over, unless Slack is out — then it propagates, and the request is carried out again
    later (its steps kept, so only what was left is done)."""
    try:
        yield
    except Exception as exc:
        if outage(exc) is not None:
            raise
        log.warning("could not %s: %s", what, exc)
