"""Pytest fixtures for the real services: a PostgreSQL database and a Redis key prefix of this run's own.

Runs never collide: each run creates databases named `mmtest_<pid>_<random>` and drops them at the end, and
uses Redis keys under a prefix of the same shape, deleting only those. An unreachable server is a failure
with the fix in its message, never a skip: a green run must mean the tests ran.

- `pg_url`: a database for the whole run (SQLAlchemy URL, psycopg 3 driver), empty: call
  `chatops.db.migrate(pg_url)` first if you need the schema (it is idempotent and safe concurrently).
- `fresh_pg_url`: a new empty database for one test (for migrations that go up and down).
- `redis_url` and `redis_prefix`: the server and this run's key prefix.
- `sqlite_url`: an SQLite file in the test's tmp_path.
- `own_redis`: a Redis server of the test's own (mm_testkit.redis_server), to flush, stop and start again.
- `engine`: a migrated engine for the test module, parametrized over SQLite and PostgreSQL.

`MM_TEST_POSTGRES_URL` and `MM_TEST_REDIS_URL` point them at other servers (loopback defaults).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from mm_testkit.redis_server import OwnRedis

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _run_tag() -> str:
    return f"mmtest_{os.getpid()}_{secrets.token_hex(4)}"


def _admin_url() -> str:
    return os.environ.get("MM_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL


def _admin() -> psycopg.Connection:
    url = _admin_url()
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.fail(
            f"PostgreSQL is not reachable at {url}: {e}\n"
            "Start it (`.ci/run` starts the local server), or set MM_TEST_POSTGRES_URL.",
            pytrace=False,
        )


def _database_url(name: str) -> str:
    return (
        make_url(_admin_url()).set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    )


@pytest.fixture(scope="session")
def pg_database_factory() -> Iterator[Callable[[], str]]:
    """Makes empty databases on demand; every one is dropped when the run ends."""
    created: list[str] = []

    def make() -> str:
        name = _run_tag()
        with _admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        created.append(name)
        return _database_url(name)

    yield make
    if created:
        with _admin() as conn:
            for name in created:
                # FORCE: a pooled connection some test left open must not keep the database alive.
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_url(pg_database_factory: Callable[[], str]) -> str:
    return pg_database_factory()


@pytest.fixture
def fresh_pg_url(pg_database_factory: Callable[[], str]) -> str:
    return pg_database_factory()


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("MM_TEST_REDIS_URL") or DEFAULT_REDIS_URL
    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as e:
        pytest.fail(
            f"Redis is not reachable at {url}: {e}\n"
            "Start it (`.ci/run` starts the local server), or set MM_TEST_REDIS_URL.",
            pytrace=False,
        )
    finally:
        client.close()
    return url


@pytest.fixture(scope="session")
def redis_prefix(redis_url: str) -> Iterator[str]:
    """Prefix every key with this; at the end of the run only these keys are deleted."""
    prefix = f"{_run_tag()}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A migrated engine of the module's own, once on SQLite and once on PostgreSQL (`pg_url`): the store's
    code runs on both."""
    from chatops import db

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'mm.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_url")
    db.migrate(url)
    engine = db.engine_for(url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def own_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A migrated engine of the test's own database, on SQLite and on PostgreSQL (`fresh_pg_url`): for a test
    of a statement that reaches every row (housekeeping's), which must not touch another test's."""
    from chatops import db

    url = (
        f"sqlite:///{tmp_path / 'own.sqlite3'}"
        if request.param == "sqlite"
        else request.getfixturevalue("fresh_pg_url")
    )
    db.migrate(url)
    engine = db.engine_for(url)
    yield engine
    engine.dispose()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mm.sqlite3'}"
