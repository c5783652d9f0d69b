"""A session's life (chatops.sessions): `next_step` over every snapshot hypothesis makes, in milliseconds; the same
snapshots written into SQLite, to check that the read gives them back, that what the store then takes agrees with
the decision, and that housekeeping's query and `needs_worker` agree on every one."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, insert, update

from chatops import db, sessions, store
from chatops.inbox import record_message
from chatops.schema import Approval, ApprovalState, InboxCommand, InboxMessage, Session, SessionKind, SessionStatus
from chatops.sessions import Command, Idle, Resume, Snapshot, Start, Stop, Turn, Wait, Waiting, next_step
from chatops.store import ApprovalRow
from mm_core.log import AssistantMessage, Decision, Outcome, ToolCallRequest, TurnEnded, UserMessage

CALLS = ("call_a", "call_b", "call_c")
COMMANDS = (None, None, *InboxCommand)  # mostly messages
NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def approval(call_id: str, state: ApprovalState, *, by: str | None = "U0BOB", everything: bool = False) -> ApprovalRow:
    return ApprovalRow(
        call_id,
        "s",
        "bash",
        None,
        None,
        None,
        "U0ALICE",
        state,
        None if state == ApprovalState.PENDING else by,
        None,
        None,
        None,
        approve_all=everything,
        shown="digest",
    )


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Any session a worker may find, within the one invariant the service keeps: an idle session has no open
    turn (a turn's status goes back to idle only once it ended)."""
    status = draw(st.sampled_from(list(SessionStatus)))
    is_open = status != SessionStatus.IDLE and draw(st.booleans())
    waiting = frozenset(draw(st.sets(st.sampled_from(CALLS)))) if is_open else frozenset()
    decided = frozenset(draw(st.sets(st.sampled_from(CALLS))))
    states = draw(st.dictionaries(st.sampled_from(CALLS), st.sampled_from(list(ApprovalState))))
    approvals = tuple(approval(c, s, everything=draw(st.booleans())) for c, s in states.items())
    rows = draw(st.lists(st.tuples(st.sampled_from(COMMANDS), st.booleans()), max_size=5))
    return Snapshot(
        id="s",
        kind=draw(st.sampled_from(list(SessionKind))),
        status=status,
        stop_requested=draw(st.booleans()),
        approvals=approvals,
        inbox=tuple(Waiting(i, command, person) for i, (command, person) in enumerate(rows)),
        turn=Turn(is_open, waiting, decided),
        lease_owner=draw(st.none() | st.just("worker-1")),
        lease_expires_at=draw(st.none() | st.sampled_from([NOW - timedelta(seconds=1), NOW + timedelta(seconds=30)])),
        updated_at=draw(st.sampled_from([NOW - timedelta(seconds=120), NOW - timedelta(seconds=5), NOW])),
    )


def new_decisions(snap: Snapshot) -> list[str]:
    assert snap.turn is not None
    return [
        a.call_id
        for a in snap.approvals
        if a.state != ApprovalState.PENDING and a.call_id in snap.turn.waiting and a.call_id not in snap.turn.decided
    ]


# --- next_step, pure --------------------------------------------------------------------------------------------


def expected(snap: Snapshot, people: bool) -> type | Stop | Wait | Command | Start | Idle:
    """The session's rules in their order, as the issue states them: the step next_step must give (for a resume,
    its type: the decisions are checked on their own)."""
    assert snap.turn is not None
    awaiting = snap.status == SessionStatus.AWAITING_APPROVAL
    pending = any(a.state == ApprovalState.PENDING for a in snap.approvals)
    if snap.stop_requested:
        return Stop(snap.turn.open)  # a stop comes first: before any wait, any clone, any message
    if awaiting and pending:
        return Wait()
    if snap.turn.open:
        # Nothing pending: it goes on, with the new decisions or none (then the loop asks its calls again).
        return Resume
    first = snap.inbox[0] if snap.inbox else None
    if first is not None and first.command is not None:
        # A command runs in its own turn; a person's waits for a running job's end, like their messages.
        return Command(first.command) if people or not first.by_person else Idle()
    upto = next((i for i, w in enumerate(snap.inbox) if w.command), len(snap.inbox))
    takes = [w for w in snap.inbox[:upto] if people or not w.by_person]
    return Start(len(takes)) if takes else Idle()


