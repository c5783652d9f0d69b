"""The pull requests mm keeps, as the database records them: one read model, and each change of state in one
function (the worker's flow is workers/pull_requests.py; the bot reads whether a thread has one).

A thread keeps one pull request (`owner` `thread:<session>`), a job one (`job:<name>`): a push records the
commit and the body the forge is to get (`needs_sync`) in the same row, before the forge is asked, so a worker
that stops between the two leaves a row housekeeping finishes (`due`), and the forge, which refuses a second
pull request for a branch, is searched by branch before one is opened. The unique index on `owner` among open
rows makes a second open row impossible whatever two workers do at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, insert, or_, select, update

from chatops.db import reading
from chatops.schema import JobRun, PullRequestRecord, PullRequestState, utcnow

OPEN_STATES = (PullRequestState.PENDING, PullRequestState.OPEN)
# A sync that was asked for this long ago and never finished (its worker stopped): housekeeping takes it over.
ABANDONED_S = 120.0


def thread_owner(session_id: str) -> str:
    return f"thread:{session_id}"


def job_owner(job_name: str) -> str:
    return f"job:{job_name}"


@dataclass(frozen=True)
class PullRecord:
    id: int
    owner: str
    session_id: str | None
    host: str
    repo: str
    branch: str
    base: str
    number: int | None
    url: str | None
    state: str
    draft: bool
    title: str
    body: str
    head_sha: str
    pushing_sha: str | None
    requested_by: str | None
    needs_sync: bool
    error: str | None
    retry_at: datetime | None
    attempts: int
    follow_until: datetime | None
    checks_said: str | None
    updated_at: datetime

    @property
    def shows_status(self) -> bool:
        """Open, or being opened (a sync due or waiting for its retry): `pr` shows it rather than pushing again."""
        return self.state == PullRequestState.OPEN or (self.state == PullRequestState.PENDING and self.needs_sync)

    def known_heads(self) -> set[str]:
        """The commits the branch may hold that are mm's own: the last pushed, and one a stopped push was sending."""
        return {c for c in (self.head_sha, self.pushing_sha) if c}

    @property
    def label(self) -> str:
        """How a thread names it (label_of), or "the pull request" before it has a number."""
        return label_of(self.number, self.url) if self.number is not None else "the pull request"


def label_of(number: int, url: str | None) -> str:
    """How a thread names a pull request: `#12`, GitLab's merge requests `!12` (as their pages do)."""
    return f"{'!' if url and '/-/merge_requests/' in url else '#'}{number}"


_COLUMNS = [PullRequestRecord.__table__.c[name] for name in PullRecord.__dataclass_fields__]


def _record(row: object) -> PullRecord:
    return PullRecord(**row._mapping)  # type: ignore[attr-defined]


def get(engine: Engine, record_id: int) -> PullRecord | None:
    with engine.connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(PullRequestRecord.id == record_id)).first()
    return _record(row) if row is not None else None


def current(engine: Engine, owner: str) -> PullRecord | None:
    """The owner's pull request that is open or being opened, if any."""
    with engine.connect() as conn:
        row = conn.execute(
            select(*_COLUMNS).where(PullRequestRecord.owner == owner, PullRequestRecord.state.in_(OPEN_STATES))
        ).first()
    return _record(row) if row is not None else None


def of_session(engine: Engine, session_id: str) -> PullRecord | None:
    """The pull request a thread shows (`@mm pr`, `status`): its own, the open one else the latest; for a job
    run's thread, its job's."""
    with reading(engine) as conn:
        job = conn.execute(select(JobRun.job_name).where(JobRun.session_id == session_id)).scalar_one_or_none()
        owner = job_owner(job) if job else thread_owner(session_id)
        row = conn.execute(
            select(*_COLUMNS)
            .where(PullRequestRecord.owner == owner)
            .order_by(PullRequestRecord.state.in_(OPEN_STATES).desc(), PullRequestRecord.id.desc())
            .limit(1)
        ).first()
    return _record(row) if row is not None else None


@dataclass(frozen=True)
class Pushed:
    """What a push gives the record: where, which commit, and what the forge is to be told."""

    owner: str
    session_id: str | None
    host: str
    repo: str
    branch: str
    base: str
    head_sha: str
    title: str
    body: str
    draft: bool
    requested_by: str | None


def record_push(engine: Engine, pushed: Pushed, *, needs_sync: bool = True) -> int:
    """Record a push for the owner's pull request, before the forge is asked: the open one gets the new head and
    body, else a new row is made (pending). Its id. `needs_sync=False`: a push about to be made (its branch's
    first, should the worker stop during it), which the forge is not to hear of before it is made."""
    values = {
        "session_id": pushed.session_id,
        "head_sha": pushed.head_sha,
        "body": pushed.body,
        "requested_by": pushed.requested_by,
        "needs_sync": needs_sync,
        "error": None,
        "retry_at": None,
        "attempts": 0,
        "pushing_sha": None,
        "checks_said": None,
        "updated_at": utcnow(),
    }
    with engine.begin() as conn:
        found = conn.execute(
            select(PullRequestRecord.id)
            .where(PullRequestRecord.owner == pushed.owner, PullRequestRecord.state.in_(OPEN_STATES))
            .with_for_update()
        ).scalar_one_or_none()
        if found is not None:
            conn.execute(update(PullRequestRecord).where(PullRequestRecord.id == found).values(values))
            return found
        return conn.execute(
            insert(PullRequestRecord)
            .values(
                values
                | {
                    "owner": pushed.owner,
                    "host": pushed.host,
                    "repo": pushed.repo,
                    "branch": pushed.branch,
                    "base": pushed.base,
                    "title": pushed.title,
                    "draft": pushed.draft,
                    "state": PullRequestState.PENDING,
                    "created_at": utcnow(),
                }
            )
            .returning(PullRequestRecord.id)
        ).scalar_one()


