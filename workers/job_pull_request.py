"""A job's one pull request (`push: {pr: true}`), kept the way Renovate keeps its: each run that changes files
rebuilds the job's branch from the base and updates the open pull request; a run without changes leaves it as
it is and says so; once it is merged or closed, the next run with changes opens a new one.

The branch is replaced only while it is where mm left it (git's lease on the commit the record holds, or on
what the forge's open pull request shows): a person who pushed to it meanwhile is never overwritten; the run
says so and fails, and closing the pull request lets the next run start afresh.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, select

from chatops import pull_requests as records
from chatops.config import Config
from chatops.schema import JobRun, PullRequestState
from mm_core.config import AgentConfig
from slackio.mrkdwn import Mrkdwn
from workers import git
from workers.errors import WorkerError
from workers.forges import ForgeError, PullState, forge_for
from workers.pull_request_body import job_body, job_title
from workers.pull_requests import Delivered, pushed_record, record_and_sync, sync
from workers.push import BranchRefused, NothingToPush, credentials, push_workspace

if TYPE_CHECKING:
    from workers.jobs import RunningJob

PUSHED = Mrkdwn("⬆️ Pushed `{branch}` ({commit}).")
LEFT_ALONE = Mrkdwn("No changes in this run: <{url}|{label}> was left as it is.")
NOTHING = "Nothing to push: the run changed no file."
MOVED = (
    "the pull request's branch `{branch}` has commits mm did not push, so this run's changes were not pushed over "
    "them; close the pull request (or delete the branch) and the next run starts afresh"
)


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
    changes: str,
) -> tuple[str | None, str, str | None]:
    """Push the run's changes to the job's pull request branch and open or update its pull request: the branch
    pushed (or None), the summary's line, and the reason the run failed (None when it did not). `changes`: the
    run's diff stat, as its summary shows it."""
    job = run.job
    assert job.push is not None
    branch = job.push.branch.format(job=job.name)
    owner = records.job_owner(job.name)
    base = job.branch or config.service.for_job(job).channel(job.channel).branch
    try:
        forge, repo = await asyncio.to_thread(forge_for, config, remote)
        record = records.current(engine, owner)
        if record is not None and (record.host, record.repo, record.branch) != (repo.host, repo.path, branch):
            # The config moved the job to another repository or branch: that pull request is no longer its own.
            records.record_ended(engine, record.id, PullRequestState.CLOSED)
            record = None
        open_now = None
        if record is not None and record.number is not None:
            found = await asyncio.to_thread(forge.get, repo, record.number)
            if found.state != PullState.OPEN:  # merged or closed: this run starts a new one, on the branch as it is
                records.record_ended(engine, record.id, PullRequestState(found.state.value), found.head_sha)
                record = None
            else:
                open_now = found
        if open_now is None:  # one open for the branch that no record has a number for yet: adopted by the sync
            open_now = await asyncio.to_thread(forge.find_open, repo, branch)
    except ForgeError as e:
        return None, Mrkdwn.of(e.text), e.text
    message = f"{job.name}: run {run.run_id}\n\n{job.prompt or job.skill or ''}"[:2000]
    # What the branch may hold that is mm's own: what the records say mm pushed (or was pushing when its worker
    # stopped), and what it held when its pull request was closed or merged (the branch is the job's again then).
    # Anything else is a person's, the head of an open pull request no record knows included.
    known = records.ended_heads(engine, owner) | (record.known_heads() if record is not None else set())
    channel, thread_ts = _thread_of(engine, run.run_id)
    lease = ""
    try:
        token = await asyncio.to_thread(credentials, config, remote)
        lease = await asyncio.to_thread(git.remote_head, remote, branch, token)
        body = await job_body(config, secrets, job, run.run_id, channel, thread_ts, answer, changes)
        delivered = Delivered(owner, session_id, repo, branch, cloned or base or "main", "", job_title(job), body, None)

        def before_push(commit: str) -> None:
            if lease and lease not in known:
                raise BranchMoved(MOVED.format(branch=branch))
            if record is not None:
                records.record_pushing(engine, record.id, commit)
            else:  # the branch's first push: its record, which the forge hears of only once the push is made
                records.record_push(engine, pushed_record(config, replace(delivered, commit=commit)), needs_sync=False)

        pushed = await asyncio.to_thread(
            push_workspace, workspace, agent, remote, branch, message, token, base, start, cloned, lease, before_push
        )
    except BranchRefused as e:
        return None, Mrkdwn.of(f"the push was refused: {e}"), f"the push was refused: {e}"
    except NothingToPush:
        if open_now is not None:
            label = records.label_of(open_now.number, open_now.url)
            return None, LEFT_ALONE.format(url=open_now.url, label=label), None
        if record is not None and record.number is None and record.error is None and lease in record.known_heads():
            # A push that landed while its worker stopped before the forge heard of it: heard of now.
            records.request_sync(engine, record.id)
            synced = await asyncio.to_thread(partial(sync, engine, config, record.id, claimed=True))
            return None, Mrkdwn.of(synced.said or NOTHING), str(synced.said) if synced.refused else None
        return None, Mrkdwn.of(NOTHING), None
    except BranchMoved as e:
        return None, Mrkdwn.of(e.text), e.text
    except git.GitError as e:
        reason = MOVED.format(branch=branch) if "stale info" in e.text else f"the push of `{branch}` failed: {e.text}"
        return None, Mrkdwn.of(reason), reason
    synced = await asyncio.to_thread(record_and_sync, engine, config, replace(delivered, commit=pushed.commit))
    line = PUSHED.format(branch=branch, commit=pushed.commit[:10])
    if synced.said:
        line = Mrkdwn("{pushed}\n{said}").format(pushed=line, said=Mrkdwn.of(synced.said))
    return branch, line, (str(synced.said) if synced.refused else None)


class BranchMoved(WorkerError):
    """The job's branch holds a commit that is not mm's: nothing is pushed over it."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def _thread_of(engine: Engine, run_id: int) -> tuple[str | None, str | None]:
    with engine.connect() as conn:
        row = conn.execute(select(JobRun.channel_id, JobRun.root_ts).where(JobRun.id == run_id)).first()
    return (row.channel_id, row.root_ts) if row is not None else (None, None)
