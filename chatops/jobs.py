"""Firing scheduled jobs, in the database: who fires (one scheduler at a time), and which runs are due.

A scheduler calls `fire_due` on each tick while it holds the leadership lease (`take_leadership`); each run is a
`job_runs` row whose unique (job, scheduled time) is the last guard, so two schedulers that both believe they
lead still start a run once. The row is the run's source of truth; the broker only carries "run R is due".

Catching up, per job: the scheduler remembers up to when it looked (`Cursor`). At its start (or when it takes
over) it starts from the job's latest scheduled run, or from its last pause or resume, or from now for a job that
never ran. Of the times missed since, the latest runs once if it is at most `grace` old; the others are recorded
as missed, so the history says what did not happen and why.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from chatops.config import JobConfig
from chatops.db import transaction
from chatops.schedule import fires
from chatops.schema import JobRun, JobRunStatus, JobState, JobTrigger, SchedulerLease

LEADERSHIP = "jobs"
_LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
# A job's state row made by its runs, not by a person: never paused nor resumed, so no point to catch up from.
NEVER = _LONG_AGO
# Times recorded as missed for one job after an outage, at most (the newest): a minutely job down for a month
# should not write forty thousand rows.
MAX_MISSED = 100
# How far back a scheduler looks for missed times: older ones are not even recorded as missed (a minutely job
# whose scheduler was gone for years must not cost a walk over every minute since).
CATCH_UP = timedelta(days=31)
IDLE_MARK = timedelta(minutes=1)  # how stale a disabled job's "last seen idle" may get (one write a minute)
UNRUN_KEPT = timedelta(days=30)  # skipped and missed runs, in the history (forget_unrun)


@dataclass(frozen=True)
class FiredRun:
    run_id: int
    job: str
    scheduled_for: datetime
    status: JobRunStatus  # SCHEDULED (to dispatch) or MISSED


def take_leadership(engine: Engine, owner: str, ttl_s: float, now: datetime) -> bool:
    """Hold (or renew) the scheduler's lease for `ttl_s`; False while another owner's lease runs."""
    expires = now + timedelta(seconds=ttl_s)
    with engine.begin() as conn:
        taken = conn.execute(
            update(SchedulerLease)
            .where(
                SchedulerLease.name == LEADERSHIP,
                (SchedulerLease.owner == owner) | (SchedulerLease.expires_at <= now),
            )
            .values(owner=owner, expires_at=expires)
        ).rowcount
    if taken:
        return True
    with engine.connect() as conn:  # a standby's usual answer, without an INSERT failing every tick
        if conn.execute(select(SchedulerLease.name).where(SchedulerLease.name == LEADERSHIP)).first() is not None:
            return False
    try:
        with engine.begin() as conn:
            conn.execute(insert(SchedulerLease).values(name=LEADERSHIP, owner=owner, expires_at=expires))
        return True
    except IntegrityError:  # the row exists and another owner's lease runs
        return False


def give_up_leadership(engine: Engine, owner: str) -> None:
    """Let another scheduler take over at once (a clean stop), rather than after the lease runs out."""
    with engine.begin() as conn:
        conn.execute(
            update(SchedulerLease)
            .where(SchedulerLease.name == LEADERSHIP, SchedulerLease.owner == owner)
            .values(expires_at=_LONG_AGO)
        )


class Cursor:
    """Up to when each job's times were looked at, by this scheduler."""

    def __init__(self) -> None:
        self._until: dict[str, datetime] = {}

    def reset(self) -> None:
        """Forget: the next tick starts again from the database (after leadership was lost and retaken)."""
        self._until.clear()

    def since(self, engine: Engine, job: JobConfig, now: datetime) -> datetime:
        if job.name not in self._until:
            self._until[job.name] = _resume_point(engine, job.name) or now
        return self._until[job.name]

    def advance(self, job: str, until: datetime) -> None:
        self._until[job] = until

    def keep(self, jobs: Iterable[str]) -> None:
        """Forget the jobs no longer configured (a reload removed them; one added again starts afresh)."""
        kept = set(jobs)
        self._until = {name: until for name, until in self._until.items() if name in kept}


