"""What a person asks in Slack that the bot carries out after its ack: `/mm …`, a thread command, a click.

Slack never sends an acked slash command or click again, so the bot records each one here before it acks
(`record`, claimed at once by the process that received it) and carries it out after, from the row. A bot killed
in between leaves the row unfinished; its claim is no longer renewed (`renew`), and a bot's replay claims it
once the claim is stale (`claim_stale`), by compare-and-set, so that of several replicas one carries it out. An
attempt that failed gives the claim up (`release`) until a time it names (a backoff, or what Slack asked), and
a replay claims it then. Failures of our own and bots that died count toward MAX_ATTEMPTS, after which the bot
gives up (`finish` with FAILED); Slack's outages do not (the bot gives up on them by age). A step that must not
happen twice keeps what it did in `progress` (`keep_progress`, only while the claim is still the writer's; in
the same transaction as the step's own change when given its connection), and `hold` checks the claim right
before a step that cannot be undone (a post). Finished rows are forgotten after a while by the workers'
housekeeping (`forget_finished`): the bot only carries requests out.

Every time here is the database's (chatops.schema.db_clock), never a bot's own: the replicas compare claims'
ages with one clock, whatever their own say.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, case, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from chatops.db import transaction
from chatops.errors import ChatopsError
from chatops.schema import RequestKind, RequestState, SlackRequest, db_clock

# Failures of one request that count — our own errors, and bots that died on it —, the first attempt's included:
# a request that failed this often is not tried again, and the person is told.
MAX_ATTEMPTS = 3
# Finished requests are kept this long (who asked what, when), then forgotten by housekeeping.
KEPT = timedelta(days=7)

_COLUMNS = (
    SlackRequest.id,
    SlackRequest.kind,
    SlackRequest.key,
    SlackRequest.payload,
    SlackRequest.progress,
    SlackRequest.received_at,
    SlackRequest.attempts,
    SlackRequest.failures,
    db_clock().label("now"),
)


class Abandoned(ChatopsError):
    """The recording was given up before its commit (its listener stopped waiting): nothing was kept."""


@dataclass(frozen=True)
class Request:
    id: int
    kind: RequestKind
    key: str
    payload: dict[str, Any]
    progress: dict[str, Any]
    received_at: datetime
    attempts: int  # claims so far, this one included: more than one means an earlier attempt may have done steps
    failures: int  # those that count toward MAX_ATTEMPTS
    age_s: float  # since it was received, by the database's clock, when claimed


def _request(row: Any) -> Request:
    age = max(0.0, (row.now - row.received_at).total_seconds())
    return Request(
        row.id,
        RequestKind(row.kind),
        row.key,
        row.payload,
        row.progress or {},
        row.received_at,
        row.attempts,
        row.failures,
        age,
    )


def request_key(kind: RequestKind, *parts: str) -> str:
    """The request's unique key, from what Slack gives (a trigger id, a message's ts, a click's action_ts…):
    a digest, so that its length does not depend on what a person wrote."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:48]
    return f"{kind.value}:{digest}"


def record(
    engine: Engine,
    kind: RequestKind,
    key: str,
    payload: dict[str, Any],
    owner: str,
    commit_if: Callable[[], bool] | None = None,
) -> Request | None:
    """Keep a request, claimed by `owner` (its first attempt); None when it is there already (a redelivery, a
    mention's twin): whoever recorded it carries it out, or its replay does. `commit_if`, asked right before the
    commit of a new row: False rolls it back (Abandoned), so that nothing is kept."""
    keep = _RECORD_PG if engine.dialect.name == "postgresql" else _RECORD_SQLITE
    values = {"p_kind": kind, "p_key": key, "p_payload": payload, "p_owner": owner}
    with engine.begin() as conn:
        row = conn.execute(keep, values).first()
        if row is not None and commit_if is not None and not commit_if():
            raise Abandoned
    return _request(row) if row is not None else None


# Built once (the bot runs `record` before the ack of every request, and `finish` after): executing them finds
# their compiled form in SQLAlchemy's cache without building a statement and its cache key each time.
_RECORD_PG, _RECORD_SQLITE = (
    dialect.insert(SlackRequest)
    .values(
        kind=bindparam("p_kind"),
        key=bindparam("p_key"),
        payload=bindparam("p_payload"),
        state=RequestState.RECEIVED,
        received_at=db_clock(),
        claimed_by=bindparam("p_owner"),
        claimed_at=db_clock(),
        attempts=1,
        failures=0,
    )
    .on_conflict_do_nothing(index_elements=[SlackRequest.key])
    .returning(*_COLUMNS)
    for dialect in (postgresql, sqlite)
)
_HELD = (
    SlackRequest.id == bindparam("p_id"),
    SlackRequest.claimed_by == bindparam("p_owner"),
    SlackRequest.state == RequestState.RECEIVED,
)
_FINISH = update(SlackRequest).where(*_HELD).values(state=bindparam("p_state"), done_at=db_clock())


