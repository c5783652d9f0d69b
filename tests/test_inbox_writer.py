"""The bot's record of a message before its ack, on the event loop (bot.inbox_writer over chatops.inbox_async), on
SQLite and PostgreSQL: messages that wait together are kept in one transaction, each with its own answer, as
record_message keeps one; a bad one fails alone; one given up before its commit is never kept."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from bot.before_ack import DatabaseSilent, Unsure
from bot.inbox_writer import InboxWriter
from chatops import inbox
from chatops.inbox_async import PgInbox, async_inbox
from chatops.schema import InboxMessage, Session, SessionStatus
from chatops.store import set_status
from test_record_before_ack import stalls_on_purpose

CHANNEL = "C0WRITER"


def thread() -> str:
    return f"{uuid.uuid4().int % 10**10}.000100"


def message(thread_ts: str, ts: str, text: str = "fix it", **extra: Any) -> dict[str, Any]:
    return inbox.message_values(
        channel_id=CHANNEL, thread_ts=thread_ts, message_ts=ts, user_id="U0ALICE", text=text, **extra
    )


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def kept(engine: Engine, thread_ts: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(InboxMessage.text)
                .join(Session, Session.id == InboxMessage.session_id)
                .where(Session.channel_id == CHANNEL, Session.thread_ts == thread_ts)
                .order_by(InboxMessage.id)
            ).scalars()
        )


def run(engine: Engine, scenario: Any, wait_s: float = 1.5, writers: int = 2) -> Any:
    async def main() -> Any:
        writer = InboxWriter(async_inbox(url_of(engine), wait_s), writers=writers)
        try:
            return await scenario(writer)
        finally:
            await writer.close()

    return asyncio.run(main())


def test_messages_that_arrive_together_are_each_kept_once_with_their_own_answer(engine: Engine) -> None:
    roots = [thread() for _ in range(6)]
    # Two messages of each thread, and the first of each twice (a retry, or the message twin of a mention).
    values = [message(root, root, f"first of {root}") for root in roots]
    values += [message(root, f"{root}1", f"second of {root}") for root in roots]
    values += [message(root, root, f"first of {root}") for root in roots]

    async def scenario(writer: InboxWriter) -> list[inbox.Recorded]:
        return await asyncio.gather(*(writer.write(v) for v in values))

    answers = run(engine, scenario)
    for i, root in enumerate(roots):
        first, second, again = answers[i], answers[i + 6], answers[i + 12]
        assert first.session_id == second.session_id == again.session_id
        assert (first.new, second.new, again.new) == (True, True, False)
        assert kept(engine, root) == [f"first of {root}", f"second of {root}"]
    assert len({a.session_id for a in answers}) == len(roots)


def test_a_message_to_an_idle_session_queues_it_and_to_a_running_one_is_busy(engine: Engine) -> None:
    root = thread()
    session_id = inbox.record_message(
        engine, channel_id=CHANNEL, thread_ts=root, message_ts=root, user_id="U0ALICE", text="start"
    ).session_id

    async def scenario(writer: InboxWriter) -> tuple[inbox.Recorded, str | None, inbox.Recorded]:
        set_status(engine, session_id, SessionStatus.IDLE)
        idle = await writer.write(message(root, f"{root}1", "more"))
        with engine.connect() as conn:
            status = conn.execute(select(Session.status).where(Session.id == session_id)).scalar_one()
        set_status(engine, session_id, SessionStatus.RUNNING)
        running = await writer.write(message(root, f"{root}2", "and more"))
        return idle, status, running

    idle, status, running = run(engine, scenario)
    assert idle == inbox.Recorded(session_id, new=True, busy=False) and status == SessionStatus.QUEUED
    assert running == inbox.Recorded(session_id, new=True, busy=True)


def test_a_message_that_cannot_be_kept_fails_alone_and_the_others_of_its_batch_are_kept(engine: Engine) -> None:
    roots = [thread() for _ in range(4)]
    bad = message(thread(), "1.0", "bad", files=[{"id": object()}])  # not JSON: no database keeps it

    async def scenario(writer: InboxWriter) -> list[Any]:
        values = [message(root, root, root) for root in roots]
        return await asyncio.gather(*(writer.write(v) for v in [*values[:2], bad, *values[2:]]), return_exceptions=True)

    answers = run(engine, scenario)
    assert isinstance(answers[2], Exception)
    assert all(isinstance(a, inbox.Recorded) and a.new for a in answers[:2] + answers[3:])
    assert [kept(engine, root) for root in roots] == [[root] for root in roots]


def test_a_message_given_up_before_its_commit_is_never_kept(engine: Engine) -> None:
    """The first message's batch waits on a lock; the second waits behind it (one writer) and is given up at its
    deadline: it is never kept. The first one's answer says what became of it: on PostgreSQL its statement,
    which commits itself, was sent (Unsure, then kept); on SQLite its transaction had not reached its commit
    (DatabaseSilent, never kept)."""
    first, given_up, later = thread(), thread(), thread()
    # The blocker holds the inbox (PostgreSQL) or the database's write lock (SQLite); the writer's own waits
    # are longer than the deadline, so that its waiters give up first, while its batch waits on the lock.
    lock = "LOCK TABLE inbox IN EXCLUSIVE MODE" if engine.dialect.name == "postgresql" else "SELECT 1"

    async def scenario(writer: InboxWriter) -> tuple[BaseException, object, inbox.Recorded]:
        with engine.begin() as blocker:
            stalls_on_purpose(blocker)
            blocker.execute(text(lock))
            stuck = asyncio.ensure_future(writer.write(message(first, first, "stuck")))
            await asyncio.sleep(0.3)  # its batch is under way, waiting on the lock
            with pytest.raises(DatabaseSilent):
                await writer.write(message(given_up, given_up, "given up"))
            answer = await asyncio.gather(stuck, return_exceptions=True)
        assert isinstance(answer[0], DatabaseSilent | Unsure), answer
        outcome = answer[0].outcome if isinstance(answer[0], Unsure) else None
        kept_first = await asyncio.gather(outcome, return_exceptions=True) if outcome is not None else [None]
        # The lock is gone and the batch goes on; one writer: once the next message is kept, it is over.
        return answer[0], kept_first[0], await writer.write(message(later, later, "kept"))

    first_answer, first_outcome, later_answer = run(engine, scenario, wait_s=10, writers=1)
    assert later_answer.new
    assert kept(engine, given_up) == [] and kept(engine, later) == ["kept"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(Session.thread_ts == given_up)).scalar_one() == 0
    if engine.dialect.name == "postgresql":
        assert isinstance(first_answer, Unsure)
        assert isinstance(first_outcome, inbox.Recorded) and first_outcome.new
        assert kept(engine, first) == ["stuck"]
    else:
        assert isinstance(first_answer, DatabaseSilent)
        assert kept(engine, first) == []


class RecordingInbox:
    """A stand-in for the database that keeps what each transaction was given, in order: the writer's own choice
    of order is what is checked here (the database's locks follow it)."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str, str]]] = []

    async def keep(self, messages: list[dict[str, Any]], committing: Any) -> list[inbox.Recorded] | None:
        self.batches.append([(m["p_channel"], m["p_thread"], m["p_message_ts"]) for m in messages])
        await asyncio.sleep(0)
        if not committing():
            return None
        return [inbox.Recorded("S", new=True, busy=False) for _ in messages]

    async def session_of(self, channel_id: str, thread_ts: str) -> str | None:
        return None

    async def close(self) -> None:
        return None


def test_every_batch_takes_its_locks_in_one_order_so_two_writers_never_deadlock() -> None:
    """A mention and its `message` twin share a key: two batches holding them crosswise ([X, Y's twin] and
    [Y, X's twin]) would each wait for the other's lock until PostgreSQL broke the cycle a second later. Every
    batch is ordered by thread and message, whatever the order the messages came in."""
    roots = [f"17000000{i:02d}.000100" for i in range(8)]
    arrivals = [message(root, root) for root in roots] + [message(root, root) for root in reversed(roots)]
    recording = RecordingInbox()

    async def main() -> None:
        writer = InboxWriter(recording, writers=2)  # type: ignore[arg-type] - the Protocol's shape, not its class
        try:
            await asyncio.gather(*(writer.write(v) for v in arrivals))
        finally:
            await writer.close()

    asyncio.run(main())
    assert sum(len(b) for b in recording.batches) == len(arrivals)
    assert all(batch == sorted(batch) for batch in recording.batches), recording.batches
    assert any(len(batch) > 1 for batch in recording.batches)  # some batches held several: the order mattered


def test_one_batch_of_idle_running_and_new_threads_answers_and_queues_each_as_one_at_a_time(engine: Engine) -> None:
    """PostgreSQL keeps a batch in one statement (its messages an array a column): each thread's answer is its
    own, and only the idle sessions that got a message are queued, as record_message does one by one."""
    idle_roots, running_roots, new_roots = (
        [thread() for _ in range(3)],
        [thread() for _ in range(3)],
        [thread() for _ in range(3)],
    )
    ids = {}
    for root in idle_roots + running_roots:
        ids[root] = inbox.record_message(
            engine, channel_id=CHANNEL, thread_ts=root, message_ts=root, user_id="U0ALICE", text="start"
        ).session_id
        set_status(engine, ids[root], SessionStatus.IDLE if root in idle_roots else SessionStatus.RUNNING)
    roots = idle_roots + running_roots + new_roots

    async def scenario(writer: InboxWriter) -> list[inbox.Recorded]:
        return await asyncio.gather(*(writer.write(message(root, f"{root}9", "more")) for root in roots))

    answers = dict(zip(roots, run(engine, scenario, writers=1), strict=True))
    with engine.connect() as conn:
        status = dict(conn.execute(select(Session.id, Session.status).where(Session.id.in_(ids.values()))).all())
    for root in idle_roots:
        assert answers[root] == inbox.Recorded(ids[root], new=True, busy=False)
        assert status[ids[root]] == SessionStatus.QUEUED
    for root in running_roots:
        assert answers[root] == inbox.Recorded(ids[root], new=True, busy=True)
        assert status[ids[root]] == SessionStatus.RUNNING
    for root in new_roots:
        assert answers[root].new and not answers[root].busy and answers[root].session_id not in ids.values()
        assert kept(engine, root) == ["more"]


def test_a_batch_is_cut_into_statements_of_distinct_threads_in_order() -> None:
    from chatops.inbox_async import rounds

    a1, b1, a2, c1, a3, b2 = (
        message(root, ts) for root, ts in [("A", "1"), ("B", "1"), ("A", "2"), ("C", "1"), ("A", "3"), ("B", "2")]
    )
    assert rounds([a1, b1, a2, c1, a3, b2]) == [[0, 1, 3], [2, 5], [4]]
    assert rounds([]) == []


def test_a_record_finds_its_thread_by_index_however_few_sessions_there_were_when_its_plan_was_made(
    fresh_pg_url: str,
) -> None:
    """A new install: the record's statement is prepared, and its plan kept, while `sessions` holds a handful of
    rows. Thousands of sessions later, a message still finds its thread through the index: the server's count of
    sequential scans of `sessions` does not move while five more messages are kept."""
    import time

    from chatops import db

    db.migrate(fresh_pg_url)
    engine = db.engine_for(fresh_pg_url)
    scans = text("SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname = 'sessions'")

    def counts() -> tuple[int, int]:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            seq, idx = conn.execute(scans).one()
            return seq, idx

    async def scenario(writer: InboxWriter) -> tuple[tuple[int, int], tuple[int, int]]:
        # Enough uses on a nearly empty table for psycopg to prepare the statement and the server to keep one
        # plan for it (a generic plan, after five custom ones).
        for _ in range(20):
            root = thread()
            await writer.write(message(root, root))
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO sessions (id, kind, channel_id, thread_ts, status, lease_token, event_seq, "
                    "assistant_thread, created_at, updated_at) SELECT md5(n::text), 'thread', 'C0OTHER', n::text, "
                    "'idle', 0, 0, false, now(), now() FROM generate_series(1, 5000) n"
                )
            )
        before = counts()
        for _ in range(5):
            root = thread()
            await writer.write(message(root, root))
        # The server publishes a connection's counts when it goes idle, at most once a second (else ten seconds
        # later): the pool's connections ask for it at their next idle moment.
        assert isinstance(writer.inbox, PgInbox)
        for conn in writer.inbox._idle:  # pyright: ignore[reportPrivateUsage] - the connections the records used
            await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.rollback()
        deadline = time.monotonic() + 20
        while (after := counts())[1] < before[1] + 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return before, after

    try:
        before, after = run(engine, scenario)
    finally:
        engine.dispose()
    assert after[1] >= before[1] + 5, f"the server never published the records' lookups: {before} → {after}"
    assert after[0] == before[0], f"a record scanned the whole sessions table: {before} → {after}"


