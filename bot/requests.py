"""Requests that act after their ack (`/mm …`, thread commands, clicks), carried out from their record.

The listeners (bot.handlers) record each one (chatops.requests), claimed by this process, before they ack, and
hand it here after the ack: `start` carries it out in a task of its own and marks it done. A bot killed in
between, or an attempt that raised, leaves it unfinished. `keep` is the process's background loop: it renews
the claims of what this process carries out, and claims and carries out again what nobody does (a bot that
died, this one before a restart, an attempt whose retry is due). The replay lives in the bot, not in the
workers' housekeeping, because carrying a request out takes the bot's code (its commands, its click checks,
its Web API client) and the workers never import the bot: data flows one way.

An attempt that failed is tried again later: after what Slack asked (Retry-After), else after a wait that
grows with the attempts. Failures of our own and bots that died count toward MAX_ATTEMPTS; Slack failing for a
while (slackio.slack_client.outage) does not, and a request Slack kept failing is given up once it is
SLACK_PATIENCE old (a slash command's response_url lives 30 minutes). Either way the person is told once.

Carrying out twice changes nothing more than once, and says nothing false: every step that changes something
is kept in the record with its change (bot.steps), so that a replay finishes what was left quietly, and a
post is made once (looked for before it is made again). An ephemeral or a slash command's answer may be said
again when a bot dies right after saying it and before marking the request done: at least once, never lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Connection, Engine

from bot.approvals import Click, ClickHandler
from bot.before_ack import recorded
from bot.commands import SLASH_COMMAND, Command, Commands, Outcome, Where, announce
from bot.errors import BotError
from bot.home import Home
from bot.steps import courtesy, find_posted, mark
from chatops.buttons import LABELS
from chatops.requests import (
    MAX_ATTEMPTS,
    Request,
    claim_stale,
    finish,
    hold,
    keep_progress,
    record,
    release,
    renew,
)
from chatops.schema import RequestKind, RequestState
from chatops.teams import Team
from slackio.slack_client import outage
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.bot.requests")

GAVE_UP = "Something went wrong on my side, so I gave up on {what} after {attempts} attempts; the error is in my log."
SLACK_FAILED = "Slack kept failing, so I gave up on {what} after {minutes} minutes; the errors are in my log."
# A request Slack kept failing is given up this old: its response_url (30 minutes) can still say so.
SLACK_PATIENCE_S = 25 * 60.0
# The longest wait before a retry, whatever the attempts or Slack's Retry-After.
LONGEST_WAIT_S = 300.0
# Slack's clock (a message's ts) and the database's may differ: a replay looks back this much further.
CLOCKS_S = 300.0

# The after-ack tasks, referenced until they end (the event loop keeps only weak references).
_running: set[asyncio.Task[None]] = set()


def in_background(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` once the caller has returned (a listener: once bolt has answered Slack)."""
    task = asyncio.get_running_loop().create_task(work)
    _running.add(task)
    task.add_done_callback(_running.discard)


