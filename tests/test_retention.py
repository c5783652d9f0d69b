"""Retention and purge (chatops/retention.py, workers/retention.py), on SQLite and PostgreSQL: a thread idle longer
than `retention.days` loses its log, messages, tool outputs, previews and workspace and keeps the audit of its
calls; purging again changes nothing and says so; a busy thread is left alone; a worker stalled past its lease
cannot write into a purged log. Time is given, never slept."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from audit_support import (
    T0,
    add_approval,
    add_call,
    add_log,
    add_message,
    add_thread,
    add_usage,
    new_channel,
    two_person_call,
)
from chatops.audit import AuditFilter, calls
from chatops.config import load_config
from chatops.retention import PurgeOutcome, idle_sessions, purge_idle, purge_session
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
from chatops.store import DbStore, acquire_lease
from mm_core.log import Fenced, UserMessage
from workers.retention import housekeep_retention, remove_purged_workspaces
from workers.workspaces import META, workspace_path

DAYS = 30
LATER = T0 + timedelta(days=DAYS, hours=1)  # "now", a little more than DAYS after the threads' last activity
_epochs = itertools.count(1)


def epoch() -> datetime:
    """A time of this test's own, before every other test's: retention's round takes the oldest idle sessions of
    the whole database (which the module's tests share), so a test that runs it makes its threads older than
    all the others, and its "now" DAYS after them comes before any other test's threads."""
    return T0 - timedelta(days=3650 * next(_epochs))


def count(engine: Engine, table: type, session_id: str) -> int:
    with engine.connect() as conn:
        column = table.session_id  # type: ignore[attr-defined]
        return conn.execute(select(func.count()).select_from(table).where(column == session_id)).scalar_one()


def session_row(engine: Engine, session_id: str):
    with engine.connect() as conn:
        return conn.execute(select(Session.__table__).where(Session.id == session_id)).one()


def make_workspace(root: Path, session_id: str) -> Path:
    path = workspace_path(root, session_id)
    (path / "src").mkdir(parents=True)
    (path / "src" / "notes.txt").write_text("what the thread wrote")
    (root / META).mkdir(exist_ok=True)
    (root / META / f"{session_id}.json").write_text(json.dumps({"repo": None}))
    return path


def test_retention_purges_an_old_thread_and_keeps_its_audit_summary(engine: Engine) -> None:
    channel, idle_since = new_channel(), epoch()
    now = idle_since + timedelta(days=DAYS, hours=1)
    old, call_id = two_person_call(engine, channel, updated_at=idle_since)
    add_usage(engine, old, channel)
    recent = add_thread(engine, channel, updated_at=now - timedelta(days=1))
    add_log(engine, recent)
    add_call(engine, recent)
    before = [c for c in calls(engine, AuditFilter(channel=channel)) if c.session_id == old]

    purged = purge_idle(engine, DAYS, now=now)

    assert old in [p.session_id for p in purged] and recent not in [p.session_id for p in purged]
    # Gone: the conversation, the messages, the tool's output, what the approver was shown.
    assert count(engine, SessionEvent, old) == 0 and count(engine, InboxMessage, old) == 0
    with engine.connect() as conn:
        output, arguments = conn.execute(
            select(ToolCall.output, ToolCall.arguments).where(ToolCall.call_id == call_id)
        ).one()
        preview, title = conn.execute(select(Approval.preview, Approval.title).where(Approval.call_id == call_id)).one()
    assert output is None and preview is None
    # Kept: the call, its approval, both decisions, the model's usage, and the audit reads them as before.
    assert arguments == '{"command": "make deploy"}' and title == "🛠️ bash: make deploy"
    assert count(engine, ApprovalDecision, old) == 2 and count(engine, ModelUsage, old) == 1
    after = [c for c in calls(engine, AuditFilter(channel=channel)) if c.session_id == old]
    assert [(c.call_id, c.requested_by, c.rule, c.decisions, c.outcome) for c in after] == [
        (c.call_id, c.requested_by, c.rule, c.decisions, c.outcome) for c in before
    ]
    assert after[0].purged_at == now and after[0].purged_by is None
    row = session_row(engine, old)
    assert row.event_seq == 0 and row.purged_at == now and row.updated_at == idle_since  # a purge is no activity
    why = "retention: idle for more than 30 days"
    assert row.agent_config["purged"] == {"at": now.isoformat(), "by": None, "why": why}
    # The other thread, used yesterday, is as it was.
    assert count(engine, SessionEvent, recent) == 3 and session_row(engine, recent).purged_at is None


def test_purging_twice_is_fine_and_says_so(engine: Engine) -> None:
    session_id, _ = two_person_call(engine, new_channel())
    first = purge_session(engine, session_id, by="U0ADMIN", why="/mm purge", now=LATER)
    second = purge_session(engine, session_id, by="U0ADMIN", why="/mm purge", now=LATER + timedelta(hours=1))
    assert first is not None and first.outcome == PurgeOutcome.PURGED
    assert (first.events, first.messages, first.outputs, first.calls) == (3, 1, 1, 1)
    assert second is not None and second.outcome == PurgeOutcome.ALREADY and second.purged_at == LATER
    assert session_id not in idle_sessions(engine, DAYS, LATER + timedelta(days=365))  # nothing left for retention
    assert session_row(engine, session_id).agent_config["purged"]["by"] == "U0ADMIN"
    assert purge_session(engine, "no-such-session", by=None, why="x") is None


@pytest.mark.parametrize(
    "state, why",
    [
        ("running", "it is running a turn"),
        ("queued", "a turn is about to start"),
        ("pending", "a call waits for a decision"),
        ("leased", "a worker holds it"),
        ("stopping", "a stop is being carried out"),
        ("message", "messages wait for its next turn"),
    ],
)
def test_a_busy_thread_is_neither_purged_nor_changed(engine: Engine, state: str, why: str) -> None:
    status = {"running": SessionStatus.RUNNING, "queued": SessionStatus.QUEUED}.get(state, SessionStatus.IDLE)
    session_id = add_thread(engine, new_channel(), status=status)
    add_log(engine, session_id)
    call_id = add_call(engine, session_id)
    if state == "pending":
        add_approval(engine, session_id, call_id, state="pending")
    if state == "leased":
        assert acquire_lease(engine, session_id, "w1", ttl_s=3600, now=LATER) is not None
    if state == "stopping":
        with engine.begin() as conn:
            conn.execute(update(Session).where(Session.id == session_id).values(stop_requested_at=T0))
    if state == "message":
        add_message(engine, session_id, taken=False)

    assert session_id not in idle_sessions(engine, DAYS, LATER)
    done = purge_session(engine, session_id, by="U0ADMIN", why="/mm purge", now=LATER)
    assert done is not None and (done.outcome, done.busy) == (PurgeOutcome.BUSY, why)
    assert count(engine, SessionEvent, session_id) == 3 and session_row(engine, session_id).purged_at is None


def test_a_purged_thread_that_started_afresh_is_purged_again_once_idle(engine: Engine) -> None:
    session_id, _ = two_person_call(engine, new_channel())
    assert purge_session(engine, session_id, by=None, why="test", now=LATER) is not None
    add_log(engine, session_id, 2)  # a new message, a new turn
    add_message(engine, session_id)
    with engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == session_id).values(updated_at=LATER))
    assert session_id not in idle_sessions(engine, DAYS, LATER + timedelta(days=DAYS - 1))
    assert session_id in idle_sessions(engine, DAYS, LATER + timedelta(days=DAYS + 1))
    again = purge_session(engine, session_id, by=None, why="test", now=LATER + timedelta(days=DAYS + 1))
    assert again is not None and (again.outcome, again.events, again.messages) == (PurgeOutcome.PURGED, 2, 1)


