"""The inbox on asyncio, for the bot's record of a message before its ack (bot.inbox_writer): several messages in
one transaction, and the thread's session read, without leaving the event loop.

Two ways to the same rows as chatops.inbox.record_message (one message, one session a thread, an idle session
queued):

- PostgreSQL (`PgInbox`): psycopg's async connections, with one statement for a batch of messages of distinct
  threads (find or create each session, keep each message unless it is there, queue an idle session:
  PG_RECORD), prepared by the server after its first few uses. The statement is its own transaction (the
  connections are in autocommit), so that a batch costs one round trip, commit included; a batch that holds a
  thread's second message takes a transaction of several statements. A pool of its own.
  Its errors are SQLAlchemy's (IntegrityError, DataError, OperationalError), as the threaded engine raises them.
- anything else, SQLite first (`SqlInbox`): SQLAlchemy's asyncio extension (aiosqlite), record_message's
  statements one by one inside the batch's transaction.

Either way a batch has one point of no return, the commit or the statement that commits itself: `keep` asks its
caller right before it (`committing`), so that a message given up before that point is never kept, and an
error after it is CommitUnknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, cast

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from chatops import db
from chatops.errors import ChatopsError
from chatops.inbox import Recorded, record_in, session_in
from chatops.schema import SessionKind, SessionStatus, new_id, utcnow


class CommitUnknown(ChatopsError):
    """The database failed after the point of no return (the commit under way): the messages may be kept."""


class AsyncInbox(Protocol):
    async def keep(self, messages: list[dict[str, Any]], committing: Callable[[], bool]) -> list[Recorded] | None:
        """Each message (chatops.inbox.message_values) kept and committed, in order. `committing()` is asked right
        before the point of no return; when it says no, nothing is kept and the answer is None. CommitUnknown when
        the database failed after that point; any other error: nothing was kept."""
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

    async def keep(self, messages: list[dict[str, Any]], committing: Callable[[], bool]) -> list[Recorded] | None:
        async with self.engine.connect() as conn:
            kept = [await record_in(conn, values) for values in messages]
            if not committing():
                await conn.rollback()
                return None
            try:
                await conn.commit()
            except Exception as exc:
                raise CommitUnknown("the database failed while committing") from exc
            return kept

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None:
        async with self.engine.connect() as conn:
            return await session_in(conn, channel_id, thread_ts)

    async def close(self) -> None:
        await self.engine.dispose()


def _busy(status: str | None) -> bool:
    return status in (SessionStatus.RUNNING, SessionStatus.AWAITING_APPROVAL)


# --- PostgreSQL ---------------------------------------------------------------------------------------------------

# One statement for many messages, what record_message does in four a message: each thread's session found, or
# created queued; each message kept unless it is there (a redelivery, a mention's twin: `new` false); an idle
# session that got a message queued. The messages of one statement are of distinct threads (`rounds`): a
# statement's parts do not see each other's rows, so a thread's second message goes in the next statement of
# the transaction, which finds the session the first one made. Rows are written and locked in the messages'
# order (bot.inbox_writer sorts a batch by thread and message), so that two batches never wait on each other in
# a cycle. The foreign key of a message on a session made by the same statement is checked at its end, when
# that row is there. Two bots creating the same session at once: the second's insert fails (IntegrityError),
# and its messages are written again, finding the session. Each message's parameters are one element of an
# array a column: one round trip and one parse for the whole batch, not one a message.
PG_RECORD = f"""
WITH input AS (
    SELECT * FROM unnest(
        %(p_id)s::text[], %(p_channel)s::text[], %(p_thread)s::text[], %(p_team)s::text[], %(p_user)s::text[],
        %(p_assistant)s::boolean[], %(p_message_ts)s::text[], %(p_text)s::text[], %(p_command)s::text[],
        %(p_files)s::text[], %(p_slack_team)s::text[], %(p_enterprise)s::text[]
    ) WITH ORDINALITY AS m(id, channel, thread, team, user_id, assistant, message_ts, text, command, files,
                           slack_team, enterprise, ord)
), found AS (
    SELECT m.ord, s.id, s.status FROM input m JOIN sessions s ON s.channel_id = m.channel AND s.thread_ts = m.thread
), created AS (
    INSERT INTO sessions (id, kind, channel_id, thread_ts, team_id, slack_team_id, enterprise_id, requester,
                          assistant_thread, status, lease_token, event_seq, created_at, updated_at)
    SELECT m.id, '{SessionKind.THREAD.value}', m.channel, m.thread, m.team, m.slack_team, m.enterprise, m.user_id,
           m.assistant,
           '{SessionStatus.QUEUED.value}', 0, 0, %(p_now)s, %(p_now)s
    FROM input m WHERE NOT EXISTS (SELECT FROM found f WHERE f.ord = m.ord)
    ORDER BY m.ord
    RETURNING id
), target AS (
    SELECT ord, id FROM found UNION ALL SELECT m.ord, m.id FROM input m JOIN created c ON c.id = m.id
), kept AS (
    INSERT INTO inbox (session_id, message_ts, user_id, text, command, files, created_at)
    SELECT t.id, m.message_ts, m.user_id, m.text, m.command, m.files::json, %(p_now)s
    FROM target t JOIN input m ON m.ord = t.ord
    ORDER BY t.ord
    ON CONFLICT DO NOTHING
    RETURNING session_id
), idle AS (
    SELECT s.id FROM found f JOIN sessions s ON s.id = f.id
    WHERE s.status = '{SessionStatus.IDLE.value}' AND s.id IN (SELECT session_id FROM kept)
    ORDER BY f.ord
    FOR UPDATE OF s
), queued AS (
    UPDATE sessions SET status = '{SessionStatus.QUEUED.value}', updated_at = %(p_now)s
    WHERE id IN (SELECT id FROM idle)
)
SELECT t.ord, t.id, f.status, t.id IN (SELECT session_id FROM kept)
FROM target t LEFT JOIN found f ON f.ord = t.ord
ORDER BY t.ord
"""
# The parameters of a message (chatops.inbox.message_values) that are columns of PG_RECORD's input.
_COLUMNS = (
    "p_channel",
    "p_thread",
    "p_team",
    "p_user",
    "p_assistant",
    "p_message_ts",
    "p_text",
    "p_command",
    "p_files",
    "p_slack_team",
    "p_enterprise",
)


def rounds(messages: list[dict[str, Any]]) -> list[list[int]]:
    """The messages' indexes in statements of distinct threads, each in the order given: a thread's n-th
    message in the n-th statement."""
    parts: list[list[int]] = []
    seen: dict[tuple[Any, Any], int] = {}
    for i, values in enumerate(messages):
        key = (values["p_channel"], values["p_thread"])
        n = seen[key] = seen.get(key, -1) + 1
        if n == len(parts):
            parts.append([])
        parts[n].append(i)
    return parts


PG_SESSION = "SELECT id FROM sessions WHERE channel_id = %s AND thread_ts = %s"
# The pool's statements find their rows by unique key, and psycopg prepares them on the server, which keeps one
# plan for the connection's life (until the next ANALYZE). A plan made while `sessions` was nearly empty (a new
# install, the minute before autovacuum's first analyze) scans the whole table for each message, at a cost that
# grows with every session (measured: 1.0 ms of the server's CPU a message at 900 sessions, 1.9 ms at 6,300).
# Without sequential scans the plan is the index lookup whatever the table held when it was made.
PG_PLANNER = "-c enable_seqscan=off"
# Connections kept: the writers' and the reads'; a batch that finds none free waits `wait_s` at most.
PG_POOL = 6


class PgInbox:
    """The inbox on PostgreSQL through psycopg's async connections, a small pool of its own."""

    def __init__(self, url: str, wait_s: float) -> None:
        parsed = make_url(db.normalize_url(url))
        self._conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        options = db.pg_connect_args(wait_s)
        self._options = options | {"options": f"{options['options']} {PG_PLANNER}"}
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
            if self._slots.locked():  # else taken at once: wait_for would make a task of it, and cost a turn
                await asyncio.wait_for(self._slots.acquire(), self._wait_s)
            else:
                await self._slots.acquire()
        except TimeoutError:
            raise _translated(psycopg.OperationalError("no connection of the inbox's pool came free")) from None
        conn = None
        try:
            while conn is None and self._idle:
                conn = self._idle.pop()
                if _ended_while_idle(conn):
                    await _drop(conn)
                    conn = None
            if conn is None:
                conn = await _connect(self._conninfo, self._options)
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

    async def keep(self, messages: list[dict[str, Any]], committing: Callable[[], bool]) -> list[Recorded] | None:
        import psycopg

        try:
            async with self._connection() as conn:
                return await _keep(conn, messages, committing)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                await self._forget_idle()
            raise _translated(exc) from exc
        except CommitUnknown:
            await self._forget_idle()
            raise

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None:
        import psycopg

        try:
            async with self._connection() as conn:
                cur = await conn.execute(PG_SESSION, (channel_id, thread_ts))
                found = await cur.fetchone()
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