class ClaimLost(BotError):
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
        inbound: Engine | None = None,
    ) -> None:
        self.engine, self.commands, self.clicks, self.home, self.enqueue = engine, commands, clicks, home, enqueue
        self.claim_seconds = claim_seconds
        # The engine of the work before the ack, every wait bounded (bot.before_ack).
        self.inbound = inbound or engine
        # Unique to this process, also across restarts in one container (the same host name and pid).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._carrying: set[int] = set()

    async def record(self, kind: RequestKind, key: str, payload: dict[str, Any]) -> Request | None:
        """The request, recorded and claimed by this process; None when it was recorded before (a redelivery,
        a mention's twin): its first delivery's bot carries it out, or a replay does. Within
        bot.before_ack.DEADLINE_S, or DatabaseSilent (nothing kept) or Unsure (bot.before_ack)."""
        return await recorded(functools.partial(record, self.inbound, kind, key, payload, self.owner))

    def start(self, slack: SlackOut, request: Request) -> None:
        in_background(self.carry_out(slack, request))

    async def start_once_kept(self, slack: SlackOut, outcome: asyncio.Future[Any] | None) -> None:
        """A record whose commit was under way at the deadline: carried out if the commit went through (else
        nothing was kept; a commit whose end is unknown is found by a replay if it was kept)."""
        try:
            kept = await outcome if outcome is not None else None
        except Exception as exc:  # noqa: BLE001 - unknown: a replay finds it if it was kept
            log.warning("a request's record ended unknown (%s); a replay carries it out if it was kept", exc)
            return
        if isinstance(kept, Request):
            self.start(slack, kept)

    async def carry_out(self, slack: SlackOut, request: Request) -> None:
        """Carry the request out and mark it done. An attempt that raises is released for a later one; after
        MAX_ATTEMPTS failures of ours (bots that died on it included), or SLACK_PATIENCE of Slack's, the
        person is told, and the request kept as failed."""
        self._carrying.add(request.id)
        began = time.monotonic()
        try:
            if request.failures >= MAX_ATTEMPTS:  # its bots died on every attempt
                await self._give_up(slack, request, GAVE_UP.format(what="{what}", attempts=MAX_ATTEMPTS))
                return
            try:
                await _CARRY[request.kind](self, slack, request)
            except ClaimLost:
                log.warning("the %s request %s was taken over by another bot", request.kind, request.id)
                return
            except Exception as exc:  # noqa: BLE001 - logged and retried or given up, by what it is
                await self._failed(slack, request, exc, request.age_s + time.monotonic() - began)
                return
            await self._keep_state(finish, request)
        finally:
            self._carrying.discard(request.id)

    async def _failed(self, slack: SlackOut, request: Request, exc: Exception, age_s: float) -> None:
        trouble = outage(exc)
        if trouble is None:
            log.exception("the %s request %s failed (attempt %d)", request.kind, request.id, request.attempts)
            if request.failures + 1 >= MAX_ATTEMPTS:
                await self._give_up(slack, request, GAVE_UP.format(what="{what}", attempts=MAX_ATTEMPTS))
            else:
                release_ = functools.partial(release, retry_in_s=self._backoff(request), counted=True)
                await self._keep_state(release_, request)
            return
        if age_s >= SLACK_PATIENCE_S:
            minutes = round(age_s / 60)
            log.error("Slack kept failing the %s request %s for %d minutes: %s", request.kind, request.id, minutes, exc)
            await self._give_up(slack, request, SLACK_FAILED.format(what="{what}", minutes=minutes))
            return
        wait = min(trouble.retry_after_s, LONGEST_WAIT_S) if trouble.retry_after_s else self._backoff(request)
        log.warning(
            "Slack failed the %s request %s (attempt %d: %s); trying again in %.0f s",
            request.kind,
            request.id,
            request.attempts,
            type(exc).__name__,
            wait,
        )
        await self._keep_state(functools.partial(release, retry_in_s=wait, counted=False), request)

    def _backoff(self, request: Request) -> float:
        """A wait that grows with the attempts: a third of the claim, doubled each time, at most LONGEST_WAIT_S."""
        return min(self.claim_seconds() / 3 * 2 ** (request.attempts - 1), LONGEST_WAIT_S)

    async def keep(self, client_for: Callable[[Team], AsyncWebClient]) -> None:
        """Forever, every third of `bot.claimSeconds`: renew this process's claims, and carry out again the
        requests nobody carries out (through `client_for(workspace)`, the app's own in its request's workspace)."""
        while True:
            claim = self.claim_seconds()
            await asyncio.sleep(claim / 3)
            try:
                await asyncio.to_thread(renew, self.engine, self.owner, set(self._carrying))
                left = await asyncio.to_thread(claim_stale, self.engine, self.owner, claim)
            except Exception as exc:  # noqa: BLE001 - the database is away: the next round asks again
                log.warning("could not look for unfinished requests: %s", exc)
                continue
            for request in left:
                log.info("the %s request %s again (attempt %d)", request.kind, request.id, request.attempts)
                self.start(SlackOut(client_for(place_of(request)), self.commands.secrets), request)

    async def _give_up(self, slack: SlackOut, request: Request, said: str) -> None:
        """Keep the request as failed, then tell the person, in one sentence: recorded first, so that it is told
        once (a give-up that could not be recorded is told by the attempt that records it)."""
        log.error("gave up on the %s request %s (attempt %d)", request.kind, request.id, request.attempts)
        if not await self._keep_state(functools.partial(finish, state=RequestState.FAILED), request):
            return
        p = request.payload
        try:
            if request.kind == RequestKind.SLASH:
                what = f"{SLASH_COMMAND} {p['text']}".strip()[:100]
                await _respond(slack, p, said.format(what=f"`{what}`"))
            elif request.kind == RequestKind.COMMAND:
                where = Where(**p["where"])
                await tell(slack, where.user, where.channel, where.thread_ts, said.format(what=f"`{p['name']}`"))
            else:
                click = Click.of(p["action"], p["body"])
                told = said.format(what=f"your click on {LABELS[click.action]}")
                if click.channel is None:
                    await self.home.publish(slack, click.user, notice=told, place=click.place)
                else:
                    await tell(slack, click.user, click.channel, click.thread_ts, told)
        except Exception as exc:  # noqa: BLE001 - Slack is out: the give-up stands, in the log
            log.warning("could not tell that the %s request %s was given up: %s", request.kind, request.id, exc)

    async def _keep_state(self, write: Callable[[Engine, int, str], Any], request: Request) -> bool:
        """Done, failed or released; whether it was written. A state that cannot be written leaves the claim to
        go stale, and a replay carries the request out again (which changes nothing more)."""
        try:
            return await asyncio.to_thread(write, self.engine, request.id, self.owner) is not False
        except Exception as exc:  # noqa: BLE001 - the database is away; the request is not lost
            log.warning("could not keep the state of the %s request %s: %s", request.kind, request.id, exc)
            return False

    # -- the kinds ----------------------------------------------------------------------------------------------

    async def _slash(self, slack: SlackOut, request: Request) -> None:
        p, steps = request.payload, RecordedSteps(self, request)
        outcome = await self.commands.slash(
            slack,
            p["text"],
            p["channel_id"],
            p["user_id"],
            p["team_id"] or None,
            p["trigger_id"],
            steps,
            place_of(request),
        )
        await self._answer(slack, outcome, steps, p["channel_id"], None, p["user_id"], p)

    async def _command(self, slack: SlackOut, request: Request) -> None:
        p, steps = request.payload, RecordedSteps(self, request)
        where = Where(**p["where"])
        outcome = await self.commands.run(slack, Command(p["name"], tuple(p["args"])), where, steps)
        await self._answer(slack, outcome, steps, where.channel, where.thread_ts, where.user)

    async def _click(self, slack: SlackOut, request: Request) -> None:
        click = Click.of(request.payload["action"], request.payload["body"])
        refusal = await self.clicks.handle(slack, click, RecordedSteps(self, request))
        if click.channel is None:  # App Home: the page shows the outcome (or the refusal) once published again
            await self.home.publish(slack, click.user, notice=refusal, place=click.place)
        if refusal is None:
            return
        log.info("click %s of %s on %s refused: %s", click.action, click.user, click.value.session_id, refusal)
        await tell(slack, click.user, click.channel, click.thread_ts, refusal)

    async def _answer(
        self,
        slack: SlackOut,
        outcome: Outcome,
        steps: RecordedSteps,
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
        if outcome.public:
            await announce(slack, steps, channel, thread_ts, outcome.public)
        if outcome.private:
            if slash is not None:
                await _respond(slack, slash, outcome.private)
            else:
                await tell(slack, user, channel, thread_ts, outcome.private)


class RecordedSteps:
    """What a request's earlier attempt did (bot.steps.Steps), kept in its record while this bot holds it."""

    def __init__(self, requests: Requests, request: Request) -> None:
        self._requests, self._request, self._done = requests, request, dict(request.progress)

    @property
    def key(self) -> str | None:
        return self._request.key

    def done(self, step: str) -> str | None:
        value = self._done.get(step)
        return value if isinstance(value, str) else None

    async def keep(self, step: str, value: str) -> None:
        self._done[step] = value
        r = self._requests
        if not await asyncio.to_thread(keep_progress, r.engine, self._request.id, r.owner, dict(self._done)):
            raise ClaimLost

    async def take(self, step: str, change: Callable[[Connection], str]) -> str:
        if (value := self.done(step)) is not None:
            return value
        r, kept = self._requests, dict(self._done)

        def run() -> str:
            with r.engine.begin() as conn:
                outcome = change(conn)
                if not keep_progress(conn, self._request.id, r.owner, kept | {step: outcome}):
                    raise ClaimLost  # the change is rolled back with it: the bot that holds the request makes it
                return outcome

        value = await asyncio.to_thread(run)
        self._done[step] = value
        return value

    async def post(self, slack: SlackOut, step: str, channel: str, text: str, thread_ts: str | None = None) -> str:
        if (ts := self.done(step)) is not None:
            return ts
        r, marked, found = self._requests, mark(self._request.id, step), None
        if self._request.attempts > 1:  # an earlier attempt may have posted it, and died before keeping its ts
            since = self._request.received_at.timestamp() - CLOCKS_S
            try:
                found = await find_posted(slack, channel, thread_ts, marked, since)
            except SlackApiError as exc:  # a channel it may not read: posted again, as before this check
                if outage(exc) is not None:
                    raise
                log.warning("could not look for what the request %s posted: %s", self._request.id, exc)
        if found is None:
            if not await asyncio.to_thread(hold, r.engine, self._request.id, r.owner):
                raise ClaimLost
            found = str((await slack.post(channel, text, thread_ts=thread_ts, metadata=marked))["ts"])
        await self.keep(step, found)
        return found


_CARRY: dict[RequestKind, Callable[[Requests, SlackOut, Request], Awaitable[None]]] = {
    RequestKind.SLASH: Requests._slash,
    RequestKind.COMMAND: Requests._command,
    RequestKind.CLICK: Requests._click,
}


def place_of(request: Request) -> Team:
    """The workspace (and org) a recorded request came from, as each kind keeps it."""
    p = request.payload
    if request.kind == RequestKind.CLICK:
        body = p["body"]
        return Team((body.get("team") or {}).get("id"), (body.get("enterprise") or {}).get("id"))
    if request.kind == RequestKind.COMMAND:
        return Team(p["where"].get("slack_team"), p["where"].get("enterprise"))
    return Team(p.get("team_id") or None, p.get("enterprise_id") or None)


async def tell(slack: SlackOut, user: str, channel: str | None, thread_ts: str | None, text: str) -> None:
    """An ephemeral sentence for one person, in the thread it is about."""
    if channel is None:
        return
    async with courtesy(f"tell {user} in {channel}"):
        await slack.ephemeral(channel, user, text, thread_ts=thread_ts)


async def _respond(slack: SlackOut, slash: dict[str, Any], text: str) -> None:
    """The answer to a slash command, for the person alone: through its response URL, else (an URL that failed
    or expired) as an ephemeral in the channel it was typed in."""
    try:
        answer = await slack.respond(slash["response_url"] or None, text, response_type="ephemeral")
        status = getattr(answer, "status_code", 200)
        if status == 200:
            return
        why = f"HTTP {status}"
    except Exception as exc:  # noqa: BLE001 - said another way below
        why = type(exc).__name__
    log.info("the response URL of %s did not answer (%s); saying it as an ephemeral", SLASH_COMMAND, why)
    await tell(slack, slash["user_id"], slash["channel_id"] or None, None, text)
