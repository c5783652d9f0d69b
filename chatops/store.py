"""The session log in the database (mm_core.log.Store), leases with fencing, and approvals by compare-and-set.

Every write that must not race is one statement or one transaction whose condition is checked by the database
itself: an append checks the lease token under a row lock (taken by the UPDATE that allocates its seq), a
lease is taken only if it is free or expired, an approval changes only while it is pending. The side tables
(tool_calls, errors) are projections of the log, written in the append's own transaction so they never
disagree with it.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, FromClause, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from chatops.db import reading, transaction
from chatops.errors import ChatopsError
from chatops.schema import (
    Approval,
    ApprovalDecision,
    ApprovalState,
    Base,
    CallDecision,
    Error,
    InboxCommand,
    InboxMessage,
    ModelUsage,
    Session,
    SessionEvent,
    SessionKind,
    SessionStatus,
    SlackEvent,
    ToolCall,
    Vote,
    db_clock,
    utcnow,
)
from mm_core.agent import ask_entries
from mm_core.config import ModelPrice
from mm_core.log import (
    AssistantMessage,
    Decision,
    Entry,
    ErrorRecord,
    Fenced,
    Nested,
    Reset,
    ToolResult,
    ToolStarted,
    UserMessage,
    YoloSet,
    from_dict,
    to_dict,
)

# A flood of messages into one busy thread becomes several turns, not one prompt of unbounded size.
INBOX_PER_TURN = 20
INBOX_CHARS_PER_TURN = 60_000

log = logging.getLogger("mm.store")


class UnknownSession(ChatopsError, LookupError):
    pass


def log_of(engine: Engine, session_id: str) -> list[Entry]:
    """A session's log as stored, read outside a turn (the bot, housekeeping): DbStore.load for a turn."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(SessionEvent.payload).where(SessionEvent.session_id == session_id).order_by(SessionEvent.seq)
        )
        return [from_dict(payload) for (payload,) in rows]


@dataclass(frozen=True)
class Metered:
    """What the store records with each model answer's tokens (model_usage, what budgets count): the session's
    channel, the model's name as people pick it and its price per million tokens (None: unpriced, no cost)."""

    channel_id: str | None = None
    model: str | None = None
    price: ModelPrice | None = None


