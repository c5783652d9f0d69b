"""The Celery tasks: run a session's work, and housekeeping. Each task names a session by id and nothing else:
what to do is read from the database when the task runs, so a task delivered twice, late, or to another
worker does the right thing or nothing.

Every task is declared by `task`, the one place that makes a task's name (`mm.<function>`: the name on the wire,
which the bot, the scheduler and the beat schedule take from the task object, never spelled again), sets its log
lines' session and counts its runs (`mm_task_seconds`). Tasks stay thin: they take ids and hand the work to the
module that does it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec

from sqlalchemy import Engine

from chatops import logs
from chatops.inbox import request_stop
from chatops.schema import utcnow
from slackio import metrics
from workers.celery_app import HOUSEKEEPING_QUEUE, TURNS_QUEUE, app

log = logging.getLogger("mm.worker")

P = ParamSpec("P")


@dataclass(frozen=True)
class Declared:
    """A task as the rest of the service knows it: its name on the wire and its queue. Reading them does not
    make Celery read its configuration (the bot imports this module before the environment is read)."""

    name: str
    queue: str
    task: Any  # Celery's task (a proxy until the app is finalized): what the worker runs

    def send(self, *args: Any) -> None:
        """Hand the task to the broker, by name: the bot's and the scheduler's hand-off."""
        app.send_task(self.name, args=list(args), queue=self.queue, ignore_result=True)


def task(queue: str, **options: Any) -> Callable[[Callable[P, None]], Declared]:
    """Declare a task on `queue`: named `mm.<function>`; a task whose first argument is `session_id` logs with
    that session; every run is timed by outcome."""

    def declare(fn: Callable[P, None]) -> Declared:
        name = f"mm.{fn.__name__}"
        names_session = next(iter(inspect.signature(fn).parameters), None) == "session_id"

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> None:
            # For this task only: the threads pool runs the next task in the same thread, and so the same context.
            about = logs.session_id.set(str(args[0]) if names_session and args else None)
            began, outcome = time.monotonic(), "failed"
            try:
                fn(*args, **kwargs)
                outcome = "ok"
            finally:
                metrics.TASK_SECONDS.labels(name, outcome).observe(time.monotonic() - began)
                logs.session_id.reset(about)

        return Declared(name, queue, app.task(name=name, queue=queue, **options)(run))

    return declare


@task(TURNS_QUEUE)
def run_session(session_id: str) -> None:
    """Run the session's turns until it has nothing left to do (or waits for a person)."""
    from workers.turns import run_session_work

    if run_session_work(session_id):
        enqueue_session(session_id)


@task(TURNS_QUEUE)
def run_job(run_id: int) -> None:
    """Start a job run the scheduler recorded: its thread in the job's channel, its session given the prompt."""
    import asyncio

    from chatops.teams import Team
    from slackio.slack_client import web_client
    from slackio.slack_out import SlackOut
    from workers.jobs import claim_run, start_run
    from workers.turns import process

    proc = process()
    start = claim_run(proc.engine, proc.config_file, run_id)
    if start is None:
        return
    slack = SlackOut(web_client(proc.config, Team.named(start.job.team)), proc.secrets)
    session_id = asyncio.run(start_run(proc.engine, slack, start))
    if session_id is not None:
        enqueue_session(session_id)


@task(TURNS_QUEUE)
def push_thread(
    session_id: str, branch: str | None, user: str, pull_request: bool = False, title: str | None = None
) -> None:
    """Push a thread's changes to a branch, and open its pull request when asked, as an approver asked (the bot
    checked who)."""
    from workers.thread_push import push_thread_work

    if push_thread_work(session_id, branch, user, pull_request, title):
        enqueue_session(session_id)


@task(TURNS_QUEUE)
def show_pull_request(session_id: str) -> None:
    """Say in the thread how its pull request stands (`@mm pr`): read from the forge, which only a worker may ask."""
    from workers.pull_request_tasks import show_pull_request_work

    show_pull_request_work(session_id)


@task(HOUSEKEEPING_QUEUE)
def follow_pull_request(record_id: int) -> None:
    """Finish a pull request's sync that was cut short or waits for a rate limit, and look at its checks."""
    from workers.pull_request_tasks import follow_pull_request_work

    follow_pull_request_work(record_id)


@task(HOUSEKEEPING_QUEUE)
def housekeeping() -> None:
    """Re-enqueue sessions with work nobody does, release expired leases, expire approvals, remind and escalate
    the approvals that wait, hand over the pull requests to sync or follow, purge what retention says, sweep
    workspaces."""
    from chatops.pull_requests import due as pull_requests_due
    from chatops.secrets import describe_error
    from chatops.store import record_error
    from workers.jobs import undelivered_runs
    from workers.nudges import nudge_waiting
    from workers.turns import housekeep, process

    for session_id in housekeep():
        enqueue_session(session_id)
    proc = process()
    for run_id in undelivered_runs(proc.engine, utcnow()):
        enqueue_job_run(run_id)
    try:
        nudge_waiting(proc.engine, proc.config, proc.secrets)
    except Exception as e:
        log.exception("housekeeping: reminding and escalating the waiting approvals failed")
        record_error(proc.engine, "housekeeping", f"reminders and escalations: {describe_error(e)}")
    try:
        for record_id in pull_requests_due(proc.engine):
            follow_pull_request.send(record_id)
    except Exception as e:
        log.exception("housekeeping: handing over the pull requests to follow failed")
        record_error(proc.engine, "housekeeping", f"pull requests: {describe_error(e)}")


def stop_session(engine: Engine, session_id: str) -> bool:
    """Stop the session's turn: a running one within a second (the worker holding it sees the flag), one that
    waits for a person when a worker takes the session. False when there was no turn to stop."""
    if not request_stop(engine, session_id):
        return False
    enqueue_session(session_id)
    return True


def enqueue_session(session_id: str) -> None:
    """Tell a worker that the session has work (the database says what): the bot's only hand-off."""
    run_session.send(session_id)


def enqueue_job_run(run_id: int) -> None:
    """Tell a worker that a job run is due (its row says what): the scheduler's and `/mm job run`'s hand-off."""
    run_job.send(run_id)


def enqueue_push(
    session_id: str, branch: str | None, user: str, pull_request: bool = False, title: str | None = None
) -> None:
    """Hand a thread's push (and pull request) to a worker: the workspace lives on a worker's disk."""
    push_thread.send(session_id, branch, user, pull_request, title)


def enqueue_pull_request_status(session_id: str) -> None:
    """Hand `@mm pr`'s look at the forge to a worker: only workers hold the forges' tokens."""
    show_pull_request.send(session_id)
