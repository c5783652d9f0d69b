"""A push takes the session between turns (workers/thread_push.take_session): a click on the offer can come while
the turn that posted it is still giving the session back, and then the push waits for it, a few seconds at most;
a turn that runs on, a queued one or a message waiting for one keeps the push out, and never loses its lease to
it. On a real database, SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine, select

from chatops import inbox, sessions, store
from chatops.schema import Session, SessionStatus
from workers import thread_push
from workers.thread_push import OWNER, take_session

TURN = "worker-1"  # the lease owner of the turn that is ending


# Every message its own ts: two alike would be one message delivered twice, and the second would queue nothing
# (a random suffix of three digits once made them alike, and CI failed).
_MESSAGES = itertools.count(1)


def message(engine: Engine, ts: str, text: str = "go") -> str:
    message_ts = f"{ts}{next(_MESSAGES)}"
    return inbox.record_message(
        engine, channel_id="C0PUSH", thread_ts=ts, message_ts=message_ts, user_id="U0A", text=text
    ).session_id


def between_turns(engine: Engine) -> tuple[str, str]:
    """A session whose turn took its message and ended: idle, nothing waiting. Its thread, and the session."""
    ts = f"{uuid.uuid4().int % 10**10}.000100"
    session_id = message(engine, ts)
    assert store.DbStore(engine).take_inbox(session_id) is not None
    store.set_status(engine, session_id, SessionStatus.IDLE)
    return ts, session_id


def lease_token(engine: Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(select(Session.lease_token).where(Session.id == session_id)).scalar_one()


def later(seconds: float, act: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, act)
    timer.start()
    return timer


def test_a_push_waits_for_the_turn_that_is_giving_the_session_back(engine: Engine) -> None:
    """The session says idle, but the turn's worker still holds the lease: the push takes it once it is let go."""
    _, session_id = between_turns(engine)
    token = store.acquire_lease(engine, session_id, TURN, 60)
    assert token is not None
    timer = later(0.3, lambda: store.release_lease(engine, session_id, token))
    pushed, facts = take_session(engine, session_id, wait_s=10, poll_s=0.02)
    timer.join()
    assert pushed is not None and pushed > token
    assert facts is not None and facts.status == SessionStatus.IDLE and facts.lease_owner == OWNER


def test_a_push_waits_for_a_turn_that_is_ending_to_say_so(engine: Engine) -> None:
    """The offer comes before the session says idle: a push asked meanwhile waits for the status and the lease."""
    _, session_id = between_turns(engine)
    token = store.acquire_lease(engine, session_id, TURN, 60)
    assert token is not None
    store.set_status(engine, session_id, SessionStatus.RUNNING, lease_token=token)

    def end() -> None:
        store.set_status(engine, session_id, SessionStatus.IDLE, lease_token=token)
        store.release_lease(engine, session_id, token)

    timer = later(0.3, end)
    pushed, facts = take_session(engine, session_id, wait_s=10, poll_s=0.02)
    timer.join()
    assert pushed is not None and facts is not None and facts.status == SessionStatus.IDLE


def test_a_turn_that_ran_on_without_its_lease_keeps_the_push_out(engine: Engine) -> None:
    """A worker died in a turn: the session says running and nobody holds it. The push leaves it to that turn
    (which it enqueues once done, below); the session stays free for it."""
    _, session_id = between_turns(engine)
    store.set_status(engine, session_id, SessionStatus.RUNNING)
    pushed, facts = take_session(engine, session_id, wait_s=0.3, poll_s=0.02)
    assert pushed is None and facts is not None and facts.status == SessionStatus.RUNNING
    assert sessions.wants_a_worker(engine, session_id)


@pytest.mark.parametrize("waiting", ["queued", "a message"])
def test_a_session_with_work_for_a_turn_is_left_to_its_turn(engine: Engine, waiting: str) -> None:
    """A message queued a turn, or came while the last one ran (the session says idle, the message waits): the
    push never takes the lease the turn's worker is about to ask for."""
    ts, session_id = between_turns(engine)
    if waiting == "queued":
        store.set_status(engine, session_id, SessionStatus.QUEUED)
    else:
        token = store.acquire_lease(engine, session_id, TURN, 60)
        assert token is not None
        store.set_status(engine, session_id, SessionStatus.RUNNING, lease_token=token)
        message(engine, ts, "and also this")  # while the turn runs: the session stays running
        store.set_status(engine, session_id, SessionStatus.IDLE, lease_token=token)
        store.release_lease(engine, session_id, token)
    before = lease_token(engine, session_id)
    pushed, _ = take_session(engine, session_id, wait_s=0.3, poll_s=0.02)
    assert pushed is None
    # Never taken, not even for a moment: every take of a lease raises its token.
    assert lease_token(engine, session_id) == before
    assert sessions.wants_a_worker(engine, session_id)