class DbStore:
    """mm_core's Store over the database; with a lease token, appends stop (Fenced) once the lease is lost.
    `metered`: what each answer's usage is recorded with (the worker sets the turn's model on it).

    Its log's reads and appends are coroutines, as mm_core's Store asks; each turn has an event loop of its own
    (workers/turns.py), so their synchronous bodies hold only that turn."""

    def __init__(self, engine: Engine, lease_token: int | None = None, metered: Metered | None = None):
        self.engine = engine
        self.lease_token = lease_token
        self.metered = metered or Metered()

    async def load(self, session_id: str) -> list[Entry]:
        return log_of(self.engine, session_id)

    async def append(self, session_id: str, entry: Entry) -> None:
        with self.engine.begin() as conn:
            _insert_entry(conn, session_id, self._next_seq(conn, session_id), entry, self.metered)

    def untaken_files(self, session_id: str, people: bool = True) -> list[tuple[int, str, list[Any]]]:
        """The files of the messages the next turn would take (row id, message ts, files as the bot kept them):
        what the worker downloads before it takes them (workers.uploads)."""
        with self.engine.connect() as conn:
            rows = _next_turn(conn.execute(_UNTAKEN, {"p_session_id": session_id}).all(), people)
        return [(row.id, row.message_ts, row.files) for row in rows if row.files]

    def take_inbox(
        self,
        session_id: str,
        preface: str = "",
        people: bool = True,
        notes: Mapping[int, str] | None = None,
        images: Mapping[int, Sequence[str]] | None = None,
    ) -> UserMessage | None:
        """Start the next turn with every untaken inbox message, in order, as one user message; None when the
        inbox is empty. `preface` goes before the text (the thread's earlier messages). Appending it and
        marking the messages taken is one transaction: a crash leaves them either untaken or in the log, never
        both, never neither. `people=False` takes only what nobody wrote (a job run's prompt): replies in a
        job's thread wait for the run's end, so they never ride on the job's yolo. `notes`: the line each
        message with files gets (by row id: which files arrived, workers.uploads); given, a message with files
        that has none (it came after the files were downloaded) waits for the next turn, and its files with it.
        `images`: the images that go to the model with the messages taken (data URLs, by row id)."""
        try:
            with self.engine.begin() as conn:
                seq = self._next_seq(conn, session_id)
                rows = _next_turn(conn.execute(_UNTAKEN, {"p_session_id": session_id}).all(), people)
                if notes is not None:
                    rows = list(itertools.takewhile(lambda row: not row.files or row.id in notes, rows))
                if not rows:
                    raise _NothingTaken  # rolls the seq taken above back: the log has no gap
                rows = _within(rows, INBOX_CHARS_PER_TURN)
                authors = list(dict.fromkeys(row.user_id for row in rows if row.user_id))
                said = {row.id: "\n".join(t for t in (row.text, (notes or {}).get(row.id)) if t) for row in rows}
                if len(rows) == 1:
                    text = said[rows[0].id]
                else:  # several people may have written while the last turn ran: the model needs to know who
                    text = "\n\n".join(f"<@{r.user_id}>: {said[r.id]}" if r.user_id else said[r.id] for r in rows)
                shown = tuple(url for row in rows for url in (images or {}).get(row.id, ()))
                message = UserMessage(preface + text, ",".join(authors) or None, images=shown)
                _insert_entry(conn, session_id, seq, message)
                conn.execute(
                    update(InboxMessage).where(InboxMessage.id.in_([r.id for r in rows])).values(taken_at=utcnow())
                )
                return message
        except _NothingTaken:
            return None

    def take_command(self, session_id: str, people: bool = True) -> TakenCommand | None:
        """The session's next inbox row when it is a command (else None), taken. The log entries a command
        stands for (`new`: a Reset; `yolo`: a YoloSet; `ask`: the request and its ask_agent call) are appended
        in the same transaction, so that a crash leaves the command either waiting or done, never half done.
        `compact` has no entry of its own until the model has summarised: a crash before that forgets it.
        `people=False` (a job's run) takes none: a person's command waits for the run's end, as their messages do
        (take_inbox), so an `ask` never rides on the job's yolo."""
        with self.engine.begin() as conn:
            row = conn.execute(_UNTAKEN.limit(1), {"p_session_id": session_id}).first()
            if row is None or row.command is None or (not people and row.user_id is not None):
                return None
            taken = TakenCommand(InboxCommand(row.command), row.text, row.user_id)
            for entry in taken.entries():
                _insert_entry(conn, session_id, self._next_seq(conn, session_id), entry)
            conn.execute(update(InboxMessage).where(InboxMessage.id == row.id).values(taken_at=utcnow()))
            return taken

    def _next_seq(self, conn: Connection, session_id: str) -> int:
        """Take the seq of the session's next entry, once its lease token is checked: one statement. Its row lock
        orders this write against a lease takeover: either the takeover waits for this commit, or this write
        sees the new token and raises, which rolls the transaction (and the seq taken) back."""
        row = conn.execute(_NEXT_SEQ, {"p_session_id": session_id}).first()
        if row is None:
            raise UnknownSession(session_id)
        next_seq, token = row
        if self.lease_token is not None and token != self.lease_token:
            raise Fenced(f"session {session_id}: lease token {self.lease_token} was superseded by {token}")
        return next_seq - 1


class _NothingTaken(ChatopsError):
    pass


@dataclass(frozen=True)
class TakenCommand:
    command: InboxCommand
    argument: str
    user_id: str | None

    def ask(self) -> tuple[str, str]:
        """`ask`'s agent and prompt (the bot recorded them as JSON)."""
        data = json.loads(self.argument)
        return str(data["agent"]), str(data["prompt"])

    def entries(self) -> list[Entry]:
        if self.command == InboxCommand.NEW:
            return [Reset()]
        if self.command == InboxCommand.YOLO:
            return [YoloSet(self.argument == "on", self.user_id)]
        if self.command == InboxCommand.ASK:
            return ask_entries(*self.ask(), author=self.user_id)
        return []


def _next_turn(rows: Sequence[Any], people: bool) -> list[Any]:
    """The untaken rows a turn takes: up to the first command (it waits for its own turn, take_command), and
    with `people=False` only those nobody wrote."""
    rows = list(itertools.takewhile(lambda row: row.command is None, rows))
    return rows if people else [row for row in rows if row.user_id is None]


