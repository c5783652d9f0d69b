"""Pins for the database store (mutation pass, issue 8): a released lease stays given up, the exact instant a
lease or an approval expires belongs to the side of "expired", the tool_calls projection shows a running call,
and a session that cannot be created is an error. On SQLite and PostgreSQL, with the kit's engine and
test_store.py's session."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, select

import test_store
from chatops import store
from chatops.schema import Session, ToolCall, utcnow
from mm_core.log import AssistantMessage, Decision, ToolCallRequest, ToolResult, ToolStarted

# test_store.py's session fixture, shared rather than copied (the migrated databases of each kind are the
# test kit's `engine`).
session_id = test_store.session_id

TICK = timedelta(microseconds=1)  # the stores keep microseconds: the smallest step before an instant


def _lease(engine: Engine, session_id: str) -> tuple[str | None, datetime | None]:
    with engine.connect() as conn:
        row = conn.execute(select(Session.lease_owner, Session.lease_expires_at).where(Session.id == session_id)).one()
    return row.lease_owner, row.lease_expires_at


def test_a_released_lease_cannot_be_renewed(engine: Engine, session_id: str) -> None:
    """A worker that gave the session up and renews out of habit must not hold it again (with no owner, the
    next worker would otherwise race a lease that looks free)."""
    token = store.acquire_lease(engine, session_id, "worker-a", ttl_s=30)
    assert token is not None
    assert store.release_lease(engine, session_id, token)
    assert not store.renew_lease(engine, session_id, token, ttl_s=30)
    assert _lease(engine, session_id) == (None, None)


def test_an_expired_lease_nobody_took_can_still_be_renewed(engine: Engine, session_id: str) -> None:
    """A worker that stalled past its lease keeps the session when no one took it over."""
    t0 = utcnow()
    token = store.acquire_lease(engine, session_id, "worker-a", ttl_s=30, now=t0)
    assert token is not None
    assert store.renew_lease(engine, session_id, token, ttl_s=30, now=t0 + timedelta(seconds=45))
    assert _lease(engine, session_id) == ("worker-a", t0 + timedelta(seconds=75))
    assert not store.renew_lease(engine, session_id, token + 1, ttl_s=30, now=t0)  # a token it never had


def test_a_lease_can_be_taken_over_at_exactly_its_expiry(engine: Engine, session_id: str) -> None:
    """At expires_at the lease is over: another worker takes the session then, and not one tick before."""
    t0 = utcnow()
    token = store.acquire_lease(engine, session_id, "worker-a", ttl_s=30, now=t0)
    assert token is not None
    expiry = t0 + timedelta(seconds=30)
    assert store.acquire_lease(engine, session_id, "worker-b", ttl_s=30, now=expiry - TICK) is None
    assert store.acquire_lease(engine, session_id, "worker-b", ttl_s=30, now=expiry) == token + 1
    assert _lease(engine, session_id) == ("worker-b", expiry + timedelta(seconds=30))


def test_a_release_with_a_superseded_token_leaves_the_new_owner_alone(engine: Engine, session_id: str) -> None:
    """A fenced worker letting go must not free the session its successor holds."""
    t0 = utcnow()
    old = store.acquire_lease(engine, session_id, "worker-a", ttl_s=30, now=t0)
    new = store.acquire_lease(engine, session_id, "worker-b", ttl_s=30, now=t0 + timedelta(seconds=31))
    assert old is not None and new == old + 1
    assert not store.release_lease(engine, session_id, old)
    assert _lease(engine, session_id)[0] == "worker-b"


def _approval(engine: Engine, session_id: str, timeout_s: float) -> tuple[str, datetime]:
    call_id = f"call-{uuid.uuid4()}"
    t0 = utcnow()
    store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash", timeout_s=timeout_s, now=t0)
    return call_id, t0 + timedelta(seconds=timeout_s)


def test_an_approval_cannot_be_decided_at_exactly_its_expiry(engine: Engine, session_id: str) -> None:
    """A click at expires_at is too late (the thread is told the approval expired); one tick before wins."""
    late, expiry = _approval(engine, session_id, 60)
    assert not store.decide_approval(engine, late, True, "U02BOB", now=expiry)
    in_time, expiry = _approval(engine, session_id, 60)
    assert store.decide_approval(engine, in_time, True, "U02BOB", now=expiry - TICK)
    decided = store.get_approval(engine, in_time)
    assert decided is not None and (decided.state, decided.decided_by) == ("approved", "U02BOB")


def test_an_approval_expires_at_exactly_its_expiry(engine: Engine, session_id: str) -> None:
    """The housekeeping sweep at expires_at expires it (and tells the thread); one tick before, it waits."""
    call_id, expiry = _approval(engine, session_id, 60)

    def expired_now(now: datetime) -> list[str]:
        rows = store.expire_approvals(engine, now=now)
        return [a.call_id for a in rows if a.session_id == session_id]

    assert expired_now(expiry - TICK) == []
    assert expired_now(expiry) == [call_id]
    found = store.get_approval(engine, call_id)
    assert found is not None and (found.state, found.decided_at) == ("expired", expiry)


def test_an_approval_without_a_timeout_never_expires(engine: Engine, session_id: str) -> None:
    """No timeout: the sweep leaves it pending and a rejection a year later still counts, as a rejection."""
    call_id = f"call-{uuid.uuid4()}"
    store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash")
    year = utcnow() + timedelta(days=365)
    assert call_id not in [a.call_id for a in store.expire_approvals(engine, now=year)]
    assert store.decide_approval(engine, call_id, False, "U02BOB", now=year)
    found = store.get_approval(engine, call_id)
    assert found is not None and (found.state, found.decided_by, found.decided_at) == ("rejected", "U02BOB", year)


def _call_row(engine: Engine, session_id: str, call_id: str) -> tuple[str, str, str | None]:
    with engine.connect() as conn:
        row = conn.execute(
            select(ToolCall.tool, ToolCall.status, ToolCall.decision).where(
                ToolCall.session_id == session_id, ToolCall.call_id == call_id
            )
        ).one()
    return row.tool, row.status, row.decision


def test_the_tool_calls_table_shows_a_running_call_as_running(engine: Engine, session_id: str) -> None:
    """Operators listing tool_calls see a call requested, then running (auto-approved in yolo), then ok."""
    log = store.DbStore(engine)
    asyncio.run(log.append(session_id, AssistantMessage("", (ToolCallRequest("c1", "bash", "{}"),))))
    assert _call_row(engine, session_id, "c1") == ("bash", "requested", None)
    asyncio.run(log.append(session_id, ToolStarted("c1", "bash")))
    assert _call_row(engine, session_id, "c1") == ("bash", "running", "auto")
    asyncio.run(log.append(session_id, ToolResult("c1", "bash", "done")))
    assert _call_row(engine, session_id, "c1") == ("bash", "ok", "auto")


def test_a_decision_before_its_call_is_listed_with_no_tool_name_yet(engine: Engine, session_id: str) -> None:
    """A decision projected before its call (an asked agent's call) makes a row with an empty tool name, which
    the call fills in when it arrives."""
    log = store.DbStore(engine)
    asyncio.run(log.append(session_id, Decision("n1", approved=True, by="U03CAROL")))
    assert _call_row(engine, session_id, "n1") == ("", "requested", "approved")
    asyncio.run(log.append(session_id, ToolStarted("n1", "bash")))
    assert _call_row(engine, session_id, "n1") == ("bash", "running", "approved")


def test_a_session_that_cannot_be_created_is_an_error(engine: Engine, session_id: str) -> None:
    """When the insert keeps failing (here: an id already taken), the caller gets an error, never None as a
    session id to write under."""
    with pytest.raises(RuntimeError, match="could not create the session of C0123ABCD/None"):
        store.ensure_session(engine, channel_id="C0123ABCD", thread_ts=None, id=session_id)
