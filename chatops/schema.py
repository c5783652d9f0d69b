"""The database schema, owned here and used by the bot and the workers alike.

Portable types only (they run on SQLite for `mm-bot dev` and on PostgreSQL in production). States are short
strings with CHECK constraints rather than database enums, so adding a state is a one-line migration.
Every constraint is named by the metadata's naming convention, which Alembic's batch mode on SQLite needs.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from slack_sdk.oauth.installation_store.sqlalchemy import SQLAlchemyInstallationStore
from slack_sdk.oauth.state_store.sqlalchemy import SQLAlchemyOAuthStateStore
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    literal,
    text,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeEngine

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class SessionKind(StrEnum):
    THREAD = "thread"
    JOB = "job"


class SessionStatus(StrEnum):
    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"


class ApprovalState(StrEnum):
    """The approval row decides: the first valid click moves it out of `pending`, by compare-and-set, and
    only then is the decision handed to the turn (mm_core.log.Decision in the session's log)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class InboxCommand(StrEnum):
    """Thread commands that change the conversation, carried out by the worker in order with the messages."""

    NEW = "new"
    COMPACT = "compact"
    ASK = "ask"  # text: the JSON {"agent": …, "prompt": …}
    YOLO = "yolo"  # text: "on" or "off"; recorded in the log (the session's row already has the setting)


class RequestKind(StrEnum):
    """What a person asks in Slack that the bot carries out after its ack, from its record (chatops.requests)."""

    SLASH = "slash"  # `/mm …`
    COMMAND = "command"  # a thread command: `@mm stop`
    CLICK = "click"  # a button: Approve, Reject, Approve all, Stop, Push branch


class RequestState(StrEnum):
    RECEIVED = "received"  # recorded, acked; carried out (or being carried out) from the record
    DONE = "done"
    FAILED = "failed"  # carried out too many times without an end: the person was told


class CallDecision(StrEnum):
    """tool_calls.decision: a projection of the log's Decision entries, for people and dashboards."""

    APPROVED = "approved"
    REJECTED = "rejected"
    AUTO = "auto"  # it ran without asking (yolo, or a call that is never gated)


class Vote(StrEnum):
    """approval_decisions.vote: one person's click that counted on a call, or its expiry (nobody's)."""

    APPROVE = "approve"
    REJECT = "reject"
    EXPIRE = "expire"


class JobRunStatus(StrEnum):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # the job's previous run still ran
    MISSED = "missed"  # no scheduler ran at its time, and it was too old to run late


class JobTrigger(StrEnum):
    SCHEDULE = "schedule"
    MANUAL = "manual"  # `/mm job run`


class PullRequestState(StrEnum):
    """pull_requests.state: what mm last knew of the pull request its push asked for."""

    PENDING = "pending"  # its branch is pushed and the pull request not opened yet (being opened, or retried)
    OPEN = "open"
    CLOSED = "closed"
    MERGED = "merged"


# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets the 64 bits.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, on SQLite too (which stores them without a zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware one (datetime.now(UTC))")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        # PostgreSQL answers in the connection's TimeZone, which the server's config may set to anything.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class db_clock(FunctionElement[datetime]):
    """The database's clock, `offset` seconds from now (a number, or a bound parameter), in SQL.

    What several processes compare — a claim's age, a retry's time — is read from the one clock they share, never
    from each process's own (a bot whose clock is ahead would find live claims stale). PostgreSQL: the statement's
    start; SQLite: `'now'` (one value within a statement), formatted as SQLAlchemy stores a datetime there, so that
    the two compare as strings."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_clock"

    def __init__(self, offset: Any = 0.0) -> None:
        super().__init__(offset if isinstance(offset, ColumnElement) else literal(float(offset), Float()))


@compiles(db_clock, "postgresql")
def _db_clock_pg(element: db_clock, compiler: SQLCompiler, **kw: Any) -> str:
    offset = compiler.process(element.clauses, **kw)
    return f"(statement_timestamp() + make_interval(secs => CAST({offset} AS double precision)))"


@compiles(db_clock, "sqlite")
def _db_clock_sqlite(element: db_clock, compiler: SQLCompiler, **kw: Any) -> str:
    offset = compiler.process(element.clauses, **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', printf('%+.3f seconds', {offset}))"


def new_id() -> str:
    return str(uuid.uuid4())


def _one_of(column: str, values: type[StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, TypeEngine[Any]]] = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Session(Base):
    """One Slack thread, or one job run. Its conversation is the append-only log in session_events."""

    __tablename__ = "sessions"
    __table_args__ = (
        UniqueConstraint("channel_id", "thread_ts"),
        CheckConstraint(_one_of("kind", SessionKind), name="kind"),
        CheckConstraint(_one_of("status", SessionStatus), name="status"),
        Index(None, "status", "lease_expires_at"),
        # Each worker's keeper asks twice a second for its own sessions' stop requests, and renews them.
        Index(None, "lease_owner"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    kind: Mapped[str] = mapped_column(String(16), default=SessionKind.THREAD)
    # The requester's own team (a Slack Connect person's, not the installation's): a stream names it.
    team_id: Mapped[str | None] = mapped_column(String(32))
    # The Slack workspace and org (Enterprise Grid) the thread is in, as the app's installation sees them: whose
    # token answers it (slackio.installations), and who may click in it (a person of another workspace may not).
    slack_team_id: Mapped[str | None] = mapped_column(String(32))
    enterprise_id: Mapped[str | None] = mapped_column(String(32))
    channel_id: Mapped[str | None] = mapped_column(String(32))
    thread_ts: Mapped[str | None] = mapped_column(String(32))
    requester: Mapped[str | None] = mapped_column(String(32))
    workspace: Mapped[str | None] = mapped_column(Text)
    agent_name: Mapped[str | None] = mapped_column(String(100))
    # The thread's own agent settings: {"model": a `models` name (`model=`), "instructions": what the latest turn
    # was told (chatops.store.set_model, set_instructions_used)}; and "purged": when, by whom and why its content
    # was purged (chatops/retention.py).
    agent_config: Mapped[dict[str, Any] | None]
    status: Mapped[str] = mapped_column(String(24), default=SessionStatus.IDLE)
    # None: the channel's (or the config's) yolo; `yolo on|off` sets it (an approver's switch for everyone).
    # "Approve all" does not: it covers its requesters only, and lives in the log (mm_core.state).
    yolo: Mapped[bool | None] = mapped_column(Boolean)
    # The thread's repository, when the `repo` command overrode the channel's (None: the channel's).
    repo: Mapped[str | None] = mapped_column(Text)
    branch: Mapped[str | None] = mapped_column(String(255))
    # A DM of Slack's assistant surface: its status goes through assistant.threads.setStatus.
    assistant_thread: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Set by `stop`; the worker holding the lease sees it within a second and cancels the turn, then clears it.
    stop_requested_at: Mapped[datetime | None]
    # Fencing: the token only ever grows, and every append checks it, so an expired owner cannot write.
    lease_token: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    # The seq of the log's next entry: an append takes it and checks the lease token in one UPDATE, whose row
    # lock orders it against a lease takeover (DbStore.append). Always max(session_events.seq) + 1, else 0.
    event_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # When retention (or `purge`) removed the thread's log, outputs, messages and workspace: the row stays, with
    # the audit's summary of its calls (chatops/retention.py).
    purged_at: Mapped[datetime | None]


class InboxMessage(Base):
    """A Slack message for a session's agent, recorded before the bot acks it; the next turn takes every
    untaken one, in order, in the same transaction that appends them to the log (DbStore.take_inbox)."""

    __tablename__ = "inbox"
    __table_args__ = (
        # A person's sessions (App Home, `/mm` in a channel) are found by what they wrote.
        Index(None, "user_id"),
        # One row per Slack message: an app_mention and the message event of the same post, a retried
        # delivery, a Socket Mode redelivery all land on it.
        UniqueConstraint("session_id", "message_ts"),
        Index(None, "session_id", "taken_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    message_ts: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str | None] = mapped_column(String(32))
    text: Mapped[str] = mapped_column(Text)
    # A thread command the worker carries out in the message's place, in order with the messages (InboxCommand);
    # `text` is then its argument. None: a message for the model.
    command: Mapped[str | None] = mapped_column(String(16))
    # The files the message carried, as Slack described them (bot.shapes.shared_files: id, name, mimetype, size,
    # url_private_download): the worker downloads them into the workspace when its turn takes the message.
    files: Mapped[list[Any] | None] = mapped_column(JSON)
    taken_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SessionEvent(Base):
    """One entry of a session's log (mm_core.log), as its to_dict() JSON; seq numbers the entries from 0."""

    __tablename__ = "session_events"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ToolCall(Base):
    """A projection of the log for people and dashboards: one row per tool call, kept up to date on append."""

    __tablename__ = "tool_calls"
    __table_args__ = (
        # The log's projection is updated by (session, call id); the loop mints call ids unique everywhere.
        UniqueConstraint("session_id", "call_id"),
        CheckConstraint(_one_of("decision", CallDecision), name="decision"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    call_id: Mapped[str] = mapped_column(String(200))
    tool: Mapped[str] = mapped_column(String(100))
    agent: Mapped[str | None] = mapped_column(String(100))
    arguments: Mapped[str | None] = mapped_column(Text)
    output: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(24), default="requested")
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    decision: Mapped[str | None] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(64))
    # The approval policy's rule that decided how the call was treated (its label), None when none matched.
    rule: Mapped[str | None] = mapped_column(String(200))
    # Who asked for the turn the call belongs to (comma-separated user ids; None: a job's prompt).
    requested_by: Mapped[str | None] = mapped_column(Text)


class Approval(Base):
    """A gated tool call waiting for a person: pending → approved | rejected | expired, by compare-and-set."""

    __tablename__ = "approvals"
    __table_args__ = (
        CheckConstraint(_one_of("state", ApprovalState), name="state"),
        Index(None, "state", "expires_at"),
    )

    call_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    tool: Mapped[str] = mapped_column(String(100))
    # The call's line as recorded, whole and unescaped (`🛠️ bash: make test`): the message shows its head, escaped.
    title: Mapped[str | None] = mapped_column(Text)
    arguments: Mapped[str | None] = mapped_column(Text)
    # The whole text a person judges the call by (the command, the diff), unescaped: the message shows it inline,
    # or its head and tail with the whole of it in an uploaded file.
    preview: Mapped[str | None] = mapped_column(Text)
    # mm_core.log.shown_digest of what the person is shown: the decision carries it back, and the call runs only
    # while it would still show exactly that. None (a row older than it): an approval runs nothing.
    shown: Mapped[str | None] = mapped_column(String(64))
    # The Slack file holding the whole text, when the message cannot (slackio/approval_message.py): without it
    # such a call cannot be approved.
    text_file: Mapped[str | None] = mapped_column(String(64))
    # Who asked: the author of the turn's message, or the authors (comma-separated) of the messages it took.
    requested_by: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default=ApprovalState.PENDING)
    # "Approve all": every further call of the same requesters runs without asking (the worker records it in the
    # log with the decision; mm_core.state derives who it covers).
    approve_all: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    decided_by: Mapped[str | None] = mapped_column(String(64))
    decided_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    message_ts: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The approval policy's rule that asked (its label; None: the tool's own gating), what of the call matched it,
    # how many distinct people must approve, and whom the rule accepts (None: the channel's approvers).
    rule: Mapped[str | None] = mapped_column(String(200))
    matched: Mapped[str | None] = mapped_column(Text)
    needed: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    approvers: Mapped[list[str] | None] = mapped_column(JSON)
    # When the thread was reminded (`approvals.remindAfter`) and the call escalated (`approvals.escalateAfter`):
    # each happens once.
    reminded_at: Mapped[datetime | None]
    escalated_at: Mapped[datetime | None]