def fire_due(
    engine: Engine, jobs: Iterable[JobConfig], cursor: Cursor, now: datetime, grace_s: float
) -> list[FiredRun]:
    """Record the runs due up to `now` (a new row each, or nothing when another scheduler recorded it first);
    a paused or disabled job fires nothing, and its times pass."""
    jobs = list(jobs)
    cursor.keep(j.name for j in jobs)
    _mark_idle(engine, [j.name for j in jobs if j.enabled], [j.name for j in jobs if not j.enabled], now)
    paused = paused_jobs(engine)
    fired: list[FiredRun] = []
    for job in jobs:
        since = max(cursor.since(engine, job, now), now - CATCH_UP)
        if job.enabled and job.name not in paused:
            due = list(deque(fires(job.schedule, job.timezone, since, now), maxlen=MAX_MISSED))
            for i, at in enumerate(due):
                on_time = i == len(due) - 1 and now - at <= timedelta(seconds=grace_s)
                status = JobRunStatus.SCHEDULED if on_time else JobRunStatus.MISSED
                if (run := _record(engine, job.name, at, status, now)) is not None:
                    fired.append(run)
        # Only once its times are recorded: a database error above leaves them to the next tick.
        cursor.advance(job.name, now)
    return fired


def _mark_idle(engine: Engine, enabled: list[str], disabled: list[str], now: datetime) -> None:
    """The jobs the config disables or no longer has did not miss their times: their state says when they were
    last seen so (to the minute), where a scheduler started after a re-enabling (a restart that rolled the new
    config in) catches up from, rather than from their last run weeks ago."""
    with engine.begin() as conn:
        known = set(conn.execute(select(JobState.job_name).where(JobState.job_name.in_(disabled))).scalars())
        for name in sorted(set(disabled) - known):
            conn.execute(insert(JobState).values(job_name=name, updated_at=now))
        conn.execute(
            update(JobState)
            .where(
                JobState.job_name.not_in(enabled),
                JobState.paused.is_(False),
                JobState.updated_at < now - IDLE_MARK,
            )
            .values(updated_at=now)
        )


def forget_unrun(engine: Engine, now: datetime, keep: timedelta = UNRUN_KEPT) -> int:
    """Delete the skipped and missed runs older than `keep`: a minutely job whose runs last longer than a minute
    records one a minute. The runs that ran stay: they are the history, with their sessions. How many went."""
    with engine.begin() as conn:
        return conn.execute(
            delete(JobRun).where(
                JobRun.status.in_([JobRunStatus.SKIPPED, JobRunStatus.MISSED]), JobRun.scheduled_for < now - keep
            )
        ).rowcount


def _record(engine: Engine, job: str, at: datetime, status: JobRunStatus, now: datetime) -> FiredRun | None:
    values = {"job_name": job, "scheduled_for": at, "status": status, "trigger": JobTrigger.SCHEDULE}
    if status == JobRunStatus.MISSED:
        values |= {"finished_at": now, "error": "no scheduler ran at its time, and it was too late to run it"}
    try:
        with engine.begin() as conn:
            run_id = conn.execute(insert(JobRun).values(values).returning(JobRun.id)).scalar_one()
    except IntegrityError:  # another scheduler recorded this time first
        return None
    return FiredRun(run_id, job, at, status)


def _resume_point(engine: Engine, job: str) -> datetime | None:
    with engine.connect() as conn:
        latest = conn.execute(
            select(func.max(JobRun.scheduled_for)).where(JobRun.job_name == job, JobRun.trigger == JobTrigger.SCHEDULE)
        ).scalar_one_or_none()
        changed = conn.execute(select(JobState.updated_at).where(JobState.job_name == job)).scalar_one_or_none()
    points = [p for p in (latest, changed) if p is not None and p != NEVER]
    return max(points) if points else None


def paused_jobs(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(JobState.job_name).where(JobState.paused.is_(True))).scalars())


# --- control: /mm jobs, /mm job run|pause|resume -------------------------------------------------------------


