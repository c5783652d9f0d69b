"""A job's one pull request (`push: {pr: true}`), kept the way Renovate keeps its: each run that changes files
rebuilds the job's branch from the base and updates the open pull request; a run without changes leaves it as
it is and says so; once it is merged or closed, the next run with changes opens a new one.

The branch is replaced only while it is where mm left it (git's lease on the commit the record holds, or on
what the forge's open pull request shows): a person who pushed to it meanwhile is never overwritten; the run
says so and fails, and closing the pull request lets the next run start afresh.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, select

from chatops import pull_requests as records
from chatops.config import Config
from chatops.schema import JobRun, PullRequestState
from mm_core.config import AgentConfig
from slackio.mrkdwn import Mrkdwn
from workers import git
from workers.forges import ForgeError, PullState, forge_for
from workers.pull_request_body import job_body, job_title
from workers.pull_requests import sync
from workers.push import BranchRefused, NothingToPush, credentials, diff_stat, push_workspace

if TYPE_CHECKING:
    from workers.jobs import RunningJob

PUSHED = Mrkdwn("⬆️ Pushed `{branch}` ({commit}).")
LEFT_ALONE = Mrkdwn("No changes in this run: <{url}|{label}> was left as it is.")
NOTHING = "Nothing to push: the run changed no file."
MOVED = (
    "the pull request's branch `{branch}` has commits mm did not push, so this run's changes were not pushed over "
    "them; close the pull request and the next run opens a new one"
)
DIFF_LINES = 30


async def push_job_pull_request(
    engine: Engine,
    config: Config,
    secrets: list[str],
    run: RunningJob,
    session_id: str,
    workspace: Path,
    agent: AgentConfig,
    remote: str,
    start: str | None,
    cloned: str | None,
    answer: str,
) -> tuple[str | None, str, str | None]:
    """Push the run's changes to the job's pull request branch and open or update its pull request: the branch
    pushed (or None), the summary's line, and the reason the run failed (None when it did not)."""
    job = run.job
    assert job.push is not None
    branch = job.push.branch.format(job=job.name)
    owner = records.job_owner(job.name)
    base = job.branch or config.service.channel(job.channel).branch
    try:
        forge, repo = await asyncio.to_thread(forge_for, config, remote)
        record = records.current(engine, owner)
        open_now = None
        if record is not None and record.number is not None:
            found = await asyncio.to_thread(forge.get, repo, record.number)
            if found.state != PullState.OPEN:  # merged or closed: this run starts a new one
                records.record_ended(engine, record.id, PullRequestState(found.state.value))
                record = None
            else:
                open_now = found
        if record is None and open_now is None:  # one open for the branch that the record lost: adopted
            open_now = await asyncio.to_thread(forge.find_open, repo, branch)
    except ForgeError as e:
        return None, Mrkdwn.of(e.text), e.text
    message = f"{job.name}: run {run.run_id}\n\n{job.prompt or job.skill or ''}"[:2000]
    try:
        token = await asyncio.to_thread(credentials, config, remote)
        if record is not None:
            lease = record.head_sha
        elif open_now is not None:
            lease = open_now.head_sha
        else:
            lease = await asyncio.to_thread(git.remote_head, remote, branch, token)
        pushed = await asyncio.to_thread(
            push_workspace, workspace, agent, remote, branch, message, token, base, start, cloned, lease
        )
    except BranchRefused as e:
        return None, Mrkdwn.of(f"the push was refused: {e}"), f"the push was refused: {e}"
    except NothingToPush:
        if open_now is not None:
            label = records.label_of(open_now.number, open_now.url)
            return None, LEFT_ALONE.format(url=open_now.url, label=label), None
        return None, Mrkdwn.of(NOTHING), None
    except git.GitError as e:
        reason = MOVED.format(branch=branch) if "stale info" in e.text else f"the push of `{branch}` failed: {e.text}"
        return None, Mrkdwn.of(reason), reason
    changes = await asyncio.to_thread(diff_stat, workspace, agent, start, DIFF_LINES)
    channel, thread_ts = _thread_of(engine, run.run_id)
    body = await job_body(config, secrets, job, run.run_id, channel, thread_ts, answer, changes)
    record_id = records.record_push(
        engine,
        records.Pushed(
            owner=owner,
            session_id=session_id,
            host=repo.host,
            repo=repo.path,
            branch=branch,
            base=base or cloned or "main",
            head_sha=pushed.commit,
            title=job_title(job),
            body=body,
            draft=config.service.pullRequest.draft,
            requested_by=None,
        ),
    )
    synced = await asyncio.to_thread(sync, engine, config, record_id)
    line = PUSHED.format(branch=branch, commit=pushed.commit[:10])
    if synced.said:
        line = Mrkdwn("{pushed}\n{said}").format(pushed=line, said=Mrkdwn.of(synced.said))
    return branch, line, (str(synced.said) if synced.refused else None)


def _thread_of(engine: Engine, run_id: int) -> tuple[str | None, str | None]:
    with engine.connect() as conn:
        row = conn.execute(select(JobRun.channel_id, JobRun.root_ts).where(JobRun.id == run_id)).first()
    return (row.channel_id, row.root_ts) if row is not None else (None, None)
