"""Approvals that wait: the reminder (`approvals.remindAfter`) and the escalation (`approvals.escalateAfter`) each
come once a call, and which ones are due is decided here, by compare-and-set, so that two housekeepers never
remind twice. Posting them is the worker's (workers/nudges.py).

An escalation widens who may approve the call: the row's `approvers` become the ids it accepted (its rule's,
else its channel's, as they stand then) plus `approvals.escalateTo`. The row then holds, alone, who may decide
it (bot/authorize.py reads it), and its message says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Engine, or_, select, update

from chatops.schema import Approval, ApprovalState, Session
from chatops.store import APPROVAL_COLUMNS, ApprovalRow, approval_from, get_approval


@dataclass(frozen=True)
class Waiting:
    """A call that waits, and where its thread is."""

    row: ApprovalRow
    channel: str
    thread_ts: str | None
    # The thread's workspace and org, whose installation speaks there (slackio.installations.team_of).
    slack_team_id: str | None = None
    enterprise_id: str | None = None


def _waiting_since(before: datetime, now: datetime) -> list[ColumnElement[bool]]:
    """Pending, not past its time, asked before `before`."""
    return [
        Approval.state == ApprovalState.PENDING,
        or_(Approval.expires_at.is_(None), Approval.expires_at > now),
        Approval.created_at <= before,
    ]


def due_reminders(engine: Engine, after_s: float, now: datetime) -> list[Waiting]:
    """The calls that have waited `after_s` and were never reminded of: marked reminded, and returned."""
    with engine.begin() as conn:
        rows = conn.execute(
            update(Approval)
            .where(*_waiting_since(now - timedelta(seconds=after_s), now), Approval.reminded_at.is_(None))
            .values(reminded_at=now)
            .returning(*APPROVAL_COLUMNS)
        ).all()
    return _in_threads(engine, [approval_from(row._asdict()) for row in rows])


def due_escalations(
    engine: Engine, after_s: float, now: datetime, to: Sequence[str], accepted: Callable[[Waiting], list[str]]
) -> list[Waiting]:
    """The calls that have waited `after_s` and were never escalated: each now also accepts `to`, and is
    returned as it stands. `accepted(waiting)`: whom the call accepted until now (in its thread's workspace)."""
    with engine.connect() as conn:
        candidates = conn.execute(
            select(*APPROVAL_COLUMNS).where(
                *_waiting_since(now - timedelta(seconds=after_s), now), Approval.escalated_at.is_(None)
            )
        ).all()
    escalated = []
    for waiting in _in_threads(engine, [approval_from(row._asdict()) for row in candidates]):
        before = accepted(waiting)
        widened = before + [a for a in to if a not in before]
        with engine.begin() as conn:
            won = conn.execute(
                update(Approval)
                .where(Approval.call_id == waiting.row.call_id, Approval.escalated_at.is_(None))
                .values(escalated_at=now, approvers=widened)
            ).rowcount
        if won == 1 and (row := get_approval(engine, waiting.row.call_id)) is not None:
            escalated.append(dataclasses.replace(waiting, row=row))
    return escalated


def _in_threads(engine: Engine, rows: Sequence[ApprovalRow]) -> list[Waiting]:
    if not rows:
        return []
    with engine.connect() as conn:
        columns = (Session.channel_id, Session.thread_ts, Session.slack_team_id, Session.enterprise_id)
        threads: dict[str, Any] = {
            sid: where
            for sid, *where in conn.execute(
                select(Session.id, *columns).where(Session.id.in_({r.session_id for r in rows}))
            )
        }
    return [
        Waiting(r, (t := threads[r.session_id])[0] or "", t[1], t[2], t[3]) for r in rows if r.session_id in threads
    ]


def pending_by_age(engine: Engine, now: datetime, ages: Sequence[tuple[str, float | None]]) -> dict[str, int]:
    """How many calls wait, by age: `ages` names each bound in seconds (None: beyond the last)."""
    with engine.connect() as conn:
        created = conn.execute(select(Approval.created_at).where(*_waiting_since(now, now))).scalars().all()
    counts: dict[str, int] = {}
    for at in created:
        waited = (now - at).total_seconds()
        name = next(n for n, bound in ages if bound is None or waited < bound)
        counts[name] = counts.get(name, 0) + 1
    return counts
