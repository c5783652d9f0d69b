"""A thread's changes pushed to a branch, when an approver asks (the "Push branch" button, or `push [branch]`),
and its pull request opened (the "Open pull request" button, or `pr [title]`) or updated.

The bot checks who asks and hands the work over (task `mm.push_thread`): the workspace lives on a worker's
disk. The push takes the session's lease between turns, so it never runs beside a turn that is still changing
the files: it waits a few seconds for a turn that is ending, else says the thread is busy, and a turn kept out
while it held the lease is enqueued once it lets go. It goes to the thread's repository (or the channel's),
never to a remote of the workspace's config (workers/push.py says how). Once the thread has a pull request,
every push goes to its branch and refreshes it (workers/pull_requests.py): a thread keeps one.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import Engine, select

from chatops import pull_requests as records
from chatops.schema import PullRequestState, Session
from chatops.secrets import describe_error
from chatops.sessions import Snapshot, between_turns, snapshot, wants_a_worker
from chatops.store import acquire_lease, record_error, release_lease
from chatops.teams import team_of
from slackio.mrkdwn import Mrkdwn
from slackio.slack_client import failed_where, web_client
from slackio.slack_out import SlackOut
from workers import git
from workers.forges import ForgeError, PullState, forge_for
from workers.pull_request_body import thread_body, thread_title
from workers.pull_requests import Delivered, record_and_sync
from workers.push import BranchRefused, NothingToPush, agent_of, credentials, diff_stat, push_workspace
from workers.turns import Process, process
from workers.workspaces import cloned_branch, public_url, start_commit, workspace_path

log = logging.getLogger("mm.worker.push")

PUSHED = Mrkdwn("⬆️ <@{user}> pushed `{branch}` to {remote} ({commit}): {files} file(s) changed.")
NOTHING = "There is nothing to push: this thread's workspace has no change."
BUSY = "⏳ A turn is running in this thread: ask again to push once it has finished."
NO_REPO = "There is nowhere to push: this thread works on no repository."
FAILED = "The push of `{branch}` failed: {words}"  # git's words: posted as text, never as markup
UNEXPECTED = "The push failed on the worker ({error}); it is recorded for the operator."
NOTHING_NEW = Mrkdwn("Nothing new to push: <{url}|{label}> has this thread's changes already.")
OWNER = "push"
LEASE_S = 120.0
# How long a push waits for the turn before it: the turn posts its offer (the push buttons) a moment before it
# gives the session back, so a click on the offer can come while the turn is still ending.
SETTLE_S = 3.0
POLL_S = 0.1


def default_branch(thread_ts: str) -> str:
    return f"mm/thread-{thread_ts.replace('.', '-')}"


def push_thread_work(
    session_id: str, branch: str | None, user: str, pull_request: bool = False, title: str | None = None
) -> bool:
    """The push task's body (its log lines name the session: workers.tasks.task). `pull_request`: open one for
    the branch (with `title`, else the thread's); a thread that has one updates it whatever was asked. True when
    the session has work once the push has let it go (the caller enqueues it, as after a turn)."""
    proc = process()
    engine = proc.engine
    token, facts = take_session(engine, session_id)
    if facts is None:
        return False  # the session is gone (purged): there is no thread to answer in
    if token is None:
        said: str = BUSY
    else:
        try:
            said = _push(proc, facts, session_id, branch, user, pull_request, title)
        except Exception as e:
            log.exception("the push of session %s failed", session_id)
            record_error(engine, "push", describe_error(e), session_id=session_id)
            said = UNEXPECTED.format(error=describe_error(e))
        finally:
            release_lease(engine, session_id, token)
    # A turn enqueued while the push held the lease found it taken and left the session to whoever held it.
    more = wants_a_worker(engine, session_id)
    asyncio.run(say_in_thread(proc, facts, said))
    return more


def take_session(
    engine: Engine, session_id: str, wait_s: float = SETTLE_S, poll_s: float = POLL_S
) -> tuple[int | None, Snapshot | None]:
    """The session's lease for a push, and the session as it then stands. Between turns only: while the session
    has work for a turn (chatops.sessions.wants_work: one running or queued, a message waiting, a decision
    to act on) or anyone holds its lease, it waits, `wait_s` at most, then the token is None. The snapshot is
    None when the session is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        facts = snapshot(engine, session_id, log=False)
        if between_turns(facts):
            token = acquire_lease(engine, session_id, OWNER, LEASE_S)
            if token is not None:
                try:  # read again under the lease: a message may have queued a turn between the two reads
                    facts = snapshot(engine, session_id, log=False)
                except BaseException:
                    release_lease(engine, session_id, token)
                    raise
                if between_turns(facts):
                    return token, facts
                # Given back at once: that turn's task may have found the lease taken, and the caller enqueues it.
                release_lease(engine, session_id, token)
                return None, facts
        if facts is None or time.monotonic() >= deadline:
            return None, facts
        time.sleep(poll_s)


def _push(
    proc: Process,
    facts: Snapshot,
    session_id: str,
    branch: str | None,
    user: str,
    pull_request: bool,
    title: str | None,
) -> str:
    config, engine = proc.config, proc.engine
    remote = (
        facts.repo
        or config.service.for_team(facts.slack_team_id, facts.enterprise_id).channel(facts.channel_id or "").repo
    )
    if not remote:
        return NO_REPO
    workspace = workspace_path(config.workspaces_root, session_id)
    if not (workspace / ".git").exists():
        return NOTHING
    owner = records.thread_owner(session_id)
    record = records.current(engine, owner)
    base = (
        facts.branch
        or config.service.for_team(facts.slack_team_id, facts.enterprise_id).channel(facts.channel_id or "").branch
    )
    repo = None  # where the pull request is: None for a push that is only a push
    try:
        if record is not None or pull_request:
            forge, found_repo = forge_for(config, remote)
            if record is not None and (record.host, record.repo) != (found_repo.host, found_repo.path):
                # The config moved the thread's repository: that pull request is no longer where it pushes.
                records.record_ended(engine, record.id, PullRequestState.CLOSED)
                record = None
            elif record is not None and record.number is not None:
                found = forge.get(found_repo, record.number)
                if found.state != PullState.OPEN:  # closed or merged on the forge: a push starts afresh
                    records.record_ended(engine, record.id, PullRequestState(found.state.value), found.head_sha)
                    record = None
            # A plain push after its pull request ended is only a push.
            repo = found_repo if record is not None or pull_request else None
    except ForgeError as e:
        return e.text
    branch = record.branch if record is not None else branch or default_branch(facts.thread_ts or session_id)
    message = f"mm: the changes of a Slack thread, pushed by {user}"
    try:
        start = start_commit(config.workspaces_root, session_id)
        cloned = cloned_branch(config.workspaces_root, session_id)
        token = credentials(config, remote)
        agent = agent_of(config, _agent_name(proc, session_id))
        pushed = push_workspace(workspace, agent, remote, branch, message, token, base, start, cloned)
    except BranchRefused as e:
        return f"The push was refused: {e}"
    except NothingToPush:
        return NOTHING
    except git.GitError as e:
        return FAILED.format(branch=branch, words=e.text)
    if record is not None and record.head_sha == pushed.commit and not record.needs_sync and record.url:
        return NOTHING_NEW.format(url=record.url, label=record.label)
    if repo is None:  # a branch, no pull request
        return (
            PUSHED.format(
                user=user,
                branch=branch,
                remote=public_url(pushed.remote),
                commit=pushed.commit[:10],
                files=pushed.files,
            )
            + pushed.said
        )
    changes = diff_stat(workspace, agent, start, 30)
    body = asyncio.run(thread_body(engine, config, proc.secrets, session_id, facts, user, changes))
    title = thread_title(engine, session_id, title)
    delivered = Delivered(owner, session_id, repo, branch, cloned or base or "main", pushed.commit, title, body, user)
    said = record_and_sync(engine, config, delivered).said
    if said is None:  # a newer push of the thread recorded meanwhile: its own answer says what the PR became
        return PUSHED.format(
            user=user, branch=branch, remote=public_url(pushed.remote), commit=pushed.commit[:10], files=pushed.files
        )
    return said


def _agent_name(proc: Process, session_id: str) -> str | None:
    """The session's own agent (a job's), whose sandbox its workspace's git runs in as its commands do."""
    with proc.engine.connect() as conn:
        return conn.execute(select(Session.agent_name).where(Session.id == session_id)).scalar_one_or_none()


async def say_in_thread(proc: Process, facts: Snapshot, text: str) -> None:
    """A line in the session's thread, from a task that is not its turn (a push, a pull request's news)."""
    slack = SlackOut(
        web_client(proc.config, team_of(facts)), proc.secrets
    )  # scrubs the token and the rest from git's words
    try:
        await slack.post(facts.channel_id or "", text, thread_ts=facts.thread_ts)
    except Exception as e:  # noqa: BLE001 - what was said happened (or not); the errors table keeps the message
        where = failed_where(e, "chat.postMessage")
        record_error(proc.engine, where, f"chat.postMessage: {e}", session_id=facts.id)
