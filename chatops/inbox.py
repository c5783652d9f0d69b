"""What a thread asks of its session, as the database keeps it: messages waiting for a turn, stop requests,
and what an assistant thread's person looks at.

The bot records a message here before it acks Slack, and enqueues "session S has work" after; the worker
takes the messages (DbStore.take_inbox) under the session's lease. Since the broker only carries that hint,
housekeeping asks which sessions need a worker (chatops.sessions.sessions_with_work) and re-enqueues them: a
lost message, a killed worker or a flushed Redis delays a turn and never loses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NotRequired, TypedDict, Unpack

from sqlalchemy import JSON, Connection, Engine, bindparam, delete, exists, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Exists

from chatops.db import transaction
from chatops.schema import (
    Approval,
    ApprovalState,
    AssistantContext,
    InboxCommand,
    InboxMessage,
    Session,
    SessionKind,
    SessionStatus,
    db_clock,
    new_id,
    utcnow,
)
from chatops.store import record_expiry


@dataclass(frozen=True)
class Recorded:
    session_id: str
    # False for a message already recorded: a retried delivery, or the message event of an app_mention.
    new: bool
    # The session was running or waiting for a decision: the message waits for the next turn.
    busy: bool


def record_message(engine: Engine, **message: Unpack[Message]) -> Recorded:
    """Keep a message for the thread's agent (creating the thread's session) and mark the session queued. With
    `command`, the row is a thread command (new, compact, ask, yolo) that the worker carries out in its turn.
    `files`: what Slack said of the files the message carries (bot.shapes.shared_files), downloaded by the
    worker whose turn takes it.

    One transaction, and the fewest statements that do it (the bot runs this before every ack): find the
    session, or create it already queued; insert the message unless it is there (a redelivery, a mention's
    twin); queue an idle session."""
    values = message_values(**message)
    for _ in range(2):
        try:
            with engine.begin() as conn:
                return record_on(conn, values)
        except IntegrityError:
            continue  # another bot created the session between our read and our insert: read it again
    raise RuntimeError(f"could not record a message of {message['channel_id']}/{message['thread_ts']}")


class Message(TypedDict):
    """A Slack message for a thread's agent, as record_message and message_values take it."""

    channel_id: str
    thread_ts: str
    message_ts: str
    user_id: str | None
    text: str
    team_id: NotRequired[str | None]
    # The workspace and org the thread is in, as the installation sees them (kept on a session it creates).
    slack_team_id: NotRequired[str | None]
    enterprise_id: NotRequired[str | None]
    assistant_thread: NotRequired[bool]
    command: NotRequired[InboxCommand | None]
    files: NotRequired[list[dict[str, Any]] | None]


def message_values(**message: Unpack[Message]) -> dict[str, Any]:
    """A message's parameters for the statements below (record_on's: record_message's, and the bot's before its ack)."""
    return {
        "p_channel": message["channel_id"],
        "p_thread": message["thread_ts"],
        "p_team": message.get("team_id"),
        "p_slack_team": message.get("slack_team_id"),
        "p_enterprise": message.get("enterprise_id"),
        "p_user": message["user_id"],
        "p_assistant": message.get("assistant_thread", False),
        "p_message_ts": message["message_ts"],
        "p_text": message["text"],
        "p_command": message.get("command"),
        "p_files": message.get("files") or None,
    }


def record_on(conn: Connection, values: dict[str, Any]) -> Recorded:
    """record_message's statements, inside the caller's transaction (which may hold other messages too); the
    caller commits. `values`: message_values(). An IntegrityError (another bot created the session meanwhile)
    spoils the transaction: the caller rolls back and records the message again."""
    keep = _KEEP_PG if conn.dialect.name == "postgresql" else _KEEP_SQLITE
    now = utcnow()
    found = conn.execute(_FIND, values).first()
    if found is None:
        session_id = conn.execute(_CREATE, values | {"p_id": new_id(), "p_now": now}).scalar_one()
    else:
        session_id = found.id
    inserted = conn.execute(keep, values | {"p_session": session_id, "p_now": now}).first()
    if inserted is None:
        return Recorded(session_id, new=False, busy=False)
    # Whatever the status read above said: a turn may have ended since (the worker set it idle and committed),
    # and the statement's own WHERE queues the session only if it is idle now, as the bot's PG statement does.
    conn.execute(_QUEUE, {"p_id": session_id, "p_now": now})
    busy = found is not None and found.status in (SessionStatus.RUNNING, SessionStatus.AWAITING_APPROVAL)
    return Recorded(session_id, new=True, busy=busy)