def check(snap: Snapshot, people: bool) -> None:
    step, want = next_step(snap, people=people), expected(snap, people)
    if want is Resume:
        assert isinstance(step, Resume)
        assert step.after_crash == (snap.status != SessionStatus.AWAITING_APPROVAL)
        assert [d.call_id for d in step.decisions] == new_decisions(snap)
    else:
        assert step == want


@given(snapshots(), st.booleans())
def test_next_step_follows_the_sessions_rules_in_their_order(snap: Snapshot, people: bool) -> None:
    check(snap, people)


def test_next_step_on_every_session_of_one_call_and_one_inbox_row() -> None:
    """Exhaustively, over a space small enough to list: every status, stop, open turn, state of one call's
    approval, whether the turn waits for it and whether the log decided it, first inbox row, and job run."""
    rows = [(), (Waiting(1, None, True),), (Waiting(1, None, False),)]
    rows += [(Waiting(1, c, p),) for c in InboxCommand for p in (True, False)]
    states: list[ApprovalState | None] = [None, *ApprovalState]
    space = itertools.product(SessionStatus, (True, False), (True, False), states, (True, False), (True, False), rows)
    count = 0
    for status, stop, is_open, state, waits, decided, inbox in space:
        if status == SessionStatus.IDLE and is_open:
            continue  # the invariant: an idle session has no open turn
        snap = Snapshot(
            "s",
            SessionKind.THREAD,
            status,
            stop_requested=stop,
            approvals=() if state is None else (approval("call_a", state),),
            inbox=inbox,
            turn=Turn(
                is_open, frozenset({"call_a"} if waits and is_open else ()), frozenset({"call_a"} if decided else ())
            ),
        )
        for people in (True, False):
            check(snap, people)
            count += 1
    assert count == 7 * 2 * 5 * 2 * 2 * 11 * 2  # (status, open turn) pairs, stop, state, waits, decided, row, job


@given(snapshots())
def test_decisions_are_the_tables_for_the_waiting_calls_an_expired_call_rejected(snap: Snapshot) -> None:
    step = next_step(snap)
    if not isinstance(step, Resume):
        return
    by_call = {a.call_id: a for a in snap.approvals}
    for decision in step.decisions:
        row = by_call[decision.call_id]
        assert decision.approved == (row.state == ApprovalState.APPROVED)
        assert decision.all == row.approve_all and decision.shown == "digest"
    assert {r.call_id for r in step.expired} == {
        d.call_id for d in step.decisions if by_call[d.call_id].state == ApprovalState.EXPIRED
    }


@given(snapshots(), st.booleans())
def test_a_session_that_wants_no_work_is_left_alone(snap: Snapshot, people: bool) -> None:
    """What housekeeping leaves (wants_work false), a worker given it anyway does nothing with."""
    if not sessions.wants_work(snap):
        assert next_step(snap, people=people) in (Wait(), Idle())


@given(snapshots())
def test_a_session_housekeeping_enqueues_is_never_one_the_worker_leaves_waiting(snap: Snapshot) -> None:
    """The two forms agree: what housekeeping counts as work, a worker does not answer with a wait (which would
    return it to the queue at once, task after task: a waiting turn with nothing pending whose decisions were all
    in its log, or were never asked, once did)."""
    assert not (sessions.wants_work(snap) and next_step(snap) == Wait())


def test_next_step_needs_the_log() -> None:
    with pytest.raises(ValueError, match="with its log"):
        next_step(Snapshot("s", SessionKind.THREAD, SessionStatus.IDLE))


