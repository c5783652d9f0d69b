"""Retention: a thread's content goes, the audit of its calls stays.

`retention.days` (off by default) purges the sessions idle longer than that, a bounded batch each housekeeping
round (workers/retention.py); `mm-bot purge --thread LINK` and `/mm purge LINK` purge one thread now. A purge,
in one transaction:

- removes the session's log (session_events) and the messages its turns took (inbox rows);
- clears each tool call's output (tool_calls.output) and each approval's preview (the whole command or diff
  a person was shown);
- scrubs the secrets the caller knows from what it keeps of the calls (arguments, titles, what matched a rule);
- forgets what Slack said the person of an assistant thread looked at (assistant_contexts);
- marks the session purged: `sessions.purged_at`, who and why in its agent_config (`purged`), its log's counter
  back to 0, and its lease token bumped, so that a worker stalled past its lease is fenced rather than append
  to the purged log.

It keeps what the audit reads (chatops/audit.py): the session's row (channel, thread, requester, repository),
each call (tool, arguments, who asked, the rule, the decision, status, times), each approval (title, arguments,
rule, who decided, when), every decision row; and model usage (tokens and cost, no text), the errors table (where
and what failed, for the operators) and job runs (their summaries are the jobs' history).

The workspace's files belong to the workers (the bot may not even mount the volume): a worker removes the
workspace of a purged session that has not started afresh (workers/retention.py). Data flows one way.

Only a quiet session is purged: idle, no live lease, no stop asked, no approval pending, no message waiting for
a turn; checked with the session's row locked, so that no turn starts halfway through. Purging is idempotent: a
session purged and unused since is left as it is, and the answer says so. A purged thread that gets a message
starts afresh (workers/turns.py says so in the thread).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, delete, exists, func, or_, select, update

from chatops.db import transaction
from chatops.schema import (
    Approval,
    ApprovalState,
    AssistantContext,
    InboxMessage,
    PullRequestRecord,
    Session,
    SessionEvent,
    SessionStatus,
    ToolCall,
    utcnow,
)
from chatops.secrets import describe_error, scrub, with_json_forms
from chatops.store import record_error

log = logging.getLogger("mm.retention")

# Sessions purged by one housekeeping round, at most: a first round after retention is turned on (a year of
# threads) is spread over many rounds instead of holding the housekeeping task for minutes.
BATCH = 50


class PurgeOutcome(StrEnum):
    PURGED = "purged"
    ALREADY = "already"  # purged before, and nothing was kept since
    BUSY = "busy"  # not quiet: nothing was changed


@dataclass(frozen=True)
class Purge:
    session_id: str
    outcome: PurgeOutcome
    purged_at: datetime | None = None  # this purge's time, or the earlier one's (ALREADY)
    events: int = 0  # log entries removed
    messages: int = 0  # inbox rows removed
    outputs: int = 0  # tool outputs cleared
    calls: int = 0  # calls whose audit is kept
    busy: str | None = None  # why it is not quiet (BUSY)


def purge_session(
    bind: Engine | Connection,
    session_id: str,
    *,
    by: str | None,
    why: str,
    secrets: Sequence[str] = (),
    now: datetime | None = None,
) -> Purge | None:
    """Purge one session (see the module), recording `by` (a user id, a command line's user, None: retention) and
    `why`; None when there is no such session. Given a connection, in its transaction (a request keeps what it
    did with the change: bot.steps)."""
    now = now or utcnow()
    with transaction(bind) as conn:
        row = conn.execute(
            select(
                Session.status,
                Session.lease_owner,
                Session.lease_expires_at,
                Session.stop_requested_at,
                Session.purged_at,
                Session.event_seq,
                Session.agent_config,
                Session.channel_id,
                Session.thread_ts,
            )
            .where(Session.id == session_id)
            .with_for_update()
        ).first()
        if row is None:
            return None
        busy = _busy(conn, session_id, row, now)
        if busy is not None:
            return Purge(session_id, PurgeOutcome.BUSY, purged_at=row.purged_at, busy=busy)
        taken = InboxMessage.taken_at.is_not(None)
        kept_messages = conn.execute(
            select(func.count()).select_from(InboxMessage).where(InboxMessage.session_id == session_id, taken)
        ).scalar_one()
        if row.purged_at is not None and row.event_seq == 0 and kept_messages == 0:
            return Purge(session_id, PurgeOutcome.ALREADY, purged_at=row.purged_at)
        events = conn.execute(delete(SessionEvent).where(SessionEvent.session_id == session_id)).rowcount
        # Only the taken ones: a message recorded while this runs (the row lock does not hold an insert back) is
        # the next turn's, and must not be lost.
        messages = conn.execute(delete(InboxMessage).where(InboxMessage.session_id == session_id, taken)).rowcount
        outputs = conn.execute(
            update(ToolCall).where(ToolCall.session_id == session_id, ToolCall.output.is_not(None)).values(output=None)
        ).rowcount
        conn.execute(
            update(Approval)
            .where(Approval.session_id == session_id, Approval.preview.is_not(None))
            .values(preview=None)
        )
        # A pull request's body quotes the thread (what was asked, the answer): the forge has its copy, ours goes.
        # One the forge has not been told yet keeps it, or the next sync would blank the forge's.
        conn.execute(
            update(PullRequestRecord)
            .where(PullRequestRecord.session_id == session_id, PullRequestRecord.needs_sync.is_(False))
            .values(body="")
        )
        if secrets:
            _scrub_kept(conn, session_id, secrets)
        if row.channel_id and row.thread_ts:
            conn.execute(
                delete(AssistantContext).where(
                    AssistantContext.channel_id == row.channel_id, AssistantContext.thread_ts == row.thread_ts
                )
            )
        calls = conn.execute(
            select(func.count()).select_from(ToolCall).where(ToolCall.session_id == session_id)
        ).scalar_one()
        purged = {"at": now.isoformat(), "by": by, "why": why}
        conn.execute(
            update(Session)
            .where(Session.id == session_id)
            .values(
                purged_at=now,
                event_seq=0,
                lease_token=Session.lease_token + 1,
                agent_config={**(row.agent_config or {}), "purged": purged},
                # A purge is not activity: App Home's order and retention's idle clock stay as they were.
                updated_at=Session.updated_at,
            )
        )
    log.info(
        "purged session %s (%s): %d log entries, %d messages, %d outputs",
        session_id,
        why,
        events,
        messages,
        outputs,
    )
    return Purge(session_id, PurgeOutcome.PURGED, now, events, messages, outputs, calls)


def idle_sessions(engine: Engine, days: int, now: datetime | None = None, limit: int = BATCH) -> list[str]:
    """The quiet sessions untouched for more than `days` that hold something to purge (never purged, or used
    since), the longest idle first."""
    now = now or utcnow()
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(Session.id)
                .where(
                    *_quiet(now),
                    Session.updated_at < now - timedelta(days=days),
                    or_(Session.purged_at.is_(None), Session.event_seq > 0),
                )
                .order_by(Session.updated_at)
                .limit(limit)
            ).scalars()
        )


def purge_idle(
    engine: Engine, days: int, *, secrets: Sequence[str] = (), now: datetime | None = None, limit: int = BATCH
) -> list[Purge]:
    """Retention's round: purge up to `limit` sessions idle for more than `days`."""
    now = now or utcnow()
    done = []
    for session_id in idle_sessions(engine, days, now, limit):
        try:
            purged = purge_session(
                engine, session_id, by=None, why=f"retention: idle for more than {days} days", secrets=secrets, now=now
            )
        except Exception as e:  # one session that cannot be purged must not hold up the others, round after round
            log.exception("retention: session %s could not be purged", session_id)
            with contextlib.suppress(Exception):  # the database itself may be what failed
                record_error(engine, "retention", f"could not purge: {describe_error(e)}", session_id=session_id)
            continue
        if purged is not None and purged.outcome == PurgeOutcome.PURGED:
            done.append(purged)
    return done


def still_purged(engine: Engine, session_ids: Sequence[str]) -> list[str]:
    """Of these sessions, those purged that have not started afresh (their log is still empty) and are quiet: a
    workspace of theirs holds the purged thread's files, and the workers remove it. The log says it, not a clock:
    a purger's and a worker's clocks need not agree."""
    if not session_ids:
        return []
    now = utcnow()
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(Session.id).where(
                    Session.id.in_(session_ids), Session.purged_at.is_not(None), Session.event_seq == 0, *_quiet(now)
                )
            ).scalars()
        )


