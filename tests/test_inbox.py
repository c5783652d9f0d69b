"""The inbox and the work-finding queries, on SQLite and PostgreSQL: what the bot records, what a turn takes, and
what housekeeping finds."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from chatops import inbox, sessions, store
from chatops.schema import SessionStatus, utcnow
from mm_core.log import Fenced, UserMessage


def thread() -> str:
    return f"{uuid.uuid4().int % 10**10}.000100"


def record(engine: Engine, thread_ts: str, ts: str, text: str, user: str = "U0ALICE") -> inbox.Recorded:
    return inbox.record_message(
        engine, channel_id="C0INBOX", thread_ts=thread_ts, message_ts=ts, user_id=user, text=text
    )


def test_a_message_is_recorded_once_and_queues_an_idle_session(engine: Engine) -> None:
    root = thread()
    first = record(engine, root, root, "fix it")
    assert first.new and not first.busy
    again = record(engine, root, root, "fix it")  # a retry, or the message twin of an app_mention
    assert again == inbox.Recorded(first.session_id, new=False, busy=False)
    assert inbox.session_of(engine, "C0INBOX", root) == first.session_id
    assert sessions.sessions_with_work(engine, now=utcnow() + timedelta(seconds=5)).count(first.session_id) == 1


def test_a_turn_takes_the_untaken_messages_in_order_and_at_most_a_turns_worth(engine: Engine) -> None:
    root = thread()
    session_id = record(engine, root, root, "m0").session_id
    store.set_status(engine, session_id, SessionStatus.RUNNING)
    for i in range(1, store.INBOX_PER_TURN + 5):
        recorded = record(engine, root, f"{root}{i:03d}", f"m{i}", user="U0BOB" if i % 2 else "U0ALICE")
        assert recorded.busy  # the thread is told it is queued
    token = store.acquire_lease(engine, session_id, "w", ttl_s=30)
    log = store.DbStore(engine, lease_token=token)
    first = log.take_inbox(session_id, preface="context\n")
    assert first is not None and first.text.startswith("context\n<@U0ALICE>: m0\n\n<@U0BOB>: m1\n\n")
    assert first.text.count("\n\n<@") == store.INBOX_PER_TURN - 1 and first.author == "U0ALICE,U0BOB"
    second = log.take_inbox(session_id)
    assert second is not None and second.text.startswith(f"<@U0ALICE>: m{store.INBOX_PER_TURN}\n\n")
    assert log.take_inbox(session_id) is None
    assert [e for e in asyncio.run(log.load(session_id)) if isinstance(e, UserMessage)] == [first, second]
    # A worker that lost its lease takes nothing, and leaves the messages for the one that has it.
    record(engine, root, f"{root}999", "late")
    assert store.acquire_lease(engine, session_id, "w2", ttl_s=30, now=utcnow() + timedelta(seconds=60))
    with pytest.raises(Fenced):
        log.take_inbox(session_id)
    assert inbox.has_untaken(engine, session_id)


def test_housekeeping_finds_work_nobody_does_and_leaves_work_somebody_does(engine: Engine) -> None:
    root = thread()
    session_id = record(engine, root, root, "hello").session_id
    later = utcnow() + timedelta(seconds=10)
    assert session_id in sessions.sessions_with_work(engine, quiet_s=5, now=later)
    assert session_id not in sessions.sessions_with_work(engine, quiet_s=60, now=later)  # its hand-off may still come
    token = store.acquire_lease(engine, session_id, "w", ttl_s=30)
    assert token is not None
    assert session_id not in sessions.sessions_with_work(engine, now=later)  # a live lease: somebody does it
    assert session_id in sessions.sessions_with_work(engine, now=utcnow() + timedelta(seconds=31))  # expired
    assert inbox.renew_held(engine, "w", ttl_s=30) >= {session_id}
    assert inbox.release_expired_leases(engine, now=utcnow() + timedelta(seconds=31)) >= 1
    assert not store.renew_lease(engine, session_id, token, ttl_s=30)  # released: nobody holds it


def test_a_stop_is_asked_only_of_a_session_with_a_turn(engine: Engine) -> None:
    root = thread()
    session_id = record(engine, root, root, "hello").session_id
    store.set_status(engine, session_id, SessionStatus.IDLE)
    assert not inbox.request_stop(engine, session_id)
    store.set_status(engine, session_id, SessionStatus.QUEUED)
    assert not inbox.request_stop(engine, session_id)  # nothing runs yet: its messages are not stopped
    store.set_status(engine, session_id, SessionStatus.RUNNING)
    assert store.acquire_lease(engine, session_id, "worker-7", ttl_s=30)
    assert inbox.request_stop(engine, session_id)
    assert inbox.stops_for(engine, "worker-7") == [session_id] and inbox.stop_requested(engine, session_id)
    inbox.clear_stop(engine, session_id)
    assert inbox.stops_for(engine, "worker-7") == []


def test_messages_to_a_session_waiting_for_a_person_wait_with_it(engine: Engine) -> None:
    root = thread()
    session_id = record(engine, root, root, "run it").session_id
    store.set_status(engine, session_id, SessionStatus.AWAITING_APPROVAL)
    store.request_approval(engine, call_id=f"call_{uuid.uuid4().hex}", session_id=session_id, tool="bash")
    record(engine, root, f"{root}1", "and meanwhile?")
    later = utcnow() + timedelta(seconds=5)
    # Nothing to do until somebody decides: no worker is woken for the message, again and again.
    assert session_id not in sessions.sessions_with_work(engine, now=later)
    inbox.expire_pending(engine, session_id)
    assert session_id in sessions.sessions_with_work(engine, now=later, only=session_id)


def test_a_worker_that_lost_the_session_cannot_set_its_status(engine: Engine) -> None:
    root = thread()
    session_id = record(engine, root, root, "hello").session_id
    old = store.acquire_lease(engine, session_id, "w1", ttl_s=30)
    new = store.acquire_lease(engine, session_id, "w2", ttl_s=30, now=utcnow() + timedelta(seconds=31))
    assert old is not None and new is not None
    assert store.set_status(engine, session_id, SessionStatus.RUNNING, lease_token=new)
    assert not store.set_status(engine, session_id, SessionStatus.IDLE, lease_token=old)
    assert inbox.renew_held(engine, "w2", ttl_s=30, held=set()) == set()  # only what the keeper says it holds


def test_a_flood_of_long_messages_becomes_several_bounded_turns(engine: Engine) -> None:
    root = thread()
    session_id = record(engine, root, root, "x" * 40_000).session_id
    record(engine, root, f"{root}1", "y" * 40_000)
    record(engine, root, f"{root}2", "z" * 10)
    token = store.acquire_lease(engine, session_id, "w", ttl_s=30)
    log = store.DbStore(engine, lease_token=token)
    first, second = log.take_inbox(session_id), log.take_inbox(session_id)
    assert first is not None and first.text == "x" * 40_000  # the second would pass the turn's characters
    assert second is not None and second.text == f"<@U0ALICE>: {'y' * 40_000}\n\n<@U0ALICE>: zzzzzzzzzz"
    assert log.take_inbox(session_id) is None