async def record_in(conn: AsyncConnection, values: dict[str, Any]) -> Recorded:
    """record_on on an async connection (the bot's group commit on SQLite: chatops.inbox_async)."""
    return await conn.run_sync(record_on, values)


async def session_in(conn: AsyncConnection, channel_id: str, thread_ts: str) -> str | None:
    """session_of on an async connection (the bot's, before its ack)."""
    found = (await conn.execute(_FIND, {"p_channel": channel_id, "p_thread": thread_ts})).first()
    return found.id if found is not None else None


# Built once (the bot runs them before every ack): executing them finds their compiled form in SQLAlchemy's
# cache without building a statement and its cache key each time.
_FIND = select(Session.id, Session.status).where(
    Session.channel_id == bindparam("p_channel"), Session.thread_ts == bindparam("p_thread")
)
_CREATE = (
    insert(Session)
    .values(
        id=bindparam("p_id"),
        kind=SessionKind.THREAD,
        channel_id=bindparam("p_channel"),
        thread_ts=bindparam("p_thread"),
        team_id=bindparam("p_team"),
        slack_team_id=bindparam("p_slack_team"),
        enterprise_id=bindparam("p_enterprise"),
        requester=bindparam("p_user"),
        assistant_thread=bindparam("p_assistant"),
        status=SessionStatus.QUEUED,
        created_at=bindparam("p_now"),
        updated_at=bindparam("p_now"),
    )
    .returning(Session.id)
)
_MESSAGE = {
    "session_id": bindparam("p_session"),
    "message_ts": bindparam("p_message_ts"),
    "user_id": bindparam("p_user"),
    "text": bindparam("p_text"),
    "command": bindparam("p_command"),
    "files": bindparam("p_files", type_=JSON),
    "created_at": bindparam("p_now"),
}
# Unless it is there already (a redelivery, a mention's twin): then nothing is returned.
_KEEP_PG, _KEEP_SQLITE = (
    dialect.insert(InboxMessage).values(_MESSAGE).on_conflict_do_nothing().returning(InboxMessage.id)
    for dialect in (postgresql, sqlite)
)
_QUEUE = (
    update(Session)
    .where(Session.id == bindparam("p_id"), Session.status == SessionStatus.IDLE)
    .values(status=SessionStatus.QUEUED, updated_at=bindparam("p_now"))
)


def session_of(engine: Engine, channel_id: str, thread_ts: str) -> str | None:
    """The thread's session, or None: the bot follows a channel thread without a mention only once it has one."""
    with engine.connect() as conn:
        return conn.execute(
            select(Session.id).where(Session.channel_id == channel_id, Session.thread_ts == thread_ts)
        ).scalar_one_or_none()


def has_messages(engine: Engine, session_id: str) -> bool:
    """Whether anyone wrote to the session yet (taken or not)."""
    with engine.connect() as conn:
        found = conn.execute(select(InboxMessage.id).where(InboxMessage.session_id == session_id).limit(1)).first()
        return found is not None


def has_message(engine: Engine, session_id: str, message_ts: str) -> bool:
    """Whether this Slack message is already kept for the session (a request carried out again after a crash)."""
    with engine.connect() as conn:
        found = conn.execute(
            select(InboxMessage.id)
            .where(InboxMessage.session_id == session_id, InboxMessage.message_ts == message_ts)
            .limit(1)
        ).first()
        return found is not None


def has_untaken(engine: Engine, session_id: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(_untaken(session_id))).scalar_one()


def _untaken(session_id: object) -> Exists:
    return exists().where(InboxMessage.session_id == session_id, InboxMessage.taken_at.is_(None))


# --- stop -------------------------------------------------------------------------------------------------------


def request_stop(bind: Engine | Connection, session_id: str) -> bool:
    """Ask the session's turn to stop; True when a turn is running or waiting (there is something to stop).
    Given a connection, in its transaction (a request keeps that it stopped with the stop: bot.steps)."""
    with transaction(bind) as conn:
        return bool(
            conn.execute(
                update(Session)
                .where(
                    Session.id == session_id,
                    Session.status.in_([SessionStatus.RUNNING, SessionStatus.AWAITING_APPROVAL]),
                )
                .values(stop_requested_at=utcnow())
            ).rowcount
        )


