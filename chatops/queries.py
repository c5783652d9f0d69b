"""What people ask about sessions (`status`, App Home): reads of the database shaped for showing, one query each.

The writes stay with their owners (chatops.store, chatops.inbox); this module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, or_, select

from chatops.schema import Approval, ApprovalState, InboxMessage, Session, SessionEvent, utcnow
from chatops.store import APPROVAL_COLUMNS, ApprovalRow, approval_from, get_approval
from chatops.teams import NOWHERE, Team, in_workspace
from mm_core.log import AssistantMessage, from_dict


@dataclass(frozen=True)
class SessionSummary:
    id: str
    channel_id: str | None
    thread_ts: str | None
    status: str
    repo: str | None
    branch: str | None
    yolo: bool | None
    updated_at: datetime


@dataclass(frozen=True)
class PendingApproval:
    row: ApprovalRow
    channel_id: str
    thread_ts: str | None


_SUMMARY = select(
    Session.id,
    Session.channel_id,
    Session.thread_ts,
    Session.status,
    Session.repo,
    Session.branch,
    Session.yolo,
    Session.updated_at,
)


def session_summary(engine: Engine, session_id: str) -> SessionSummary | None:
    with engine.connect() as conn:
        row = conn.execute(_SUMMARY.where(Session.id == session_id)).first()
    return SessionSummary(*row) if row else None


def instructions_used(engine: Engine, session_id: str) -> dict[str, Any] | None:
    """What the session's latest turn was told besides the agent's own prompt (chatops.store.set_instructions_used);
    None before its first turn."""
    return _turn_record(engine, session_id, "instructions")


def network_used(engine: Engine, session_id: str) -> dict[str, Any] | None:
    """The hosts the session's latest turn with network traffic reached and was refused
    (chatops.store.set_network_used): {"reached": {host: connections}, "refused": {host: why}}; None before."""
    return _turn_record(engine, session_id, "network")


def _turn_record(engine: Engine, session_id: str, key: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(select(Session.agent_config).where(Session.id == session_id)).scalar_one_or_none()
    used = (row or {}).get(key)
    return used if isinstance(used, dict) else None


def recent_sessions(engine: Engine, user: str, limit: int = 10, place: Team = NOWHERE) -> list[SessionSummary]:
    """The sessions `user` started or wrote to in the workspace `place`, most recently active first."""
    wrote = select(InboxMessage.session_id).where(InboxMessage.user_id == user)
    with engine.connect() as conn:
        rows = conn.execute(
            _SUMMARY.where(or_(Session.requester == user, Session.id.in_(wrote)), *in_workspace(place))
            .order_by(Session.updated_at.desc())
            .limit(limit)
        ).all()
    return [SessionSummary(*row) for row in rows]


def latest_session(engine: Engine, channel_id: str, user: str) -> SessionSummary | None:
    """`user`'s most recently active session in a channel: what `/mm stop` or `/mm status` there is about."""
    wrote = select(InboxMessage.session_id).where(InboxMessage.user_id == user)
    with engine.connect() as conn:
        row = conn.execute(
            _SUMMARY.where(Session.channel_id == channel_id, or_(Session.requester == user, Session.id.in_(wrote)))
            .order_by(Session.updated_at.desc())
            .limit(1)
        ).first()
    return SessionSummary(*row) if row else None


def pending_approvals(
    engine: Engine, limit: int = 50, session_id: str | None = None, place: Team = NOWHERE
) -> list[PendingApproval]:
    """Approvals still waiting and not past their time in the workspace `place`, oldest first, with where their
    session is."""
    now = utcnow()
    query = (
        select(*APPROVAL_COLUMNS, Session.channel_id.label("s_channel"), Session.thread_ts.label("s_thread"))
        .join(Session, Session.id == Approval.session_id)
        .where(
            Approval.state == ApprovalState.PENDING,
            or_(Approval.expires_at.is_(None), Approval.expires_at > now),
            *in_workspace(place),
        )
        .order_by(Approval.created_at)
        .limit(limit)
    )
    if session_id is not None:
        query = query.where(Approval.session_id == session_id)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    out = []
    for row in rows:
        values = row._asdict()
        channel, thread = values.pop("s_channel"), values.pop("s_thread")
        approval = approval_from(values)
        if approval.needed > 1:  # who approved it so far: App Home shows them, and does not ask them again
            approval = get_approval(engine, approval.call_id) or approval
        out.append(PendingApproval(approval, channel or "", thread))
    return out


def tokens_used(engine: Engine, session_id: str) -> tuple[int, int]:
    """Prompt and completion tokens over the session's whole log."""
    prompt = completion = 0
    with engine.connect() as conn:
        rows = conn.execute(
            select(SessionEvent.payload).where(SessionEvent.session_id == session_id, SessionEvent.kind == "assistant")
        )
        for (payload,) in rows:
            entry = from_dict(payload)
            if isinstance(entry, AssistantMessage):
                prompt += entry.prompt_tokens
                completion += entry.completion_tokens
    return prompt, completion


def writers(engine: Engine, session_id: str) -> set[str]:
    """Everyone who wrote to the session: the people in the conversation."""
    with engine.connect() as conn:
        rows = conn.execute(select(InboxMessage.user_id).where(InboxMessage.session_id == session_id).distinct())
        return {u for u in rows.scalars() if u}


def log_length(engine: Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(SessionEvent).where(SessionEvent.session_id == session_id)
        ).scalar_one()