def test_examples() -> None:
    idle = Snapshot("s", SessionKind.THREAD, SessionStatus.IDLE, turn=Turn(False))
    assert next_step(idle) == Idle()
    asked = Snapshot("s", SessionKind.THREAD, SessionStatus.QUEUED, inbox=(Waiting(1, None, True),), turn=Turn(False))
    assert next_step(asked) == Start(1)
    assert next_step(asked, people=False) == Idle()  # a person's message waits for the job run's end
    waiting = Snapshot(
        "s",
        SessionKind.THREAD,
        SessionStatus.AWAITING_APPROVAL,
        approvals=(approval("call_a", ApprovalState.APPROVED), approval("call_b", ApprovalState.EXPIRED)),
        turn=Turn(True, frozenset({"call_a", "call_b"})),
    )
    step = next_step(waiting)
    assert step == Resume(
        (
            Decision("call_a", True, "U0BOB", shown="digest"),
            Decision("call_b", False, "U0BOB", shown="digest"),
        ),
        (waiting.approvals[1],),
        after_crash=False,
    )


# --- on SQLite: the read, the store, housekeeping's query ---------------------------------------------------------


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('sessions')) / 'mm.sqlite3'}"
    db.migrate(url)
    engine = db.engine_for(url)
    yield engine
    engine.dispose()


def write(engine: Engine, snap: Snapshot) -> str:
    """The snapshot as rows: the session, its log (a turn open with its calls, or ended), its approvals, its inbox."""
    assert snap.turn is not None
    session_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            insert(Session).values(
                id=session_id,
                kind=snap.kind,
                channel_id="C0LIFE",
                thread_ts=session_id,
                status=SessionStatus.IDLE,
                updated_at=snap.updated_at or NOW,
            )
        )
    log = store.DbStore(engine)
    asyncio.run(log.append(session_id, UserMessage("hi", "U0ALICE")))
    calls = {c: f"{session_id}-{c}" for c in CALLS}  # call ids are unique across sessions
    if snap.turn.open:
        requests = tuple(ToolCallRequest(calls[c], "bash", "{}") for c in sorted(snap.turn.waiting))
        asyncio.run(log.append(session_id, AssistantMessage("", requests)))
        for c in sorted(snap.turn.decided & snap.turn.waiting):
            asyncio.run(log.append(session_id, Decision(calls[c], True, "U0BOB")))
    else:
        asyncio.run(log.append(session_id, TurnEnded(Outcome.ANSWERED)))
    with engine.begin() as conn:
        for a in snap.approvals:
            conn.execute(
                insert(Approval).values(
                    call_id=calls[a.call_id],
                    session_id=session_id,
                    tool="bash",
                    requested_by=a.requested_by,
                    state=a.state,
                    decided_by=a.decided_by,
                    approve_all=a.approve_all,
                    shown=a.shown,
                    created_at=NOW,
                    rule=a.rule,
                    needed=a.needed,
                )
            )
        for w in snap.inbox:
            conn.execute(
                insert(InboxMessage).values(
                    session_id=session_id,
                    message_ts=f"{w.id}.0",
                    user_id="U0ALICE" if w.by_person else None,
                    text=json.dumps({"agent": "a", "prompt": "p"}) if w.command == InboxCommand.ASK else "on",
                    command=w.command,
                    created_at=NOW,
                )
            )
        conn.execute(
            update(Session)
            .where(Session.id == session_id)
            .values(
                status=snap.status,
                stop_requested_at=NOW if snap.stop_requested else None,
                lease_owner=snap.lease_owner,
                lease_expires_at=snap.lease_expires_at,
                updated_at=snap.updated_at or NOW,
            )
        )
    return session_id


def read(engine: Engine, session_id: str) -> Snapshot:
    snap = sessions.snapshot(engine, session_id)
    assert snap is not None
    return snap