class ApprovalDecision(Base):
    """Each click that counted on a call, and its expiry: appended, never updated. A two-person rule's call is
    approved when it holds `needed` approvals by distinct people; the approvals row's state is the outcome."""

    __tablename__ = "approval_decisions"
    __table_args__ = (
        # One person's approval counts once on a call (they may still reject it after approving).
        UniqueConstraint("call_id", "user_id", "vote"),
        CheckConstraint(_one_of("vote", Vote), name="vote"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    call_id: Mapped[str] = mapped_column(ForeignKey("approvals.call_id", ondelete="CASCADE"), index=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    user_id: Mapped[str | None] = mapped_column(String(32))  # None: the expiry
    vote: Mapped[str] = mapped_column(String(16))
    approve_all: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    rule: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelUsage(Base):
    """The tokens of each model answer, with its cost when the model has a price: what budgets count. Written
    with the answer's log entry (a projection of it), kept when retention purges the log."""

    __tablename__ = "model_usage"
    __table_args__ = (Index(None, "channel_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    channel_id: Mapped[str | None] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(200))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Error(Base):
    """The reference's session `errors` array, queryable: where it happened, what, when."""

    __tablename__ = "errors"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id", ondelete="SET NULL"), index=True)
    where: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SlackEvent(Base):
    """Event ids already processed: Slack retries deliveries, and each must act once."""

    __tablename__ = "slack_events"

    event_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    received_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class SlackRequest(Base):
    """A slash command, thread command or click, recorded before the bot acks it and carried out after, from
    this row (chatops.requests): a bot killed in between leaves it unfinished, and a bot's replay claims it
    once its claim has gone stale and carries it out again."""

    __tablename__ = "slack_requests"
    __table_args__ = (
        CheckConstraint(_one_of("kind", RequestKind), name="kind"),
        CheckConstraint(_one_of("state", RequestState), name="state"),
        # The bots' replay asks for unfinished requests by their claim's age; housekeeping forgets finished ones.
        Index(None, "state", "claimed_at"),
        Index(None, "done_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    # From what Slack gives, hashed (chatops.requests.request_key): a redelivery or a mention's twin finds it.
    key: Mapped[str] = mapped_column(String(64), unique=True)
    payload: Mapped[dict[str, Any]]
    # What a step keeps so that carrying it out again does not repeat it (`/mm PROMPT`: the root's ts).
    progress: Mapped[dict[str, Any] | None]
    state: Mapped[str] = mapped_column(String(16), default=RequestState.RECEIVED)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The bot process carrying it out (compare-and-set), and when it last said so (the database's clock); None:
    # released for a retry, which may come from `retry_at` on.
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    claimed_at: Mapped[datetime | None]
    retry_at: Mapped[datetime | None]
    # Claims so far (tries: a replay looks for what an earlier one posted), and the failures among them that
    # count toward giving up (our own errors, and bots that died on it; not Slack's outages).
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    done_at: Mapped[datetime | None]


class AssistantContext(Base):
    """What the person looks at beside an assistant thread (the channel), as Slack last said
    (assistant_thread_started, assistant_thread_context_changed): kept instead of bolt's default store, which
    asks Slack before the ack. Nothing reads it yet."""

    __tablename__ = "assistant_contexts"
    # Housekeeping forgets the contexts of threads untouched for a while.
    __table_args__ = (Index(None, "updated_at"),)

    channel_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    thread_ts: Mapped[str] = mapped_column(String(32), primary_key=True)
    context: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class JobRun(Base):
    """One firing of a scheduled job; the unique (job, time) makes a schedule fired twice run once."""

    __tablename__ = "job_runs"
    __table_args__ = (
        UniqueConstraint("job_name", "scheduled_for"),
        CheckConstraint(_one_of("status", JobRunStatus), name="status"),
        CheckConstraint(_one_of("trigger", JobTrigger), name="trigger"),
        # The job's latest runs (status, the failures in a row) are read by job and status.
        Index(None, "job_name", "status"),
        # One running run a job: a run that starts while another runs is skipped, whichever worker starts it.
        Index(
            "uq_job_runs_one_running",
            "job_name",
            unique=True,
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_name: Mapped[str] = mapped_column(String(100))
    scheduled_for: Mapped[datetime]
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id", ondelete="SET NULL"))
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16), default=JobRunStatus.SCHEDULED)
    summary: Mapped[str | None] = mapped_column(Text)
    trigger: Mapped[str] = mapped_column(String(16), default=JobTrigger.SCHEDULE, server_default=JobTrigger.SCHEDULE)
    requested_by: Mapped[str | None] = mapped_column(String(32))
    # The run's thread: its root message in the job's channel.
    channel_id: Mapped[str | None] = mapped_column(String(32))
    root_ts: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    pushed_branch: Mapped[str | None] = mapped_column(String(255))
    # The `/mm job run` that asked for it (chatops.requests' key): a replay of the command finds its run here
    # instead of recording a second one.
    request_key: Mapped[str | None] = mapped_column(String(64), unique=True)


class JobState(Base):
    """What a job remembers between runs: paused or not (by whom, why), and its failures in a row."""

    __tablename__ = "job_states"

    job_name: Mapped[str] = mapped_column(String(100), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    paused_by: Mapped[str | None] = mapped_column(String(32))  # a person, or None when the failures paused it
    paused_reason: Mapped[str | None] = mapped_column(Text)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class SchedulerLease(Base):
    """Who fires the jobs: one scheduler at a time holds the row's lease and renews it; another takes it over
    once it expires. The job runs' uniqueness stays the last guard against a run fired twice."""

    __tablename__ = "scheduler_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime]


class PullRequestRecord(Base):
    """A pull request mm opened, or is about to open, for a thread or a job: what its branch was pushed with and
    what the forge is to be told (`needs_sync`), so that a worker killed between the push and the forge's answer
    leaves nothing a later one cannot finish (workers/pull_requests.py). One open at a time per `owner`."""

    __tablename__ = "pull_requests"
    __table_args__ = (
        CheckConstraint(_one_of("state", PullRequestState), name="state"),
        Index(
            "uq_pull_requests_one_open",
            "owner",
            unique=True,
            postgresql_where=text("state IN ('pending', 'open')"),
            sqlite_where=text("state IN ('pending', 'open')"),
        ),
        Index(None, "session_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # What keeps one pull request: `thread:<session id>` or `job:<job name>`.
    owner: Mapped[str] = mapped_column(String(200))
    # The thread told about it: the thread's own, or a job's latest run.
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id", ondelete="SET NULL"))
    host: Mapped[str] = mapped_column(String(255))
    repo: Mapped[str] = mapped_column(String(500))  # the path on the forge: owner/name, or GitLab's group/…/name
    branch: Mapped[str] = mapped_column(String(255))
    base: Mapped[str] = mapped_column(String(255))
    number: Mapped[int | None] = mapped_column(Integer)
    url: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default=PullRequestState.PENDING)
    draft: Mapped[bool] = mapped_column(Boolean, default=False)
    title: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    head_sha: Mapped[str] = mapped_column(String(64))  # the commit mm pushed last: the lease of its next push
    # The commit a push is sending, written before it leaves: after a worker stopped mid-push, the branch may hold
    # it, and it is mm's own (a job's next run may replace it).
    pushing_sha: Mapped[str | None] = mapped_column(String(64))
    requested_by: Mapped[str | None] = mapped_column(String(32))
    # The forge has not been told the row's title, body or head yet: a sync is due.
    needs_sync: Mapped[bool] = mapped_column(Boolean, default=True)
    error: Mapped[str | None] = mapped_column(Text)  # the forge's last refusal, as the thread was told
    # When the record is next looked at: a sync tried again (a rate limit's reset, a forge away), or its checks.
    retry_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # syncs tried again in a row (a forge away)
    # The checks on head_sha are followed until then; checks_said: the head whose checks' end the thread was told.
    follow_until: Mapped[datetime | None]
    checks_said: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


# --- Slack's installations (many workspaces: OAuth v2) --------------------------------------------------------------
# slack_sdk's own SQLAlchemy stores keep the installations, their bots and the OAuth flow's one-use states; their
# tables are theirs, built by their own builders on this metadata so that the migrations follow them like every
# other table (slackio.installations opens the stores on them).
INSTALLATIONS_TABLE = SQLAlchemyInstallationStore.default_installations_table_name
BOTS_TABLE = SQLAlchemyInstallationStore.default_bots_table_name
OAUTH_STATES_TABLE = "slack_oauth_states"
slack_installations = SQLAlchemyInstallationStore.build_installations_table(Base.metadata, INSTALLATIONS_TABLE)
slack_bots = SQLAlchemyInstallationStore.build_bots_table(Base.metadata, BOTS_TABLE)
slack_oauth_states = SQLAlchemyOAuthStateStore.build_oauth_states_table(Base.metadata, OAUTH_STATES_TABLE)
