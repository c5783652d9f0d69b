"""The inbox on asyncio, for the bot's record of a message before its ack (bot.inbox_writer): several messages in
one transaction, and the thread's session read, without leaving the event loop.

Two ways to the same rows as chatops.inbox.record_message (one message, one session a thread, an idle session
queued):

- PostgreSQL (`PgInbox`): psycopg's async connections, with one statement a message (find or create the
  session, keep the message unless it is there, queue an idle session: PG_RECORD), prepared by the server
  after its first few uses, so that a batch costs a round trip a message and one commit; a pool of its own.
  Its errors are SQLAlchemy's (IntegrityError, DataError, OperationalError), as the threaded engine raises them.
- anything else, SQLite first (`SqlInbox`): SQLAlchemy's asyncio extension (aiosqlite), record_message's
  statements one by one inside the batch's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from chatops import db
from chatops.inbox import Recorded, record_in, session_in
from chatops.schema import SessionKind, SessionStatus, new_id, utcnow


class Transaction(Protocol):
    async def keep(self, messages: list[dict[str, Any]]) -> list[Recorded]:
        """Each message (chatops.inbox.message_values) kept in this transaction, in order."""
        ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


class AsyncInbox(Protocol):
    def transaction(self) -> Any:
        """An async context manager: a Transaction on a connection of the pool, rolled back unless committed."""
        ...

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None: ...

    async def close(self) -> None: ...


def async_inbox(url: str, wait_s: float) -> AsyncInbox:
    """The inbox on asyncio for the database at `url`, every wait bounded by `wait_s` (chatops.db.engine_for)."""
    if make_url(db.normalize_url(url)).get_backend_name() == "postgresql":
        return PgInbox(url, wait_s)
    return SqlInbox(db.async_engine_for(url, wait_s=wait_s))


# --- SQLite (and any other database SQLAlchemy's asyncio extension drives) ---------------------------------------


class SqlInbox:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        async with self.engine.connect() as conn:
            yield _SqlTransaction(conn)
            if conn.in_transaction():
                await conn.rollback()

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None:
        async with self.engine.connect() as conn:
            return await session_in(conn, channel_id, thread_ts)

    async def close(self) -> None:
        await self.engine.dispose()


class _SqlTransaction:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def keep(self, messages: list[dict[str, Any]]) -> list[Recorded]:
        return [await record_in(self.conn, values) for values in messages]

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        await self.conn.rollback()


def _busy(status: str | None) -> bool:
    return status in (SessionStatus.RUNNING, SessionStatus.AWAITING_APPROVAL)


# --- PostgreSQL ---------------------------------------------------------------------------------------------------

# One statement a message, what record_message does in four: the thread's session found, or created queued;
# the message kept unless it is there (a redelivery, a mention's twin: `new` false); an idle session queued. The
# foreign key of the message on a session made by the same statement is checked at its end, when that row is
# there. Two bots creating the same session at once: the second's insert fails (IntegrityError), and its
# message is written again, finding the session.
PG_RECORD = f"""
WITH found AS (
    SELECT id, status FROM sessions WHERE channel_id = %(p_channel)s AND thread_ts = %(p_thread)s
), created AS (
    INSERT INTO sessions (id, kind, channel_id, thread_ts, team_id, requester, assistant_thread, status,
                          lease_token, event_seq, created_at, updated_at)
    SELECT %(p_id)s, '{SessionKind.THREAD.value}', %(p_channel)s, %(p_thread)s, %(p_team)s, %(p_user)s,
           %(p_assistant)s, '{SessionStatus.QUEUED.value}', 0, 0, %(p_now)s, %(p_now)s
    WHERE NOT EXISTS (SELECT FROM found)
    RETURNING id
), target AS (
    SELECT id FROM found UNION ALL SELECT id FROM created
), kept AS (
    INSERT INTO inbox (session_id, message_ts, user_id, text, command, files, created_at)
    SELECT id, %(p_message_ts)s, %(p_user)s, %(p_text)s, %(p_command)s, %(p_files)s::json, %(p_now)s FROM target
    ON CONFLICT DO NOTHING
    RETURNING id
), queued AS (
    UPDATE sessions SET status = '{SessionStatus.QUEUED.value}', updated_at = %(p_now)s
    WHERE id IN (SELECT id FROM found) AND status = '{SessionStatus.IDLE.value}' AND EXISTS (SELECT FROM kept)
)
SELECT (SELECT id FROM target), (SELECT status FROM found), EXISTS (SELECT FROM kept)
"""
PG_SESSION = "SELECT id FROM sessions WHERE channel_id = %s AND thread_ts = %s"
# Connections kept: the writers' and the reads'; a batch that finds none free waits `wait_s` at most.
PG_POOL = 6


class PgInbox:
    """The inbox on PostgreSQL through psycopg's async connections, a small pool of its own."""

    def __init__(self, url: str, wait_s: float) -> None:
        parsed = make_url(db.normalize_url(url))
        self._conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        ms = max(1, round(wait_s * 1000))
        self._options = {
            "connect_timeout": max(2, round(wait_s)),
            "options": f"-c statement_timeout={ms} -c lock_timeout={ms}",
        }
        self._wait_s = wait_s
        self._idle: list[Any] = []
        self._slots = asyncio.Semaphore(PG_POOL)
        self._closed = False

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """A connection of the pool; one that failed is closed, and with it every idle one (a server that
        restarted has ended them all: the next batch connects anew instead of failing on each)."""
        import psycopg

        try:
            await asyncio.wait_for(self._slots.acquire(), self._wait_s)
        except TimeoutError:
            raise _translated(psycopg.OperationalError("no connection of the inbox's pool came free")) from None
        conn = None
        try:
            conn = self._idle.pop() if self._idle else await _connect(self._conninfo, self._options)
            yield conn
        except BaseException:
            # Whatever it was doing is given up (an error, a cancellation): closed rather than rolled back,
            # which would wait on a database that may not answer.
            if conn is not None:
                await _drop(conn)
                conn = None
            raise
        finally:
            if conn is not None and not self._closed and not conn.closed:
                self._idle.append(conn)
            elif conn is not None:
                await _drop(conn)
            self._slots.release()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        import psycopg

        try:
            async with self._connection() as conn:
                yield _PgTransaction(conn)
                if conn.info.transaction_status != _IDLE:  # neither committed nor rolled back: rolled back
                    await conn.rollback()
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                await self._forget_idle()
            raise _translated(exc) from exc

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None:
        import psycopg

        try:
            async with self._connection() as conn:
                cur = await conn.execute(PG_SESSION, (channel_id, thread_ts))
                found = await cur.fetchone()
                await conn.rollback()
                return found[0] if found else None
        except psycopg.OperationalError as exc:
            await self._forget_idle()
            raise _translated(exc) from exc
        except psycopg.Error as exc:
            raise _translated(exc) from exc

    async def _forget_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _drop(conn)

    async def close(self) -> None:
        self._closed = True
        await self._forget_idle()


