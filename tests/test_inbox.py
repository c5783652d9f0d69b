"""The inbox and the work-finding queries, on SQLite and PostgreSQL: what the bot records, what a turn takes, and
what housekeeping finds."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine, event, select

from chatops import db, inbox, sessions, store
from chatops.schema import ApprovalDecision, SessionStatus, Vote, utcnow
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


def test_housekeeping_finds_work_nobody_does_and_leaves_work_somebody_does(own_engine: Engine) -> None:
    engine = own_engine  # housekeeping's statements reach every row: a database of the test's own
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
    assert inbox.release_expired_leases(engine, now=utcnow() + timedelta(seconds=31)) == 1
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
    assert record(engine, root, f"{root}1", "and meanwhile?").busy  # the thread is told it waits its turn
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


def test_a_message_queues_its_own_idle_session_and_no_other(engine: Engine) -> None:
    first, second = thread(), thread()
    ours = record(engine, first, first, "hello").session_id
    theirs = record(engine, second, second, "hello").session_id
    for session_id in (ours, theirs):
        store.set_status(engine, session_id, SessionStatus.IDLE)
    again = record(engine, first, f"{first}1", "and now?")
    assert again.new and not again.busy  # an idle session takes it in its next turn, at once
    statuses = {s: snap.status for s in (ours, theirs) if (snap := sessions.snapshot(engine, s, log=False))}
    assert statuses == {ours: SessionStatus.QUEUED, theirs: SessionStatus.IDLE}
    later = utcnow() + timedelta(seconds=5)
    assert ours in sessions.sessions_with_work(engine, now=later)


def test_housekeeping_asked_about_one_session_answers_for_that_one_alone(engine: Engine) -> None:
    first, second = thread(), thread()
    ours = record(engine, first, first, "hello").session_id
    theirs = record(engine, second, second, "hello").session_id
    later = utcnow() + timedelta(seconds=5)
    assert {ours, theirs} <= set(sessions.sessions_with_work(engine, now=later))
    assert sessions.sessions_with_work(engine, now=later, only=ours) == [ours]
    store.set_status(engine, ours, SessionStatus.IDLE)
    token = store.acquire_lease(engine, ours, "w", ttl_s=30)
    assert token is not None and store.DbStore(engine, lease_token=token).take_inbox(ours) is not None
    store.release_lease(engine, ours, token)
    # Done with its work, it is not handed to a worker again, though another session still has work.
    assert sessions.sessions_with_work(engine, now=later, only=ours) == []


def test_a_session_counts_as_written_to_once_a_message_is_kept_taken_or_not(engine: Engine) -> None:
    root = thread()
    # `/mm repo` in a thread nobody wrote to yet makes its session: the repository may still be chosen.
    session_id = store.ensure_session(engine, channel_id="C0INBOX", thread_ts=root)
    assert not inbox.has_messages(engine, session_id)
    assert record(engine, root, root, "fix it").session_id == session_id
    assert inbox.has_messages(engine, session_id)
    log = store.DbStore(engine, lease_token=store.acquire_lease(engine, session_id, "w", ttl_s=30))
    assert log.take_inbox(session_id) is not None
    assert inbox.has_messages(engine, session_id)  # taken, it was still written
    other = thread()
    assert not inbox.has_messages(engine, store.ensure_session(engine, channel_id="C0INBOX", thread_ts=other))


def test_a_lease_is_free_for_another_worker_from_the_moment_it_expires(own_engine: Engine) -> None:
    engine = own_engine  # housekeeping's statements reach every row: a database of the test's own
    root = thread()
    session_id = record(engine, root, root, "hello").session_id
    taken = utcnow()
    token = store.acquire_lease(engine, session_id, "w1", ttl_s=30, now=taken)
    assert token is not None
    before = taken + timedelta(seconds=29)
    assert session_id not in sessions.sessions_with_work(engine, now=before)
    assert store.acquire_lease(engine, session_id, "w2", ttl_s=30, now=before) is None
    expiry = taken + timedelta(seconds=30)
    assert session_id in sessions.sessions_with_work(engine, now=expiry)
    assert store.renew_lease(engine, session_id, token, ttl_s=30, now=taken)  # still w1's, the expiry unchanged
    assert inbox.release_expired_leases(engine, now=taken + timedelta(seconds=29)) == 0
    assert inbox.release_expired_leases(engine, now=expiry) == 1
    assert not store.renew_lease(engine, session_id, token, ttl_s=30)  # released: nobody holds it
    assert store.acquire_lease(engine, session_id, "w2", ttl_s=30, now=expiry) is not None


def test_a_message_is_known_as_kept_by_its_own_session_and_ts_alone(engine: Engine) -> None:
    root, other = thread(), thread()
    session_id = record(engine, root, root, "fix it").session_id
    record(engine, root, f"{root}1", "and the tests")
    elsewhere = record(engine, other, other, "hello").session_id
    assert inbox.has_message(engine, session_id, root) and inbox.has_message(engine, session_id, f"{root}1")
    assert not inbox.has_message(engine, session_id, f"{root}2")  # a request carried out again: not yet kept
    assert not inbox.has_message(engine, elsewhere, root)


def test_a_session_a_message_creates_keeps_its_workspace_org_and_kind_of_thread(engine: Engine) -> None:
    root = thread()
    recorded = inbox.record_message(
        engine,
        channel_id="D0ASSIST",
        thread_ts=root,
        message_ts=root,
        user_id="U0ALICE",
        text="hello",
        slack_team_id="T0INBOX",
        enterprise_id="E0INBOX",
        assistant_thread=True,
    )
    found = sessions.snapshot(engine, recorded.session_id, log=False)
    assert found is not None
    assert (found.slack_team_id, found.enterprise_id, found.assistant_thread) == ("T0INBOX", "E0INBOX", True)


def test_what_an_assistant_threads_person_looks_at_is_kept_until_the_thread_is_long_quiet(own_engine: Engine) -> None:
    engine = own_engine  # housekeeping's statements reach every row: a database of the test's own
    root, other = thread(), thread()
    assert inbox.assistant_context(engine, "D0ASSIST", root) is None
    inbox.keep_assistant_context(engine, "D0ASSIST", root, {"channel_id": "C0FIRST"}, changed=False)
    assert inbox.assistant_context(engine, "D0ASSIST", root) == {"channel_id": "C0FIRST"}
    inbox.keep_assistant_context(engine, "D0ASSIST", root, {"channel_id": "C0SECOND"})  # the person looked elsewhere
    # The thread's start, delivered late, is older news than the change: it does not replace it.
    inbox.keep_assistant_context(engine, "D0ASSIST", root, {"channel_id": "C0FIRST"}, changed=False)
    assert inbox.assistant_context(engine, "D0ASSIST", root) == {"channel_id": "C0SECOND"}
    inbox.keep_assistant_context(engine, "D0ASSIST", other, {"channel_id": "C0OTHER"})
    assert inbox.assistant_context(engine, "D0ASSIST", other) == {"channel_id": "C0OTHER"}
    assert inbox.forget_assistant_contexts(engine, kept=timedelta(days=30)) == 0
    assert inbox.forget_assistant_contexts(engine, kept=timedelta(seconds=-60)) == 2  # as if a month went by
    assert inbox.assistant_context(engine, "D0ASSIST", root) is None


def test_a_message_that_arrives_as_the_turn_ends_queues_the_session(fresh_pg_url: str) -> None:
    """The bot reads the session busy, the worker ends the turn and sets it idle (committed), then the bot keeps
    the message: the session must be queued, or the message waits for housekeeping. PostgreSQL, where the two
    transactions overlap (SQLite's writer lock keeps them apart)."""
    db.migrate(fresh_pg_url)
    engine = db.engine_for(fresh_pg_url)
    try:
        root = thread()
        session_id = record(engine, root, root, "fix it").session_id
        store.set_status(engine, session_id, SessionStatus.RUNNING)
        values = inbox.message_values(
            channel_id="C0INBOX", thread_ts=root, message_ts=f"{root}1", user_id="U0BOB", text="and the docs"
        )
        with engine.begin() as conn:
            ended: list[bool] = []

            @event.listens_for(conn, "after_cursor_execute")
            def turn_ends(conn: object, cursor: object, statement: str, *args: object) -> None:
                if not ended and statement.lstrip().upper().startswith("SELECT SESSIONS.ID, SESSIONS.STATUS"):
                    ended.append(store.set_status(engine, session_id, SessionStatus.IDLE))  # the worker, meanwhile

            recorded = inbox.record_on(conn, values)
        assert ended == [True] and recorded.busy  # it was read busy
        snap = sessions.snapshot(engine, session_id, log=False)
        assert snap is not None and snap.status == SessionStatus.QUEUED
    finally:
        engine.dispose()


def test_the_bot_finds_a_threads_session_on_its_event_loop(engine: Engine) -> None:
    """Before its ack the bot asks on an async connection whether a thread has a session (a reply without a
    mention is followed only then)."""
    root = thread()
    session_id = record(engine, root, root, "hello").session_id

    async def find() -> tuple[str | None, str | None]:
        bot = db.async_engine_for(engine.url.render_as_string(hide_password=False))
        try:
            async with bot.connect() as conn:
                return await inbox.session_in(conn, "C0INBOX", root), await inbox.session_in(conn, "C0INBOX", thread())
        finally:
            await bot.dispose()

    assert asyncio.run(find()) == (session_id, None)


def test_a_renewed_lease_runs_its_ttl_from_the_renewal(own_engine: Engine) -> None:
    engine = own_engine  # housekeeping's statements reach every row: a database of the test's own
    root = thread()
    session_id = record(engine, root, root, "hello").session_id
    assert store.acquire_lease(engine, session_id, "w", ttl_s=30) is not None
    assert inbox.renew_held(engine, "w", ttl_s=120) == {session_id}
    assert inbox.release_expired_leases(engine, now=utcnow() + timedelta(seconds=60)) == 0  # held past its first ttl
    assert inbox.release_expired_leases(engine, now=utcnow() + timedelta(seconds=121)) == 1


def test_housekeeping_releases_a_lease_that_expired_before_now(own_engine: Engine) -> None:
    """Its clock is the worker's now unless a test gives one."""
    engine = own_engine
    root = thread()
    session_id = record(engine, root, root, "hello").session_id
    assert store.acquire_lease(engine, session_id, "w", ttl_s=30, now=utcnow() - timedelta(seconds=60)) is not None
    assert inbox.release_expired_leases(engine) == 1
    assert store.acquire_lease(engine, session_id, "w2", ttl_s=30) is not None


def test_an_approval_a_stop_expires_is_recorded_as_nobodys_decision(engine: Engine) -> None:
    """The audit of a call shows it expired unanswered, not that it was never decided."""
    root = thread()
    session_id = record(engine, root, root, "run it").session_id
    call_id = f"call_{uuid.uuid4().hex}"
    store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash", rule="push")
    assert inbox.expire_pending(engine, session_id) == [call_id]
    with engine.connect() as conn:
        votes = conn.execute(
            select(ApprovalDecision.vote, ApprovalDecision.user_id, ApprovalDecision.rule).where(
                ApprovalDecision.call_id == call_id
            )
        ).all()
    assert [tuple(v) for v in votes] == [(Vote.EXPIRE, None, "push")]
    assert inbox.expire_pending(engine, session_id) == []
