"""The worker's lease keeper (workers/leases.py) on a real database: it renews its turns' leases in time, gives up
a turn whose lease another worker took, delivers stops, rides out a database that goes away, and never keeps
the process from exiting."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine, event, text

from chatops import db, inbox, sessions, store
from chatops.schema import SessionStatus, utcnow
from mm_testkit.clocks import HandClock
from workers import leases
from workers.leases import STOP_POLL_SECONDS, Cancelled, LeaseKeeper

TTL = 1.5  # a renewal every half second: the keeper's own poll
# How long a cancellation that must come may take on a loaded machine (it comes within a poll or two); a window
# in which one must not come is a few polls (a wrong one would come within them).
MUST_COME = 10.0


@pytest.fixture
def keepers() -> Iterator[Callable[[Engine, float], LeaseKeeper]]:
    """Makes keepers that let go of every session at the test's end, passed or failed: their threads live on
    (daemons, as in a worker), idle rather than querying a database the test is done with."""
    made: list[LeaseKeeper] = []

    def make(engine: Engine, ttl: float) -> LeaseKeeper:
        made.append(LeaseKeeper(engine, ttl=ttl))
        return made[-1]

    yield make
    for keeper in made:
        for session_id in list(keeper._held):
            keeper.drop(session_id)


@pytest.fixture
def keeper(engine: Engine, keepers: Callable[[Engine, float], LeaseKeeper]) -> LeaseKeeper:
    return keepers(engine, TTL)


def new_session(engine: Engine) -> str:
    ts = f"{uuid.uuid4().int % 10**10}.000100"
    recorded = inbox.record_message(
        engine, channel_id="C0LEASE", thread_ts=ts, message_ts=ts, user_id="U0ALICE", text="go"
    )
    return recorded.session_id


def running_turn(engine: Engine, keeper: LeaseKeeper) -> str:
    """A session whose turn runs on the keeper's worker: RUNNING, its lease held under the keeper's owner name."""
    session_id = new_session(engine)
    assert store.acquire_lease(engine, session_id, keeper.owner, ttl_s=keeper.ttl) is not None
    store.set_status(engine, session_id, SessionStatus.RUNNING)
    return session_id


async def held_turn(keeper: LeaseKeeper, session_id: str, *, cancellable: bool = True) -> asyncio.Task[None]:
    """A turn's task, held by the keeper as workers.turns holds a running turn."""
    task = asyncio.create_task(asyncio.sleep(60))
    keeper.hold(session_id, task)
    keeper.cancellable(session_id, cancellable)
    return task


async def cancelled_within(task: asyncio.Task[None], seconds: float) -> bool:
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return bool(done) and task.cancelled()


async def until(what: Callable[[], object], message: str) -> None:
    """Wait on the event loop for `what`, as long as something that must come may take (MUST_COME)."""
    deadline = time.monotonic() + MUST_COME
    while not what():
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.02)