class _PgTransaction:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def keep(self, messages: list[dict[str, Any]]) -> list[Recorded]:
        from psycopg.types.json import Json

        now = utcnow()
        recorded = []
        # One statement after the other, not in a pipeline: psycopg's async pipeline polls a writable socket
        # until the answers come, which costs more CPU than the round trips it saves on a local network.
        for values in messages:
            params = values | {
                "p_id": new_id(),
                "p_now": now,
                "p_command": values["p_command"].value if values["p_command"] is not None else None,
                "p_files": Json(values["p_files"]) if values["p_files"] is not None else None,
            }
            cursor = await self.conn.execute(PG_RECORD, params)
            session_id, status, new = await cursor.fetchone()
            recorded.append(Recorded(session_id, new=new, busy=new and _busy(status)))
        return recorded

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        await self.conn.rollback()


_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE


async def _connect(conninfo: str, options: dict[str, Any]) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo, **options)


async def _drop(conn: Any) -> None:
    # A connection given up: its own failure to close changes nothing.
    with contextlib.suppress(Exception):
        await conn.close()


def _translated(exc: Exception) -> StatementError:
    """psycopg's error as SQLAlchemy raises it from the threaded engine (IntegrityError, DataError,
    OperationalError, ...), so that the bot's answers to it are the same (bot.before_ack.silent, bot.app)."""
    import psycopg

    return DBAPIError.instance(PG_RECORD, None, exc, psycopg.Error)
