"""Engines and migrations.

`migrate()` is safe to run from every replica at start-up: on PostgreSQL the upgrade runs under an advisory
lock held by the migration connection, on SQLite inside one `BEGIN IMMEDIATE` transaction (the database's
write lock); the second replica waits, then finds the schema at head and does nothing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from chatops.errors import ChatopsError
from chatops.secrets import describe_error, mask_url, scrub

# The `migrations` package sits beside `chatops`, in a checkout and in an installed wheel alike; found by path,
# so that it works before (and without) `migrations` being importable from the current directory.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"

# Any constant will do, as long as every replica uses the same one: "mm-bot" in ASCII.
MIGRATION_LOCK_KEY = 0x6D6D2D626F74
SQLITE_BUSY_TIMEOUT_S = 30.0
# A PostgreSQL transaction that waits this long for its client's next statement belongs to a process that
# stalled (stopped, swapped out, wedged) between two statements: the server ends its session, so that the row
# locks it holds do not keep the others waiting — a replica taking over a stalled bot's request would otherwise
# wait on its claim's row for as long as the stall lasts. Every transaction here is a few statements back to
# back, never a call to Slack or the model between them; the busiest process's pauses are a thousandth of this.
STALLED_S = 10.0


class DatabaseUnavailable(ChatopsError):
    """The database cannot be opened or reached: a bad URL, a server that does not answer, a file that
    cannot be created. str() names it (password masked), says why and what to do; `reason` is the why."""

    def __init__(self, url: str, error: BaseException):
        try:
            password = make_url(url).password
        except ArgumentError:
            password = None
        self.reason = scrub(describe_error(error), [str(password)] if password else [])
        super().__init__(
            f"cannot use the database {mask_url(url)}: {self.reason} — start it, or set DATABASE_URL to one that works"
        )


@contextmanager
def connect(url: str, **kwargs: Any) -> Iterator[Connection]:
    """A connection on a private engine, disposed of afterwards; DatabaseUnavailable if none can be made."""
    engine = engine_for(url, **kwargs)
    try:
        conn = engine.connect()
    except OperationalError as exc:
        engine.dispose()
        raise DatabaseUnavailable(url, exc) from exc
    try:
        with conn:
            yield conn
    finally:
        engine.dispose()


@contextmanager
def transaction(bind: Engine | Connection) -> Iterator[Connection]:
    """A transaction: the engine's own (committed on leaving), or the caller's when given its connection, so that
    a change and what the caller keeps of it commit together."""
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.begin() as conn:
        yield conn


@contextmanager
def reading(bind: Engine | Connection) -> Iterator[Connection]:
    """A connection to read on: the engine's own (returned on leaving), or the caller's, inside its transaction."""
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.connect() as conn:
        yield conn


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 here (the driver installed), not psycopg2."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def engine_for(url: str, *, foreign_keys: bool = True, wait_s: float | None = None, **kwargs: Any) -> Engine:
    """An engine for the service's database; make one per process and share it.

    On SQLite: the file's directory is created, foreign keys are enforced, and every transaction starts with
    BEGIN IMMEDIATE, so writers queue on the busy timeout instead of failing when a read turns into a write.
    DatabaseUnavailable when it can never work: a URL that does not parse, a driver that is not installed, an
    SQLite directory that cannot be created. A server that is down is only found on connecting.

    `wait_s`: how long one step may wait — connecting (PostgreSQL counts in whole seconds, two at least), a
    connection from the pool, a statement or a lock on PostgreSQL (the server ends it), a lock on SQLite — for
    work that must answer in time (the bot's, before it acks Slack). None: the defaults, which wait long.
    """
    try:
        engine = _engine_for(url, foreign_keys, wait_s, **kwargs)
    except (ArgumentError, OSError, ImportError) as exc:
        raise DatabaseUnavailable(url, exc) from exc
    assert isinstance(engine, Engine)
    return engine


def async_engine_for(url: str, *, wait_s: float | None = None, **kwargs: Any) -> AsyncEngine:
    """engine_for's twin on asyncio, for work that runs on the event loop itself (the bot's record before its
    ack): psycopg's async driver on PostgreSQL, aiosqlite on SQLite; the same settings, `wait_s` included.
    Make one per process (its pool belongs to the event loop that first uses it)."""
    try:
        parsed = make_url(normalize_url(url))
        if parsed.get_backend_name() == "sqlite":
            parsed = parsed.set(drivername="sqlite+aiosqlite")
        # postgresql+psycopg stays: create_async_engine takes psycopg's async connection for it.
        async_url = parsed.render_as_string(hide_password=False)
        engine = _engine_for(async_url, True, wait_s, create=create_async_engine, **kwargs)
    except (ArgumentError, OSError, ImportError) as exc:
        raise DatabaseUnavailable(url, exc) from exc
    assert isinstance(engine, AsyncEngine)
    return engine


def pg_connect_args(wait_s: float | None = None) -> dict[str, Any]:
    """libpq's arguments for every connection of ours to PostgreSQL: a stalled transaction is ended (STALLED_S);
    with `wait_s` (see engine_for), connecting, each statement and each lock wait are bounded by it too."""
    options = f"-c idle_in_transaction_session_timeout={round(STALLED_S * 1000)}"
    if wait_s is None:
        return {"options": options}
    ms = max(1, round(wait_s * 1000))
    return {
        "connect_timeout": max(2, round(wait_s)),
        "options": f"{options} -c statement_timeout={ms} -c lock_timeout={ms}",
    }


def _engine_for(
    url: str, foreign_keys: bool, wait_s: float | None, create: Any = create_engine, **kwargs: Any
) -> Engine | AsyncEngine:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        if wait_s is not None:
            kwargs.setdefault("pool_timeout", wait_s)
        kwargs["connect_args"] = pg_connect_args(wait_s) | kwargs.get("connect_args", {})
        return create(url, pool_pre_ping=True, **kwargs)
    if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    if wait_s is not None:
        kwargs.setdefault("pool_timeout", wait_s)
    busy = SQLITE_BUSY_TIMEOUT_S if wait_s is None else wait_s
    made = create(url, connect_args={"timeout": busy}, **kwargs)
    # An async engine's events are its synchronous core's (SQLAlchemy runs them inside the driver's adapter).
    engine = made.sync_engine if isinstance(made, AsyncEngine) else made

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from pysqlite, so that BEGIN below is ours and DDL is transactional.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        _set_wal(cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return made


def _set_wal(cursor: Any) -> None:
    """Switch a new database file to WAL. The switch needs the file to itself and does not wait on the busy
    timeout, so processes opening a new file at once (bot, worker, replicas migrating) retry it."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def alembic_config(url: str) -> AlembicConfig:
    """Alembic's configuration, built in code: the scripts ship inside the `migrations` package."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would eat a '%' in a password.
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision`."""
    _run(url, lambda cfg: command.upgrade(cfg, revision))