def wait_for(what: Callable[[], object], seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def test_a_turn_held_past_its_lease_keeps_the_session_from_other_workers(engine: Engine, keeper: LeaseKeeper) -> None:
    session_id = running_turn(engine, keeper)

    async def turn() -> None:
        task = await held_turn(keeper, session_id)
        await asyncio.sleep(TTL * 2.5)  # well past the lease taken at the start
        assert not task.done()
        task.cancel()

    asyncio.run(turn())
    # Renewed all along: nobody else may take it, and housekeeping does not hand it to another worker.
    assert store.acquire_lease(engine, session_id, "another-worker", ttl_s=30) is None
    assert session_id not in sessions.sessions_with_work(engine, quiet_s=0)
    assert keeper.drop(session_id) is None  # it ended on its own: the keeper cancelled nothing


def test_the_keeper_renews_all_its_leases_in_one_statement_no_more_often_than_a_third_of_the_lease(
    engine: Engine, keepers: Callable[[Engine, float], LeaseKeeper], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fine poll, so that the renewals' spacing is the keeper's own choice rather than the poll's half second.
    monkeypatch.setattr(leases, "STOP_POLL_SECONDS", 0.02)
    ttl = 0.6
    before = set(threading.enumerate())
    keeper = keepers(engine, ttl)
    first, second = running_turn(engine, keeper), running_turn(engine, keeper)
    renewals: list[float] = []

    def count(conn: object, cursor: object, statement: str, parameters: object, *args: object) -> None:
        renewal = statement.lstrip().upper().startswith("UPDATE SESSIONS SET LEASE_EXPIRES_AT")
        if renewal and first in str(parameters) and second in str(parameters):  # one statement for both
            renewals.append(time.monotonic())

    event.listen(engine, "before_cursor_execute", count)
    try:

        async def turns() -> None:
            tasks = [await held_turn(keeper, first), await held_turn(keeper, second)]
            await asyncio.sleep(2.0)
            for task in tasks:
                task.cancel()

        opened = time.monotonic()  # the keeper's thread starts after this, at the first hold
        asyncio.run(turns())
    finally:
        event.remove(engine, "before_cursor_execute", count)
    ended = time.monotonic()
    # Each renewal is due a third of the lease after the one before, the first a third after the keeper started:
    # so whatever the load, the first comes no sooner and a window holds no more of them; and it does renew.
    third = ttl / 3
    assert renewals and renewals[0] - opened >= third, renewals
    assert 3 <= len(renewals) <= (ended - opened) / third, renewals
    assert len([t for t in set(threading.enumerate()) - before if t.name == "mm-lease-keeper"]) == 1  # one a process


def test_a_lease_is_renewed_the_moment_a_third_of_it_has_passed_and_not_before(
    engine: Engine, keepers: Callable[[Engine, float], LeaseKeeper], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leases, "STOP_POLL_SECONDS", 0.02)
    clock = HandClock(1000.0)
    monkeypatch.setattr(leases, "time", clock)
    ttl = 3.0
    keeper = keepers(engine, ttl)
    session_id = running_turn(engine, keeper)
    polled: list[str] = []
    renewed_at: list[float] = []

    def count(conn: object, cursor: object, statement: str, parameters: object, *args: object) -> None:
        if threading.current_thread().name != "mm-lease-keeper":
            return
        polled.append(statement)
        if statement.lstrip().upper().startswith("UPDATE SESSIONS SET LEASE_EXPIRES_AT"):
            renewed_at.append(clock.now)

    event.listen(engine, "before_cursor_execute", count)
    try:

        async def turn() -> None:
            task = await held_turn(keeper, session_id)
            await until(lambda: polled, "the keeper never polled")  # it has read the clock: 1000.0
            await asyncio.sleep(0.3)  # fifteen polls at 1000.0
            assert renewed_at == []
            clock.now = 1000.0 + ttl / 3  # due, to the tick
            await until(lambda: renewed_at, "no renewal once a third of the lease had passed")
            clock.now = 1000.0 + ttl / 3 + ttl / 3 - 0.001
            await asyncio.sleep(0.3)
            assert renewed_at == [1001.0]  # the next is due a third after this one, not before
            clock.now = 1000.0 + ttl / 3 + ttl / 3
            await until(lambda: len(renewed_at) == 2, "no second renewal a third of the lease after the first")
            task.cancel()

        asyncio.run(turn())
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert renewed_at == [1001.0, 1002.0]


def test_a_keeper_that_holds_no_turn_leaves_the_database_alone(
    engine: Engine, keepers: Callable[[Engine, float], LeaseKeeper], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle worker does not poll the database: stops are asked for and leases renewed only while it holds a
    turn (the keeper's thread lives on, a daemon, once its first turn is over)."""
    monkeypatch.setattr(leases, "STOP_POLL_SECONDS", 0.02)
    keeper = keepers(engine, TTL)
    session_id = running_turn(engine, keeper)
    asked: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if threading.current_thread().name == "mm-lease-keeper":
            asked.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:

        async def turn() -> None:
            task = await held_turn(keeper, session_id)
            await until(lambda: asked, "the keeper never asked for stops while it held a turn")
            task.cancel()

        asyncio.run(turn())
        keeper.drop(session_id)
        time.sleep(0.5)  # a poll under way when the turn was dropped ends (most likely)
        asked.clear()
        time.sleep(1.0)  # fifty polls
        # At most the poll that had taken its list of turns before the drop, late on a loaded machine: its stops
        # query and renewal. A keeper that polled while idle would have asked fifty times.
        assert len(asked) <= 2, asked
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_turn_whose_lease_another_worker_took_is_stopped_and_told_why(
    engine: Engine, keeper: LeaseKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    session_id = running_turn(engine, keeper)

    async def turn() -> bool:
        task = await held_turn(keeper, session_id)
        # This worker stalled past its lease, and another took the session over.
        later = utcnow() + timedelta(seconds=TTL + 1)
        assert store.acquire_lease(engine, session_id, "another-worker", ttl_s=60, now=later) is not None
        return await cancelled_within(task, MUST_COME)

    with caplog.at_level(logging.WARNING, logger="mm.worker"):
        assert asyncio.run(turn())
    assert keeper.drop(session_id) == Cancelled.LOST
    assert f"session {session_id}: lease lost to another worker; stopping its turn here" in caplog.messages


def test_a_stop_cancels_the_turn_only_while_it_runs_and_every_time_it_is_asked(
    engine: Engine, keeper: LeaseKeeper
) -> None:
    session_id = running_turn(engine, keeper)

    async def turns() -> None:
        task = await held_turn(keeper, session_id, cancellable=False)  # the work around a turn: not cut short
        assert inbox.request_stop(engine, session_id)
        assert not await cancelled_within(task, 3 * STOP_POLL_SECONDS)
        keeper.cancellable(session_id, True)  # the turn starts: the standing stop acts on it
        assert await cancelled_within(task, MUST_COME)
        assert keeper.reason(session_id) == Cancelled.STOP
        # The turn handled it (workers.turns clears the flag and leaves the turn); the next turn is stopped again.
        inbox.clear_stop(engine, session_id)
        keeper.cancellable(session_id, False)
        assert keeper.reason(session_id) is None
        task = await held_turn(keeper, session_id)
        assert inbox.request_stop(engine, session_id)
        assert await cancelled_within(task, MUST_COME)

    asyncio.run(turns())
    assert keeper.drop(session_id) == Cancelled.STOP
    assert keeper.drop(session_id) is None  # dropped: nothing more to say
    assert keeper.reason(session_id) is None  # a cancellation of a turn the keeper no longer holds: not its own
    keeper.cancellable(session_id, True)  # a turn that ended meanwhile: nothing to mark
    assert keeper.reason(session_id) is None


def test_a_stop_for_another_workers_turn_leaves_this_ones_alone(engine: Engine, keeper: LeaseKeeper) -> None:
    mine, theirs = running_turn(engine, keeper), new_session(engine)
    assert store.acquire_lease(engine, theirs, "another-worker", ttl_s=30) is not None
    store.set_status(engine, theirs, SessionStatus.RUNNING)

    async def turn() -> bool:
        task = await held_turn(keeper, mine)
        assert inbox.request_stop(engine, theirs)
        stopped = await cancelled_within(task, 3 * STOP_POLL_SECONDS)
        task.cancel()
        return stopped

    assert not asyncio.run(turn())
    assert keeper.drop(mine) is None


@pytest.fixture
def pg_engine(fresh_pg_url: str) -> Iterator[tuple[Engine, str]]:
    db.migrate(fresh_pg_url)
    engine = db.engine_for(fresh_pg_url)
    yield engine, engine.url.database or ""
    engine.dispose()


def test_the_keeper_says_when_the_database_does_not_answer_and_renews_once_it_is_back(
    pg_engine: tuple[Engine, str], keepers: Callable[[Engine, float], LeaseKeeper], caplog: pytest.LogCaptureFixture
) -> None:
    engine, name = pg_engine
    keeper = keepers(engine, TTL)
    session_id = running_turn(engine, keeper)
    admin = create_engine(engine.url.set(database="postgres"), isolation_level="AUTOCOMMIT")

    def database(allowed: bool) -> None:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}'))
            if not allowed:
                conn.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name}
                )

    def said() -> bool:  # by this test's keeper (another test's could be logging the same of its database)
        return any(
            r.getMessage() == "lease keeper: the database did not answer" and r.thread == keeper_thread(keeper)
            for r in caplog.records
        )

    async def turn() -> None:
        task = await held_turn(keeper, session_id)
        database(False)
        try:
            await asyncio.to_thread(wait_for, said, 10, "the keeper to log the database's silence")
        finally:
            database(True)
        gone = utcnow() + timedelta(seconds=TTL)
        # Back: the keeper goes on renewing, past the lease the outage would have let expire.
        await asyncio.sleep(TTL + STOP_POLL_SECONDS)
        assert store.acquire_lease(engine, session_id, "another-worker", ttl_s=30, now=gone) is None
        assert not task.done()
        task.cancel()

    with caplog.at_level(logging.ERROR, logger="mm.worker"):
        try:
            asyncio.run(turn())
        finally:
            admin.dispose()
    assert keeper.drop(session_id) is None


def keeper_thread(keeper: LeaseKeeper) -> int | None:
    return keeper._thread.ident if keeper._thread is not None else None


@pytest.mark.process
def test_a_worker_holding_a_turn_exits_without_waiting_for_the_keeper(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    db.migrate(url)
    program = (
        "import asyncio\n"
        "from chatops import db\n"
        "from workers.leases import LeaseKeeper\n"
        "async def main():\n"
        "    keeper = LeaseKeeper(db.engine_for(URL), ttl=30)\n"
        "    keeper.hold('s1', asyncio.ensure_future(asyncio.sleep(60)))\n"
        "    await asyncio.sleep(1)\n"  # the keeper's thread is running
        "asyncio.run(main())\n"
        "print('main ended', flush=True)\n"
    ).replace("URL", repr(url))
    # A keeper thread that held the process open would leave it running until the timeout.
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "main ended\n", done.stderr