def _within(rows: Sequence[Any], limit: int) -> list[Any]:
    """The first messages whose text fits in `limit` characters (always the first one): the rest wait for the
    next turn, so a flood of long messages becomes several prompts of bounded size."""
    kept, size = [], 0
    for row in rows:
        size += len(row.text)
        if kept and size > limit:
            break
        kept.append(row)
    return kept


# The append's statements, built once: executing them finds their compiled form in SQLAlchemy's cache without
# building a construct and its cache key on every call (the append is the service's hottest path).
_sessions, _events, _calls, _errors, _usage = (
    Base.metadata.tables[t.__tablename__] for t in (Session, SessionEvent, ToolCall, Error, ModelUsage)
)


def _params(table: Any, *names: str) -> dict[str, Any]:
    return {name: bindparam(f"p_{name}", type_=table.c[name].type) for name in names}


# `updated_at` set to itself: an append is not a change of the session (its onupdate would be).
_NEXT_SEQ = (
    update(_sessions)
    .where(_sessions.c.id == bindparam("p_session_id", type_=_sessions.c.id.type))
    .values(event_seq=_sessions.c.event_seq + 1, updated_at=_sessions.c.updated_at)
    .returning(_sessions.c.event_seq, _sessions.c.lease_token)
)
_INSERT_EVENT = insert(_events).values(_params(_events, "session_id", "seq", "kind", "payload", "created_at"))
_INSERT_USAGE = insert(_usage).values(
    _params(_usage, "session_id", "channel_id", "model", "prompt_tokens", "completion_tokens", "cost", "created_at")
)
_INSERT_ERROR = insert(_errors).values(_params(_errors, "session_id", "where", "message", "created_at"))
_UNTAKEN = (
    select(
        InboxMessage.id,
        InboxMessage.message_ts,
        InboxMessage.user_id,
        InboxMessage.text,
        InboxMessage.command,
        InboxMessage.files,
    )
    .where(InboxMessage.session_id == bindparam("p_session_id"), InboxMessage.taken_at.is_(None))
    .order_by(InboxMessage.id)
    .limit(INBOX_PER_TURN)
)

# The projection of a call: one upsert by (session, call id). A value given (not None) is set; one not given
# keeps the row's, or on insert the column's default. `auto` is the decision of a call that started with none
# recorded (it ran without asking): it never replaces a decision.
_CALL_VALUES = (
    "tool",
    "agent",
    "arguments",
    "output",
    "status",
    "started_at",
    "finished_at",
    "duration_ms",
    "decision",
    "decided_by",
    "rule",
    "requested_by",
)
_CALL_KEYS = tuple(f"p_{name}" for name in ("session_id", "call_id", *_CALL_VALUES, "auto"))


def _call_upsert(insert_of: Any) -> Any:
    p = _params(_calls, "session_id", "call_id", *_CALL_VALUES)
    auto = bindparam("p_auto", type_=_calls.c.decision.type)
    inserted = {
        **p,
        "tool": func.coalesce(p["tool"], ""),
        "status": func.coalesce(p["status"], "requested"),
        "decision": func.coalesce(p["decision"], auto),
    }
    kept = {name: func.coalesce(p[name], _calls.c[name]) for name in _CALL_VALUES}
    kept["decision"] = func.coalesce(p["decision"], _calls.c.decision, auto)
    return (
        insert_of(_calls)
        .values(inserted)
        .on_conflict_do_update(index_elements=[_calls.c.session_id, _calls.c.call_id], set_=kept)
    )


_UPSERT_CALL = {"postgresql": _call_upsert(postgresql.insert), "sqlite": _call_upsert(sqlite.insert)}


def _insert_entry(conn: Connection, session_id: str, seq: int, entry: Entry, metered: Metered | None = None) -> None:
    now = utcnow()
    conn.execute(
        _INSERT_EVENT,
        {
            "p_session_id": session_id,
            "p_seq": seq,
            "p_kind": entry.kind,
            "p_payload": to_dict(entry),
            "p_created_at": now,
        },
    )
    _project(conn, session_id, entry, now, metered or Metered())


