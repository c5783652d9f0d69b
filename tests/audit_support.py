"""Rows of a thread and its calls, inserted through the schema as the service keeps them: what the audit reads and
retention purges. The approval flow that fills `approval_decisions`, `approvals.rule`/`needed` and
`tool_calls.rule`/`requested_by` is another part of the work; until it lands these tests write those rows
themselves, in their final shape."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, update

from chatops.schema import (
    Approval,
    ApprovalDecision,
    InboxMessage,
    ModelUsage,
    Session,
    SessionEvent,
    SessionStatus,
    ToolCall,
)

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
_ts = itertools.count(1)


def new_channel() -> str:
    """A channel of the test's own: tests share their module's database."""
    return "C" + uuid.uuid4().hex[:10].upper()


def new_ts() -> str:
    return f"{1_767_600_000 + next(_ts)}.{uuid.uuid4().int % 1_000_000:06d}"


def add_thread(
    engine: Engine,
    channel: str,
    *,
    thread_ts: str | None = None,
    requester: str = "U0ALICE",
    updated_at: datetime = T0,
    status: SessionStatus = SessionStatus.IDLE,
) -> str:
    session_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            insert(Session).values(
                id=session_id,
                channel_id=channel,
                thread_ts=thread_ts or new_ts(),
                requester=requester,
                status=status,
                created_at=updated_at - timedelta(hours=1),
                updated_at=updated_at,
            )
        )
    return session_id


def thread_ts_of(engine: Engine, session_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(Session.__table__.select().where(Session.id == session_id)).one().thread_ts


def add_log(engine: Engine, session_id: str, entries: int = 3) -> None:
    """`entries` log entries (their content does not matter here), the session's counter after them."""
    with engine.begin() as conn:
        for seq in range(entries):
            conn.execute(
                insert(SessionEvent).values(
                    session_id=session_id, seq=seq, kind="user", payload={"kind": "user", "text": f"secret talk {seq}"}
                )
            )
        # The log's counter only: an append is no activity of the session (its updated_at stays).
        conn.execute(
            update(Session).where(Session.id == session_id).values(event_seq=entries, updated_at=Session.updated_at)
        )


def add_message(engine: Engine, session_id: str, user: str = "U0ALICE", *, taken: bool = True) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(InboxMessage).values(
                session_id=session_id,
                message_ts=new_ts(),
                user_id=user,
                text="please deploy",
                taken_at=T0 if taken else None,
            )
        )


def add_call(
    engine: Engine,
    session_id: str,
    *,
    tool: str = "bash",
    arguments: str = '{"command": "make deploy"}',
    output: str | None = "deployed",
    status: str = "ok",
    requested_by: str | None = "U0ALICE",
    rule: str | None = None,
    decision: str | None = "auto",
    decided_by: str | None = None,
    started_at: datetime | None = T0,
) -> str:
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    with engine.begin() as conn:
        conn.execute(
            insert(ToolCall).values(
                session_id=session_id,
                call_id=call_id,
                tool=tool,
                arguments=arguments,
                output=output,
                status=status,
                started_at=started_at,
                finished_at=started_at + timedelta(seconds=2) if started_at else None,
                duration_ms=2000 if started_at else None,
                decision=decision,
                decided_by=decided_by,
                rule=rule,
                requested_by=requested_by,
            )
        )
    return call_id


def add_approval(
    engine: Engine,
    session_id: str,
    call_id: str,
    *,
    state: str = "approved",
    asked_at: datetime = T0,
    requested_by: str = "U0ALICE",
    rule: str | None = None,
    matched: str | None = None,
    needed: int = 1,
    decided_by: str | None = None,
    decided_at: datetime | None = None,
    preview: str = "$ make deploy",
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(Approval).values(
                call_id=call_id,
                session_id=session_id,
                tool="bash",
                title="🛠️ bash: make deploy",
                arguments='{"command": "make deploy"}',
                preview=preview,
                requested_by=requested_by,
                state=state,
                decided_by=decided_by,
                decided_at=decided_at,
                created_at=asked_at,
                rule=rule,
                matched=matched,
                needed=needed,
            )
        )


def add_decision(
    engine: Engine,
    session_id: str,
    call_id: str,
    user: str | None,
    vote: str,
    at: datetime,
    *,
    approve_all: bool = False,
    rule: str | None = None,
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(ApprovalDecision).values(
                call_id=call_id,
                session_id=session_id,
                user_id=user,
                vote=vote,
                approve_all=approve_all,
                rule=rule,
                created_at=at,
            )
        )


def add_usage(engine: Engine, session_id: str, channel: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(ModelUsage).values(
                session_id=session_id, channel_id=channel, model="m", prompt_tokens=10, completion_tokens=5
            )
        )


def two_person_call(engine: Engine, channel: str, updated_at: datetime = T0) -> tuple[str, str]:
    """A thread whose deploy needed two approvers under the rule `prod-deploy`: asked by Alice at T0, approved by
    Bob then Carol, run; the thread last active at `updated_at`. Its session and call ids."""
    session_id = add_thread(engine, channel, updated_at=updated_at)
    add_log(engine, session_id)
    add_message(engine, session_id)
    call_id = add_call(
        engine,
        session_id,
        rule="prod-deploy",
        decision="approved",
        decided_by="U0CAROL",
        started_at=T0 + timedelta(minutes=5),
    )
    add_approval(
        engine,
        session_id,
        call_id,
        rule="prod-deploy",
        matched="make deploy",
        needed=2,
        decided_by="U0CAROL",
        decided_at=T0 + timedelta(minutes=4),
    )
    add_decision(engine, session_id, call_id, "U0BOB", "approve", T0 + timedelta(minutes=2), rule="prod-deploy")
    add_decision(engine, session_id, call_id, "U0CAROL", "approve", T0 + timedelta(minutes=4), rule="prod-deploy")
    return session_id, call_id