def stops_for(engine: Engine, owner: str) -> list[str]:
    """The sessions this lease owner holds whose stop was asked: one indexed query for all of a worker's turns."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(Session.id).where(Session.lease_owner == owner, Session.stop_requested_at.is_not(None))
            ).scalars()
        )


def stop_requested(engine: Engine, session_id: str) -> bool:
    with engine.connect() as conn:
        return (
            conn.execute(select(Session.stop_requested_at).where(Session.id == session_id)).scalar_one_or_none()
            is not None
        )


def clear_stop(engine: Engine, session_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == session_id).values(stop_requested_at=None))


# --- finding work -----------------------------------------------------------------------------------------------


def renew_held(
    engine: Engine, owner: str, ttl_s: float, now: datetime | None = None, held: set[str] | None = None
) -> set[str]:
    """Extend the leases `owner` holds (only those of `held`, when given), in one statement; the sessions it
    still holds (a lease somebody took over is no longer `owner`'s, and is not renewed; one this process gave
    up, even if the release failed, is not in `held` and expires)."""
    now = now or utcnow()
    where = [Session.lease_owner == owner] + ([Session.id.in_(held)] if held is not None else [])
    with engine.begin() as conn:
        rows = conn.execute(
            update(Session).where(*where).values(lease_expires_at=now + timedelta(seconds=ttl_s)).returning(Session.id)
        )
        return set(rows.scalars())


def expire_pending(engine: Engine, session_id: str) -> list[str]:
    """The session's turn ended without a decision (a stop): its pending approvals go, so that nothing waits
    on them and a late click finds them decided. The call ids it expired (their messages lose their buttons)."""
    now = utcnow()
    with engine.begin() as conn:
        rows = conn.execute(
            update(Approval)
            .where(Approval.session_id == session_id, Approval.state == ApprovalState.PENDING)
            .values(state=ApprovalState.EXPIRED, decided_at=now)
            .returning(Approval.call_id, Approval.session_id, Approval.rule)
        ).all()
        record_expiry(conn, rows, now)
        return [row.call_id for row in rows]


def release_expired_leases(engine: Engine, now: datetime | None = None) -> int:
    """Forget the owners of leases past their time (the token stays, so their writers stay fenced)."""
    now = now or utcnow()
    with engine.begin() as conn:
        return conn.execute(
            update(Session)
            .where(Session.lease_owner.is_not(None), Session.lease_expires_at <= now)
            .values(lease_owner=None, lease_expires_at=None)
        ).rowcount


# --- assistant threads ------------------------------------------------------------------------------------------


def keep_assistant_context(
    engine: Engine, channel_id: str, thread_ts: str, context: dict[str, Any], *, changed: bool = True
) -> None:
    """What the person looks at beside an assistant thread, as Slack last said (one row a thread). The
    thread's start (`changed=False`) does not replace a change: delivered late, it is the older news."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    now = utcnow()
    statement = dialect.insert(AssistantContext).values(
        channel_id=channel_id, thread_ts=thread_ts, context=context, updated_at=now
    )
    keys = [AssistantContext.channel_id, AssistantContext.thread_ts]
    with engine.begin() as conn:
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=keys, set_={"context": statement.excluded.context, "updated_at": now}
            )
            if changed
            else statement.on_conflict_do_nothing(index_elements=keys)
        )


# An assistant thread's context is forgotten once the thread has been quiet this long (Slack says it again when
# the person comes back to the thread and looks at a channel).
CONTEXTS_KEPT = timedelta(days=30)


def forget_assistant_contexts(engine: Engine, kept: timedelta = CONTEXTS_KEPT) -> int:
    """Forget the contexts of assistant threads untouched for `kept` (housekeeping); how many."""
    with engine.begin() as conn:
        cutoff = db_clock(-kept.total_seconds())
        return conn.execute(delete(AssistantContext).where(AssistantContext.updated_at <= cutoff)).rowcount


def assistant_context(engine: Engine, channel_id: str, thread_ts: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        return conn.execute(
            select(AssistantContext.context).where(
                AssistantContext.channel_id == channel_id, AssistantContext.thread_ts == thread_ts
            )
        ).scalar_one_or_none()
