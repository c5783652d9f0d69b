"""What a person asks in Slack that the bot carries out after its ack: `/mm …`, a thread command, a click.

Slack never sends an acked slash command or click again, so the bot records each one here before it acks
(`record`, claimed at once by the process that received it) and carries it out after, from the row. A bot killed
in between leaves the row unfinished; its claim is no longer renewed (`renew`), and a bot's replay claims it
once the claim is stale (`claim_stale`), by compare-and-set, so that of several replicas one carries it out,
and gives up after MAX_ATTEMPTS claims (`finish` with FAILED). A step that must not happen twice keeps what it
did in `progress` (`keep_progress`, only while the claim is still the writer's). Finished rows are forgotten
after a while by the workers' housekeeping (`forget_finished`): the bot only carries requests out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, bindparam, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from chatops.schema import RequestKind, RequestState, SlackRequest, utcnow

# Claims of one request, counting the first (by the bot that received it): a request that killed or failed
# its bot this often is not tried again, and the person is told.
MAX_ATTEMPTS = 3
# Finished requests are kept this long (who asked what, when), then forgotten by housekeeping.
KEPT = timedelta(days=7)

_COLUMNS = (
    SlackRequest.id,
    SlackRequest.kind,
    SlackRequest.payload,
    SlackRequest.progress,
    SlackRequest.received_at,
    SlackRequest.attempts,
)


@dataclass(frozen=True)
class Request:
    id: int
    kind: RequestKind
    payload: dict[str, Any]
    progress: dict[str, Any]
    received_at: datetime
    attempts: int  # claims so far, this one included


def _request(row: Any) -> Request:
    return Request(row.id, RequestKind(row.kind), row.payload, row.progress or {}, row.received_at, row.attempts)


def request_key(kind: RequestKind, *parts: str) -> str:
    """The request's unique key, from what Slack gives (a trigger id, a message's ts, a click's action_ts…):
    a digest, so that its length does not depend on what a person wrote."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:48]
    return f"{kind.value}:{digest}"


def record(
    engine: Engine, kind: RequestKind, key: str, payload: dict[str, Any], owner: str, now: datetime | None = None
) -> Request | None:
    """Keep a request, claimed by `owner` (its first attempt); None when it is there already (a redelivery, a
    mention's twin): whoever recorded it carries it out, or its replay does."""
    now = now or utcnow()
    keep = _RECORD_PG if engine.dialect.name == "postgresql" else _RECORD_SQLITE
    values = {"p_kind": kind, "p_key": key, "p_payload": payload, "p_owner": owner, "p_now": now}
    with engine.begin() as conn:
        row = conn.execute(keep, values).first()
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
        received_at=bindparam("p_now"),
        claimed_by=bindparam("p_owner"),
        claimed_at=bindparam("p_now"),
        attempts=1,
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
_FINISH = update(SlackRequest).where(*_HELD).values(state=bindparam("p_state"), done_at=bindparam("p_now"))


def renew(engine: Engine, owner: str, ids: set[int], now: datetime | None = None) -> None:
    """`owner` still carries out these requests: their claims are fresh again (one statement for all)."""
    if not ids:
        return
    with engine.begin() as conn:
        conn.execute(
            update(SlackRequest)
            .where(SlackRequest.id.in_(ids), SlackRequest.claimed_by == owner)
            .values(claimed_at=now or utcnow())
        )


def claim_stale(
    engine: Engine, owner: str, stale_s: float, retry_s: float, now: datetime | None = None, limit: int = 20
) -> list[Request]:
    """Unfinished requests nobody carries out, claimed for `owner` (attempts counted), oldest first: those whose
    claim was not renewed for `stale_s` (their bot is gone), and those released by a failed attempt `retry_s`
    ago. Each claim is a compare-and-set: of two replicas asking at once, one gets each request."""
    now = now or utcnow()
    stale = or_(
        SlackRequest.claimed_at.is_(None),
        SlackRequest.claimed_at <= now - timedelta(seconds=stale_s),
        and_(SlackRequest.claimed_by.is_(None), SlackRequest.claimed_at <= now - timedelta(seconds=retry_s)),
    )
    unfinished = SlackRequest.state == RequestState.RECEIVED
    with engine.connect() as conn:
        ids = list(
            conn.execute(
                select(SlackRequest.id).where(unfinished, stale).order_by(SlackRequest.received_at).limit(limit)
            ).scalars()
        )
    claimed = []
    for request_id in ids:
        with engine.begin() as conn:
            row = conn.execute(
                update(SlackRequest)
                .where(SlackRequest.id == request_id, unfinished, stale)
                .values(claimed_by=owner, claimed_at=now, attempts=SlackRequest.attempts + 1)
                .returning(*_COLUMNS)
            ).first()
        if row is not None:
            claimed.append(_request(row))
    return claimed


def keep_progress(engine: Engine, request_id: int, owner: str, progress: dict[str, Any]) -> bool:
    """Keep what a step did, while `owner` still holds the claim; False when another bot took it over (then
    the caller stops: that bot carries the request out)."""
    return _as_holder(engine, request_id, owner, progress=progress)


def finish(
    engine: Engine, request_id: int, owner: str, state: RequestState = RequestState.DONE, now: datetime | None = None
) -> bool:
    """The request is done (or given up on), if `owner` still holds it; False when another bot took it over."""
    values = {"p_id": request_id, "p_owner": owner, "p_state": state, "p_now": now or utcnow()}
    with engine.begin() as conn:
        return conn.execute(_FINISH, values).rowcount == 1


def release(engine: Engine, request_id: int, owner: str, now: datetime | None = None) -> None:
    """An attempt failed: the claim is given up, so that a replay tries again soon (`claim_stale`'s retry_s)."""
    _as_holder(engine, request_id, owner, claimed_by=None, claimed_at=now or utcnow())


def _as_holder(engine: Engine, request_id: int, owner: str, **values: Any) -> bool:
    """Change an unfinished request that `owner` holds; False when it does not (any more)."""
    with engine.begin() as conn:
        statement = update(SlackRequest).where(*_HELD).values(**values)
        return conn.execute(statement, {"p_id": request_id, "p_owner": owner}).rowcount == 1


def forget_finished(engine: Engine, now: datetime | None = None, kept: timedelta = KEPT) -> int:
    """Forget the requests finished more than `kept` ago (housekeeping); how many."""
    cutoff = (now or utcnow()) - kept
    with engine.begin() as conn:
        return conn.execute(
            delete(SlackRequest).where(SlackRequest.state != RequestState.RECEIVED, SlackRequest.done_at <= cutoff)
        ).rowcount
