"""A job run, from its start to its summary: the worker's side of scheduled jobs (chatops/jobs.py fires them).

Starting (`start_run`, the `mm.run_job` task): the run's row goes from scheduled to running, by compare-and-set
and under the one-running-run-a-job index, so a run delivered twice starts once and a run due while the job's
previous one still runs is recorded as skipped. Its root message goes to the job's channel, and its thread is a
session of kind `job` in a fresh workspace, given the job's prompt; from there it is a thread like any other:
tool lines, approval buttons, the answer.

Finishing (`finish_run`, when the session's turn has ended): the outcome, the duration, the counters and tokens,
what changed in the workspace, posted as the thread's last message; the job's failures in a row are counted,
and after `maxFailures` the job pauses itself and says so in its channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError

from chatops.config import Config, JobConfig
from chatops.inbox import record_message
from chatops.jobs import ensure_state, paused_jobs
from chatops.reload import ConfigFile
from chatops.schema import (
    ApprovalState,
    JobRun,
    JobRunStatus,
    JobState,
    JobTrigger,
    Session,
    SessionEvent,
    SessionKind,
    SessionStatus,
    utcnow,
)
from chatops.secrets import scrub
from chatops.store import approvals_of, ensure_session, record_error
from chatops.teams import Team
from mm_core import display
from mm_core.config import AgentConfig
from mm_core.events import TurnFinished
from mm_core.log import Outcome
from slackio import blocks
from slackio.mrkdwn import Mrkdwn, code_block
from slackio.slack_out import SlackOut
from workers import git
from workers.job_pull_request import push_job_pull_request
from workers.push import BranchRefused, NothingToPush, agent_of, credentials, diff_stat, push_workspace
from workers.workspaces import cloned_branch, start_commit

log = logging.getLogger("mm.worker.jobs")

STARTED = Mrkdwn("🔧 *{job}* started{by} · `{schedule}` ({zone})")
BY_HAND = Mrkdwn(" by <@{user}>")
SUCCEEDED = "✅ *{job}* succeeded in {duration}"
FAILED = "❌ *{job}* failed after {duration}: {reason}"
PAUSED = (
    "⏸ *{job}* paused itself after {failures} failed runs in a row. `/mm job resume {job}` starts it again once "
    "the cause is fixed."
)
SKILL_PROMPT = "Read the skill `{skill}` with read_skill and follow it."
REASONS = {
    Outcome.CANCELLED: "it was stopped",
    Outcome.FAILED: "the turn failed (its error is in the thread)",
    Outcome.MAX_TURNS: "it reached maxTurns without a final answer",
    Outcome.BUDGET: "it reached a budget (its thread says which)",
}
EXPIRED = "a call waited for a decision until it expired"
DIFF_LINES = 20  # of `git diff --stat` in the summary
PUSHED = Mrkdwn("⬆️ Pushed `{branch}` to {remote} ({commit}).")
NOTHING_PUSHED = "Nothing to push: the run changed no file."
NO_REMOTE = "there is nowhere to push: the job has no repository and no `push.remote`"
REMOVED_REASON = "its job was removed from the config while it ran"
REMOVED = "❌ This run ended with no summary: " + REMOVED_REASON + "."
GONE = "the job is no longer in the config"
PAUSED_BEFORE = "the job was paused before the run started"
UNKNOWN_JOB_WAIT = timedelta(minutes=10)
STALE_S = 600.0
REDELIVER_S = 120.0
NO_END = "its end was not recorded (the worker stopped, or the summary failed): its thread says how far it went"


@dataclass(frozen=True)
class RunStart:
    run_id: int
    job: JobConfig
    requested_by: str | None


def prompt_of(job: JobConfig) -> str:
    parts = [SKILL_PROMPT.format(skill=job.skill)] if job.skill else []
    return "\n\n".join([*parts, *([job.prompt] if job.prompt else [])])


def claim_run(engine: Engine, config_file: ConfigFile, run_id: int) -> RunStart | None:
    """Move the run from scheduled to running; None when it is not to start (started already, gone from the
    config, skipped because the job's previous run still runs: each recorded)."""
    with engine.connect() as conn:
        row = conn.execute(select(JobRun.__table__).where(JobRun.id == run_id)).first()
    if row is None or row.status != JobRunStatus.SCHEDULED:
        return None  # a second delivery of a run that started, or a run removed
    job = _job(config_file.current(), row.job_name)
    if job is None:  # added by an edit the scheduler or the bot read before this process did: read it now
        config_file.ask()
        job = _job(config_file.current(), row.job_name)
    now = utcnow()
    if job is None:
        if now - row.scheduled_for < UNKNOWN_JOB_WAIT:
            # Not yet in this pod's copy of the file (a ConfigMap reaches each node in its own time):
            # housekeeping sends the run again (undelivered_runs) until the edit arrives or the wait ends.
            log.info("job run %s: %s is not in this worker's config yet; it is sent again", run_id, row.job_name)
            return None
        _close(engine, run_id, JobRunStatus.FAILED, now, error=GONE, only=JobRunStatus.SCHEDULED)
        return None
    if row.trigger == JobTrigger.SCHEDULE and row.job_name in paused_jobs(engine):
        _close(engine, run_id, JobRunStatus.SKIPPED, now, error=PAUSED_BEFORE, only=JobRunStatus.SCHEDULED)
        return None
    try:
        with engine.begin() as conn:
            moved = conn.execute(
                update(JobRun)
                .where(JobRun.id == run_id, JobRun.status == JobRunStatus.SCHEDULED)
                .values(status=JobRunStatus.RUNNING, started_at=now)
            ).rowcount
    except IntegrityError:  # the one-running-run-a-job index: the previous run still runs
        skipped = JobRunStatus.SKIPPED
        _close(
            engine, run_id, skipped, now, error="the job's previous run was still running", only=JobRunStatus.SCHEDULED
        )
        return None
    return RunStart(run_id, job, row.requested_by) if moved else None


def _job(config: Config, name: str) -> JobConfig | None:
    return next((j for j in config.service.jobs if j.name == name), None)


async def start_run(engine: Engine, slack: SlackOut, start: RunStart) -> str | None:
    """Post the run's root message and give its thread the prompt; the session's id (to enqueue), or None when
    the run could not start (then it is recorded failed)."""
    job = start.job
    by = BY_HAND.format(user=start.requested_by) if start.requested_by else Mrkdwn()
    text = STARTED.format(job=job.name, by=by, schedule=job.schedule, zone=job.timezone)
    try:
        posted = await slack.post(job.channel, text)
    except Exception as e:  # noqa: BLE001 - the run fails, with Slack's words, and the job's failures count it
        reason = f"its message could not be posted in <#{job.channel}>: {e}"
        record_error(engine, "job", f"{job.name}: {reason}")
        _close(engine, start.run_id, JobRunStatus.FAILED, utcnow(), error=reason, only=JobRunStatus.RUNNING)
        count_run(engine, job, failed=True)
        return None
    ts = str(posted["ts"])
    team = Team.named(job.team)
    session_id = ensure_session(
        engine,
        channel_id=job.channel,
        thread_ts=ts,
        kind=SessionKind.JOB,
        requester=start.requested_by,
        repo=job.repo,
        branch=job.branch,
        agent_name=job.agent,
        slack_team_id=team.team_id,
        enterprise_id=team.enterprise_id,
    )
    # Nobody wrote the prompt (the requester is the session's): it alone runs with the job's yolo.
    record_message(engine, channel_id=job.channel, thread_ts=ts, message_ts=ts, user_id=None, text=prompt_of(job))
    with engine.begin() as conn:
        conn.execute(
            update(JobRun)
            .where(JobRun.id == start.run_id)
            .values(session_id=session_id, channel_id=job.channel, root_ts=ts)
        )
    return session_id


@dataclass(frozen=True)
class RunningJob:
    run_id: int
    job: JobConfig
    scheduled_for: datetime
    started_at: datetime


def job_of_session(
    engine: Engine, config: Config, session_id: str, reread: Callable[[], Config] | None = None
) -> RunningJob | None:
    """The running run a session carries. `reread`: the config read again, for a job this process's copy of
    the file does not have yet (a ConfigMap reaches each node in its own time)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(JobRun.id, JobRun.job_name, JobRun.scheduled_for, JobRun.started_at).where(
                JobRun.session_id == session_id, JobRun.status == JobRunStatus.RUNNING
            )
        ).first()
    if row is None:
        return None
    job = _job(config, row.job_name)
    if job is None and reread is not None:
        job = _job(reread(), row.job_name)
    return RunningJob(row.id, job, row.scheduled_for, row.started_at or utcnow()) if job is not None else None


def time_left(engine: Engine, run: RunningJob, session_id: str, now: datetime) -> float:
    """What is left of the run's time limit: it counts the time the run worked, from its first turn's start
    (the queue and the clone before it are not the chore's), less the waits for a decision (an approval
    answered after an hour does not use up a run's half hour)."""
    with engine.connect() as conn:
        began = conn.execute(
            select(func.min(SessionEvent.created_at)).where(
                SessionEvent.session_id == session_id, SessionEvent.created_at >= run.started_at
            )
        ).scalar_one_or_none()
    if began is None:
        return run.job.timeLimit  # its first turn has not begun
    waits = sorted(
        (a.created_at, a.decided_at or now)
        for a in approvals_of(engine, session_id)
        if a.created_at is not None and a.created_at >= began
    )
    waited, reached = 0.0, began
    for begin, end in waits:  # calls asked together wait together: count their union once
        begin = max(begin, reached)
        if end > begin:
            waited += (end - begin).total_seconds()
            reached = end
    return run.job.timeLimit - ((now - began).total_seconds() - waited)


async def finish_run(
    engine: Engine,
    config: Config,
    session_id: str,
    finished: TurnFinished | None,
    reason: str | None,
    workspace: Path | None,
    post: Any,
    secrets: list[str],
) -> None:
    """Close the session's running run: its status, its summary posted with `post(text)` (into the thread) and,
    when it pauses the job, in the channel as well."""
    found = job_of_session(engine, config, session_id)
    if found is None:
        if await asyncio.to_thread(_close_removed, engine, session_id):
            await post(REMOVED)
        return
    run_id, job, started = found.run_id, found.job, found.started_at
    now = utcnow()
    if reason is None and finished is not None and finished.outcome != Outcome.ANSWERED:
        reason = REASONS.get(finished.outcome, str(finished.outcome))
    if reason is None and any(a.state == ApprovalState.EXPIRED for a in approvals_of(engine, session_id)):
        reason = EXPIRED
    duration = blocks.duration((now - started).total_seconds())
    outcome = (
        SUCCEEDED.format(job=job.name, duration=duration)
        if reason is None
        else FAILED.format(job=job.name, duration=duration, reason=reason)
    )
    recap = display.recap(finished) if finished is not None else None
    # The summary is the service's mrkdwn (a pull request's link); job names, git's words and file names in it
    # are values, escaped.
    lines: list[str] = [
        Mrkdwn("{outcome} · {recap}").format(outcome=outcome, recap=recap) if recap else Mrkdwn.of(outcome)
    ]
    start = start_commit(config.workspaces_root, session_id)
    agent = agent_of(config, job.agent)  # the run's workspace's git runs in the sandbox its commands ran in
    changes = await asyncio.to_thread(diff_stat, workspace, agent, start, DIFF_LINES) if workspace is not None else ""
    if changes:
        lines.append(Mrkdwn("Changes:\n{changes}").format(changes=code_block(changes)))
    pushed_branch = None
    if job.push is not None and reason is None and workspace is not None:
        cloned = cloned_branch(config.workspaces_root, session_id)
        answer = finished.answer if finished is not None else ""
        pushed_branch, said, reason = await _push(
            engine, config, secrets, found, session_id, workspace, agent, start, cloned, answer or "", changes
        )
        lines.append(said)
        if reason is not None:  # the outcome line changes: the run failed after all
            failed = FAILED.format(job=job.name, duration=duration, reason=reason)
            lines[0] = Mrkdwn("{failed} · {recap}").format(failed=failed, recap=recap) if recap else Mrkdwn.of(failed)
    summary = scrub(Mrkdwn("\n").join(lines), secrets)
    status = JobRunStatus.SUCCEEDED if reason is None else JobRunStatus.FAILED
    closed = _close(
        engine,
        run_id,
        status,
        now,
        error=reason,
        summary=summary,
        only=JobRunStatus.RUNNING,
        pushed_branch=pushed_branch,
    )
    if not closed:
        return  # another worker closed it
    # Nothing of the run's yolo is left to undo: the job's yolo covered its prompt alone (workers.asking), an
    # "Approve all" in its thread the run's prompt (mm_core.state), and the thread's own `yolo on|off`, a person's
    # explicit switch, stays.
    await post(summary)
    failures = count_run(engine, job, failed=reason is not None)
    if failures >= job.maxFailures and pause_job(engine, job, failures):
        await post(PAUSED.format(job=job.name, failures=failures), in_channel=True)


def _close_removed(engine: Engine, session_id: str) -> bool:
    """Close the session's running run whose job an edit removed from the config while it ran."""
    with engine.begin() as conn:
        return (
            conn.execute(
                update(JobRun)
                .where(JobRun.session_id == session_id, JobRun.status == JobRunStatus.RUNNING)
                .values(status=JobRunStatus.FAILED, finished_at=utcnow(), error=REMOVED_REASON)
            ).rowcount
            > 0
        )


def close_stale_runs(engine: Engine, now: datetime, quiet_s: float = STALE_S) -> list[int]:
    """Runs still marked running whose session has been idle for `quiet_s`: their end was never recorded (the
    worker stopped between the turn's end and the summary, or the summary failed). They are closed as failed,
    or every later run of the job would be skipped as "still running". The ids closed."""
    before = now - timedelta(seconds=quiet_s)
    with engine.begin() as conn:
        stale = (
            conn.execute(
                select(JobRun.id)
                .outerjoin(Session, Session.id == JobRun.session_id)
                .where(
                    JobRun.status == JobRunStatus.RUNNING,
                    # Idle since, or never given its thread (the worker stopped between the claim and the post).
                    ((Session.status == SessionStatus.IDLE) & (Session.updated_at < before))
                    | (JobRun.session_id.is_(None) & (JobRun.started_at < before)),
                )
            )
            .scalars()
            .all()
        )
    return [
        run_id
        for run_id in stale
        if _close(engine, run_id, JobRunStatus.FAILED, now, error=NO_END, only=JobRunStatus.RUNNING)
    ]


async def _push(
    engine: Engine,
    config: Config,
    secrets: list[str],
    run: RunningJob,
    session_id: str,
    workspace: Path,
    agent: AgentConfig,
    start: str | None,
    cloned: str | None,
    answer: str,
    changes: str,
) -> tuple[str | None, str, str | None]:
    """Push the run's changes as the job says (to a branch of the run's own, or to its pull request's): the
    branch pushed (or None), the summary's line, and the reason the run failed when the push did."""
    job = run.job
    assert job.push is not None
    remote = job.push.remote or job.repo or config.service.for_job(job).channel(job.channel).repo
    if not remote:
        return None, NO_REMOTE, NO_REMOTE
    if job.push.pr:
        return await push_job_pull_request(
            engine, config, secrets, run, session_id, workspace, agent, remote, start, cloned, answer, changes
        )
    local = run.scheduled_for.astimezone(ZoneInfo(job.timezone))  # the date the team sees in the job's zone
    branch = job.push.branch.format(job=job.name, date=f"{local:%Y-%m-%d}", run=run.run_id)
    message = f"{job.name}: run {run.run_id} of {local:%Y-%m-%d %H:%M} {job.timezone}\n\n{prompt_of(job)[:2000]}"
    try:
        base = job.branch or config.service.for_job(job).channel(job.channel).branch
        token = await asyncio.to_thread(credentials, config, remote)
        pushed = await asyncio.to_thread(
            push_workspace, workspace, agent, remote, branch, message, token, base, start, cloned
        )
    except BranchRefused as e:
        return None, Mrkdwn.of(f"the push was refused: {e}"), f"the push was refused: {e}"
    except NothingToPush:
        return None, Mrkdwn.of(NOTHING_PUSHED), None
    except git.GitError as e:
        reason = f"the push of `{branch}` failed: {e.text}"
        return None, Mrkdwn.of(reason), reason
    pushed_line = PUSHED.format(branch=branch, remote=pushed.remote, commit=pushed.commit[:10]) + pushed.said
    return branch, pushed_line, None


def undelivered_runs(engine: Engine, now: datetime, quiet_s: float = REDELIVER_S) -> list[int]:
    """Runs recorded as due a while ago and still not started: their hand-off to the broker may have been lost
    (a scheduler killed between the two). Sent again, they start once (claim_run's compare-and-set)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(JobRun.id)
            .where(JobRun.status == JobRunStatus.SCHEDULED, JobRun.scheduled_for < now - timedelta(seconds=quiet_s))
            .order_by(JobRun.id)
            .limit(100)
        )
        return list(rows.scalars())


def _close(
    engine: Engine,
    run_id: int,
    status: JobRunStatus,
    now: datetime,
    *,
    error: str | None = None,
    summary: str | None = None,
    only: JobRunStatus | None = None,
    pushed_branch: str | None = None,
) -> bool:
    stmt = update(JobRun).where(JobRun.id == run_id)
    if only is not None:  # a compare-and-set: another worker may have moved it
        stmt = stmt.where(JobRun.status == only)
    values = {"status": status, "finished_at": now, "error": error, "summary": summary, "pushed_branch": pushed_branch}
    with engine.begin() as conn:
        return conn.execute(stmt.values(values)).rowcount == 1


def count_run(engine: Engine, job: JobConfig, failed: bool) -> int:
    """Count the run into the job's failures in a row (a success clears them); the count."""
    with engine.begin() as conn:
        ensure_state(conn, job.name)
        state = conn.execute(select(JobState.consecutive_failures).where(JobState.job_name == job.name)).scalar_one()
        # updated_at is the job's last pause or resume (where a scheduler catches up from): counting leaves it.
        count = state + 1 if failed else 0
        conn.execute(
            update(JobState)
            .where(JobState.job_name == job.name)
            .values(consecutive_failures=count, updated_at=JobState.updated_at)
        )
        return count


def pause_job(engine: Engine, job: JobConfig, failures: int) -> bool:
    """Pause the job for its failures; False when it was paused already (then nothing is announced again)."""
    with engine.begin() as conn:
        return (
            conn.execute(
                update(JobState)
                .where(JobState.job_name == job.name, JobState.paused.is_(False))
                .values(paused=True, paused_by=None, paused_reason=f"{failures} failed runs in a row")
            ).rowcount
            == 1
        )