@dataclass(frozen=True)
class JobOverview:
    paused: bool
    paused_reason: str | None
    failures: int
    last_status: str | None  # of the latest run that ended (or is running)
    last_at: datetime | None


def record_manual_run(engine: Engine, job: str, user: str, now: datetime, request_key: str | None = None) -> int:
    """A run asked for now (`/mm job run`), also for a paused or disabled job; its id, to dispatch. With the
    asking request's key, once: a replay of the request finds the run its earlier attempt recorded."""
    with engine.begin() as conn:
        try:
            with conn.begin_nested():
                return conn.execute(
                    insert(JobRun)
                    .values(
                        job_name=job,
                        scheduled_for=now,
                        trigger=JobTrigger.MANUAL,
                        requested_by=user,
                        request_key=request_key,
                    )
                    .returning(JobRun.id)
                ).scalar_one()
        except IntegrityError:
            if request_key is None:
                raise
        # Another attempt at the same request recorded it meanwhile (a replica that took it over).
        return conn.execute(select(JobRun.id).where(JobRun.request_key == request_key)).scalar_one()


def run_of_request(engine: Engine, request_key: str) -> int | None:
    """The run a `/mm job run` request recorded, if an attempt did."""
    with engine.connect() as conn:
        return conn.execute(select(JobRun.id).where(JobRun.request_key == request_key)).scalar()


def set_paused(
    bind: Engine | Connection, job: str, paused: bool, user: str | None, now: datetime, why: str | None = None
) -> bool:
    """Pause or resume a job (by `user`, else by the app itself, saying `why`); False when it already was so.
    Resuming clears its failures in a row, and the time it happens is where a scheduler starting later catches
    up from. Given a connection, in its transaction."""
    values = {
        "paused": paused,
        "paused_by": user if paused else None,
        "paused_reason": (why or f"paused by <@{user}>") if paused else None,
        "updated_at": now,
        **({} if paused else {"consecutive_failures": 0}),
    }
    with transaction(bind) as conn:
        ensure_state(conn, job)
        return (
            conn.execute(
                update(JobState).where(JobState.job_name == job, JobState.paused.is_(not paused)).values(values)
            ).rowcount
            == 1
        )


def ensure_state(conn: Connection, job: str) -> None:
    """Give the job its state row (not paused, no failures, NEVER changed by a person) when it has none yet."""
    if conn.execute(select(JobState.job_name).where(JobState.job_name == job)).first() is None:
        conn.execute(insert(JobState).values(job_name=job, updated_at=NEVER))


def running_run(engine: Engine, job: str) -> tuple[str | None, str | None] | None:
    """The job's run that is running now, as (channel, root ts) of its thread; None when none runs."""
    with engine.connect() as conn:
        row = conn.execute(
            select(JobRun.channel_id, JobRun.root_ts).where(
                JobRun.job_name == job, JobRun.status == JobRunStatus.RUNNING
            )
        ).first()
    return (row.channel_id, row.root_ts) if row is not None else None


def overview(engine: Engine, names: Iterable[str]) -> dict[str, JobOverview]:
    """Each job's state and its latest run that started (skipped and missed ones say so too)."""
    names = list(names)
    with engine.connect() as conn:
        states = {
            s.job_name: s for s in conn.execute(select(JobState.__table__).where(JobState.job_name.in_(names))).all()
        }
        latest = {}
        for name in names:
            row = conn.execute(
                select(JobRun.status, JobRun.scheduled_for)
                .where(JobRun.job_name == name, JobRun.status != JobRunStatus.SCHEDULED)
                .order_by(JobRun.scheduled_for.desc())
                .limit(1)
            ).first()
            latest[name] = row
    return {
        name: JobOverview(
            paused=bool(states[name].paused) if name in states else False,
            paused_reason=states[name].paused_reason if name in states else None,
            failures=states[name].consecutive_failures if name in states else 0,
            last_status=latest[name].status if latest[name] is not None else None,
            last_at=latest[name].scheduled_for if latest[name] is not None else None,
        )
        for name in names
    }