def test_a_worker_stalled_past_its_lease_cannot_write_into_a_purged_log(engine: Engine) -> None:
    session_id = add_thread(engine, new_channel())
    add_log(engine, session_id)
    token = acquire_lease(engine, session_id, "stalled", ttl_s=1, now=T0)
    assert token is not None
    assert purge_session(engine, session_id, by=None, why="test", now=LATER) is not None  # the lease has expired
    with pytest.raises(Fenced):
        asyncio.run(DbStore(engine, lease_token=token).append(session_id, UserMessage("late", "U0ALICE")))
    assert count(engine, SessionEvent, session_id) == 0


def test_the_secrets_the_purger_knows_leave_what_is_kept(engine: Engine) -> None:
    session_id = add_thread(engine, new_channel())
    call_id = add_call(engine, session_id, arguments=json.dumps({"command": "echo xoxb-secret-1234 > .env"}))
    add_approval(engine, session_id, call_id, matched="xoxb-secret-1234")
    purge_session(engine, session_id, by=None, why="test", secrets=["xoxb-secret-1234"], now=LATER)
    with engine.connect() as conn:
        (arguments,) = conn.execute(select(ToolCall.arguments).where(ToolCall.call_id == call_id)).one()
        (matched,) = conn.execute(select(Approval.matched).where(Approval.call_id == call_id)).one()
    assert json.loads(arguments or "") == {"command": "echo *** > .env"} and matched == "***"


