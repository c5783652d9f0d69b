"""The Celery tasks: run a session's work, and housekeeping. Each task names a session by id and nothing else:
what to do is read from the database when the task runs, so a task delivered twice, late, or to another
worker does the right thing or nothing.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine

from chatops.inbox import request_stop
from chatops.schema import utcnow
from workers.celery_app import HOUSEKEEPING_QUEUE, TURNS_QUEUE, app

log = logging.getLogger("mm.worker")


@app.task(name="mm.run_session", queue=TURNS_QUEUE)
def run_session(session_id: str) -> None:
    """Run the session's turns until it has nothing left to do (or waits for a person)."""
    from workers.turns import run_session_work

    if run_session_work(session_id):
        enqueue_session(session_id)


RUN_JOB = "mm.run_job"


@app.task(name=RUN_JOB, queue=TURNS_QUEUE)
def run_job(run_id: int) -> None:
    """Start a job run the scheduler recorded: its thread in the job's channel, its session given the prompt."""
    import asyncio

    from slackio.slack_client import web_client
    from slackio.slack_out import SlackOut
    from workers.jobs import claim_run, start_run
    from workers.turns import process

    proc = process()
    start = claim_run(proc.engine, proc.config_file, run_id)
    if start is None:
        return
    session_id = asyncio.run(start_run(proc.engine, SlackOut(web_client(proc.config), proc.secrets), start))
    if session_id is not None:
        enqueue_session(session_id)


@app.task(name="mm.push_thread", queue=TURNS_QUEUE)
def push_thread(session_id: str, branch: str | None, user: str) -> None:
    """Push a thread's changes to a branch, as an approver asked (the bot checked who)."""
    from workers.thread_push import push_thread_work

    push_thread_work(session_id, branch, user)


@app.task(name="mm.housekeeping", queue=HOUSEKEEPING_QUEUE)
def housekeeping() -> None:
    """Re-enqueue sessions with work nobody does, release expired leases, expire approvals, sweep workspaces."""
    from workers.jobs import undelivered_runs
    from workers.turns import housekeep, process

    for session_id in housekeep():
        enqueue_session(session_id)
    for run_id in undelivered_runs(process().engine, utcnow()):
        enqueue_job_run(run_id)


def stop_session(engine: Engine, session_id: str) -> bool:
    """Stop the session's turn: a running one within a second (the worker holding it sees the flag), one that
    waits for a person when a worker takes the session. False when there was no turn to stop."""
    if not request_stop(engine, session_id):
        return False
    enqueue_session(session_id)
    return True


def enqueue_session(session_id: str) -> None:
    """Tell a worker that the session has work (the database says what): the bot's only hand-off."""
    app.send_task("mm.run_session", args=[session_id], queue=TURNS_QUEUE, ignore_result=True)


def enqueue_job_run(run_id: int) -> None:
    """Tell a worker that a job run is due (its row says what): the scheduler's and `/mm job run`'s hand-off."""
    app.send_task(RUN_JOB, args=[run_id], queue=TURNS_QUEUE, ignore_result=True)


def enqueue_push(session_id: str, branch: str | None, user: str) -> None:
    """Hand a thread's push to a worker: the workspace lives on a worker's disk."""
    app.send_task("mm.push_thread", args=[session_id, branch, user], queue=TURNS_QUEUE, ignore_result=True)
