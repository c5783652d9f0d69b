"""The database store, on SQLite and on PostgreSQL: the log, fencing, leases, approvals and the projections."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import TypeVar

import pytest
from sqlalchemy import Engine, select, text

from chatops import db, store
from chatops.budgets import OwnBudget, own_budget
from chatops.inbox import record_message
from chatops.queries import instructions_used
from chatops.schema import (
    ApprovalDecision,
    ApprovalState,
    Error,
    InboxCommand,
    Session,
    SessionEvent,
    SessionKind,
    SessionStatus,
    ToolCall,
    utcnow,
)
from mm_core.agent import ASK_REQUEST
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Compaction,
    Decision,
    ErrorRecord,
    Fenced,
    Nested,
    Outcome,
    Reset,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    ToolSuspended,
    TurnEnded,
    UserMessage,
    YoloSet,
    to_dict,
)

EVERY_KIND = [
    UserMessage("fix the build ✅", author="U01ALICE"),
    AssistantMessage(
        "Looking.",
        tool_calls=(ToolCallRequest("c1", "bash", '{"command": "make"}'), ToolCallRequest("c2", "read_file", "{}")),
        prompt_tokens=120,
        completion_tokens=9,
    ),
    Decision("c1", approved=True, by="U02BOB", all=True),
    ToolStarted("c1", "bash"),
    ToolResult("c1", "bash", "ok\n", status=CallStatus.OK, duration_ms=42),
    ToolStarted("c2", "read_file", agent="reviewer"),
    ToolResult("c2", "read_file", "", status=CallStatus.ERROR, duration_ms=0, agent="reviewer"),
    ToolSuspended("c2", "ask_agent"),
    Nested("c2", to_dict(UserMessage("review this"))),
    Compaction("they asked to fix the build", keep_from=3),
    ErrorRecord("the model stalled", where="generation"),
    TurnEnded(Outcome.ANSWERED),
    Reset(),
]


@pytest.fixture
def session_id(engine: Engine) -> str:
    return store.ensure_session(engine, channel_id="C0123ABCD", thread_ts=f"{uuid.uuid4().int % 10**10}.000100")


T = TypeVar("T")


def _concurrently(n: int, fn: Callable[[int], T]) -> list[T]:
    """fn(0) … fn(n-1) started together; an exception fails the test with the thread's own traceback."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []
    slots: dict[int, T] = {}

    def run(i: int) -> None:
        barrier.wait()
        try:
            slots[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return [slots[i] for i in range(n)]


def test_every_entry_kind_roundtrips(engine: Engine, session_id: str) -> None:
    log = store.DbStore(engine)
    for entry in EVERY_KIND:
        asyncio.run(log.append(session_id, entry))
    assert asyncio.run(log.load(session_id)) == EVERY_KIND
    with engine.connect() as conn:
        seqs = conn.execute(select(SessionEvent.seq).where(SessionEvent.session_id == session_id)).scalars().all()
    assert sorted(seqs) == list(range(len(EVERY_KIND)))


def test_unknown_session_is_refused(engine: Engine) -> None:
    with pytest.raises(store.UnknownSession):
        asyncio.run(store.DbStore(engine).append("no-such-session", UserMessage("hi")))
    assert asyncio.run(store.DbStore(engine).load("no-such-session")) == []


def test_concurrent_appends_get_distinct_seqs(engine: Engine, session_id: str) -> None:
    log = store.DbStore(engine)
    results = _concurrently(6, lambda i: asyncio.run(log.append(session_id, UserMessage(f"m{i}"))))
    assert results == [None] * 6
    assert sorted(asyncio.run(log.load(session_id)), key=str) == [UserMessage(f"m{i}") for i in range(6)]


def test_projections_into_tool_calls_and_errors(engine: Engine, session_id: str) -> None:
    log = store.DbStore(engine)
    for entry in EVERY_KIND[: EVERY_KIND.index(TurnEnded(Outcome.ANSWERED))]:
        asyncio.run(log.append(session_id, entry))
    asyncio.run(
        log.append(session_id, AssistantMessage("", tool_calls=(ToolCallRequest("c3", "bash", '{"command":"rm"}'),)))
    )
    asyncio.run(log.append(session_id, Decision("c3", approved=False, by="U02BOB")))
    asyncio.run(
        log.append(session_id, ToolResult("c3", "bash", "[command rejected by the user]", status=CallStatus.REJECTED))
    )
    with engine.connect() as conn:
        calls = conn.execute(select(ToolCall.__table__).where(ToolCall.session_id == session_id))
        rows = {r.call_id: r for r in calls}
        errors = conn.execute(select(Error.where, Error.message).where(Error.session_id == session_id)).all()
    c1, c2, c3 = rows["c1"], rows["c2"], rows["c3"]
    assert (c1.tool, c1.arguments, c1.output, c1.status, c1.duration_ms) == (
        "bash",
        '{"command": "make"}',
        "ok\n",
        "ok",
        42,
    )
    assert (c1.decision, c1.decided_by) == ("approved", "U02BOB")
    assert c1.started_at is not None and c1.finished_at >= c1.started_at and c1.finished_at.tzinfo is not None
    assert (c2.agent, c2.status, c2.output, c2.decision, c2.decided_by) == ("reviewer", "error", "", "auto", None)
    assert (c3.status, c3.decision, c3.started_at, c3.output) == (
        "rejected",
        "rejected",
        None,
        "[command rejected by the user]",
    )
    assert errors == [("generation", "the model stalled")]


def test_an_asked_agents_calls_are_projected_too(engine: Engine, session_id: str) -> None:
    log = store.DbStore(engine)
    nested = [
        AssistantMessage("", (ToolCallRequest("n1", "bash", '{"command": "ls"}'),), agent="reviewer"),
        ToolStarted("n1", "bash", agent="reviewer"),
        ToolResult("n1", "bash", "a.py\n", agent="reviewer", duration_ms=5),
    ]
    asyncio.run(log.append(session_id, Decision("n1", approved=True, by="U03CAROL")))
    for entry in nested:
        asyncio.run(log.append(session_id, Nested("ask-call", to_dict(entry))))
    with engine.connect() as conn:
        row = conn.execute(
            select(ToolCall.__table__).where(ToolCall.session_id == session_id, ToolCall.call_id == "n1")
        ).one()
    assert (row.tool, row.agent, row.arguments, row.output, row.decision, row.decided_by) == (
        "bash",
        "reviewer",
        '{"command": "ls"}',
        "a.py\n",
        "approved",
        "U03CAROL",
    )


def test_fencing_stops_an_expired_owner(engine: Engine, session_id: str) -> None:
    t0 = utcnow()
    old = store.acquire_lease(engine, session_id, "worker-a", ttl_s=30, now=t0)
    assert old is not None
    asyncio.run(store.DbStore(engine, lease_token=old).append(session_id, UserMessage("first")))

    # worker-a stalls past its lease; worker-b takes the session over.
    new = store.acquire_lease(engine, session_id, "worker-b", ttl_s=30, now=t0 + timedelta(seconds=31))
    assert new is not None and new > old
    with pytest.raises(Fenced):
        asyncio.run(store.DbStore(engine, lease_token=old).append(session_id, ErrorRecord("late write")))
    asyncio.run(store.DbStore(engine, lease_token=new).append(session_id, UserMessage("second")))

    assert asyncio.run(store.DbStore(engine).load(session_id)) == [UserMessage("first"), UserMessage("second")]
    with engine.connect() as conn:  # the fenced append's projection was not written either
        assert conn.execute(select(Error.message).where(Error.session_id == session_id)).all() == []
    assert not store.renew_lease(engine, session_id, old, ttl_s=30)
    assert not store.release_lease(engine, session_id, old)


def test_lease_compare_and_set(engine: Engine, session_id: str) -> None:
    tokens = _concurrently(5, lambda i: store.acquire_lease(engine, session_id, f"worker-{i}", ttl_s=60))
    winners = [t for t in tokens if t is not None]
    assert len(winners) == 1 and all(t is None or isinstance(t, int) for t in tokens)
    token = winners[0]

    assert store.acquire_lease(engine, session_id, "late", ttl_s=60) is None  # held and not expired
    assert store.renew_lease(engine, session_id, token, ttl_s=60)
    assert store.release_lease(engine, session_id, token)
    again = store.acquire_lease(engine, session_id, "next", ttl_s=60)
    assert again is not None and again == token + 1  # released: free to take, and the token still grows

    # An expired lease can be taken, and only once.
    later = utcnow() + timedelta(seconds=61)
    takers = _concurrently(4, lambda i: store.acquire_lease(engine, session_id, f"t{i}", ttl_s=60, now=later))
    assert [t for t in takers if t is not None] == [again + 1]


def test_approval_first_decision_wins(engine: Engine, session_id: str) -> None:
    call_id = f"call-{uuid.uuid4()}"
    row = store.request_approval(
        engine,
        call_id=call_id,
        session_id=session_id,
        tool="bash",
        arguments='{"command":"make"}',
        preview="make",
        requested_by="U01ALICE",
        timeout_s=1800,
    )
    assert row.state == ApprovalState.PENDING and row.expires_at is not None and row.expires_at > utcnow()
    # Asking again (a resumed turn) keeps the one row.
    assert store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash") == row

    outcomes = [
        bool(o) for o in _concurrently(6, lambda i: store.decide_approval(engine, call_id, i % 2 == 0, f"U0{i}"))
    ]
    assert outcomes.count(True) == 1 and outcomes.count(False) == 5
    winner = outcomes.index(True)
    decided = store.get_approval(engine, call_id)
    assert decided is not None
    assert (decided.state, decided.decided_by) == ("approved" if winner % 2 == 0 else "rejected", f"U0{winner}")
    assert not store.decide_approval(engine, call_id, True, "U09LATE")

    store.set_approval_message(engine, call_id, "1700000000.000200")
    shown = store.get_approval(engine, call_id)
    assert shown is not None and shown.message_ts == "1700000000.000200"


def _votes(engine: Engine, call_id: str) -> list[tuple[str | None, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(ApprovalDecision.user_id, ApprovalDecision.vote)
            .where(ApprovalDecision.call_id == call_id)
            .order_by(ApprovalDecision.id)
        )
        return [(user, vote) for user, vote in rows]


def test_a_two_person_call_is_approved_by_the_second_distinct_approver_whoever_clicks_at_once(
    engine: Engine, session_id: str
) -> None:
    """Six approvers click Approve on a call that needs two, all at once: one is counted first, one more
    approves it, the other four change nothing. Every counted click is its own appended row."""
    call_id = f"call-{uuid.uuid4()}"
    store.request_approval(
        engine, call_id=call_id, session_id=session_id, tool="bash", rule="push", needed=2, requested_by="U0ALICE"
    )
    outcomes = _concurrently(6, lambda i: store.decide_approval(engine, call_id, True, f"U0{i}"))
    assert sorted(outcomes) == sorted([store.Counted.VOTED, store.Counted.DECIDED] + [store.Counted.NOTHING] * 4)
    row = store.get_approval(engine, call_id)
    assert row is not None and row.state == ApprovalState.APPROVED and len(row.approved_by) == 2
    assert row.decided_by == row.approved_by[1] and row.approved_by[0] != row.approved_by[1]
    assert [vote for _, vote in _votes(engine, call_id)] == ["approve", "approve"]
    assert all(user in row.approved_by for user, _ in _votes(engine, call_id))


def test_the_same_approver_twice_counts_once_and_a_rejection_ends_a_two_person_call(
    engine: Engine, session_id: str
) -> None:
    twice, rejected = f"call-{uuid.uuid4()}", f"call-{uuid.uuid4()}"
    for call_id in (twice, rejected):
        store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash", rule="push", needed=2)
    assert store.decide_approval(engine, twice, True, "U0BOB") is store.Counted.VOTED
    assert store.decide_approval(engine, twice, True, "U0BOB") is store.Counted.NOTHING
    row = store.get_approval(engine, twice)
    assert row is not None and row.state == ApprovalState.PENDING and row.approved_by == ("U0BOB",) and row.missing == 1
    assert store.decide_approval(engine, twice, True, "U0CAROL") is store.Counted.DECIDED
    assert _votes(engine, twice) == [("U0BOB", "approve"), ("U0CAROL", "approve")]

    assert store.decide_approval(engine, rejected, True, "U0BOB") is store.Counted.VOTED
    assert store.decide_approval(engine, rejected, False, "U0DAVE") is store.Counted.DECIDED
    row = store.get_approval(engine, rejected)
    assert row is not None and (row.state, row.decided_by) == (ApprovalState.REJECTED, "U0DAVE")
    assert _votes(engine, rejected) == [("U0BOB", "approve"), ("U0DAVE", "reject")]


def test_an_approver_may_take_their_approval_back_and_nobody_s_decision_never_counts_for_two(
    engine: Engine, session_id: str
) -> None:
    withdrawn, odd = f"call-{uuid.uuid4()}", f"call-{uuid.uuid4()}"
    for call_id in (withdrawn, odd):
        store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash", rule="push", needed=2)
    assert store.decide_approval(engine, withdrawn, True, "U0BOB") is store.Counted.VOTED
    assert store.decide_approval(engine, withdrawn, False, "U0BOB") is store.Counted.DECIDED
    assert _votes(engine, withdrawn) == [("U0BOB", "approve"), ("U0BOB", "reject")]
    # A decision that names no Slack user (a sentence, a malformed id) is never one of the people a call needs.
    assert store.decide_approval(engine, odd, True, "u-odd") is store.Counted.NOTHING
    assert store.decide_approval(engine, odd, True, "u-odd") is store.Counted.NOTHING
    row = store.get_approval(engine, odd)
    assert row is not None and row.state == ApprovalState.PENDING and _votes(engine, odd) == []


def test_approve_all_covers_only_a_call_the_tools_own_gating_asked_of_the_channel() -> None:
    plain = store.ApprovalRow("c", "s", "bash", None, None, None, "U0A", ApprovalState.PENDING, None, None, None, None)
    assert store.covered_by_approve_all(plain)
    assert not store.covered_by_approve_all(replace(plain, rule="push"))
    assert not store.covered_by_approve_all(replace(plain, needed=2))
    assert not store.covered_by_approve_all(replace(plain, approvers=("U0BOB", "S0ONCALL")))  # escalated


def test_what_an_approval_shows_survives_storage_exactly_nul_included(engine: Engine, session_id: str) -> None:
    """Issue 21, second round: a NUL in a preview became U+FFFD on its way into the row (PostgreSQL text cannot hold
    it), so the message showed `�` and no warning. The row keeps it (and a lone surrogate, and U+FFFD itself)
    reversibly: the message shows `\\u0000` and says so."""
    from slackio.approval_message import approval_blocks, layout

    command = "printf 'a\x00b' > f; echo \ufffd0000 \udc80"
    row = store.request_approval(
        engine,
        call_id=f"call-{uuid.uuid4()}",
        session_id=session_id,
        tool="bash",
        title=f"🛠️ bash: {command}",
        arguments=json.dumps({"command": command}, ensure_ascii=False),
        preview=command,
    )
    assert (row.preview, row.title) == (command, f"🛠️ bash: {command}")
    assert json.loads(row.arguments or "")["command"] == command
    shown = layout(row)
    assert shown.invisible and shown.text == "printf 'a\\u0000b' > f; echo \ufffd0000 \\udc80"
    blocks, _ = approval_blocks(row, "C1")
    assert "invisible or reordering characters" in json.dumps(blocks)


def test_approvals_expire_once_and_cannot_be_decided_late(engine: Engine, session_id: str) -> None:
    t0 = utcnow()
    soon, later = f"soon-{uuid.uuid4()}", f"later-{uuid.uuid4()}"
    store.request_approval(engine, call_id=soon, session_id=session_id, tool="bash", timeout_s=60, now=t0)
    store.request_approval(engine, call_id=later, session_id=session_id, tool="bash", timeout_s=3600, now=t0)

    t1 = t0 + timedelta(seconds=61)
    assert not store.decide_approval(engine, soon, True, "U02BOB", now=t1)  # past its time, even before expiry ran
    expired = store.expire_approvals(engine, now=t1)
    assert [a.call_id for a in expired if a.session_id == session_id] == [soon]
    assert expired[0].state == "expired"
    assert [a.call_id for a in store.expire_approvals(engine, now=t1) if a.session_id == session_id] == []
    assert store.decide_approval(engine, later, False, "U02BOB", now=t1)
    assert _votes(engine, soon) == [(None, "expire")]  # the expiry is appended as nobody's decision, once


def test_call_id_of_another_session_is_refused(engine: Engine, session_id: str) -> None:
    other = store.ensure_session(engine, channel_id="C0123ABCD", thread_ts=f"{uuid.uuid4().int % 10**10}.9")
    call_id = f"call-{uuid.uuid4()}"
    store.request_approval(engine, call_id=call_id, session_id=session_id, tool="bash")
    with pytest.raises(ValueError, match="already used by another session"):
        store.request_approval(engine, call_id=call_id, session_id=other, tool="bash")


def test_ensure_session_is_one_per_thread(engine: Engine) -> None:
    ts = f"{uuid.uuid4().int % 10**10}.000300"
    ids = _concurrently(4, lambda i: store.ensure_session(engine, channel_id="C0999", thread_ts=ts, requester="U1"))
    assert len(set(ids)) == 1 and isinstance(ids[0], str)
    job_a = store.ensure_session(engine, channel_id="C0999", thread_ts=None, kind=SessionKind.JOB)
    job_b = store.ensure_session(engine, channel_id="C0999", thread_ts=None, kind=SessionKind.JOB)
    assert job_a != job_b


def test_status_compare_and_set_and_slack_event_dedupe(engine: Engine, session_id: str) -> None:
    assert store.set_status(engine, session_id, SessionStatus.QUEUED, expect=SessionStatus.IDLE)
    assert not store.set_status(engine, session_id, SessionStatus.QUEUED, expect=SessionStatus.IDLE)
    event_id = f"Ev{uuid.uuid4().hex[:10]}"
    firsts = _concurrently(4, lambda i: store.record_slack_event(engine, event_id))
    assert sorted(firsts) == [False, False, False, True]


def test_hostile_text_never_fails_an_append(engine: Engine, session_id: str) -> None:
    """The log keeps what happened exactly; the projections store what their columns can hold.

    PostgreSQL refuses NUL in text and overlong strings, and no driver encodes a lone surrogate: a `bash`
    command printing a binary file, a model inventing a 300-character tool name or sending broken JSON
    escapes must not make the turn's append fail.
    """
    log = store.DbStore(engine)
    entries = [
        AssistantMessage("", tool_calls=(ToolCallRequest("h1", "b" * 300, '{"a": "\x00\ud800"}'),)),
        ToolStarted("h1", "bash", agent="a" * 300),
        ToolResult("h1", "bash", "ELF\x00\x01\x02 \udc80 done", duration_ms=3),
        Decision("h1", approved=True, by="U" * 100),
        ErrorRecord("bad \x00 byte \ud800", where="w" * 100),
    ]
    for entry in entries:
        asyncio.run(log.append(session_id, entry))
    assert asyncio.run(log.load(session_id)) == entries
    with engine.connect() as conn:
        row = conn.execute(
            select(ToolCall.__table__).where(ToolCall.session_id == session_id, ToolCall.call_id == "h1")
        ).one()
        error = conn.execute(select(Error.where, Error.message).where(Error.session_id == session_id)).one()
    assert row.tool == "bash" and row.agent == "a" * 100 and row.decided_by == "U" * 64
    assert row.arguments == '{"a": "\ufffd\ufffd"}'
    assert row.output == "ELF\ufffd\x01\x02 \ufffd done"
    assert error == ("w" * 64, "bad \ufffd byte \ufffd")
    store.record_error(engine, "x" * 100, "late \x00", session_id=session_id)
    approval = store.request_approval(
        engine,
        call_id=f"call-{uuid.uuid4()}",
        session_id=session_id,
        tool="t" * 300,
        arguments="\x00",
        preview="ELF\x00\udc80",
        requested_by="U" * 100,
    )
    # What a person is shown is kept exactly (issue 21): the row's texts read back as they were given.
    assert (approval.tool, approval.arguments, approval.preview) == ("t" * 100, "\x00", "ELF\x00\udc80")


def test_approval_for_an_unknown_session_says_so(engine: Engine) -> None:
    with pytest.raises(store.UnknownSession):
        store.request_approval(engine, call_id=f"call-{uuid.uuid4()}", session_id="no-such-session", tool="bash")


def _event_seq(engine: Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(select(Session.event_seq).where(Session.id == session_id)).scalar_one()


def _seqs(engine: Engine, session_id: str) -> list[int]:
    with engine.connect() as conn:
        query = select(SessionEvent.seq).where(SessionEvent.session_id == session_id).order_by(SessionEvent.seq)
        return list(conn.execute(query).scalars())


def test_the_next_seq_stays_right_under_concurrent_and_fenced_appends(engine: Engine, session_id: str) -> None:
    """sessions.event_seq is the log's next seq: concurrent appends take distinct ones with no gap, and an
    append refused (fenced, or an empty inbox taken) gives its seq back."""
    assert _event_seq(engine, session_id) == 0
    old = store.acquire_lease(engine, session_id, "worker-a", ttl_s=30)
    assert old is not None
    log = store.DbStore(engine, lease_token=old)
    _concurrently(6, lambda i: asyncio.run(log.append(session_id, UserMessage(f"m{i}"))))
    assert _seqs(engine, session_id) == list(range(6)) and _event_seq(engine, session_id) == 6

    assert log.take_inbox(session_id) is None  # nothing to take: no entry, no seq used
    assert _event_seq(engine, session_id) == 6

    new = store.acquire_lease(engine, session_id, "worker-b", ttl_s=30, now=utcnow() + timedelta(seconds=31))
    assert new is not None
    with pytest.raises(Fenced):
        asyncio.run(log.append(session_id, AssistantMessage("late", tool_calls=(ToolCallRequest("f1", "bash", "{}"),))))
    with pytest.raises(Fenced):
        log.take_inbox(session_id)
    assert _event_seq(engine, session_id) == 6
    with engine.connect() as conn:  # the fenced append's projection was rolled back with it
        assert conn.execute(select(ToolCall.id).where(ToolCall.session_id == session_id)).all() == []

    asyncio.run(store.DbStore(engine, lease_token=new).append(session_id, UserMessage("after")))
    assert _seqs(engine, session_id) == list(range(7)) and _event_seq(engine, session_id) == 7
    assert asyncio.run(store.DbStore(engine).load(session_id))[-1] == UserMessage("after")


def _call_row(engine: Engine, session_id: str, call_id: str):
    with engine.connect() as conn:
        return conn.execute(
            select(ToolCall.__table__).where(ToolCall.session_id == session_id, ToolCall.call_id == call_id)
        ).one()


def test_the_call_upsert_keeps_a_decision_and_what_was_not_given(engine: Engine, session_id: str) -> None:
    log = store.DbStore(engine)
    # Decided before it started: the start does not make it "auto"; a result keeps what it does not give.
    asyncio.run(log.append(session_id, Decision("k1", approved=False, by="U02BOB")))
    asyncio.run(log.append(session_id, ToolStarted("k1", "bash", agent="reviewer")))
    asyncio.run(log.append(session_id, ToolResult("k1", "bash", "out", status=CallStatus.REJECTED, duration_ms=7)))
    k1 = _call_row(engine, session_id, "k1")
    assert (k1.tool, k1.agent, k1.decision, k1.decided_by, k1.status, k1.output, k1.duration_ms) == (
        "bash",
        "reviewer",
        "rejected",
        "U02BOB",
        "rejected",
        "out",
        7,
    )
    assert k1.started_at is not None and k1.finished_at is not None

    # Started with no decision: "auto", kept by a second start; a Decision after it is recorded.
    asyncio.run(
        log.append(session_id, AssistantMessage("", tool_calls=(ToolCallRequest("k2", "read_file", '{"p": 1}'),)))
    )
    k2 = _call_row(engine, session_id, "k2")
    assert (k2.tool, k2.arguments, k2.status, k2.decision, k2.started_at) == (
        "read_file",
        '{"p": 1}',
        "requested",
        None,
        None,
    )
    asyncio.run(log.append(session_id, ToolStarted("k2", "read_file")))
    asyncio.run(log.append(session_id, ToolStarted("k2", "read_file")))
    k2 = _call_row(engine, session_id, "k2")
    assert (k2.status, k2.decision, k2.decided_by, k2.arguments) == ("running", "auto", None, '{"p": 1}')
    asyncio.run(log.append(session_id, Decision("k2", approved=True, by=None)))
    assert _call_row(engine, session_id, "k2").decision == "approved"

    # A decision for a call never requested creates its row, with no tool yet.
    asyncio.run(log.append(session_id, Decision("k3", approved=True, by="U03CAROL")))
    k3 = _call_row(engine, session_id, "k3")
    assert (k3.tool, k3.status, k3.decision, k3.decided_by, k3.agent) == ("", "requested", "approved", "U03CAROL", None)

    # Several calls in one message: each its row.
    calls = tuple(ToolCallRequest(f"m{i}", "bash", f'{{"i": {i}}}') for i in range(3))
    asyncio.run(log.append(session_id, AssistantMessage("", tool_calls=calls, agent="helper")))
    for i in range(3):
        row = _call_row(engine, session_id, f"m{i}")
        assert (row.tool, row.arguments, row.agent) == ("bash", f'{{"i": {i}}}', "helper")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_migration_sets_the_next_seq_of_existing_logs(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "fresh_pg_url")
    db.migrate(url, "0001")
    engine = db.engine_for(url)
    try:
        with engine.begin() as conn:
            for sid, kind in (("s-with-log", "thread"), ("s-empty", "job")):
                conn.execute(
                    text(
                        "INSERT INTO sessions (id, kind, status, lease_token, created_at, updated_at)"
                        " VALUES (:id, :kind, 'idle', 0, :now, :now)"
                    ),
                    {"id": sid, "kind": kind, "now": utcnow()},
                )
            for seq in range(3):
                conn.execute(
                    text(
                        "INSERT INTO session_events (session_id, seq, kind, payload, created_at)"
                        " VALUES ('s-with-log', :seq, 'user', :payload, :now)"
                    ),
                    {"seq": seq, "payload": json.dumps(to_dict(UserMessage(f"m{seq}"))), "now": utcnow()},
                )
        db.migrate(url)
        engine.dispose()
        assert (_event_seq(engine, "s-with-log"), _event_seq(engine, "s-empty")) == (3, 0)
        asyncio.run(store.DbStore(engine).append("s-with-log", UserMessage("m3")))
        asyncio.run(store.DbStore(engine).append("s-empty", UserMessage("first")))
        assert _seqs(engine, "s-with-log") == [0, 1, 2, 3] and _seqs(engine, "s-empty") == [0]
        assert asyncio.run(store.DbStore(engine).load("s-with-log")) == [UserMessage(f"m{i}") for i in range(4)]
    finally:
        engine.dispose()


def test_a_taken_command_appends_the_entries_it_stands_for(engine: Engine) -> None:
    """`new` starts the conversation again, `yolo on|off` is said in it (by whom), `compact` waits for the model's
    summary, `ask` is the request and its ask_agent call: each in the transaction that takes the command."""
    thread = f"{uuid.uuid4().int % 10**10}.000100"
    commands = [
        (InboxCommand.YOLO, "on"),
        (InboxCommand.YOLO, "off"),
        (InboxCommand.NEW, ""),
        (InboxCommand.COMPACT, ""),
        (InboxCommand.ASK, json.dumps({"agent": "reviewer", "prompt": "look"})),
    ]
    [session_id] = {
        record_message(
            engine,
            channel_id="C0123ABCD",
            thread_ts=thread,
            message_ts=f"{thread[:-6]}{n:06d}",
            user_id="U01ALICE",
            text=argument,
            command=command,
        ).session_id
        for n, (command, argument) in enumerate(commands)
    }
    log = store.DbStore(engine)
    taken = [log.take_command(session_id) for _ in commands]
    assert [t.command if t else None for t in taken] == [c for c, _ in commands]
    entries = asyncio.run(log.load(session_id))
    assert entries[:3] == [YoloSet(True, "U01ALICE"), YoloSet(False, "U01ALICE"), Reset()]
    asked, call = entries[3:]
    assert asked == UserMessage(ASK_REQUEST.format(agent="reviewer", prompt="look"), "U01ALICE")
    assert isinstance(call, AssistantMessage) and [c.name for c in call.tool_calls] == ["ask_agent"]
    assert json.loads(call.tool_calls[0].arguments) == {"agent": "reviewer", "prompt": "look"}


def test_the_tool_calls_table_says_who_asked_for_a_call(engine: Engine, session_id: str) -> None:
    log = store.DbStore(engine)
    asyncio.run(log.append(session_id, AssistantMessage("", tool_calls=(ToolCallRequest("c1", "bash", "{}"),))))
    asyncio.run(log.append(session_id, ToolResult("c1", "bash", "ok", requested_by="U01ALICE,U02BOB")))
    with engine.connect() as conn:
        row = conn.execute(select(ToolCall.requested_by).where(ToolCall.session_id == session_id)).one()
    assert row.requested_by == "U01ALICE,U02BOB"


def test_an_error_outside_any_turn_is_kept_for_the_operators_and_logged(
    engine: Engine, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger=store.log.name):
        store.record_error(engine, "slack", "chat.postMessage failed", session_id=session_id, detail={"error": "x"})
    with engine.connect() as conn:
        rows = conn.execute(
            select(Error.where, Error.message, Error.detail).where(Error.session_id == session_id)
        ).all()
    assert [tuple(r) for r in rows] == [("slack", "chat.postMessage failed", {"error": "x"})]
    assert "error (slack): chat.postMessage failed" in caplog.text


def test_a_threads_own_settings_are_kept_side_by_side(engine: Engine, session_id: str) -> None:
    """`model=NAME`, `budget N` and what the latest turn used each set their own key of the thread's settings and
    keep the others."""
    assert store.thread_model(engine, session_id) is None
    store.set_model(engine, session_id, "big")
    store.set_budget(engine, session_id, 5000, "U01ALICE", approver=True)
    store.set_instructions_used(engine, session_id, {"files": ["AGENTS.md"]})
    assert store.thread_model(engine, session_id) == "big"
    assert own_budget(engine, session_id) == OwnBudget(5000, "U01ALICE", True)
    assert instructions_used(engine, session_id) == {"files": ["AGENTS.md"]}
    store.set_budget(engine, session_id, 100, "U02BOB", approver=False)
    assert own_budget(engine, session_id) == OwnBudget(100, "U02BOB", False)
    assert store.thread_model(engine, session_id) == "big"