def _project(conn: Connection, session_id: str, entry: Entry, now: datetime, metered: Metered) -> None:
    match entry:
        case AssistantMessage(tool_calls=calls, agent=agent):
            if entry.prompt_tokens or entry.completion_tokens:  # an asked agent's answers too (Nested, below)
                conn.execute(_INSERT_USAGE, _usage_row(session_id, entry, metered, now))
            if calls:  # several: one executemany (one round trip on psycopg's pipeline)
                rows = [
                    _call(session_id, call.id, tool=call.name, arguments=call.arguments, agent=agent) for call in calls
                ]
                conn.execute(_UPSERT_CALL[conn.dialect.name], rows[0] if len(rows) == 1 else rows)
        case ToolStarted(call_id=call_id, tool=tool, agent=agent):
            # No decision recorded before it started: it ran without asking (yolo).
            values = _call(session_id, call_id, tool=tool, agent=agent, status="running", started_at=now)
            values["p_auto"] = CallDecision.AUTO
            conn.execute(_UPSERT_CALL[conn.dialect.name], values)
        case ToolResult():
            values = _call(
                session_id,
                entry.call_id,
                tool=entry.tool,
                agent=entry.agent,
                output=entry.output,
                status=entry.status,
                finished_at=now,
                duration_ms=entry.duration_ms,
                rule=entry.rule,
                requested_by=entry.requested_by,
            )
            conn.execute(_UPSERT_CALL[conn.dialect.name], values)
        case Decision(call_id=call_id, approved=approved, by=by):
            decision = CallDecision.APPROVED if approved else CallDecision.REJECTED
            conn.execute(_UPSERT_CALL[conn.dialect.name], _call(session_id, call_id, decision=decision, decided_by=by))
        case ErrorRecord(message=message, where=where):
            # Also a log line, for log pipelines (chatops/logs.py redacts it and names the session).
            log.warning("error in a turn (%s): %s", where, message)
            values = _fit(_errors, where=where, message=message)
            conn.execute(
                _INSERT_ERROR,
                {
                    "p_session_id": session_id,
                    "p_where": values["where"],
                    "p_message": values["message"],
                    "p_created_at": now,
                },
            )
        case Nested(entry=inner):
            # An asked agent's calls are the session's calls too: listed, with who approved them.
            _project(conn, session_id, from_dict(inner), now, metered)
        case _:
            pass


# PostgreSQL text cannot hold NUL, and no driver can encode a lone surrogate.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _fit(table: FromClause, **values: Any) -> dict[str, Any]:
    """The values as the table's columns can hold them: unstorable characters become U+FFFD and strings are
    cut to their column's length. Only for projections and records for people: the log keeps the exact text,
    and a binary file printed by `bash` or a tool name a model made up must not fail the append."""
    fitted = {}
    for key, value in values.items():
        if isinstance(value, str):
            value = _UNSTORABLE.sub("\ufffd", value)[: getattr(table.c[key].type, "length", None)]
        fitted[key] = value
    return fitted


def _usage_row(session_id: str, answer: AssistantMessage, metered: Metered, now: datetime) -> dict[str, Any]:
    """The model_usage row of an answer. An asked agent's answers are counted with the session's model and price:
    the log does not say which model an asked agent ran (its own config file does)."""
    prompt, completion, price = answer.prompt_tokens, answer.completion_tokens, metered.price
    cost = (price.input * prompt + price.output * completion) / 1e6 if price is not None else None
    return {
        "p_session_id": session_id,
        "p_channel_id": metered.channel_id,
        "p_model": _fit(_usage, model=metered.model)["model"],
        "p_prompt_tokens": prompt,
        "p_completion_tokens": completion,
        "p_cost": cost,
        "p_created_at": now,
    }


def _call(session_id: str, call_id: str, **values: Any) -> dict[str, Any]:
    """The upsert's parameters for the call's row: the values given, fitted; None for the rest (kept)."""
    params = dict.fromkeys(_CALL_KEYS)
    params["p_session_id"] = session_id
    for key, value in _fit(_calls, call_id=call_id, **values).items():
        params[f"p_{key}"] = value
    return params


# --- sessions -----------------------------------------------------------------------------------------------


def ensure_session(
    engine: Engine,
    *,
    channel_id: str | None,
    thread_ts: str | None,
    kind: SessionKind = SessionKind.THREAD,
    team_id: str | None = None,
    requester: str | None = None,
    **values: Any,
) -> str:
    """The id of the thread's session, created on first use; two bots racing get the same one."""
    find = select(Session.id).where(Session.channel_id == channel_id, Session.thread_ts == thread_ts)
    for _ in range(2):
        with engine.begin() as conn:
            if thread_ts is not None and (found := conn.execute(find).scalar_one_or_none()):
                return found
            try:
                with conn.begin_nested():
                    return conn.execute(
                        insert(Session)
                        .values(
                            kind=kind,
                            channel_id=channel_id,
                            thread_ts=thread_ts,
                            team_id=team_id,
                            requester=requester,
                            **values,
                        )
                        .returning(Session.id)
                    ).scalar_one()
            except IntegrityError:
                continue  # another process created it between our read and our insert: read it again
    raise RuntimeError(f"could not create the session of {channel_id}/{thread_ts}")


