"""Migrations go up and down on SQLite and PostgreSQL, agree with the models, and survive two replicas."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import CheckConstraint, Column, Integer, MetaData, insert, inspect, select

from chatops import db
from chatops.schema import Base, InboxMessage, Session, SessionEvent

TABLES = {
    *("sessions", "session_events", "inbox", "tool_calls", "approvals", "errors", "slack_events"),
    *("job_runs", "job_states", "scheduler_leases", "slack_requests", "assistant_contexts"),
    *("approval_decisions", "model_usage", "pull_requests"),
    *("slack_installations", "slack_bots", "slack_oauth_states"),
}
HEAD = "0011"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "fresh_pg_url")


def _tables(url: str) -> set[str]:
    engine = db.engine_for(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _diff(url: str, metadata: MetaData) -> list:
    engine = db.engine_for(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "target_metadata": metadata})
            return compare_metadata(context, metadata)
    finally:
        engine.dispose()


def test_upgrade_to_head_then_downgrade_to_base(url: str) -> None:
    assert db.current_revision(url) is None
    db.migrate(url)
    assert db.current_revision(url) == db.head_revision() == HEAD
    assert _tables(url) == TABLES | {"alembic_version"}

    db.migrate(url)  # again: nothing to do, no error
    assert db.current_revision(url) == HEAD

    db.downgrade(url, "base")
    assert db.current_revision(url) is None
    assert _tables(url) == {"alembic_version"}

    db.migrate(url)  # and back up: the downgrade left nothing behind that would collide
    assert _tables(url) == TABLES | {"alembic_version"}


def test_models_and_migrations_agree(url: str) -> None:
    db.migrate(url)
    assert _diff(url, Base.metadata) == []


def test_drift_is_detected(sqlite_url: str) -> None:
    """The agreement test above would catch a model changed without a migration: prove the check can fail."""
    db.migrate(sqlite_url)
    drifted = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        copy = table.to_metadata(drifted)
        if table.name == "errors":
            copy.append_column(Column("severity", Integer, nullable=True))
    diff = _diff(sqlite_url, drifted)
    assert [(d[0], d[2], d[3].name) for d in diff if d[0] == "add_column"] == [("add_column", "errors", "severity")]
    assert len(diff) == 1


def test_url_spellings_use_psycopg3() -> None:
    assert db.normalize_url("postgresql://u:p%40ss@h/d") == "postgresql+psycopg://u:p%40ss@h/d"
    assert db.normalize_url("postgres://h/d") == "postgresql+psycopg://h/d"
    assert db.normalize_url("sqlite:///x.db") == "sqlite:///x.db"


def test_sqlite_directory_is_created_on_connect(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'var' / 'nested' / 'mm.sqlite3'}"
    db.migrate(url)
    assert (tmp_path / "var" / "nested" / "mm.sqlite3").is_file()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_replicas_migrating_at_once(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "fresh_pg_url")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            barrier.wait()
            db.migrate(url)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert db.current_revision(url) == HEAD
    engine = db.engine_for(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").all() == [(HEAD,)]
    finally:
        engine.dispose()
    assert _diff(url, Base.metadata) == []


def _model_checks(metadata: MetaData) -> set[tuple[str, str, str]]:
    return {
        (table.name, str(c.name), str(c.sqltext))
        for table in metadata.sorted_tables
        for c in table.constraints
        if isinstance(c, CheckConstraint)
    }


def _database_checks(url: str) -> set[tuple[str, str, str]]:
    engine = db.engine_for(url)
    try:
        inspector = inspect(engine)
        return {
            (table, str(c["name"]), c["sqltext"])
            for table in inspector.get_table_names()
            for c in inspector.get_check_constraints(table)
        }
    finally:
        engine.dispose()


def test_check_constraints_agree_with_the_models(sqlite_url: str) -> None:
    """Alembic's comparison ignores CHECK constraints: a state added to the model without a migration (a
    one-line change, by design) would pass it and fail in production. SQLite keeps the text as written."""
    db.migrate(sqlite_url)
    assert _database_checks(sqlite_url) == _model_checks(Base.metadata)
    # the states of sessions, calls, approvals, job runs (+ trigger), the kinds and states of Slack requests, and
    # the votes of approval decisions
    assert len(_model_checks(Base.metadata)) == 10

    drifted = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        copy = table.to_metadata(drifted)
        if table.name == "sessions":
            for c in list(copy.constraints):
                if isinstance(c, CheckConstraint) and str(c.name).endswith("status"):
                    copy.constraints.remove(c)
            copy.append_constraint(CheckConstraint("status IN ('idle', 'stopped')", name="status"))
    assert _database_checks(sqlite_url) != _model_checks(drifted)


def test_0005_takes_back_a_yolo_that_approve_all_set(url: str) -> None:
    """Before 0005, "Approve all" set the thread's yolo, opening it to anyone (issue 21): the migration keeps a
    thread's yolo only where `yolo on` set it (its latest `yolo`, waiting in the inbox, else in the log)."""
    db.migrate(url, "0004")  # the tables written below are as 0004 left them
    approve_all = {"kind": "approval", "call_id": "c", "approved": True, "all": True}
    on, off = {"kind": "yolo", "on": True, "by": "U1"}, {"kind": "yolo", "on": False, "by": "U1"}
    logs = {"approved-all": [approve_all], "yolo-on": [on], "on-off-all": [on, off, approve_all], "waiting": [off]}
    engine = db.engine_for(url)
    try:
        with engine.begin() as conn:
            for name, entries in logs.items():
                conn.execute(insert(Session).values(id=name, yolo=True))
                for seq, payload in enumerate(entries):
                    conn.execute(
                        insert(SessionEvent).values(session_id=name, seq=seq, kind=payload["kind"], payload=payload)
                    )
            # `yolo on` said, not yet taken by a turn: it is the latest.
            conn.execute(insert(InboxMessage).values(session_id="waiting", message_ts="1.1", text="on", command="yolo"))
        db.migrate(url)
        with engine.connect() as conn:
            found = dict(conn.execute(select(Session.id, Session.yolo)).all())
        assert found == {"approved-all": None, "yolo-on": True, "on-off-all": None, "waiting": True}
    finally:
        engine.dispose()