def _parameters(messages: list[dict[str, Any]], part: list[int], now: Any) -> dict[str, Any]:
    """PG_RECORD's parameters for the messages of `part`: a column each, an element a message."""
    columns: dict[str, Any] = {name: [messages[i][name] for i in part] for name in _COLUMNS}
    columns["p_id"] = [new_id() for _ in part]
    columns["p_command"] = [c.value if c is not None else None for c in columns["p_command"]]
    columns["p_files"] = [json.dumps(f) if f is not None else None for f in columns["p_files"]]
    return columns | {"p_now": now}


async def _keep(conn: Any, messages: list[dict[str, Any]], committing: Callable[[], bool]) -> list[Recorded] | None:
    """PgInbox.keep on one connection (autocommit): one statement, its own transaction, when the messages are of
    distinct threads; else a transaction of one statement a round (rounds). Whatever can fail on our side
    (a message's parameters, reading the answer) is done before the point of no return, or, for the statement
    that commits itself, is CommitUnknown after it."""
    import psycopg

    now = utcnow()
    parts = rounds(messages)
    if len(parts) == 1:
        parameters = _parameters(messages, parts[0], now)
        if not committing():
            return None
        try:
            cursor = await conn.execute(PG_RECORD, parameters)
            rows = await cursor.fetchall()
        except psycopg.Error as exc:
            # The server's own refusal (a constraint, a timeout) ended the statement and its transaction; a
            # connection lost on the way leaves its commit unknown.
            if conn.closed:  # psycopg closes a connection it lost (`broken`)
                raise CommitUnknown("the database failed while the record committed itself") from exc
            raise
        try:
            return _recorded(messages, [(parts[0], rows)])
        except Exception as exc:  # committed, and its answer unreadable (a bug): said as unknown
            raise CommitUnknown("the record committed itself and its answer could not be read") from exc
    await conn.execute("BEGIN")
    answers = []
    for part in parts:
        cursor = await conn.execute(PG_RECORD, _parameters(messages, part, now))
        answers.append((part, await cursor.fetchall()))
    recorded = _recorded(messages, answers)
    if not committing():
        await conn.execute("ROLLBACK")
        return None
    try:
        await conn.execute("COMMIT")
    except psycopg.Error as exc:
        raise CommitUnknown("the database failed while committing") from exc
    return recorded