def set_status(
    engine: Engine,
    session_id: str,
    status: SessionStatus,
    *,
    expect: SessionStatus | None = None,
    lease_token: int | None = None,
) -> bool:
    """Set the session's status (only if it is `expect`, and only while `lease_token` holds the session, when
    given: a worker that lost the session must not overwrite the new owner's status); True if it changed."""
    stmt = update(Session).where(Session.id == session_id)
    if expect is not None:
        stmt = stmt.where(Session.status == expect)
    if lease_token is not None:
        stmt = stmt.where(Session.lease_token == lease_token)
    with engine.begin() as conn:
        return conn.execute(stmt.values(status=status, updated_at=utcnow())).rowcount == 1


def record_slack_event(engine: Engine, event_id: str) -> bool:
    """True the first time an event id is seen, False for Slack's retries of it."""
    try:
        with engine.begin() as conn:
            conn.execute(insert(SlackEvent).values(event_id=event_id, received_at=utcnow()))
        return True
    except IntegrityError:
        return False


# Slack retries an event within minutes (and gives up after three tries, about an hour): its id is kept a day.
EVENTS_KEPT = timedelta(days=1)


def forget_seen_events(engine: Engine, kept: timedelta = EVENTS_KEPT) -> int:
    """Forget the event ids seen more than `kept` ago (housekeeping): no retry of theirs can come; how many."""
    with engine.begin() as conn:
        cutoff = db_clock(-kept.total_seconds())
        return conn.execute(delete(SlackEvent).where(SlackEvent.received_at <= cutoff)).rowcount


def record_error(
    engine: Engine, where: str, message: str, *, session_id: str | None = None, detail: Any = None
) -> None:
    """An error outside any turn's log (a failed Slack call, a crashed task): kept for the operators, and logged."""
    log.warning("error (%s): %s", where, message)
    values = _fit(Error.__table__, where=where, message=message)
    with engine.begin() as conn:
        conn.execute(insert(Error).values(session_id=session_id, detail=detail, created_at=utcnow(), **values))


# --- leases -------------------------------------------------------------------------------------------------


def acquire_lease(engine: Engine, session_id: str, owner: str, ttl_s: float, now: datetime | None = None) -> int | None:
    """Take the session if nobody holds it or the holder's lease expired; the new, larger token, or None."""
    now = now or utcnow()
    stmt = (
        update(Session)
        .where(
            Session.id == session_id,
            or_(Session.lease_owner.is_(None), Session.lease_expires_at.is_(None), Session.lease_expires_at <= now),
        )
        .values(
            lease_token=Session.lease_token + 1,
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=ttl_s),
            updated_at=now,
        )
        .returning(Session.lease_token)
    )
    with engine.begin() as conn:
        return conn.execute(stmt).scalar_one_or_none()


def renew_lease(engine: Engine, session_id: str, token: int, ttl_s: float, now: datetime | None = None) -> bool:
    """Extend the lease if `token` still holds it (even expired, as long as nobody took it over)."""
    now = now or utcnow()
    with engine.begin() as conn:
        result = conn.execute(
            update(Session)
            .where(Session.id == session_id, Session.lease_token == token, Session.lease_owner.is_not(None))
            .values(lease_expires_at=now + timedelta(seconds=ttl_s))
        )
        return result.rowcount == 1


def release_lease(engine: Engine, session_id: str, token: int) -> bool:
    """Give the session up; the token stays (tokens only grow, so old writers stay fenced)."""
    with engine.begin() as conn:
        result = conn.execute(
            update(Session)
            .where(Session.id == session_id, Session.lease_token == token)
            .values(lease_owner=None, lease_expires_at=None, updated_at=utcnow())
        )
        return result.rowcount == 1


