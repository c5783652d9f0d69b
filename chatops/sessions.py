"""A session's life in one place: one read of it (`snapshot`), one decision of what it needs next (`next_step`),
and the one transaction that decides an approval (`decide`).

What a worker does with a session it holds the lease of is `next_step(snapshot(...))`, a pure function:

- Stop: a stop was asked (the open turn, if any, ends; the calls it waited for expire).
- Wait: the turn waits for people (an approval is still pending, or nothing new was decided).
- Resume(decisions): a turn is open: after decisions, or after the worker running it died.
- Command: the next inbox row is a thread command (new, compact, yolo, ask).
- Start(messages): the inbox holds messages for a new turn.
- Idle: nothing to do.

Whether a session needs a worker at all (`needs_worker`) reads no log: housekeeping asks it of every session in
one query (`sessions_with_work`), the bot asks it after a decision, and both forms are built from the same rules
(`_RULES`), which tests check agree on every snapshot. Where leases live: chatops.store (take, renew, give up)
and chatops.inbox (a worker's renewals, housekeeping's release of the expired); a snapshot says who holds one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeGuard

from sqlalchemy import ColumnElement, Connection, Engine, and_, exists, or_, select, true
from sqlalchemy.sql.expression import ScalarSelect

from chatops.db import reading, transaction
from chatops.schema import Approval, ApprovalState, InboxMessage, Session, SessionEvent, SessionStatus, utcnow
from chatops.store import (
    APPROVAL_COLUMNS,
    INBOX_PER_TURN,
    ApprovalRow,
    Counted,
    approval_from,
    approvals_of,
    covered_by_approve_all,
    decide_approval,
    get_approval,
)
from mm_core.log import Decision, from_dict
from mm_core.state import SessionState

# --- the read ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """An untaken inbox row, as the next turn would see it."""

    id: int
    command: str | None  # a thread command (InboxCommand), or None: a message for the model
    by_person: bool  # somebody wrote it (a job's prompt: nobody)
    has_files: bool = False


@dataclass(frozen=True)
class Turn:
    """What the log says of the turn in progress."""

    open: bool
    waiting: frozenset[str] = frozenset()  # the calls a decision may be for (SessionState.open_calls)
    decided: frozenset[str] = frozenset()  # the calls the log holds a decision for
    fresh: bool = False  # the conversation is empty (nothing since the last `new`): a new turn gets the context


@dataclass(frozen=True)
class Snapshot:
    """One session as one read found it: its row, its approvals, its untaken inbox and (unless read without it)
    what its log says of the turn in progress."""

    id: str
    kind: str
    status: str
    stop_requested: bool = False
    channel_id: str | None = None
    thread_ts: str | None = None
    team_id: str | None = None
    # The workspace and org the thread is in, as the installation sees them (slackio.installations.team_of).
    slack_team_id: str | None = None
    enterprise_id: str | None = None
    requester: str | None = None
    repo: str | None = None
    branch: str | None = None
    agent_name: str | None = None
    yolo: bool | None = None  # the thread's own switch (`yolo on|off`); None: the channel's
    model: str | None = None  # the thread's `model=`; None: the channel's
    assistant_thread: bool = False
    has_log: bool = False
    first_message_ts: str | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    updated_at: datetime | None = None
    purged_at: datetime | None = None  # when its history was purged (chatops/retention.py)
    approvals: tuple[ApprovalRow, ...] = ()
    inbox: tuple[Waiting, ...] = ()  # the first INBOX_PER_TURN untaken rows, in order
    turn: Turn | None = field(default=None)  # None: read without the log

    @property
    def undecided(self) -> bool:
        """Some approval of the session is still pending."""
        return any(row.state == ApprovalState.PENDING for row in self.approvals)

    def with_status(self, status: SessionStatus) -> Snapshot:
        return replace(self, status=status, has_log=True)


def _first_message() -> ScalarSelect[Any]:
    return (
        select(InboxMessage.message_ts)
        .where(InboxMessage.session_id == Session.id)
        .order_by(InboxMessage.id)
        .limit(1)
        .scalar_subquery()
    )


def snapshot(bind: Engine | Connection, session_id: str, *, log: bool = True) -> Snapshot | None:
    """The session as it stands (None: no such session), in four reads: its row, its approvals, its untaken
    inbox, and its log (only with `log`: whether a turn is open, and which calls it waits for)."""
    with reading(bind) as conn:
        s = conn.execute(
            select(Session.__table__, _first_message().label("first_message_ts")).where(Session.id == session_id)
        ).first()
        if s is None:
            return None
        approvals = conn.execute(
            select(*APPROVAL_COLUMNS).where(Approval.session_id == session_id).order_by(Approval.created_at)
        ).all()
        inbox = conn.execute(
            select(InboxMessage.id, InboxMessage.command, InboxMessage.user_id, InboxMessage.files)
            .where(InboxMessage.session_id == session_id, InboxMessage.taken_at.is_(None))
            .order_by(InboxMessage.id)
            .limit(INBOX_PER_TURN)
        ).all()
        turn = None
        if log:
            entries = conn.execute(
                select(SessionEvent.payload).where(SessionEvent.session_id == session_id).order_by(SessionEvent.seq)
            )
            state = SessionState.of([from_dict(payload) for (payload,) in entries])
            turn = Turn(
                state.turn_start() is not None,
                frozenset(state.open_calls()),
                frozenset(state.decisions()),
                not state.entries,
            )
    model = (s.agent_config or {}).get("model")
    return Snapshot(
        id=s.id,
        kind=s.kind,
        status=s.status,
        stop_requested=s.stop_requested_at is not None,
        channel_id=s.channel_id,
        thread_ts=s.thread_ts,
        team_id=s.team_id,
        slack_team_id=s.slack_team_id,
        enterprise_id=s.enterprise_id,
        requester=s.requester,
        repo=s.repo,
        branch=s.branch,
        agent_name=s.agent_name,
        yolo=s.yolo,
        model=model if isinstance(model, str) else None,
        assistant_thread=bool(s.assistant_thread),
        has_log=s.event_seq > 0,
        first_message_ts=s.first_message_ts,
        lease_owner=s.lease_owner,
        lease_expires_at=s.lease_expires_at,
        updated_at=s.updated_at,
        purged_at=s.purged_at,
        approvals=tuple(approval_from(row._asdict()) for row in approvals),
        inbox=tuple(Waiting(r.id, r.command, r.user_id is not None, bool(r.files)) for r in inbox),
        turn=turn,
    )


# --- the decision -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stop:
    turn_open: bool  # a turn is open: it ends, and the calls it waited for expire


@dataclass(frozen=True)
class Wait:
    pass


@dataclass(frozen=True)
class Resume:
    decisions: tuple[Decision, ...]  # for calls still waiting, not yet in the log (an expired call: rejected)
    expired: tuple[ApprovalRow, ...]  # the calls among them nobody decided in time (the thread is told)
    after_crash: bool  # the turn did not wait for people: its worker died


@dataclass(frozen=True)
class Command:
    command: str  # InboxCommand


@dataclass(frozen=True)
class Start:
    messages: int  # how many inbox rows the turn takes (at most)


@dataclass(frozen=True)
class Idle:
    pass


Step = Stop | Wait | Resume | Command | Start | Idle


def next_step(snap: Snapshot, *, people: bool = True) -> Step:
    """What the session needs now, from one snapshot read with its log. `people=False` (a job's run is running):
    only what nobody wrote is taken, a person's messages and commands wait for the run's end."""
    if snap.turn is None:
        raise ValueError("next_step needs a snapshot read with its log")
    if snap.stop_requested:
        return Stop(snap.turn.open)
    awaiting = snap.status == SessionStatus.AWAITING_APPROVAL
    if awaiting and snap.undecided:
        return Wait()  # a stray delivery (a message to a waiting thread): the turn waits for people still
    if snap.turn.open:
        # Nothing is pending: the turn goes on, with what was decided since, or with nothing new (its decisions
        # reached the log before the worker died, or its calls were never asked: the loop asks them again).
        # Waiting here would wait for nobody, while housekeeping, rightly, kept enqueueing the session.
        decisions, expired = _decisions(snap.approvals, snap.turn)
        return Resume(decisions, expired, after_crash=not awaiting)
    first = snap.inbox[0] if snap.inbox else None
    if first is not None and first.command is not None:
        return Command(first.command) if people or not first.by_person else Idle()
    taken = next_turn(snap.inbox, people)
    return Start(len(taken)) if taken else Idle()


def next_turn(rows: Sequence[Waiting], people: bool) -> list[Waiting]:
    """The untaken rows a turn takes, as DbStore.take_inbox does (tests check both agree): up to the first command
    (it waits for its own turn), and with `people=False` only those nobody wrote."""
    rows = list(itertools.takewhile(lambda row: row.command is None, rows))
    return rows if people else [row for row in rows if not row.by_person]


def _decisions(approvals: Sequence[ApprovalRow], turn: Turn) -> tuple[tuple[Decision, ...], tuple[ApprovalRow, ...]]:
    decisions, expired = [], []
    for row in approvals:
        if row.call_id not in turn.waiting or row.call_id in turn.decided or row.state == ApprovalState.PENDING:
            continue
        if row.state == ApprovalState.EXPIRED:
            expired.append(row)
        approved = row.state == ApprovalState.APPROVED
        by = row.decided_by or str(row.state)
        # Bound to what the person saw: a row without its digest (older than it) approves nothing.
        decisions.append(Decision(row.call_id, approved, by, all=row.approve_all, shown=row.shown or ""))
    return tuple(decisions), tuple(expired)


# --- who needs a worker -----------------------------------------------------------------------------------------

_awaiting = Session.status == SessionStatus.AWAITING_APPROVAL
_pending = exists().where(Approval.session_id == Session.id, Approval.state == ApprovalState.PENDING)
_untaken = exists().where(InboxMessage.session_id == Session.id, InboxMessage.taken_at.is_(None))

# Why a session needs a worker, each rule in Python (over a snapshot) and in SQL (over the sessions table), side
# by side: housekeeping asks the SQL of every session at once, and tests check both agree on every snapshot.
# Messages to a session that waits for a person wait with it: the next turn takes them once the decision came.
_RULES: tuple[tuple[str, Callable[[Snapshot], bool], ColumnElement[bool]], ...] = (
    (
        "a turn is queued or running",
        lambda s: s.status in (SessionStatus.QUEUED, SessionStatus.RUNNING),
        Session.status.in_([SessionStatus.QUEUED, SessionStatus.RUNNING]),
    ),
    ("a stop was asked", lambda s: s.stop_requested, Session.stop_requested_at.is_not(None)),
    (
        "messages wait, and no person is waited for",
        lambda s: s.status != SessionStatus.AWAITING_APPROVAL and bool(s.inbox),
        and_(~_awaiting, _untaken),
    ),
    (
        "every approval the turn waits for is decided",
        lambda s: s.status == SessionStatus.AWAITING_APPROVAL and not s.undecided,
        and_(_awaiting, ~_pending),
    ),
)


def wants_work(snap: Snapshot) -> bool:
    """Whether the session has something for a worker to do (whoever holds its lease)."""
    return any(rule(snap) for _, rule, _ in _RULES)


def needs_worker(snap: Snapshot, now: datetime, quiet_s: float = 0.0) -> bool:
    """Whether the session has work and no worker: no live lease, and unchanged for `quiet_s` (work whose message
    is merely waiting in a busy queue is not enqueued again and again)."""
    free = snap.lease_owner is None or snap.lease_expires_at is None or snap.lease_expires_at <= now
    quiet = snap.updated_at is None or snap.updated_at <= now - timedelta(seconds=quiet_s)
    return free and quiet and wants_work(snap)


def sessions_with_work(
    engine: Engine, quiet_s: float = 0.0, now: datetime | None = None, only: str | None = None
) -> list[str]:
    """`needs_worker` of every session (or `only` that one) in one query, least recently changed first."""
    now = now or utcnow()
    free = or_(Session.lease_owner.is_(None), Session.lease_expires_at.is_(None), Session.lease_expires_at <= now)
    wanted = or_(*(clause for _, _, clause in _RULES))
    conditions = [free, wanted, Session.updated_at <= now - timedelta(seconds=quiet_s)]
    conditions.append(Session.id == only if only is not None else true())
    with engine.connect() as conn:
        return list(conn.execute(select(Session.id).where(*conditions).order_by(Session.updated_at)).scalars())


def wants_a_worker(engine: Engine, session_id: str) -> bool:
    """Whether the session has work and nobody holds it: asked by whoever gives its lease back (a turn, a push),
    since a message, a stop or a run's task that came while it held the lease was kept out and waits for it."""
    return session_id in sessions_with_work(engine, only=session_id)


def between_turns(snap: Snapshot | None) -> TypeGuard[Snapshot]:
    """The session is there and no turn is due: nothing for a worker until someone writes or decides (a push may
    then take its lease, workers.thread_push)."""
    return snap is not None and not wants_work(snap)


def waits_for_people(bind: Engine | Connection, session_id: str) -> bool:
    """After a decision: whether the session still waits for one (then no worker is called for it)."""
    return between_turns(snapshot(bind, session_id, log=False))


# --- deciding an approval ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """What a click did: the calls it decided (they left pending), or its approval counted towards a call that
    needs more people (`voted`); neither when another decision came first or this person counted already."""

    calls: tuple[str, ...] = ()
    voted: bool = False

    def to_json(self) -> str:
        return json.dumps({"calls": list(self.calls), "voted": self.voted})

    @classmethod
    def from_json(cls, text: str) -> Decided:
        data = json.loads(text)
        if isinstance(data, list):  # the step as a bot before policies recorded it: the calls alone
            return cls(tuple(data))
        return cls(tuple(data["calls"]), bool(data["voted"]))


def decide(
    bind: Engine | Connection,
    call_id: str,
    approve: bool,
    by: str,
    *,
    everything: bool = False,
    readable: Callable[[ApprovalRow], bool] = lambda row: True,
) -> Decided:
    """A person's decision on a call, in one transaction (the caller's, given a connection): counted by
    decide_approval (compare-and-set; a call that needs several people is approved by the last of them).
    `everything` (Approve all): the other waiting calls of the same requesters are approved too, those `readable`
    where the click came from and covered_by_approve_all; the others wait for a decision of their own. Their
    later calls run without asking: the worker hands the decision to the log, where mm_core.state derives whom
    it covers (and the loop never lets it cover a call a rule asks for)."""
    with transaction(bind) as conn:
        clicked = get_approval(conn, call_id)
        if clicked is None:
            return Decided()
        # An "Approve all" of a call a rule asks for is that call's approval only: it grants nobody anything.
        everything = everything and covered_by_approve_all(clicked)
        counted = decide_approval(conn, call_id, approve, by, approve_all=everything)
        if counted is Counted.NOTHING:
            return Decided()
        if counted is Counted.VOTED:
            return Decided(voted=True)
        if not (approve and everything):
            return Decided((call_id,))
        rows = approvals_of(conn, clicked.session_id)
        return Decided(
            (
                call_id,
                *(
                    row.call_id
                    for row in rows
                    if row.state == ApprovalState.PENDING
                    and row.requested_by == clicked.requested_by
                    and covered_by_approve_all(row)
                    and readable(row)
                    and decide_approval(conn, row.call_id, True, by)
                ),
            )
        )
