"""Requests that act after their ack (`/mm …`, thread commands, clicks), carried out from their record.

The listeners (bot.handlers) record each one (chatops.requests), claimed by this process, before they ack, and
hand it here after the ack: `start` carries it out in a task of its own and marks it done. A bot killed in
between, or an attempt that raised, leaves it unfinished. `keep` is the process's background loop: it renews
the claims of what this process carries out, and claims and carries out again what nobody does (a bot that
died, this one before a restart, an attempt that failed), at most MAX_ATTEMPTS times in all, then tells the
person in one sentence. The replay lives in the bot, not in the workers' housekeeping, because carrying a
request out takes the bot's code (its commands, its click checks, its Web API client) and the workers never
import the bot: data flows one way.

Carrying out twice changes nothing more than once: a click decides by compare-and-set, a stop is a flag, an
inbox row is unique per message, and `/mm PROMPT` keeps its thread's root (Steps) before it records the
prompt, so that a replay does not start a second thread. A line posted as the request's answer may be posted
again when a bot dies right after posting it and before marking the request done: at least once, never lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Engine

from bot.approvals import Click, ClickHandler
from bot.commands import SLASH_COMMAND, Command, Commands, Outcome, Where, announce
from bot.home import Home
from chatops.buttons import LABELS
from chatops.requests import MAX_ATTEMPTS, Request, claim_stale, finish, keep_progress, record, release, renew
from chatops.schema import RequestKind, RequestState
from workers.slack_out import SlackOut

log = logging.getLogger("mm.bot.requests")

GAVE_UP = "Something went wrong on my side, so I gave up on {what} after {attempts} attempts; the error is in my log."

# The after-ack tasks, referenced until they end (the event loop keeps only weak references).
_running: set[asyncio.Task[None]] = set()


def in_background(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` once the caller has returned (a listener: once bolt has answered Slack)."""
    task = asyncio.get_running_loop().create_task(work)
    _running.add(task)
    task.add_done_callback(_running.discard)


class ClaimLost(Exception):
    """Another bot took the request over (this one stalled past its claim): it carries the request out."""