# --- approvals ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalRow:
    call_id: str
    session_id: str
    tool: str
    title: str | None
    arguments: str | None
    preview: str | None
    requested_by: str | None
    state: ApprovalState
    decided_by: str | None
    decided_at: datetime | None
    expires_at: datetime | None
    message_ts: str | None
    approve_all: bool = False
    created_at: datetime | None = None
    shown: str | None = None  # the digest of what the person is shown (mm_core.log.shown_digest)
    text_file: str | None = None  # the uploaded file holding the whole text, when the message cannot
    # The approval policy's rule that asked (None: the tool's own gating), what of the call matched it, how many
    # distinct people must approve, and whom the rule accepts (None: the channel's approvers).
    rule: str | None = None
    matched: str | None = None
    needed: int = 1
    approvers: tuple[str, ...] | None = None
    reminded_at: datetime | None = None
    escalated_at: datetime | None = None
    # Who approved so far, in order (approval_decisions): read only for a call that needs more than one person.
    approved_by: tuple[str, ...] = ()

    @property
    def missing(self) -> int:
        """How many more distinct people must approve the call."""
        return max(0, self.needed - len(self.approved_by))


def covered_by_approve_all(row: ApprovalRow) -> bool:
    """Whether "Approve all" may approve the call: only a call the tool's own gating asks for of the channel's
    approvers. A call a policy rule asks for (one approver from a named group, or several people) is decided on
    its own, every time: an approval of a lighter call never crosses a stricter rule. Nor does an escalated call
    (its `approvers` widened): an `escalateTo` person may decide that call, not grant its requester the thread."""
    return row.rule is None and row.needed <= 1 and row.approvers is None


APPROVAL_COLUMNS = [getattr(Approval, f) for f in ApprovalRow.__dataclass_fields__ if f != "approved_by"]
# What a person is shown of a call is kept exactly: a NUL or a lone surrogate (which PostgreSQL text cannot hold,
# and _fit would make U+FFFD) is stored as U+FFFD and its four hex digits, and so is U+FFFD itself, so that the
# text read back is the text as it was: mm_core.display shows the NUL as `\u0000`, with its warning.
_SHOWN_TEXTS = ("title", "arguments", "preview")
_UNKEPT = re.compile("[\x00\ud800-\udfff\ufffd]")
_KEPT = re.compile("\ufffd([0-9a-f]{4})")


# A decision a person made carries their Slack user id; one nobody made (NO_APPROVERS) carries a sentence.
_APPROVER = re.compile(r"^[UW][A-Z0-9]{2,31}$")


def _keep(text: str | None) -> str | None:
    return _UNKEPT.sub(lambda m: f"\ufffd{ord(m.group()):04x}", text) if text is not None else None


def _kept(text: str | None) -> str | None:
    return _KEPT.sub(lambda m: chr(int(m.group(1), 16)), text) if text is not None else None


def approval_from(values: dict[str, Any], approved_by: Sequence[str] = ()) -> ApprovalRow:
    """An ApprovalRow from a result row's APPROVAL_COLUMNS (`row._asdict()`), and who approved it so far."""
    texts = {name: _kept(values[name]) for name in _SHOWN_TEXTS}
    approvers = values["approvers"]
    return ApprovalRow(
        **{
            **values,
            **texts,
            "state": ApprovalState(values["state"]),
            "approvers": tuple(approvers) if approvers is not None else None,
            "approved_by": tuple(approved_by),
        }
    )


def _with_votes(conn: Connection, rows: Sequence[Any]) -> list[ApprovalRow]:
    """ApprovalRows of result rows, with who approved each call that needs several people (one query for them)."""
    several = [row.call_id for row in rows if row.needed > 1]
    by: dict[str, list[str]] = {}
    if several:
        votes = conn.execute(
            select(ApprovalDecision.call_id, ApprovalDecision.user_id)
            .where(ApprovalDecision.call_id.in_(several), ApprovalDecision.vote == Vote.APPROVE)
            .order_by(ApprovalDecision.id)
        )
        for call_id, user in votes:
            by.setdefault(call_id, []).append(user or "")
    return [approval_from(row._asdict(), by.get(row.call_id, ())) for row in rows]


