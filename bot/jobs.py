"""`/mm jobs` and `/mm job run|pause|resume NAME`: the scheduled jobs seen and steered from Slack.

Anyone in a channel may list the jobs; running one now, pausing and resuming are for the approvers of the job's
channel (a run does work on the repository; a pause stops the team's chores). A run asked for here is recorded
like a scheduled one (trigger `manual`), also for a paused or disabled job, and handed to the workers.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Engine

from bot.authorize import Approvers
from bot.steps import NoSteps, Steps
from chatops.config import Config, JobConfig
from chatops.jobs import overview, record_manual_run, run_of_request, running_run, set_paused
from chatops.reload import ConfigFile
from chatops.schedule import next_fire
from chatops.schema import utcnow
from chatops.teams import NOWHERE, Team, section_covers
from slackio.mrkdwn import Mrkdwn

_JOB = re.compile(r"^job(?:\s+(run|pause|resume)(?:\s+(\S+))?)?$", re.IGNORECASE)

NO_JOBS = "No jobs are configured (`jobs` in the config)."
JOB_USAGE = "Say `/mm jobs`, or `/mm job run NAME`, `/mm job pause NAME`, `/mm job resume NAME`."
UNKNOWN_JOB = "There is no job named `{name}`; the jobs are: {jobs}."
RUN_ASKED = Mrkdwn("🔧 <@{user}> started *{job}* now; its thread follows in <#{channel}>.")
PAUSED = Mrkdwn(
    "⏸ <@{user}> paused *{job}*: it runs only when asked (`/mm job run {job}`) until `/mm job resume {job}`."
)
RESUMED = Mrkdwn("▶️ <@{user}> resumed *{job}*: its next run is {next}.")
ALREADY = "*{job}* is {state} already."
STILL_RUNNING = Mrkdwn(
    "*{job}* is running now (its thread is in <#{channel}>): a second run would be skipped, so none was started."
)
STEERED = "job_steered"  # the step of `/mm job pause|resume` that changed the job: "yes", or "no" (it already was)
OUTCOME = {"succeeded": "✅ succeeded", "failed": "❌ failed", "skipped": "⏭ skipped", "missed": "⌛ missed"}


def is_job_command(text: str) -> bool:
    text = text.strip().lower()
    return text == "jobs" or bool(_JOB.match(text))


class JobCommands:
    def __init__(self, engine: Engine, config_file: ConfigFile, approvers: Approvers, enqueue_run: Any) -> None:
        self.engine, self.config_file, self.approvers, self.enqueue_run = engine, config_file, approvers, enqueue_run

    @property
    def config(self) -> Config:
        return self.config_file.current()

    async def answer(
        self, client: Any, text: str, user: str, steps: Steps | None = None, place: Team = NOWHERE
    ) -> tuple[str, tuple[str, str] | None]:
        """The private answer, and a public line for a channel (channel, text) when a job was steered. `steps`:
        what an earlier attempt at the same `/mm` did (a run it recorded is handed over, not recorded again);
        `place`: the workspace asking, which sees and steers its own jobs and the top level's alone."""
        steps = steps or NoSteps(self.engine)
        text = text.strip()
        jobs = {j.name: j for j in self.config.service.jobs if section_covers(j.team, place)}
        if text.lower() == "jobs":
            return (await asyncio.to_thread(self.listing, list(jobs.values())) if jobs else NO_JOBS), None
        m = _JOB.match(text)
        if m is None or not m.group(1) or not m.group(2):
            return JOB_USAGE, None
        action, name = m.group(1).lower(), m.group(2)
        job = jobs.get(name)
        if job is None:
            listed = ", ".join(f"`{n}`" for n in jobs) or "none"
            return UNKNOWN_JOB.format(name=name[:100], jobs=listed), None
        refusal = await self.approvers.may_approve(
            client, job.channel, user, None, f"{action} jobs", place=Team.named(job.team)
        )
        if refusal:
            return refusal, None
        now = utcnow()
        if action == "run":
            # The run is recorded under the request's key: a replay finds the one its earlier attempt recorded
            # (even one that attempt could not keep as a step), and hands that one over.
            run_id = await asyncio.to_thread(run_of_request, self.engine, steps.key) if steps.key else None
            if run_id is None:
                if (running := await asyncio.to_thread(running_run, self.engine, job.name)) is not None:
                    return STILL_RUNNING.format(job=job.name, channel=running[0] or job.channel), None
                run_id = await asyncio.to_thread(record_manual_run, self.engine, job.name, user, now, steps.key)
            await self.enqueue_run(run_id)  # a run handed over twice starts once (workers.jobs.claim_run)
            return RUN_ASKED.format(user=user, job=job.name, channel=job.channel), None
        pause = action == "pause"
        # Kept with the change itself: a replay announces what this attempt did, not that it already was so.
        steered = await steps.take(
            STEERED, lambda conn: "yes" if set_paused(conn, job.name, pause, user, now) else "no"
        )
        if steered != "yes":
            return ALREADY.format(job=job.name, state="paused" if pause else "running"), None
        said = PAUSED if pause else RESUMED
        line = said.format(user=user, job=job.name, next=_next(job))
        return line, (job.channel, line)

    def listing(self, jobs: list[JobConfig] | None = None) -> Mrkdwn:
        """`jobs` (every job of the config unless given) with their state, a line each."""
        jobs = self.config.service.jobs if jobs is None else jobs
        states = overview(self.engine, [j.name for j in jobs])
        lines = []
        for job in jobs:
            state = states[job.name]
            if state.paused:
                # Only the service writes the reason (who paused it, or how many runs failed): its mention is meant.
                when = Mrkdwn("⏸ paused ({why})").format(why=Mrkdwn(state.paused_reason or "by a person"))
            elif not job.enabled:
                when = "disabled in the config"
            else:
                when = f"next {_next(job)}"
            last = (
                f"last {OUTCOME.get(state.last_status, state.last_status)} ({state.last_at:%Y-%m-%d %H:%M} UTC)"
                if state.last_status and state.last_at
                else "never run"
            )
            lines.append(
                Mrkdwn("• *{name}* `{schedule}` ({zone}) in <#{channel}> · {when} · {last}").format(
                    name=job.name, schedule=job.schedule, zone=job.timezone, channel=job.channel, when=when, last=last
                )
            )
        return Mrkdwn("\n").join(lines)


def _next(job: JobConfig) -> str:
    at = next_fire(job.schedule, job.timezone, utcnow()).astimezone(ZoneInfo(job.timezone))
    return f"{at:%a %Y-%m-%d %H:%M} {at.tzname()}"