def test_a_turn_that_waits_for_a_person_lets_the_push_through(engine: Engine) -> None:
    """An approval is pending: the turn waits without its lease, and the changes so far may be pushed, as
    before. Once the approval is decided a turn is due, and the push leaves the session to it."""
    _, session_id = between_turns(engine)
    store.request_approval(engine, call_id="c1", session_id=session_id, tool="bash", arguments="{}")
    store.set_status(engine, session_id, SessionStatus.AWAITING_APPROVAL)
    pushed, facts = take_session(engine, session_id, wait_s=0, poll_s=0.02)
    assert pushed is not None and facts is not None and facts.status == SessionStatus.AWAITING_APPROVAL
    store.release_lease(engine, session_id, pushed)
    store.decide_approval(engine, "c1", approved=True, by="U0BOB")
    pushed, _ = take_session(engine, session_id, wait_s=0.3, poll_s=0.02)
    assert pushed is None


def test_a_message_that_queues_a_turn_under_the_push_s_lease_gets_the_session_back(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message comes between the push's first read and its lease: the read under the lease sees it, and the
    push lets the session go at once, for the turn's worker to take."""
    ts, session_id = between_turns(engine)
    real = store.acquire_lease

    def then_a_message(*args: object, **kwargs: object) -> int | None:
        token = real(*args, **kwargs)  # type: ignore[arg-type]
        message(engine, ts, "one more thing")
        return token

    monkeypatch.setattr(thread_push, "acquire_lease", then_a_message)
    reads = count_reads(monkeypatch)
    pushed, facts = take_session(engine, session_id, wait_s=30, poll_s=0.02)
    assert pushed is None and facts is not None and facts.status == SessionStatus.QUEUED
    assert len(reads) == 2  # answered at once, not after waiting for a turn whose task may have given up
    assert sessions.wants_a_worker(engine, session_id)  # free for the turn: nobody holds the lease
    assert store.acquire_lease(engine, session_id, TURN, 60) is not None


def test_another_push_that_holds_on_keeps_this_one_out(engine: Engine) -> None:
    _, session_id = between_turns(engine)
    first, _ = take_session(engine, session_id, wait_s=0, poll_s=0.02)
    assert first is not None
    second, facts = take_session(engine, session_id, wait_s=0.3, poll_s=0.02)
    assert second is None and facts is not None and facts.lease_owner == OWNER
    store.release_lease(engine, session_id, first)
    third, _ = take_session(engine, session_id, wait_s=0, poll_s=0.02)
    assert third is not None


def test_a_session_that_is_gone_is_said_and_not_waited_for(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = count_reads(monkeypatch)
    assert take_session(engine, "no-such-session", wait_s=30, poll_s=0.02) == (None, None)
    assert reads == ["no-such-session"]


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sessions take_session reads from now on, one entry a read."""
    reads: list[str] = []
    real = thread_push.snapshot

    def counted(bind: Engine, session_id: str, **kwargs: bool) -> sessions.Snapshot | None:
        reads.append(session_id)
        return real(bind, session_id, **kwargs)

    monkeypatch.setattr(thread_push, "snapshot", counted)
    return reads


# --- the push task: a turn kept out meanwhile is enqueued once the push lets go ----------------------------------


@pytest.mark.parametrize("meanwhile", [None, "a message"])
def test_the_push_task_enqueues_the_turn_it_kept_out(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, meanwhile: str | None
) -> None:
    """The task's own body on a real database; only the git work, the worker's process and Slack are stand-ins.
    What came while the push held the lease (its turn's task found the lease taken and gave up) is enqueued."""
    from workers import tasks

    ts, session_id = between_turns(engine)
    said: list[str] = []
    enqueued: list[str] = []

    def push(*_args: object) -> str:
        if meanwhile == "a message":
            message(engine, ts, "and also this")
        return "pushed"

    async def say(_proc: object, facts: sessions.Snapshot, text: str) -> None:
        said.append(text)

    monkeypatch.setattr(thread_push, "process", lambda: SimpleNamespace(engine=engine))
    monkeypatch.setattr(thread_push, "_push", push)
    monkeypatch.setattr(thread_push, "say_in_thread", say)
    monkeypatch.setattr(tasks, "enqueue_session", enqueued.append)
    tasks.push_thread.task(session_id, None, "U0BOB")
    assert said == ["pushed"]
    assert enqueued == ([] if meanwhile is None else [session_id])
    assert lease_token(engine, session_id) > 0 and sessions.wants_a_worker(engine, session_id) == bool(meanwhile)


def test_a_push_task_for_a_gone_session_says_nothing(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import tasks

    said: list[str] = []

    async def say(_proc: object, _facts: object, text: str) -> None:
        said.append(text)

    monkeypatch.setattr(thread_push, "process", lambda: SimpleNamespace(engine=engine))
    monkeypatch.setattr(thread_push, "say_in_thread", say)
    monkeypatch.setattr(tasks, "enqueue_session", lambda _s: said.append("enqueued"))
    tasks.push_thread.task("no-such-session", None, "U0BOB")
    assert said == []