def renew(engine: Engine, owner: str, ids: set[int]) -> None:
    """`owner` still carries out these requests: their claims are fresh again (one statement for all)."""
    if not ids:
        return
    with engine.begin() as conn:
        conn.execute(
            update(SlackRequest)
            .where(SlackRequest.id.in_(ids), SlackRequest.claimed_by == owner)
            .values(claimed_at=db_clock())
        )


def claim_stale(engine: Engine, owner: str, stale_s: float, limit: int = 20) -> list[Request]:
    """Unfinished requests nobody carries out, claimed for `owner`, oldest first: those whose claim was not
    renewed for `stale_s` (their bot is gone: a failure that counts), and those an attempt released whose time
    to retry has come. Each claim is a compare-and-set: of two replicas asking at once, one gets each request."""
    died = and_(SlackRequest.claimed_by.is_not(None), SlackRequest.claimed_at <= db_clock(-stale_s))
    due = and_(
        SlackRequest.claimed_by.is_(None), or_(SlackRequest.retry_at.is_(None), SlackRequest.retry_at <= db_clock())
    )
    unfinished = SlackRequest.state == RequestState.RECEIVED
    with engine.connect() as conn:
        ids = list(
            conn.execute(
                select(SlackRequest.id)
                .where(unfinished, or_(died, due))
                .order_by(SlackRequest.received_at)
                .limit(limit)
            ).scalars()
        )
    claimed = []
    for request_id in ids:
        with engine.begin() as conn:
            row = conn.execute(
                update(SlackRequest)
                .where(SlackRequest.id == request_id, unfinished, or_(died, due))
                .values(
                    claimed_by=owner,
                    claimed_at=db_clock(),
                    retry_at=None,
                    attempts=SlackRequest.attempts + 1,
                    # SET reads the row as it was: a claim that was still held is a bot that died on it.
                    failures=SlackRequest.failures + case((SlackRequest.claimed_by.is_(None), 0), else_=1),
                )
                .returning(*_COLUMNS)
            ).first()
        if row is not None:
            claimed.append(_request(row))
    return claimed


def keep_progress(bind: Engine | Connection, request_id: int, owner: str, progress: dict[str, Any]) -> bool:
    """Keep what a step did, while `owner` still holds the claim; False when another bot took it over (then
    the caller stops: that bot carries the request out). Given a connection, in its transaction: the step's
    own change and this commit together, or not at all."""
    return _as_holder(bind, request_id, owner, progress=progress)


def hold(bind: Engine | Connection, request_id: int, owner: str) -> bool:
    """Whether `owner` still holds the request, its claim renewed: asked right before a step that cannot be
    taken back (a post), so that a bot that stalled past its claim does not post what its replacement posts."""
    return _as_holder(bind, request_id, owner, claimed_at=db_clock())


def finish(bind: Engine | Connection, request_id: int, owner: str, state: RequestState = RequestState.DONE) -> bool:
    """The request is done (or given up on), if `owner` still holds it; False when another bot took it over."""
    with transaction(bind) as conn:
        return conn.execute(_FINISH, {"p_id": request_id, "p_owner": owner, "p_state": state}).rowcount == 1


def release(engine: Engine, request_id: int, owner: str, retry_in_s: float, counted: bool) -> None:
    """An attempt failed: the claim is given up until `retry_in_s` from now, when a replay tries again; `counted`:
    the failure counts toward MAX_ATTEMPTS (ours, not Slack's)."""
    failures = SlackRequest.failures + (1 if counted else 0)
    _as_holder(engine, request_id, owner, claimed_by=None, retry_at=db_clock(retry_in_s), failures=failures)


def _as_holder(bind: Engine | Connection, request_id: int, owner: str, **values: Any) -> bool:
    """Change an unfinished request that `owner` holds; False when it does not (any more)."""
    with transaction(bind) as conn:
        statement = update(SlackRequest).where(*_HELD).values(**values)
        return conn.execute(statement, {"p_id": request_id, "p_owner": owner}).rowcount == 1


def forget_finished(engine: Engine, kept: timedelta = KEPT) -> int:
    """Forget the requests finished more than `kept` ago (housekeeping); how many."""
    with engine.begin() as conn:
        return conn.execute(
            delete(SlackRequest).where(
                SlackRequest.state != RequestState.RECEIVED, SlackRequest.done_at <= db_clock(-kept.total_seconds())
            )
        ).rowcount