def downgrade(url: str, revision: str) -> None:
    """Downgrade the database at `url` to `revision` (`base` removes every table)."""
    _run(url, lambda cfg: command.downgrade(cfg, revision))


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def known_revision(revision: str) -> bool:
    """Whether this code's migrations know `revision` (a database a newer release migrated has one they do not)."""
    return revision in {
        script.revision for script in ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions()
    }


def current_revision(url: str) -> str | None:
    """The revision the database is at (None: never migrated); `doctor` compares it with head_revision()."""
    with connect(url) as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _run(url: str, action: Any) -> None:
    # Foreign keys off on SQLite: batch mode copies and drops tables, which must not cascade.
    with connect(url, foreign_keys=False) as conn, _migration_lock(conn):
        cfg = alembic_config(url)
        cfg.attributes["connection"] = conn
        # One transaction around everything, begun here: env.py sees it and runs inside it.
        with conn.begin():
            action(cfg)


@contextmanager
def _migration_lock(conn: Connection) -> Iterator[None]:
    if conn.dialect.name != "postgresql":
        # SQLite: the BEGIN IMMEDIATE of the migration's transaction is the lock.
        yield
        return
    conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
    conn.commit()  # a session-level lock outlives this transaction; the migration's own begins next
    try:
        yield
    finally:
        if conn.in_transaction():
            conn.rollback()
        conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
        conn.commit()