def decided_in_log(snap: Snapshot) -> frozenset[str]:
    assert snap.turn is not None
    return snap.turn.decided & snap.turn.waiting if snap.turn.open else frozenset()


SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SLOW
@given(snapshots())
def test_the_read_gives_back_what_was_written(lite: Engine, snap: Snapshot) -> None:
    found = read(lite, write(lite, snap))
    assert found.status == snap.status and found.stop_requested == snap.stop_requested and found.has_log
    assert [(w.command, w.by_person) for w in found.inbox] == [(w.command, w.by_person) for w in snap.inbox]
    assert sorted(a.state for a in found.approvals) == sorted(a.state for a in snap.approvals)
    assert found.turn is not None and snap.turn is not None
    assert found.turn.open == snap.turn.open
    strip = len(found.id) + 1
    assert {c[strip:] for c in found.turn.waiting} == snap.turn.waiting
    assert {c[strip:] for c in found.turn.decided} == decided_in_log(snap)


@SLOW
@given(snapshots(), st.booleans())
def test_what_the_store_takes_agrees_with_the_decision(lite: Engine, snap: Snapshot, people: bool) -> None:
    session_id = write(lite, snap)
    step = next_step(read(lite, session_id), people=people)
    taker = store.DbStore(lite)
    if isinstance(step, Command):
        taken = taker.take_command(session_id, people=people)
        assert taken is not None and taken.command == step.command
    elif isinstance(step, Start):
        assert taker.take_command(session_id, people=people) is None
        assert taker.take_inbox(session_id, people=people) is not None
    elif isinstance(step, Idle) and not (snap.turn and snap.turn.open):
        assert taker.take_command(session_id, people=people) is None
        assert taker.take_inbox(session_id, people=people) is None


@SLOW
@given(snapshots(), st.sampled_from([0.0, 10.0, 60.0]))
def test_housekeepings_query_and_needs_worker_agree(lite: Engine, snap: Snapshot, quiet_s: float) -> None:
    session_id = write(lite, snap)
    found = read(lite, session_id)
    queried = session_id in sessions.sessions_with_work(lite, quiet_s=quiet_s, now=NOW, only=session_id)
    assert queried == sessions.needs_worker(found, NOW, quiet_s)
    assert queried == sessions.needs_worker(snap, NOW, quiet_s)  # the read lost nothing the rules look at


# --- deciding -------------------------------------------------------------------------------------------------


def test_approve_all_decides_the_requesters_other_readable_calls_in_one_go(lite: Engine) -> None:
    snap = Snapshot(
        "s",
        SessionKind.THREAD,
        SessionStatus.AWAITING_APPROVAL,
        approvals=tuple(approval(c, ApprovalState.PENDING) for c in CALLS),
        turn=Turn(True, frozenset(CALLS)),
    )
    session_id = write(lite, snap)
    calls = [f"{session_id}-{c}" for c in CALLS]
    assert sessions.waits_for_people(lite, session_id)
    unreadable = calls[2]
    decided = sessions.decide(
        lite, calls[0], True, "U0BOB", everything=True, readable=lambda row: row.call_id != unreadable
    )
    assert decided == sessions.Decided(tuple(calls[:2]))
    # decided already: a later click changes nothing
    assert sessions.decide(lite, calls[0], False, "U0CAROL") == sessions.Decided()
    assert sessions.waits_for_people(lite, session_id)  # the unreadable one waits for its own decision
    assert sessions.decide(lite, unreadable, False, "U0BOB") == sessions.Decided((unreadable,))
    assert not sessions.waits_for_people(lite, session_id)
    step = next_step(read(lite, session_id))
    assert isinstance(step, Resume) and [d.approved for d in step.decisions] == [True, True, False]