def _pending() -> Any:
    return exists().where(Approval.session_id == Session.id, Approval.state == ApprovalState.PENDING)


def _untaken() -> Any:
    return exists().where(InboxMessage.session_id == Session.id, InboxMessage.taken_at.is_(None))


def _quiet(now: datetime) -> list[Any]:
    return [
        Session.status == SessionStatus.IDLE,
        or_(Session.lease_owner.is_(None), Session.lease_expires_at.is_(None), Session.lease_expires_at <= now),
        Session.stop_requested_at.is_(None),
        ~_pending(),
        ~_untaken(),
    ]


def _busy(conn: Connection, session_id: str, row: Any, now: datetime) -> str | None:
    """Why the session is not quiet, in words for the person who asked; None when it is."""
    if row.status == SessionStatus.RUNNING:
        return "it is running a turn"
    if row.status == SessionStatus.QUEUED:
        return "a turn is about to start"
    pending = conn.execute(
        select(exists().where(Approval.session_id == session_id, Approval.state == ApprovalState.PENDING))
    ).scalar_one()
    if row.status == SessionStatus.AWAITING_APPROVAL or pending:
        return "a call waits for a decision"
    if row.lease_owner is not None and row.lease_expires_at is not None and row.lease_expires_at > now:
        return "a worker holds it"
    if row.stop_requested_at is not None:
        return "a stop is being carried out"
    untaken = conn.execute(
        select(exists().where(InboxMessage.session_id == session_id, InboxMessage.taken_at.is_(None)))
    ).scalar_one()
    if untaken:
        return "messages wait for its next turn"
    return None


def _scrub_kept(conn: Connection, session_id: str, secrets: Sequence[str]) -> None:
    """The secrets out of what the audit keeps of the session's calls (a model that saw a token may have put it
    in a command): each text that holds one is written again without it."""
    known = with_json_forms(secrets)
    calls = conn.execute(
        select(ToolCall.id, ToolCall.arguments).where(
            ToolCall.session_id == session_id, ToolCall.arguments.is_not(None)
        )
    ).all()
    for call_id, arguments in calls:
        if arguments is not None and (clean := scrub(arguments, known)) != arguments:
            conn.execute(update(ToolCall).where(ToolCall.id == call_id).values(arguments=clean))
    approvals = conn.execute(
        select(Approval.call_id, Approval.title, Approval.arguments, Approval.matched).where(
            Approval.session_id == session_id
        )
    ).all()
    for row in approvals:
        texts = {"title": row.title, "arguments": row.arguments, "matched": row.matched}
        clean = {k: scrub(v, known) for k, v in texts.items() if v is not None and scrub(v, known) != v}
        if clean:
            conn.execute(update(Approval).where(Approval.call_id == row.call_id).values(**clean))
