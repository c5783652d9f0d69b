"""A push takes the session between turns (workers/thread_push.take_session): a click on the offer can come while
the turn that posted it is still giving the session back, and then the push waits for it, a few seconds at most;
a turn that runs on, or a queued one, keeps the push out. On a real database, SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from sqlalchemy import Engine

from chatops import inbox, store
from chatops.schema import SessionStatus
from workers.thread_push import OWNER, take_session

TURN = "worker-1"  # the lease owner of the turn that is ending


def idle_session(engine: Engine) -> str:
    ts = f"{uuid.uuid4().int % 10**10}.000100"
    recorded = inbox.record_message(
        engine, channel_id="C0PUSH", thread_ts=ts, message_ts=ts, user_id="U0ALICE", text="go"
    )
    store.set_status(engine, recorded.session_id, SessionStatus.IDLE)
    return recorded.session_id


def later(seconds: float, act: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, act)
    timer.start()
    return timer


def test_a_push_waits_for_the_turn_that_is_giving_the_session_back(engine: Engine) -> None:
    """The session says idle, but the turn's worker still holds the lease: the push takes it once it is let go."""
    session_id = idle_session(engine)
    token = store.acquire_lease(engine, session_id, TURN, 60)
    assert token is not None
    timer = later(0.3, lambda: store.release_lease(engine, session_id, token))
    taken = take_session(engine, session_id, wait_s=10, poll_s=0.02)
    timer.join()
    assert taken is not None
    pushed, facts = taken
    assert pushed > token and facts.status == SessionStatus.IDLE and facts.lease_owner == OWNER


def test_a_push_waits_for_a_turn_that_is_ending_to_say_so(engine: Engine) -> None:
    """The offer comes before the session says idle: a push asked meanwhile waits for the status and the lease."""
    session_id = idle_session(engine)
    token = store.acquire_lease(engine, session_id, TURN, 60)
    assert token is not None
    store.set_status(engine, session_id, SessionStatus.RUNNING, lease_token=token)

    def end() -> None:
        store.set_status(engine, session_id, SessionStatus.IDLE, lease_token=token)
        store.release_lease(engine, session_id, token)

    timer = later(0.3, end)
    taken = take_session(engine, session_id, wait_s=10, poll_s=0.02)
    timer.join()
    assert taken is not None and taken[1].status == SessionStatus.IDLE


def test_a_turn_that_runs_on_keeps_the_push_out_and_keeps_its_lease(engine: Engine) -> None:
    session_id = idle_session(engine)
    token = store.acquire_lease(engine, session_id, TURN, 60)
    assert token is not None
    store.set_status(engine, session_id, SessionStatus.RUNNING, lease_token=token)
    assert take_session(engine, session_id, wait_s=0.3, poll_s=0.02) is None
    # The turn's lease is untouched: it renews as before.
    assert store.renew_lease(engine, session_id, token, 60)


def test_a_queued_session_is_left_to_its_turn(engine: Engine) -> None:
    """A message queued a turn: the push never takes the lease the turn's worker is about to ask for."""
    session_id = idle_session(engine)
    store.set_status(engine, session_id, SessionStatus.QUEUED)
    assert take_session(engine, session_id, wait_s=0.3, poll_s=0.02) is None
    assert store.acquire_lease(engine, session_id, TURN, 60) is not None


def test_another_push_that_holds_on_keeps_this_one_out(engine: Engine) -> None:
    session_id = idle_session(engine)
    first = take_session(engine, session_id, wait_s=0, poll_s=0.02)
    assert first is not None
    assert take_session(engine, session_id, wait_s=0.3, poll_s=0.02) is None
    store.release_lease(engine, session_id, first[0])
    assert take_session(engine, session_id, wait_s=0, poll_s=0.02) is not None


def test_a_session_that_is_gone_is_not_waited_for(engine: Engine) -> None:
    assert take_session(engine, "no-such-session", wait_s=30, poll_s=0.02) is None
