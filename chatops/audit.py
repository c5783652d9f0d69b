"""The audit: every tool call the service kept, with who asked for it, the rule that decided how it was treated,
each decision on it (who, what, when) and how it ended; read for `mm-bot audit` and `/mm audit`.

One read model over four tables, none of them written here: tool_calls (the log's projection: the tool, its
arguments, its outcome, who asked for the turn), sessions (the channel and thread), approvals (the rule that
asked, how many people had to approve, the state the decisions led to) and approval_decisions (each click that
counted, and an expiry, appended and never updated). A retention purge keeps all of it but the tool's output
and the approval's preview (chatops/retention.py), so a purged thread's calls are still here.

The calls come in the order they were asked (tool_calls.id grows as the log's answers are appended), a page at a
time on a connection of its own, so a year of calls never sits in memory nor holds a transaction open while the
reader writes them out. A call's time is when it was asked: its approval's, else when it started (or ended, for
one that never started). The arguments are what the model sent, scrubbed of the secrets the caller knows: the
model may have seen a token and put it in a command.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Select, and_, exists, func, or_, select

from chatops.errors import ChatopsError
from chatops.schema import Approval, ApprovalDecision, ApprovalState, Session, ToolCall, Vote
from chatops.secrets import scrub, with_json_forms
from chatops.teams import NOWHERE, Team, in_workspace

# Calls read a page at a time: bounded memory, and the decisions of a page in one IN list SQLite takes.
PAGE = 500

_AGE = re.compile(r"(\d{1,9})\s*([mhdw])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_USER = re.compile(r"[UW][A-Z0-9]{2,31}")
_CHANNEL = re.compile(r"[CDG][A-Z0-9]{2,31}")


class BadFilter(ChatopsError, ValueError):
    """A filter the audit cannot take; str() says what it expected, and what it got."""


def parse_when(text: str, now: datetime, what: str = "a time") -> datetime:
    """A moment given as an ISO date or time (`2026-01-31`, `2026-01-31T09:00`, `…Z`, `…+02:00`; UTC unless it
    says) or as an age before `now` (`30m`, `24h`, `7d`, `2w`); BadFilter naming `what` otherwise."""
    value = text.strip()
    if m := _AGE.fullmatch(value):
        try:
            return now - timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])
        except OverflowError:
            raise BadFilter(f"{what}: {value!r} reaches back before the calendar starts") from None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise BadFilter(
            f"{what}: expected a date or time such as 2026-01-31 or 2026-01-31T09:00Z (UTC unless it says), or an "
            f"age such as 30m, 24h, 7d or 2w, got {value[:100]!r}"
        ) from None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).astimezone(UTC)


def check_user(text: str) -> str:
    """A Slack user id (U…, W…), as --user takes it; BadFilter otherwise."""
    if not _USER.fullmatch(text):
        raise BadFilter(f"--user: expected a Slack user id such as U0123ABCD, got {text[:100]!r}")
    return text


def check_channel(text: str) -> str:
    """A Slack channel id (C…, G…, D…), as --channel takes it; BadFilter otherwise."""
    if not _CHANNEL.fullmatch(text):
        raise BadFilter(f"--channel: expected a Slack channel id such as C0123ABCD, got {text[:100]!r}")
    return text


@dataclass(frozen=True)
class AuditFilter:
    """Which calls: asked from `since` (inclusive) until `until` (exclusive), in one channel, and asked for or
    decided by one person (a requester of the call's turn, or anyone whose decision on it counted)."""

    since: datetime | None = None
    until: datetime | None = None
    channel: str | None = None
    user: str | None = None
    # In one Slack workspace (or org): an admin of one workspace exports only its calls (chatops.teams).
    place: Team = NOWHERE


@dataclass(frozen=True)
class Decided:
    """One decision that counted on a call: a person's approve or reject, or its expiry (`by` None)."""

    by: str | None
    vote: str  # chatops.schema.Vote
    approve_all: bool
    rule: str | None
    at: datetime | None


@dataclass(frozen=True)
class AuditCall:
    call_id: str
    at: datetime  # when it was asked
    session_id: str
    kind: str  # a thread's session, or a job's run (chatops.schema.SessionKind)
    channel_id: str | None
    thread_ts: str | None
    requested_by: tuple[str, ...]  # who asked for its turn (nobody: a job's prompt)
    tool: str
    agent: str | None  # an asked agent's call (ask_agent), else None
    arguments: str | None  # as the model sent them, scrubbed of the secrets known
    rule: str | None  # the approval policy's rule that decided how it was treated
    matched: str | None  # what of the call matched that rule
    needed: int | None  # distinct approvals it needed; None: nobody was asked
    approval: str | None  # where its approval ended (chatops.schema.ApprovalState); None: nobody was asked
    decisions: tuple[Decided, ...]
    decision: str | None  # the log's decision (approved, rejected, auto: it ran without asking)
    decided_by: str | None
    outcome: str  # the call's status: ok, error, rejected, cancelled, interrupted, dropped; requested, running
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: int | None
    purged_at: datetime | None  # its thread's log, outputs and workspace were removed then (retention, purge)
    purged_by: str | None


def calls(
    engine: Engine, where: AuditFilter | None = None, *, secrets: Sequence[str] = (), page: int = PAGE
) -> Iterator[AuditCall]:
    """The calls `where` selects, in the order they were asked, read `page` at a time."""
    where = where or AuditFilter()
    hidden = with_json_forms(secrets)
    after = 0
    while True:
        with engine.connect() as conn:
            rows = conn.execute(_page(where, after, page)).all()
            decided = _decisions(conn, [row.call_id for row in rows])
        for row in rows:
            yield _call(row, decided.get(row.call_id, []), hidden)
        if len(rows) < page:
            return
        after = rows[-1].id


def _asked_at() -> ColumnElement[datetime]:
    # Every call has a session, so the last term is never NULL: a call the log projected and nothing else (its
    # worker died before asking or starting it) sorts and filters by its session's start.
    return func.coalesce(Approval.created_at, ToolCall.started_at, ToolCall.finished_at, Session.created_at)


def _page(where: AuditFilter, after: int, page: int) -> Select[*tuple[Any, ...]]:
    at = _asked_at()
    query = (
        select(
            ToolCall.id,
            ToolCall.call_id,
            ToolCall.session_id,
            at.label("at"),
            Session.kind,
            Session.channel_id,
            Session.thread_ts,
            ToolCall.requested_by,
            Approval.requested_by.label("asked_by"),
            ToolCall.tool,
            ToolCall.agent,
            ToolCall.arguments,
            ToolCall.rule,
            Approval.rule.label("approval_rule"),
            Approval.matched,
            Approval.needed,
            Approval.state,
            Approval.approve_all,
            Approval.decided_by.label("approval_decided_by"),
            Approval.decided_at,
            ToolCall.decision,
            ToolCall.decided_by,
            ToolCall.status,
            ToolCall.started_at,
            ToolCall.finished_at,
            ToolCall.duration_ms,
            Session.purged_at,
            Session.agent_config,
        )
        .join(Session, Session.id == ToolCall.session_id)
        .outerjoin(Approval, and_(Approval.call_id == ToolCall.call_id, Approval.session_id == ToolCall.session_id))
        .where(ToolCall.id > after)
        .order_by(ToolCall.id)
        .limit(page)
    )
    if where.since is not None:
        query = query.where(at >= where.since)
    if where.until is not None:
        query = query.where(at < where.until)
    if where.channel is not None:
        query = query.where(Session.channel_id == where.channel)
    query = query.where(*in_workspace(where.place))
    if where.user is not None:
        user = check_user(where.user)  # it goes into LIKE patterns: only an id's letters and digits may
        query = query.where(
            or_(
                _lists(ToolCall.requested_by, user),
                _lists(Approval.requested_by, user),
                ToolCall.decided_by == user,
                Approval.decided_by == user,
                exists().where(ApprovalDecision.call_id == ToolCall.call_id, ApprovalDecision.user_id == user),
            )
        )
    return query


def _lists(column: Any, user: str) -> ColumnElement[bool]:
    """`column` (user ids, comma-separated) names `user`."""
    return or_(column == user, column.like(f"{user},%"), column.like(f"%,{user}"), column.like(f"%,{user},%"))


def _decisions(conn: Connection, call_ids: list[str]) -> dict[str, list[Decided]]:
    if not call_ids:
        return {}
    rows = conn.execute(
        select(
            ApprovalDecision.call_id,
            ApprovalDecision.user_id,
            ApprovalDecision.vote,
            ApprovalDecision.approve_all,
            ApprovalDecision.rule,
            ApprovalDecision.created_at,
        )
        .where(ApprovalDecision.call_id.in_(call_ids))
        .order_by(ApprovalDecision.created_at, ApprovalDecision.id)
    )
    found: dict[str, list[Decided]] = {}
    for row in rows:
        found.setdefault(row.call_id, []).append(
            Decided(row.user_id, row.vote, bool(row.approve_all), row.rule, row.created_at)
        )
    return found


_VOTE_OF = {
    ApprovalState.APPROVED: Vote.APPROVE,
    ApprovalState.REJECTED: Vote.REJECT,
    ApprovalState.EXPIRED: Vote.EXPIRE,
}


def _call(row: Any, decided: list[Decided], hidden: list[str]) -> AuditCall:
    if not decided and row.state in _VOTE_OF:
        # Decided before each decision had a row of its own (revision 0009): the approval's row holds the one that
        # won, the only record there is.
        vote = _VOTE_OF[row.state]
        by = None if vote == Vote.EXPIRE else row.approval_decided_by
        decided = [Decided(by, vote, bool(row.approve_all), row.approval_rule, row.decided_at)]
    purged = (row.agent_config or {}).get("purged")
    asked = row.requested_by or row.asked_by
    return AuditCall(
        call_id=row.call_id,
        at=row.at,
        session_id=row.session_id,
        kind=row.kind,
        channel_id=row.channel_id,
        thread_ts=row.thread_ts,
        requested_by=tuple(u for u in (asked or "").split(",") if u),
        tool=row.tool,
        agent=row.agent,
        arguments=scrub(row.arguments, hidden) if row.arguments is not None else None,
        rule=row.rule or row.approval_rule,
        matched=scrub(row.matched, hidden) if row.matched is not None else None,
        needed=row.needed if row.state is not None else None,
        approval=row.state,
        decisions=tuple(decided),
        decision=row.decision,
        decided_by=row.decided_by,
        outcome=row.status,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_ms=row.duration_ms,
        purged_at=row.purged_at,
        purged_by=purged.get("by") if isinstance(purged, dict) else None,
    )