def request_approval(
    engine: Engine,
    *,
    call_id: str,
    session_id: str,
    tool: str,
    title: str | None = None,
    arguments: str | None = None,
    preview: str | None = None,
    requested_by: str | None = None,
    shown: str | None = None,
    timeout_s: float | None = None,
    now: datetime | None = None,
    rule: str | None = None,
    matched: str | None = None,
    needed: int = 1,
    approvers: Sequence[str] | None = None,
) -> ApprovalRow:
    """Record a pending approval; asking again for the same call (a resumed turn) returns the existing row, as it
    was first shown. `rule`, `matched`, `needed`, `approvers`: the approval policy's verdict on the call."""
    now = now or utcnow()
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(Approval).values(
                    call_id=call_id,
                    session_id=session_id,
                    **_fit(Approval.__table__, tool=tool, requested_by=requested_by),
                    title=_keep(title),
                    arguments=_keep(arguments),
                    preview=_keep(preview),
                    shown=shown,
                    state=ApprovalState.PENDING,
                    expires_at=now + timedelta(seconds=timeout_s) if timeout_s is not None else None,
                    created_at=now,
                    **_fit(Approval.__table__, rule=rule),
                    matched=_keep(matched),
                    needed=needed,
                    approvers=list(approvers) if approvers is not None else None,
                )
            )
    except IntegrityError:
        pass
    found = get_approval(engine, call_id)
    if found is None:  # the insert broke the foreign key, not the primary key
        raise UnknownSession(session_id)
    if found.session_id != session_id:
        raise ValueError(f"call id {call_id!r} is already used by another session")
    return found


def get_approval(bind: Engine | Connection, call_id: str) -> ApprovalRow | None:
    with reading(bind) as conn:
        rows = conn.execute(select(*APPROVAL_COLUMNS).where(Approval.call_id == call_id)).all()
        found = _with_votes(conn, rows)
    return found[0] if found else None


def approvals_of(bind: Engine | Connection, session_id: str) -> list[ApprovalRow]:
    """The session's approvals, oldest first: what a resumed turn decides its waiting calls by."""
    with reading(bind) as conn:
        rows = conn.execute(
            select(*APPROVAL_COLUMNS).where(Approval.session_id == session_id).order_by(Approval.created_at)
        ).all()
        return _with_votes(conn, rows)


def set_yolo(engine: Engine, session_id: str, on: bool | None) -> None:
    """The session's own yolo (`yolo on|off`, an approver's switch for everyone): the next turn's setting, over
    the channel's."""
    with engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == session_id).values(yolo=on, updated_at=utcnow()))


def set_repo(engine: Engine, session_id: str, repo: str, branch: str | None) -> None:
    """The thread's own repository (`repo`), over the channel's: set before its first turn."""
    with engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == session_id).values(repo=repo, branch=branch))


def set_model(engine: Engine, session_id: str, model: str) -> None:
    """The thread's own model (`model=NAME` in a mention): a `models` entry's name, over the channel's."""
    _merge_agent_config(engine, session_id, {"model": model})


def set_budget(engine: Engine, session_id: str, tokens: int, by: str, approver: bool) -> None:
    """The thread's own token budget (`budget N`), over the config's, with who set it and whether as an approver
    (chatops.budgets reads it)."""
    _merge_agent_config(engine, session_id, {"budget": {"tokens": tokens, "by": by, "approver": approver}})


def thread_model(engine: Engine, session_id: str) -> str | None:
    """The `models` entry the thread asked for, or None (the channel's)."""
    with engine.connect() as conn:
        row = conn.execute(select(Session.agent_config).where(Session.id == session_id)).scalar_one_or_none()
    model = (row or {}).get("model")
    return model if isinstance(model, str) else None


def _merge_agent_config(engine: Engine, session_id: str, values: dict[str, Any]) -> None:
    with engine.begin() as conn:
        row = conn.execute(
            select(Session.agent_config).where(Session.id == session_id).with_for_update()
        ).scalar_one_or_none()
        conn.execute(update(Session).where(Session.id == session_id).values(agent_config={**(row or {}), **values}))


def set_instructions_used(engine: Engine, session_id: str, used: dict[str, Any]) -> None:
    """What the latest turn was told besides the agent's own prompt (workers.turns), for `status` to show."""
    _merge_agent_config(engine, session_id, {"instructions": used})


def set_network_used(engine: Engine, session_id: str, used: dict[str, Any]) -> None:
    """The hosts the latest turn's commands reached and were refused (workers.egress), for `status` to show."""
    _merge_agent_config(engine, session_id, {"network": used})


def set_approval_file(engine: Engine, call_id: str, file_id: str) -> None:
    """Remember the uploaded file that holds the call's whole text (its message shows only a head and a tail)."""
    with engine.begin() as conn:
        conn.execute(update(Approval).where(Approval.call_id == call_id).values(text_file=file_id))