def _recorded(messages: list[dict[str, Any]], answers: list[tuple[list[int], list[Any]]]) -> list[Recorded]:
    """Each message's Recorded from PG_RECORD's rows (ord, session, its status before, new) of each round."""
    recorded: list[Recorded | None] = [None] * len(messages)
    for part, rows in answers:
        for ord_, session_id, status, new in rows:
            recorded[part[ord_ - 1]] = Recorded(session_id, new=new, busy=new and _busy(status))
    if any(r is None for r in recorded):  # every message has its session: a statement that did not say is a bug
        raise RuntimeError("the inbox's statement left a message without its session")
    return cast(list[Recorded], recorded)


def _ended_while_idle(conn: Any) -> bool:
    """Whether the server said something to an idle connection of the pool: it only does when it ends it (a
    restart, a failover, a terminated backend: its notice, or the connection's end, waits to be read). Such a
    connection is not taken: a batch's statement, which commits itself, would fail on it with its outcome
    unknown, where a new connection keeps it."""
    if conn.closed:
        return True
    try:
        # poll, not select: a busy bot's sockets pass select's limit of 1,024 descriptors.
        waiting = select.poll()
        waiting.register(conn.fileno(), select.POLLIN)
        return bool(waiting.poll(0))
    except (OSError, ValueError):
        return True


async def _connect(conninfo: str, options: dict[str, Any]) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **options)


async def _drop(conn: Any) -> None:
    # A connection given up: its own failure to close changes nothing.
    with contextlib.suppress(Exception):
        await conn.close()


def _translated(exc: Exception) -> StatementError:
    """psycopg's error as SQLAlchemy raises it from the threaded engine (IntegrityError, DataError,
    OperationalError, ...), so that the bot's answers to it are the same (bot.before_ack.silent, bot.app)."""
    import psycopg

    return DBAPIError.instance(PG_RECORD, None, exc, psycopg.Error)
