"""Approvals that wait, told in their threads: the reminder naming who may decide (`approvals.remindAfter`),
and the escalation (`approvals.escalateAfter`), after which `approvals.escalateTo` may decide too and is named.
Which calls are due, and the widening of who may decide, is chatops/nudges.py's (compare-and-set: each comes
once); this posts them, from housekeeping.

People are named by user mention. A user group is named by its members' mentions (read from
`usergroups.users.list`, at most MAX_NAMED): the gateway never posts `<!subteam^…>`, which would also notify the
whole group at every later edit of the message. A group Slack cannot list is named by its id. The requester is
not named: they cannot decide a rule's call, and the reminder is for the people who can.

Each is at most once: a worker that stops between the mark and the post loses that reminder, never doubles it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import datetime

import aiohttp
from sqlalchemy import Engine

from chatops.approvers import accepted
from chatops.config import Config, ServiceConfig
from chatops.nudges import Waiting, due_escalations, due_reminders, pending_by_age
from chatops.schema import utcnow
from chatops.teams import team_of
from slackio import metrics
from slackio.approval_message import approval_blocks, line_of
from slackio.blocks import duration
from slackio.mrkdwn import Mrkdwn
from slackio.slack_client import TIMEOUT, web_client
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.workers.nudges")

MAX_NAMED = 20
REMINDER = Mrkdwn("⏰ {who}: a call has waited {age} for a decision in this thread: {line}")
ESCALATED = Mrkdwn("⏫ No decision after {age}, so {who} may now decide this call too: {line}")
NOBODY = Mrkdwn("nobody is configured to decide it")


def nudge_waiting(engine: Engine, config: Config, secrets: tuple[str, ...], now: datetime | None = None) -> int:
    """Remind and escalate the calls that are due (housekeeping's part), and count the calls that wait by age
    (mm_approvals_pending); how many messages it posted."""
    approvals, now = config.service.approvals, now or utcnow()
    metrics.pending_ages(pending_by_age(engine, now, metrics.PENDING_AGES))
    if approvals.remindAfter is None and approvals.escalateAfter is None:
        return 0
    return asyncio.run(_nudge(engine, config, secrets, now))


async def _nudge(engine: Engine, config: Config, secrets: tuple[str, ...], now: datetime) -> int:
    service, approvals = config.service, config.service.approvals
    # One connection pool for every call; each thread's client speaks with its own workspace's token.
    pool = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))

    def slack_of(waiting: Waiting) -> SlackOut:
        client = web_client(config, team_of(waiting))
        client.session = pool
        return SlackOut(client, secrets)

    posted = 0
    try:
        if approvals.remindAfter is not None:
            for waiting in due_reminders(engine, approvals.remindAfter, now):
                async with _each(waiting):
                    slack = slack_of(waiting)
                    who = await _named(slack, accepted(_view(service, waiting), waiting.channel, waiting.row), waiting)
                    text = REMINDER.format(who=who, age=duration(approvals.remindAfter), line=line_of(waiting.row))
                    posted += await _post(slack, waiting, text)
        if approvals.escalateAfter is not None and approvals.escalateTo:
            to = approvals.escalateTo
            for waiting in due_escalations(
                engine,
                approvals.escalateAfter,
                now,
                to,
                lambda waiting: accepted(_view(service, waiting), waiting.channel, waiting.row),
            ):
                async with _each(waiting):
                    slack = slack_of(waiting)
                    await _show(slack, waiting, secrets)
                    who = await _named(slack, to, waiting)
                    text = ESCALATED.format(who=who, age=duration(approvals.escalateAfter), line=line_of(waiting.row))
                    posted += await _post(slack, waiting, text)
    finally:
        await pool.close()
    return posted


def _accepted(service: ServiceConfig, waiting: Waiting) -> list[str]:
    return accepted(_view(service, waiting), waiting.channel, waiting.row)


def _view(service: ServiceConfig, waiting: Waiting) -> ServiceConfig:
    """The config as the waiting call's workspace sees it (its `teams` section over the top level's)."""
    return service.for_team(waiting.slack_team_id, waiting.enterprise_id)


@contextlib.asynccontextmanager
async def _each(waiting: Waiting) -> AsyncIterator[None]:
    """One call's reminder or escalation: a failure is logged and the others still go (each is already marked
    done: a courtesy lost, never one said twice)."""
    try:
        yield
    except Exception:
        log.exception("could not remind or escalate %s", waiting.row.call_id)


async def _named(slack: SlackOut, ids: list[str], waiting: Waiting) -> Mrkdwn:
    """Mentions of `ids`, a group by its members; never whoever asked for the call."""
    asked = set((waiting.row.requested_by or "").split(","))
    people: list[str] = []
    groups: list[str] = []
    for id_ in ids:
        if not id_.startswith("S"):
            people.append(id_)
            continue
        try:
            answer = await slack.client.usergroups_users_list(usergroup=id_)
            people += [u for u in answer.get("users") or [] if isinstance(u, str)]
        except Exception as e:  # noqa: BLE001 - a group Slack cannot list is still named, by its id
            log.warning("user group %s could not be listed for a reminder: %s", id_, e)
            groups.append(id_)
    unique = [p for i, p in enumerate(people) if p not in people[:i] and p not in asked]
    named = [Mrkdwn("<@{id}>").format(id=p) for p in unique[:MAX_NAMED]]
    if len(unique) > MAX_NAMED:
        named.append(Mrkdwn("and {n} more").format(n=len(unique) - MAX_NAMED))
    named += [Mrkdwn("the user group `{id}`").format(id=g) for g in groups]
    return Mrkdwn(", ").join(named) if named else NOBODY


async def _post(slack: SlackOut, waiting: Waiting, text: Mrkdwn) -> int:
    try:
        await slack.post(waiting.channel, text, thread_ts=waiting.thread_ts)
        return 1
    except Exception as e:  # noqa: BLE001 - a courtesy: the call waits as before
        log.warning("could not post in %s/%s: %s", waiting.channel, waiting.thread_ts, e)
        return 0


async def _show(slack: SlackOut, waiting: Waiting, secrets: tuple[str, ...]) -> None:
    """The call's message as it now stands: who may decide it, and when it was escalated."""
    if waiting.row.message_ts is None:
        return
    blocks, text = approval_blocks(waiting.row, waiting.channel, secrets)
    try:
        await slack.update(waiting.channel, waiting.row.message_ts, text, blocks=blocks)
    except Exception as e:  # noqa: BLE001 - the escalation stands; only its display failed
        log.warning("could not update the approval message %s: %s", waiting.row.message_ts, e)