def set_approval_message(engine: Engine, call_id: str, message_ts: str) -> None:
    """Remember the Slack message that shows the approval, to update it once decided."""
    with engine.begin() as conn:
        conn.execute(update(Approval).where(Approval.call_id == call_id).values(message_ts=message_ts))


class Counted(StrEnum):
    """What one person's click did to a call (decide_approval)."""

    DECIDED = "decided"  # the call left pending: rejected, or approved by as many people as it needs
    VOTED = "voted"  # an approval was counted, and the call waits for more people
    NOTHING = "nothing"  # the call was not pending any more (decided, expired), or this person counted already

    def __bool__(self) -> bool:
        """Whether the click counted."""
        return self is not Counted.NOTHING


def decide_approval(
    bind: Engine | Connection,
    call_id: str,
    approved: bool,
    by: str,
    now: datetime | None = None,
    *,
    approve_all: bool = False,
) -> Counted:
    """Count one person's decision on a pending, unexpired call, and move the call out of pending when it is
    decided: a rejection at once, an approval once `needed` distinct people approved. Each counted click is an
    appended approval_decisions row, never changed. The row is locked first (an UPDATE, which PostgreSQL and
    SQLite both make wait for a concurrent one), so two approvers clicking at once are counted one after the
    other, never both as "the first of two". `approve_all`: the approval also covers every further call of the
    same requesters (mm_core.state derives whom). Given a connection, in its transaction."""
    now = now or utcnow()
    user = by if _APPROVER.match(by) else None  # NO_APPROVERS and other decisions nobody made have no user
    with transaction(bind) as conn:
        locked = conn.execute(
            update(Approval)
            .where(
                Approval.call_id == call_id,
                Approval.state == ApprovalState.PENDING,
                or_(Approval.expires_at.is_(None), Approval.expires_at > now),
            )
            .values(needed=Approval.needed)
            .returning(Approval.session_id, Approval.needed, Approval.rule)
        ).first()
        if locked is None:
            return Counted.NOTHING
        votes = conn.execute(
            select(ApprovalDecision.user_id).where(
                ApprovalDecision.call_id == call_id, ApprovalDecision.vote == Vote.APPROVE
            )
        ).scalars()
        approvers = set(votes)
        # A person's approval counts once; one who approved may still reject (and so end the call). A decision
        # nobody made (no user id) never counts towards several people.
        if approved and (user in approvers if user is not None else locked.needed > 1):
            return Counted.NOTHING
        conn.execute(
            insert(ApprovalDecision).values(
                call_id=call_id,
                session_id=locked.session_id,
                user_id=user,
                vote=Vote.APPROVE if approved else Vote.REJECT,
                approve_all=approved and approve_all,
                rule=locked.rule,
                created_at=now,
            )
        )
        if approved and len(approvers) + 1 < locked.needed:
            return Counted.VOTED
        conn.execute(
            update(Approval)
            .where(Approval.call_id == call_id)
            .values(
                state=ApprovalState.APPROVED if approved else ApprovalState.REJECTED,
                decided_by=by,
                decided_at=now,
                approve_all=approved and approve_all,
            )
        )
        return Counted.DECIDED


def record_expiry(conn: Connection, rows: Sequence[Any], now: datetime) -> None:
    """The expiry of each call in `rows` (call_id, session_id, rule), appended as nobody's decision."""
    if rows:
        conn.execute(
            insert(ApprovalDecision),
            [
                {
                    "call_id": r.call_id,
                    "session_id": r.session_id,
                    "vote": Vote.EXPIRE,
                    "rule": r.rule,
                    "created_at": now,
                }
                for r in rows
            ],
        )


def expire_approvals(engine: Engine, now: datetime | None = None) -> list[ApprovalRow]:
    """Expire every pending approval past its time; the rows that this call expired (to tell their threads)."""
    now = now or utcnow()
    with engine.begin() as conn:
        rows = conn.execute(
            update(Approval)
            .where(Approval.state == ApprovalState.PENDING, Approval.expires_at <= now)
            .values(state=ApprovalState.EXPIRED, decided_at=now)
            .returning(*APPROVAL_COLUMNS)
        ).all()
        record_expiry(conn, rows, now)
        return _with_votes(conn, rows)