class Requests:
    """This bot process's requests: recorded before the ack, carried out after, replayed when left unfinished."""

    def __init__(
        self,
        engine: Engine,
        commands: Commands,
        clicks: ClickHandler,
        home: Home,
        enqueue: Callable[[str], Awaitable[None]],
        claim_seconds: Callable[[], float],
    ) -> None:
        self.engine, self.commands, self.clicks, self.home, self.enqueue = engine, commands, clicks, home, enqueue
        self.claim_seconds = claim_seconds
        # Unique to this process, also across restarts in one container (the same host name and pid).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._carrying: set[int] = set()

    async def record(self, kind: RequestKind, key: str, payload: dict[str, Any]) -> Request | None:
        """The request, recorded and claimed by this process; None when it was recorded before (a redelivery,
        a mention's twin): its first delivery's bot carries it out, or a replay does."""
        return await asyncio.to_thread(record, self.engine, kind, key, payload, self.owner)

    def start(self, slack: SlackOut, request: Request) -> None:
        in_background(self.carry_out(slack, request))

    async def carry_out(self, slack: SlackOut, request: Request) -> None:
        """Carry the request out and mark it done. An attempt that raises is released for a replay; after
        MAX_ATTEMPTS (also of bots that died on it) the person is told, and the request kept as failed."""
        self._carrying.add(request.id)
        try:
            if request.attempts > MAX_ATTEMPTS:  # its bots died on every attempt
                await self._give_up(slack, request)
                return
            try:
                await _CARRY[request.kind](self, slack, request)
            except ClaimLost:
                log.warning("the %s request %s was taken over by another bot", request.kind, request.id)
                return
            except Exception:
                log.exception("the %s request %s failed (attempt %d)", request.kind, request.id, request.attempts)
                if request.attempts >= MAX_ATTEMPTS:
                    await self._give_up(slack, request)
                else:
                    await self._keep_state(release, request)
                return
            await self._keep_state(finish, request)
        finally:
            self._carrying.discard(request.id)

    async def keep(self, client: AsyncWebClient) -> None:
        """Forever, every third of `bot.claimSeconds`: renew this process's claims, and carry out again the
        requests nobody carries out (through `client`, the app's own)."""
        slack = SlackOut(client, self.commands.secrets)
        while True:
            claim = self.claim_seconds()
            await asyncio.sleep(claim / 3)
            try:
                await asyncio.to_thread(renew, self.engine, self.owner, set(self._carrying))
                left = await asyncio.to_thread(claim_stale, self.engine, self.owner, claim, claim / 3)
            except Exception as exc:  # noqa: BLE001 - the database is away: the next round asks again
                log.warning("could not look for unfinished requests: %s", exc)
                continue
            for request in left:
                log.info("the %s request %s again (attempt %d)", request.kind, request.id, request.attempts)
                self.start(slack, request)

    async def _give_up(self, slack: SlackOut, request: Request) -> None:
        """Tell the person, in one sentence, and keep the request as failed."""
        log.error("gave up on the %s request %s after %d attempts", request.kind, request.id, request.attempts)
        p = request.payload
        attempts = min(request.attempts, MAX_ATTEMPTS)
        if request.kind == RequestKind.SLASH:
            what = f"{SLASH_COMMAND} {p['text']}".strip()[:100]
            await _respond(slack, p, GAVE_UP.format(what=f"`{what}`", attempts=attempts))
        elif request.kind == RequestKind.COMMAND:
            where = Where(**p["where"])
            said = GAVE_UP.format(what=f"`{p['name']}`", attempts=attempts)
            await tell(slack, where.user, where.channel, where.thread_ts, said)
        else:
            click = Click.of(p["action"], p["body"])
            said = GAVE_UP.format(what=f"your click on {LABELS[click.action]}", attempts=attempts)
            if click.channel is None:
                await self.home.publish(slack, click.user, notice=said)
            else:
                await tell(slack, click.user, click.channel, click.thread_ts, said)
        await self._keep_state(functools.partial(finish, state=RequestState.FAILED), request)

    async def _keep_state(self, write: Callable[[Engine, int, str], Any], request: Request) -> None:
        """Done, failed or released: a state that cannot be written leaves the claim to go stale, and a replay
        carries the request out again (which changes nothing more)."""
        try:
            await asyncio.to_thread(write, self.engine, request.id, self.owner)
        except Exception as exc:  # noqa: BLE001 - the database is away; the request is not lost
            log.warning("could not keep the state of the %s request %s: %s", request.kind, request.id, exc)

    # -- the kinds ----------------------------------------------------------------------------------------------

    async def _slash(self, slack: SlackOut, request: Request) -> None:
        p, steps = request.payload, RecordedSteps(self, request)
        outcome = await self.commands.slash(
            slack, p["text"], p["channel_id"], p["user_id"], p["team_id"] or None, p["trigger_id"], steps
        )
        await self._answer(slack, outcome, p["channel_id"], None, p["user_id"], p)

    async def _command(self, slack: SlackOut, request: Request) -> None:
        p = request.payload
        where = Where(**p["where"])
        outcome = await self.commands.run(slack, Command(p["name"], tuple(p["args"])), where)
        await self._answer(slack, outcome, where.channel, where.thread_ts, where.user)

    async def _click(self, slack: SlackOut, request: Request) -> None:
        click = Click.of(request.payload["action"], request.payload["body"])
        refusal = await self.clicks.handle(slack, click)
        if click.channel is None:  # App Home: the page shows the outcome (or the refusal) once published again
            await self.home.publish(slack, click.user, notice=refusal)
        if refusal is None:
            return
        log.info("click %s of %s on %s refused: %s", click.action, click.user, click.value.session_id, refusal)
        await tell(slack, click.user, click.channel, click.thread_ts, refusal)

    async def _answer(
        self,
        slack: SlackOut,
        outcome: Outcome,
        channel: str,
        thread_ts: str | None,
        user: str,
        slash: dict[str, Any] | None = None,
    ) -> None:
        if outcome.enqueue:
            try:
                await self.enqueue(outcome.enqueue)
            except Exception as exc:  # noqa: BLE001 - recorded: housekeeping enqueues it later
                log.warning("could not enqueue session %s (%s); housekeeping will", outcome.enqueue, exc)
        if outcome.private:
            if slash is not None:
                await _respond(slack, slash, outcome.private)
            else:
                await tell(slack, user, channel, thread_ts, outcome.private)
        if outcome.public:
            await announce(slack, channel, thread_ts, outcome.public)


class RecordedSteps:
    """What a request's earlier attempt did (bot.steps.Steps), kept in its record while this bot holds it."""

    def __init__(self, requests: Requests, request: Request) -> None:
        self._requests, self._id, self._done = requests, request.id, dict(request.progress)

    def done(self, step: str) -> str | None:
        value = self._done.get(step)
        return value if isinstance(value, str) else None

    async def keep(self, step: str, value: str) -> None:
        self._done[step] = value
        r = self._requests
        if not await asyncio.to_thread(keep_progress, r.engine, self._id, r.owner, dict(self._done)):
            raise ClaimLost


_CARRY: dict[RequestKind, Callable[[Requests, SlackOut, Request], Awaitable[None]]] = {
    RequestKind.SLASH: Requests._slash,
    RequestKind.COMMAND: Requests._command,
    RequestKind.CLICK: Requests._click,
}


async def tell(slack: SlackOut, user: str, channel: str | None, thread_ts: str | None, text: str) -> None:
    """An ephemeral sentence for one person, in the thread it is about."""
    if channel is None:
        return
    try:
        await slack.ephemeral(channel, user, text, thread_ts=thread_ts)
    except Exception as e:  # noqa: BLE001 - a courtesy: nothing was changed either way
        log.warning("could not tell %s in %s: %s", user, channel, e)


async def _respond(slack: SlackOut, slash: dict[str, Any], text: str) -> None:
    """The answer to a slash command, for the person alone, through its response URL."""
    try:
        await slack.respond(slash["response_url"] or None, text, response_type="ephemeral")
    except Exception as exc:  # noqa: BLE001 - a courtesy
        log.warning("could not answer %s: %s", SLASH_COMMAND, exc)