def record_synced(
    engine: Engine,
    record_id: int,
    *,
    number: int,
    url: str,
    draft: bool,
    head_sha: str,
    follow_for: timedelta | None,
) -> bool:
    """The forge has the row's pull request as recorded (opened, found or updated): its number and page, and,
    when `follow_for`, the checks on `head_sha` are followed that long. False when a later push recorded a newer
    head meanwhile (its own sync tells the forge)."""
    now = utcnow()
    with engine.begin() as conn:
        return _set_if(
            conn,
            record_id,
            [PullRequestRecord.head_sha == head_sha],
            number=number,
            url=url,
            draft=draft,
            state=PullRequestState.OPEN,
            needs_sync=False,
            error=None,
            retry_at=None,
            attempts=0,
            follow_until=now + follow_for if follow_for else None,
            updated_at=now,
        )


def record_refusal(engine: Engine, record_id: int, error: str, retry_at: datetime | None) -> None:
    """The forge refused or failed: the text the thread was told, and when to try again (None: not by itself,
    a person acts first; the next push tries again). A retry counts as an attempt."""
    with engine.begin() as conn:
        conn.execute(
            update(PullRequestRecord)
            .where(PullRequestRecord.id == record_id)
            .values(
                error=error,
                retry_at=retry_at,
                needs_sync=retry_at is not None,
                attempts=PullRequestRecord.attempts + 1 if retry_at is not None else 0,
                updated_at=utcnow(),
            )
        )


def record_pushing(engine: Engine, record_id: int, commit: str) -> None:
    """The commit a push of the record's branch is about to send (PullRecord.known_heads)."""
    with engine.begin() as conn:
        conn.execute(update(PullRequestRecord).where(PullRequestRecord.id == record_id).values(pushing_sha=commit))


def ended_heads(engine: Engine, owner: str, most: int = 20) -> set[str]:
    """The heads mm left on the owner's closed or merged pull requests' branch: still mm's own (a job's next run
    may replace a branch that holds one)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(PullRequestRecord.head_sha, PullRequestRecord.pushing_sha)
            .where(PullRequestRecord.owner == owner, PullRequestRecord.state.not_in(OPEN_STATES))
            .order_by(PullRequestRecord.id.desc())
            .limit(most)
        )
        return {c for row in rows for c in row if c}


def record_ended(engine: Engine, record_id: int, state: PullRequestState, head: str | None = None) -> None:
    """The forge says it was closed or merged (or the config moved its owner elsewhere): the owner's next push
    opens a new one. `head`: what the forge showed on its branch when it ended, kept among the heads its owner may
    replace (ended_heads: a closed pull request's branch is its owner's again)."""
    values: dict[str, object] = {"state": state, "needs_sync": False, "follow_until": None, "updated_at": utcnow()}
    if head:
        values["pushing_sha"] = head
    with engine.begin() as conn:
        conn.execute(update(PullRequestRecord).where(PullRequestRecord.id == record_id).values(values))


def request_sync(engine: Engine, record_id: int) -> None:
    """The push the record was written for has landed after all (its worker stopped before it said so)."""
    with engine.begin() as conn:
        conn.execute(update(PullRequestRecord).where(PullRequestRecord.id == record_id).values(needs_sync=True))


def claim_look(engine: Engine, record_id: int, every_s: float, now: datetime | None = None) -> bool:
    """Claim the record's next look (a sync due, its checks), by compare-and-set on `retry_at`: True for the one
    task that takes it, which pushes the next look `every_s` away (a forge's rate limit is shared by all)."""
    now = now or utcnow()
    with engine.begin() as conn:
        due_now = or_(PullRequestRecord.retry_at.is_(None), PullRequestRecord.retry_at <= now)
        return _set_if(conn, record_id, [due_now], retry_at=now + timedelta(seconds=every_s))


def record_checks_said(engine: Engine, record_id: int, head_sha: str) -> bool:
    """Mark the end of `head_sha`'s checks as told, by compare-and-set: True for the one caller that tells it."""
    with engine.begin() as conn:
        following = [PullRequestRecord.head_sha == head_sha, PullRequestRecord.follow_until.is_not(None)]
        return _set_if(conn, record_id, following, checks_said=head_sha, follow_until=None)


def _set_if(conn: Connection, record_id: int, conditions: list[Any], **values: Any) -> bool:
    """Set `values` on the record only while `conditions` hold (a compare-and-set): True for the one caller that
    changed it."""
    changed = update(PullRequestRecord).where(PullRequestRecord.id == record_id, *conditions).values(**values)
    return conn.execute(changed).rowcount == 1


def due(engine: Engine, now: datetime | None = None) -> list[int]:
    """The rows housekeeping hands to a worker: a sync abandoned or waiting for its retry time, and the open pull
    requests whose checks are followed."""
    now = now or utcnow()
    abandoned = now - timedelta(seconds=ABANDONED_S)
    with engine.connect() as conn:
        rows = conn.execute(
            select(PullRequestRecord.id)
            .where(
                PullRequestRecord.state.in_(OPEN_STATES),
                or_(PullRequestRecord.retry_at.is_(None), PullRequestRecord.retry_at <= now),
                or_(
                    PullRequestRecord.needs_sync & (PullRequestRecord.updated_at < abandoned),
                    PullRequestRecord.needs_sync & PullRequestRecord.retry_at.is_not(None),
                    PullRequestRecord.follow_until.is_not(None),
                ),
            )
            .order_by(PullRequestRecord.id)
            .limit(100)
        )
        return list(rows.scalars())