def test_approve_all_never_crosses_a_rule(lite: Engine) -> None:
    """A call a policy rule asks for is decided on its own: an "Approve all" of a lighter call leaves it waiting,
    and one clicked on it approves it alone and grants nobody anything (the log's Decision has no `all`)."""
    ruled = replace(approval(CALLS[1], ApprovalState.PENDING), rule="CI files")
    snap = Snapshot(
        "s",
        SessionKind.THREAD,
        SessionStatus.AWAITING_APPROVAL,
        approvals=(approval(CALLS[0], ApprovalState.PENDING), ruled, approval(CALLS[2], ApprovalState.PENDING)),
        turn=Turn(True, frozenset(CALLS)),
    )
    session_id = write(lite, snap)
    calls = [f"{session_id}-{c}" for c in CALLS]
    assert sessions.decide(lite, calls[0], True, "U0BOB", everything=True).calls == (calls[0], calls[2])
    assert sessions.waits_for_people(lite, session_id)
    assert sessions.decide(lite, calls[1], True, "U0BOB", everything=True).calls == (calls[1],)
    step = next_step(read(lite, session_id))
    assert isinstance(step, Resume)
    assert [(d.approved, d.all) for d in step.decisions] == [(True, True), (True, False), (True, False)]


def test_a_click_towards_a_call_that_needs_two_people_is_a_vote_until_the_second(lite: Engine) -> None:
    two = replace(approval(CALLS[0], ApprovalState.PENDING), rule="deploy", needed=2)
    snap = Snapshot("s", SessionKind.THREAD, SessionStatus.AWAITING_APPROVAL, approvals=(two,), turn=Turn(True))
    call = f"{write(lite, snap)}-{CALLS[0]}"
    assert sessions.decide(lite, call, True, "U0BOB") == sessions.Decided(calls=(), voted=True)
    assert sessions.decide(lite, call, True, "U0BOB") == sessions.Decided(calls=(), voted=False)  # counted once
    assert sessions.decide(lite, call, True, "U0CAROL") == sessions.Decided(calls=(call,), voted=False)


def test_a_click_on_a_call_that_is_not_there_decides_and_counts_nothing(lite: Engine) -> None:
    forged = f"call_{uuid.uuid4().hex}"
    for everything in (False, True):
        assert sessions.decide(lite, forged, True, "U0BOB", everything=everything) == sessions.Decided(
            calls=(), voted=False
        )


def test_what_a_click_did_reads_back_as_it_was_kept_the_older_list_form_too() -> None:
    for decided in (sessions.Decided(("call_a", "call_b")), sessions.Decided(voted=True), sessions.Decided()):
        assert sessions.Decided.from_json(decided.to_json()) == decided
    assert sessions.Decided.from_json('["call_a"]') == sessions.Decided(calls=("call_a",), voted=False)


def test_the_read_of_a_new_thread_its_first_message_and_a_model_it_cannot_name(lite: Engine) -> None:
    assert sessions.snapshot(lite, "no-such-session") is None
    root = f"{uuid.uuid4().int % 10**9}.000100"
    # The bot was mentioned in a reply: the thread's first message for the agent is not its root.
    first = record_message(
        lite, channel_id="C0READ", thread_ts=root, message_ts=f"{root}1", user_id="U0ALICE", text="look"
    )
    record_message(lite, channel_id="C0READ", thread_ts=root, message_ts=f"{root}2", user_id="U0BOB", text="+1")
    found = read(lite, first.session_id)
    assert found.first_message_ts == f"{root}1"
    assert found.turn is not None and found.turn.fresh  # nothing said yet: the first turn gets the thread's context
    asyncio.run(store.DbStore(lite).append(first.session_id, UserMessage("look", "U0ALICE")))
    found = read(lite, first.session_id)
    assert found.turn is not None and not found.turn.fresh
    for kept, model in [({"model": "big"}, "big"), ({"model": {"name": "big"}}, None), (None, None)]:
        with lite.begin() as conn:
            conn.execute(update(Session).where(Session.id == first.session_id).values(agent_config=kept))
        assert read(lite, first.session_id).model == model  # a value that is no model's name: the channel's