def test_the_workspace_of_a_purged_thread_goes_and_one_that_started_afresh_keeps_its_own(
    engine: Engine, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    old, _ = two_person_call(engine, new_channel())
    restarted, _ = two_person_call(engine, new_channel())
    kept, _ = two_person_call(engine, new_channel())
    busy, _ = two_person_call(engine, new_channel())
    for session_id in (old, restarted, busy):
        assert purge_session(engine, session_id, by=None, why="test", now=LATER) is not None
    add_log(engine, restarted, 2)  # a message came, and its first turn is in the log: the workspace is its own
    add_message(engine, busy, taken=False)  # a message waits: its turn removes the old files itself
    stale, fresh, unpurged, waiting = (make_workspace(root, s) for s in (old, restarted, kept, busy))

    assert remove_purged_workspaces(engine, root) == [old]
    assert not stale.exists() and not (root / META / f"{old}.json").exists()
    assert fresh.exists() and unpurged.exists() and waiting.exists()
    assert remove_purged_workspaces(engine, root) == []  # again: nothing more


def test_housekeeping_purges_only_when_retention_days_are_set(engine: Engine, tmp_path: Path) -> None:
    idle_since = epoch()
    now = idle_since + timedelta(days=DAYS, hours=1)
    session_id, _ = two_person_call(engine, new_channel(), updated_at=idle_since)
    root = tmp_path / "workspaces"
    workspace = make_workspace(root, session_id)
    env = {"DATABASE_URL": str(engine.url), "MM_WORKSPACES": str(root)}
    off = tmp_path / "off.yaml"
    off.write_text("retention: {}\n")
    on = tmp_path / "on.yaml"
    on.write_text(f"retention: {{days: {DAYS}}}\n")

    housekeep_retention(engine, load_config(off, environ=env), secrets=[], now=now)
    assert session_row(engine, session_id).purged_at is None and workspace.exists()
    housekeep_retention(engine, load_config(on, environ=env), secrets=[], now=now)
    assert session_row(engine, session_id).purged_at == now and not workspace.exists()


def test_a_purge_blanks_the_body_of_a_pull_request_the_forge_has(engine: Engine) -> None:
    """A pull request's body quotes the thread: the forge keeps its copy, the record's goes with the thread's; one
    not yet sent keeps it (a sync would otherwise blank the forge's)."""
    from chatops import pull_requests as records

    session_id, _ = two_person_call(engine, new_channel())
    pushed = records.Pushed(
        owner=records.thread_owner(session_id),
        session_id=session_id,
        host="git.example.com",
        repo="acme/app",
        branch="mm/thread-1",
        base="main",
        head_sha="a" * 40,
        title="Fix the greeting",
        body="> make deploy, said the thread",
        draft=True,
        requested_by="U0BOB",
    )
    sent = records.record_push(engine, pushed)
    assert records.record_synced(engine, sent, number=1, url="u", draft=True, head_sha="a" * 40, follow_for=None)
    waiting = records.record_push(engine, replace(pushed, owner="job:x", session_id=session_id))
    purge_session(engine, session_id, by=None, why="test", now=LATER)
    told, untold = records.get(engine, sent), records.get(engine, waiting)
    assert told is not None and told.body == "" and told.title == "Fix the greeting"
    assert untold is not None and untold.body == "> make deploy, said the thread"