def test_a_connection_lost_while_a_batch_commits_itself_is_unsure_and_the_next_batch_reconnects(pg_url: str) -> None:
    """The batch's statement, which commits itself, was sent, and its connection is lost before the answer: its
    waiter cannot know (Unsure, with nothing to wait for); the pool drops that connection and the next message
    is kept on a new one."""
    from chatops import db

    db.migrate(pg_url)
    engine = db.engine_for(pg_url)
    lost, later = thread(), thread()

    async def scenario(writer: InboxWriter) -> tuple[BaseException | inbox.Recorded, inbox.Recorded]:
        with engine.begin() as blocker:
            stalls_on_purpose(blocker)
            blocker.execute(text("LOCK TABLE inbox IN EXCLUSIVE MODE"))
            answer = asyncio.ensure_future(writer.write(message(lost, lost, "lost")))
            waiting = text(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            pids: Sequence[int] = ()
            for _ in range(100):
                blocker.execute(text("SELECT pg_stat_clear_snapshot()"))  # else the transaction's first look
                if pids := blocker.execute(waiting).scalars().all():
                    break
                await asyncio.sleep(0.05)
            assert pids, "the batch never waited on the lock"
            blocker.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pids[0]})
            first = (await asyncio.gather(answer, return_exceptions=True))[0]
        return first, await writer.write(message(later, later, "kept"))

    try:
        first, second = run(engine, scenario, wait_s=10, writers=1)
        assert isinstance(first, Unsure) and first.outcome is None, first
        assert second.new and kept(engine, later) == ["kept"]
        assert kept(engine, lost) == []  # the server ended it before its commit; the waiter could not know that
    finally:
        engine.dispose()


def test_a_batch_after_its_pools_connections_were_ended_while_idle_is_kept_on_new_ones(pg_url: str) -> None:
    """The server ended the pool's idle connections (a restart, a failover): the next batch, one statement that
    commits itself, is not sent on one of them, where its outcome would be unknown; every message is kept."""
    from chatops import db

    db.migrate(pg_url)
    engine = db.engine_for(pg_url)
    roots = [thread() for _ in range(4)]
    others = text(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'"
    )

    async def scenario(writer: InboxWriter) -> list[Any]:
        first = thread()
        await writer.write(message(first, first))  # the pool has an idle connection
        with engine.connect() as admin:
            for pid in admin.execute(others).scalars().all():
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            for _ in range(100):
                admin.execute(text("SELECT pg_stat_clear_snapshot()"))
                if not admin.execute(others).scalars().all():
                    break
                await asyncio.sleep(0.05)
        return await asyncio.gather(*(writer.write(message(r, r)) for r in roots), return_exceptions=True)

    try:
        answers = run(engine, scenario, writers=1)
        assert all(isinstance(a, inbox.Recorded) and a.new for a in answers), answers
        assert [kept(engine, root) for root in roots] == [["fix it"]] * len(roots)
    finally:
        engine.dispose()
