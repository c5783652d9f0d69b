"""Running a session's work on a worker: take the lease, run or resume turns, render them, give the lease back.

The execution model. A turn spends nearly all its time waiting on the model, so one process carries many:
Celery's threads pool gives each task a thread, and each thread runs its turn on an event loop of its own.
One shared loop for all turns would be lighter, but the store is synchronous (SQLAlchemy on a sync engine):
inside a shared loop every append would stall every turn of the process. In a thread of its own, an append
blocks only its own turn, and the database driver releases the GIL while it waits. Celery's time limits do
not apply to threads, so a turn enforces `worker.turnTimeLimit` itself; stop requests and lease renewals for
all of a process's turns go through one keeper thread (workers/leases.py).

What to do is always read from the database, never from the task message: one snapshot of the session
(chatops.sessions: its row, approvals, inbox and what its log says of the open turn), and one decision over it,
`next_step`, which this module carries out. A message delivered twice finds the lease taken or nothing to do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import Engine, select

from chatops import budgets, db, pull_requests
from chatops.buttons import Action, ButtonValue, element
from chatops.config import Config, ServiceConfig, load_config
from chatops.inbox import (
    clear_stop,
    expire_pending,
    forget_assistant_contexts,
    release_expired_leases,
)
from chatops.jobs import forget_unrun
from chatops.reload import ConfigFile
from chatops.requests import forget_finished
from chatops.schema import ApprovalState, InboxCommand, Session, SessionKind, SessionStatus, utcnow
from chatops.secrets import describe_error, known_secrets, scrub, secrets_of
from chatops.sessions import (
    Command,
    Idle,
    Resume,
    Stop,
    Wait,
    decide,
    next_step,
    sessions_with_work,
    snapshot,
    wants_a_worker,
)
from chatops.store import (
    ApprovalRow,
    DbStore,
    Metered,
    TakenCommand,
    acquire_lease,
    expire_approvals,
    forget_seen_events,
    get_approval,
    record_error,
    release_lease,
    request_approval,
    set_approval_file,
    set_approval_message,
    set_instructions_used,
    set_status,
)
from chatops.teams import team_of
from mm_core import Agent, ModelHttp, display
from mm_core.agent import DEFAULT_SYSTEM_PROMPT
from mm_core.config import AgentConfig
from mm_core.events import Event, NetworkUsed, PermissionRequested, TurnFinished
from mm_core.instructions import extra_instructions, read_repo_files
from mm_core.log import ErrorRecord, Fenced, Outcome, TurnEnded
from mm_core.state import SessionState
from mm_core.tools.ask_agent import load_agent_file
from slackio import metrics
from slackio.approval_message import NO_APPROVERS, ApprovalAsked
from slackio.blocks import duration
from slackio.installations import tokens
from slackio.mrkdwn import Mrkdwn
from slackio.slack_client import TIMEOUT, failed_where, web_client
from slackio.slack_out import SlackOut
from workers.asking import thread_setting
from workers.attachments import attach
from workers.attachments import hint as attach_hint
from workers.egress import TurnNetwork, with_thread_network
from workers.jobs import NO_END, RunningJob, close_stale_runs, finish_run, job_of_session, time_left
from workers.leases import Cancelled, LeaseKeeper
from workers.push import changed_files, credentials, has_forge
from workers.render import ThreadRenderer
from workers.retention import housekeep_retention
from workers.uploads import not_received, receive
from workers.workspaces import WorkspaceError, prepare, public_url, remove_workspace, start_commit, sweep

log = logging.getLogger("mm.worker")

RESUMED = "↻ The worker running this turn stopped; another one resumed it."
STOPPED = "⏹ Stopped."
PUSH_OFFER = "📦 {files} changed file(s) in this thread's workspace: an approver can push them to a branch."
PULL_REQUEST_OFFER = (
    "📦 {files} changed file(s) in this thread's workspace: an approver can push them to a branch or open a pull "
    "request."
)
UPDATE_OFFER = Mrkdwn("📦 {files} changed file(s) in this thread's workspace: an approver can add them to {pull}.")
UPDATE_LABEL = "Update pull request"
NEW_CONVERSATION = "🆕 New conversation: I forget what was said before here. The workspace stays as it is."
TIME_LIMIT = "⏱ The turn ran for longer than {limit} and was stopped."
TIME_BUDGET = (
    "⏱ This turn's budget of {limit} (`budgets.turnTime`) is used: the turn was stopped. Ask again to go on, or "
    "raise `budgets.turnTime` in the config."
)
EXPIRED = "⌛ Nobody decided on `{title}` in time: it was not run."
CRASHED = object()  # _run's answer when the turn crashed: ended, and not to be looped on
WORKER_FAILED = "⚠️ The worker failed while running this turn ({reason}); the error is recorded."
MODEL_GONE = "The model `{name}` this thread runs with is no longer configured: nothing was run."
THREAD_CONTEXT = "Earlier messages in this Slack thread, for context:\n{lines}\n\nThe request:\n"
PURGED = (
    "🧹 This thread's history was purged on {when}: I start afresh, without its earlier messages, tool outputs or "
    "workspace."
)
CONTEXT_MESSAGES = 50
CONTEXT_CHARS = 8000


@dataclass(frozen=True)
class Process:
    """What every turn of one worker process shares."""

    config_file: ConfigFile
    engine: Engine
    keeper: LeaseKeeper
    start_secrets: tuple[str, ...]
    model_http: ModelHttp = field(default_factory=ModelHttp)  # the model's client: a session per event loop

    @property
    def config(self) -> Config:
        """The config as its file says now: each turn takes it once, at its start."""
        return self.config_file.current()

    @property
    def secrets(self) -> tuple[str, ...]:
        """What is never posted nor logged (chatops.secrets.known_secrets): the secrets known at start and those a
        reload brought."""
        return known_secrets(self.start_secrets, self.config)


_process_lock = threading.Lock()


@cache
def _process_unlocked() -> Process:
    config = load_config()
    # Many turns, each holding a connection only for the length of one write. The connections a burst opened are
    # kept, not closed as soon as fewer are busy: with 200 turns, 10 kept and 40 more at peaks opened 0.71
    # connections a turn (bench/bench_turns.py), each a PostgreSQL backend started; all 50 kept open 0.26.
    engine = db.engine_for(config.database_url, pool_size=50, max_overflow=0)
    keeper = LeaseKeeper(engine, config.service.worker.leaseSeconds)
    return Process(ConfigFile(config), engine, keeper, tuple(secrets_of(config)))


def process() -> Process:
    with _process_lock:
        return _process_unlocked()


# --- running a session's work -----------------------------------------------------------------------------------


def run_session_work(session_id: str) -> bool:
    """The task's body: in this thread, an event loop for one turn of the session (or its stop). True when the
    session has more work once the lease is given back (the caller enqueues it again)."""
    return asyncio.run(_work(process(), session_id))


async def _work(proc: Process, session_id: str) -> bool:
    ttl = proc.config.service.worker.leaseSeconds
    token = acquire_lease(proc.engine, session_id, proc.keeper.owner, ttl)
    if token is None:
        return False  # another worker (or a push) holds it, and enqueues whatever is new when it lets go
    task = asyncio.current_task()
    assert task is not None
    proc.keeper.hold(session_id, task)
    try:
        # One turn per task: a task then lasts no longer than a turn, which is what the broker's visibility
        # timeout and RabbitMQ's consumer timeout are sized for. More work is enqueued again below.
        await SessionTurns(proc, session_id, token).next()
    except Fenced as e:
        log.warning("session %s: %s; leaving it to the new owner", session_id, e)
        return False
    finally:
        proc.keeper.drop(session_id)
        release_lease(proc.engine, session_id, token)
    # A message or a stop that came between our last look and the release would wait for housekeeping.
    return wants_a_worker(proc.engine, session_id)


class SessionTurns:
    """One session's turns under one lease: each `next()` runs one turn, or resumes the open one."""

    def __init__(self, proc: Process, session_id: str, token: int):
        self.proc, self.session_id, self.token = proc, session_id, token
        self.config = proc.config
        row = snapshot(proc.engine, session_id)
        if row is None:
            raise LookupError(f"session {session_id} is gone")
        self.store = DbStore(proc.engine, lease_token=token, metered=Metered(row.channel_id))
        self.row = row  # the session as this lease found it: what next_step decides from
        self.asked: tuple[ApprovalRow, ...] = ()  # the approvals this turn asked for
        self.setting: tuple[AgentConfig, frozenset[str | None]] | None = None  # resolved once a turn (_setting)
        self.ending: SessionStatus | None = None  # the status the session takes once the thread shows the turn
        # A job run's turn: how it finished, or why it did not (its summary says so).
        self.finished: TurnFinished | None = None
        self.failure: str | None = None
        self.running: RunningJob | None = None
        self.workspace: Path | None = None
        self.gate: budgets.Gate | None = None  # the turn's budgets (chatops.budgets), once it runs

    @property
    def service(self) -> ServiceConfig:
        """The config as the thread's workspace sees it: its `teams` section over the top level's."""
        return self.config.service.for_team(self.row.slack_team_id, self.row.enterprise_id)

    async def next(self) -> bool:
        """Run what the session needs now; False when there is nothing more (idle, or waiting for a person)."""
        engine, session_id = self.proc.engine, self.session_id
        client = web_client(self.config, team_of(self.row))
        # One connection pool for the turn's Slack calls: without a session, slack_sdk opens an aiohttp session
        # and a connection for every call (and closes them after it). Closed below.
        client.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        slack = SlackOut(client, self.proc.secrets)
        renderer = ThreadRenderer(
            client,
            self.row.channel_id or "",
            self.row.thread_ts or "",
            preview_lines=self.config.agent.previewLines,
            secrets=self.proc.secrets,
            assistant_thread=self.row.assistant_thread,
            recipient_user=self.row.requester,
            recipient_team=self.row.team_id,
            on_error=lambda where, message: record_error(engine, where, message, session_id=session_id),
            session_id=session_id,
            on_approval_posted=lambda call_id, ts: set_approval_message(engine, call_id, ts),
            on_approval_file=lambda call_id, file_id: set_approval_file(engine, call_id, file_id),
            recap_note=self._recap_note,
        )
        self.finished = self.failure = self.setting = self.gate = None
        # The run a job's session carries, decided once a turn: its yolo, its time limit, what the turn takes.
        self.running = self._running_job() if self.row.kind == SessionKind.JOB else None
        try:
            more = await self._next(renderer, client)
            if self.row.kind == SessionKind.JOB and self.ending == SessionStatus.IDLE:
                await self._finish_job(renderer, slack)
            return more
        finally:
            await renderer.aclose()
            if self.row.kind != SessionKind.JOB and self.ending == SessionStatus.IDLE:
                await self._attach(slack)
                await self._offer_push(slack)
            session = getattr(client, "session", None)
            if session is not None:
                await session.close()
            # Only once the thread shows all of the turn: a session that says idle has said everything.
            if self.ending is not None:
                set_status(engine, session_id, self.ending, lease_token=self.token)
                self.row, self.ending = self.row.with_status(self.ending), None

    async def _next(self, renderer: ThreadRenderer, client: Any) -> bool:
        """Decide from the snapshot (chatops.sessions.next_step), then carry the step out."""
        engine, session_id = self.proc.engine, self.session_id
        step = next_step(self.row, people=self.running is None)
        if isinstance(step, Stop):
            # Before the workspace: a stop must not wait on (or fail with) a clone.
            clear_stop(engine, session_id)
            if step.turn_open:
                self.failure = "it was stopped"
                async with self._agent() as agent:
                    await agent.stop()
                await self._expire(renderer)
                await renderer.notice(STOPPED)
            self.ending = SessionStatus.IDLE
            return True  # the inbox may hold more
        if isinstance(step, Wait):
            return False  # a stray delivery (a message to a waiting thread): the turn waits for people still
        if isinstance(step, Idle) and self.running is None:
            return self._idle()  # nothing to run: no workspace is prepared for it
        try:
            workspace = self.workspace = await self._workspace(renderer)
        except WorkspaceError as e:
            self.failure = e.text
            await self._refuse(renderer, e.text)
            return False
        clock = metrics.StepClock()
        network = TurnNetwork()

        def emit(event: Event) -> None:
            renderer.emit(event)
            clock.observe(event)
            if isinstance(event, NetworkUsed):
                network.saw(event)
            elif isinstance(event, TurnFinished):
                self.finished = event
            elif isinstance(event, PermissionRequested):
                # Recorded before the message is posted: a click always finds its row.
                renderer.emit(ApprovalAsked(self._ask(agent.state(), event), self.row.channel_id or ""))

        model_name = self._model_name()
        if model_name is not None and model_name not in self.config.service.models:
            self.failure = MODEL_GONE.format(name=model_name)
            await self._refuse(renderer, self.failure)
            return False
        if isinstance(step, Idle):
            return self._idle()  # a job's run whose turn ended before: its summary shows what the workspace holds
        config, granted = self._setting()
        gate = self.gate = self._gate(config)
        agent = Agent(
            config,
            self.store,
            session_id,
            workspace,
            api_key=self.config.model_api_keys.get(model_name) if model_name else self.config.model_api_key,
            model_http=self.proc.model_http,
            emit=emit,
            granted=granted,
            policies=self.config.service.approvals.policies,
            instructions=await self._instructions(workspace),
            budget=gate if gate.limits.counted() else None,
        )
        gate.spent = agent.spent
        async with agent:
            try:
                if isinstance(step, Resume):
                    for row in step.expired:
                        await renderer.update_approval(row, self.row.channel_id or "")
                        await renderer.notice(EXPIRED.format(title=_title(row.tool, row.arguments)))
                    if step.after_crash:
                        await renderer.notice(RESUMED)
                    run = agent.resume(step.decisions)
                elif isinstance(step, Command):
                    command = self.store.take_command(session_id, people=self.running is None)
                    run = await self._command(agent, command, renderer) if command is not None else None
                    if run is None:
                        self.ending = SessionStatus.IDLE
                        return True  # the inbox may hold more
                else:
                    preface = await self._preface(client, renderer)
                    notes, images = await self._receive_files(workspace, renderer, config.model.vision)
                    taken = self.store.take_inbox(
                        session_id, preface, people=self.running is None, notes=notes, images=images
                    )
                    if taken is None:
                        return self._idle()
                    run = agent.start()
                set_status(engine, session_id, SessionStatus.RUNNING, lease_token=self.token)
                self.row = self.row.with_status(SessionStatus.RUNNING)
                metrics.TURNS_STARTED.inc()
                with metrics.TURNS_RUNNING.track_inprogress():
                    finished = await self._run(agent, run, renderer)
                if isinstance(finished, TurnFinished) and finished.outcome == Outcome.BUDGET and gate.stopped:
                    metrics.BUDGET_STOPS.labels(gate.stopped.budget).inc()
                    self.failure = gate.stopped.said  # a job's run fails with it
            finally:
                await agent.resources.aclose()
                await self._record_network(network)
        if finished is CRASHED:
            metrics.TURNS.labels("crashed").inc()
            self.ending = SessionStatus.IDLE
            return False
        if finished is not None and finished.outcome == Outcome.SUSPENDED:
            self.ending = SessionStatus.AWAITING_APPROVAL
            # Calls nobody may approve were rejected at once (_ask): then the turn goes on without waiting.
            return not any(row.state == ApprovalState.PENDING for row in self.asked)
        self.ending = SessionStatus.IDLE
        return True

    async def _record_network(self, network: TurnNetwork) -> None:
        """Keep the turn's hosts for `status`; a failure is recorded, never in place of how the turn ended."""
        try:
            await asyncio.to_thread(network.record, self.proc.engine, self.session_id)
        except Exception as e:  # noqa: BLE001 - `status` shows the hosts of an earlier turn; the turn is over
            record_error(self.proc.engine, "network", f"keeping the turn's hosts: {e}", session_id=self.session_id)

    def _gate(self, config: AgentConfig) -> budgets.Gate:
        """The turn's budgets (chatops.budgets), and what the store records its answers' usage with: the channel,
        the model as people pick it (the `models` entry, else the model's name) and its price."""
        channel = self.row.channel_id or ""
        self.store.metered = Metered(self.row.channel_id, self._model_name() or config.model.name, config.model.price)
        job = self.running.job if self.running is not None else None
        limits = budgets.limits_of(self.proc.engine, self.service, self.session_id, channel, job)
        return budgets.Gate(self.proc.engine, self.session_id, channel, limits)

    def _recap_note(self) -> str | None:
        """The line under the turn's recap: its use against its budgets."""
        try:
            return self.gate.recap() if self.gate is not None else None
        except Exception as e:  # noqa: BLE001 - the recap is shown without it; the turn is over
            record_error(
                self.proc.engine, "budget", f"reading the use against the budgets: {e}", session_id=self.session_id
            )
            return None

    def _idle(self) -> bool:
        """Nothing to run: the session is idle (a job's run whose turn ended before, its end never recorded,
        fails)."""
        if self.running is not None:
            self.failure = NO_END
        self.ending = SessionStatus.IDLE
        return False

    def _agent(self) -> Agent:
        """An agent only to end the open turn (a stop, a workspace gone): it runs no model."""
        return Agent(self._agent_config(), self.store, self.session_id, self.config.workspaces_root / self.session_id)

    async def _run(self, agent: Agent, run: Any, renderer: ThreadRenderer) -> Any:
        """The turn, within its time limit; a stop or the limit ends it through the loop's own cancellation."""
        limit = left = self.config.service.worker.turnTimeLimit
        if (job := self.running) is not None:
            # The run's limit, not each turn's: what it worked before waiting for a decision counts.
            limit = job.job.timeLimit
            left = max(0.0, time_left(self.proc.engine, job, self.session_id, utcnow()))
        # A turnTime budget lowers the limit (like it, counted from the turn's start or resume).
        budget = self.gate.limits.configured.turnTime if self.gate is not None else None
        by_budget = budget is not None and budget < left
        if budget is not None and by_budget:
            limit = left = budget
        task = asyncio.current_task()
        assert task is not None
        keeper = self.proc.keeper
        keeper.cancellable(self.session_id, True)  # a stop or a lost lease cancels the turn only while it runs
        deadline = asyncio.timeout(left)
        try:
            async with deadline:
                return await run
        except TimeoutError:
            if not deadline.expired():
                raise
            message = (TIME_BUDGET if by_budget else TIME_LIMIT).format(limit=duration(limit))
            self.failure = f"it ran for longer than its time {'budget' if by_budget else 'limit'} ({duration(limit)})"
            if by_budget:
                metrics.BUDGET_STOPS.labels("turn_time").inc()
            record_error(self.proc.engine, "turn", message, session_id=self.session_id)
            await renderer.notice(message)
            return None
        except asyncio.CancelledError:
            reason = self.proc.keeper.reason(self.session_id)
            if reason is None:
                raise  # the worker itself is going away: the lease expires and another worker resumes
            task.uncancel()
            if reason == Cancelled.LOST:
                raise Fenced(f"session {self.session_id}: the lease was lost") from None
            clear_stop(self.proc.engine, self.session_id)
            self.failure = "it was stopped"
            await self._expire(renderer)
            await renderer.notice(STOPPED)
            return None
        except Fenced:
            raise
        except Exception as e:
            # A crash of our own code (or the database's): the turn ends here, its calls answered, so that the
            # next look at the session does not resume it into the same crash, again and again.
            reason = describe_error(e)
            log.exception("session %s: the turn failed", self.session_id)
            try:
                await self.store.append(self.session_id, ErrorRecord(reason, "worker"))
                await agent.stop()
                await self._expire(renderer)
            except Exception:  # noqa: BLE001 - the database itself may be what failed: keep the record at least
                record_error(self.proc.engine, "worker", reason, session_id=self.session_id)
            await renderer.notice(WORKER_FAILED.format(reason=scrub(reason, list(self.proc.secrets))))
            self.failure = f"the worker failed: {reason}"
            return CRASHED
        finally:
            keeper.cancellable(self.session_id, False)

    async def _workspace(self, renderer: ThreadRenderer) -> Path:
        channel = self.service.channel(self.row.channel_id or "")
        repo, branch = self.row.repo or channel.repo, self.row.branch or channel.branch
        # A private repository on a host the config names is cloned with the worker's token (workers/push.py),
        # asked for only when a clone is made: a GitHub App's is a request to GitHub (raising GitError, which
        # prepare says as its failure).
        config = self.config
        token = (lambda: credentials(config, repo)) if repo else None
        if self.row.purged_at is not None and not self.row.has_log:
            # The first turn since the purge: a workspace there is the purged thread's, should no housekeeping round
            # have removed it yet (workers/retention.py).
            await asyncio.to_thread(remove_workspace, self.config.workspaces_root, self.session_id)
        ws = await asyncio.to_thread(
            prepare, self.config.workspaces_root, self.session_id, repo, branch, credentials=token
        )
        if ws.note:
            await renderer.notice(f"♻️ {ws.note}")
        elif ws.fresh and self.row.has_log:
            await renderer.notice(
                f"♻️ This thread's workspace was gone, so it was prepared again from {public_url(repo or '')}."
            )
        return ws.path

    async def _refuse(self, renderer: ThreadRenderer, text: str) -> None:
        """The turn cannot start (no workspace): the messages are answered with the reason, not kept forever.
        The log's error entry is the errors table's row (the store projects it)."""
        engine, session_id = self.proc.engine, self.session_id
        if self.row.turn is not None and self.row.turn.open:
            # A turn was open (its workspace went away and cannot be made again): it ends, its calls answered.
            async with self._agent() as agent:
                await agent.stop()
            await self._expire(renderer)
            record_error(engine, "workspace", text, session_id=session_id)
        elif self.store.take_inbox(session_id, "", people=self.running is None) is not None:
            await self.store.append(session_id, ErrorRecord(text, "workspace"))
            await self.store.append(session_id, TurnEnded(Outcome.FAILED))
        else:
            record_error(engine, "workspace", text, session_id=session_id)
        self.ending = SessionStatus.IDLE
        await renderer.notice(f"⚠️ {text}")

    async def _receive_files(
        self, workspace: Path, renderer: ThreadRenderer, vision: bool
    ) -> tuple[dict[int, str], dict[int, list[str]]]:
        """The files of the messages this turn takes, downloaded into the workspace (workers.uploads); a line in
        the thread for each one refused. What each message's text gets added for the model, and the images that
        go with it to a model that takes them (`vision`), by inbox row."""
        rows = self.store.untaken_files(self.session_id, people=self.running is None)
        if not rows:
            return {}, {}
        config = self.config
        try:
            token = await tokens(config).token(team_of(self.row))  # a download's, as the thread's posts
            received = await receive(
                rows, workspace, token, config.slack_api_url, config.service.workspaces.files, vision
            )
        except Exception as e:  # a bug of ours must not hold the messages back for ever
            log.exception("session %s: downloading the shared files failed", self.session_id)
            record_error(self.proc.engine, "files", f"downloading shared files: {e}", session_id=self.session_id)
            received = not_received(rows)
        for line in received.refused:
            await renderer.notice(line)
        return received.notes([row_id for row_id, _, _ in rows]), received.images()

    async def _expire(self, renderer: ThreadRenderer) -> None:
        """The turn was stopped: the calls it waited for expire, and their messages lose their buttons."""
        for call_id in expire_pending(self.proc.engine, self.session_id):
            if (row := get_approval(self.proc.engine, call_id)) is not None:
                await renderer.update_approval(row, self.row.channel_id or "")

    def _ask(self, state: SessionState, event: PermissionRequested) -> tuple[ApprovalRow, ...]:
        """Record the waiting calls as approvals, asked by the author of the turn's message. In a channel where
        nobody may approve, they are rejected at once, so that the turn does not wait for ever."""
        engine, service = self.proc.engine, self.service
        timeout = service.approvals.timeout
        start = state.turn_start()
        message = state.entries[start] if start is not None else None
        # Everyone whose message started the turn asked for its calls (none of them may approve them alone).
        author = getattr(message, "author", None) or self.row.requester
        channel_id = self.row.channel_id or ""
        rows = []
        for call in event.calls:
            # Whom the call accepts: its rule's approvers, else the channel's; a rule's call is never the requester's
            # to approve (bot/authorize.py), so then requester_can_approve does not count.
            accepts = list(call.approvers) if call.approvers is not None else service.channel(channel_id).approvers
            nobody = not accepts and (call.rule is not None or not service.approvals.requester_can_approve)
            prefix = f"{call.agent} · " if call.agent else ""
            # Unescaped and whole: the message shows the title's head and the whole text, escaped (display).
            row = request_approval(
                engine,
                call_id=call.call_id,
                session_id=self.session_id,
                tool=call.tool,
                title=prefix + display.CallLine(call.icon, call.title).text,
                arguments=json.dumps(call.arguments, ensure_ascii=False),
                preview=display.whole_text(call),
                requested_by=author,
                shown=call.shown,
                timeout_s=timeout,
                rule=call.rule,
                matched=call.matched or None,
                needed=call.needed,
                approvers=call.approvers,
            )
            if nobody and decide(engine, call.call_id, False, NO_APPROVERS):
                row = get_approval(engine, call.call_id) or row
            rows.append(row)
        self.asked += tuple(rows)
        return tuple(rows)

    async def _command(self, agent: Agent, command: TakenCommand, renderer: ThreadRenderer) -> Any:
        """A thread command the bot recorded in the inbox: its log entries are in (take_command); what is left
        is to say so, or to run the turn it opened (`ask`). None when there is no turn to run."""
        if command.command == InboxCommand.ASK:
            return agent.start()
        if command.command == InboxCommand.NEW:
            await agent.resources.aclose()
            await renderer.notice(NEW_CONVERSATION)
        elif command.command == InboxCommand.COMPACT:
            try:
                await renderer.notice(f"🗜 {await agent.compact()}.")
            except Exception as e:  # noqa: BLE001 - the model failed: the conversation is as it was
                await renderer.notice(f"⚠️ Could not compact: {scrub(describe_error(e), list(self.proc.secrets))}")
        return None

    async def _attach(self, slack: SlackOut) -> None:
        """The files the answer attaches (`[attach: path]` lines, workers.attachments), once it is shown."""
        finished, workspace = self.finished, self.workspace
        if finished is None or workspace is None or not finished.answer:
            return
        try:
            limits = self.config.service.workspaces.files
            await attach(slack, self.row.channel_id or "", self.row.thread_ts, workspace, finished.answer, limits)
        except Exception as e:  # noqa: BLE001 - the answer is shown; a line Slack refused is only recorded
            where = failed_where(e, "files_upload_v2")
            record_error(self.proc.engine, where, f"attaching files: {e}", session_id=self.session_id)

    async def _offer_push(self, slack: SlackOut) -> None:
        """After a turn that ran commands or edits, when the workspace differs from its repository: the button
        that pushes it to a branch (for an approver; `push [branch]` does the same)."""
        finished, workspace = self.finished, self.workspace
        if finished is None or workspace is None or not (finished.counters.commands or finished.counters.file_ops):
            return
        if not (self.row.repo or self.service.channel(self.row.channel_id or "").repo):
            return
        start = start_commit(self.config.workspaces_root, self.session_id)
        changed = await asyncio.to_thread(changed_files, workspace, self._agent_config(), start)
        if not changed:
            return
        text, actions = await asyncio.to_thread(self._push_offer, changed)
        value = ButtonValue(self.session_id)
        blocks = [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "actions", "block_id": "push", "elements": [element(a, value, label) for a, label in actions]},
        ]
        try:
            await slack.post(self.row.channel_id or "", text, thread_ts=self.row.thread_ts, blocks=blocks)
        except Exception as e:  # noqa: BLE001 - a courtesy: `push` in the thread does the same
            record_error(
                self.proc.engine,
                failed_where(e, "chat.postMessage"),
                f"chat.postMessage: {e}",
                session_id=self.session_id,
            )

    def _push_offer(self, changed: int) -> tuple[str, list[tuple[Action, str | None]]]:
        """What the offer says and its buttons: a thread with a pull request updates it; where the repository's
        forge is known, a pull request is offered beside the branch."""
        pull = pull_requests.current(self.proc.engine, pull_requests.thread_owner(self.session_id))
        if pull is not None:
            shown = Mrkdwn("<{url}|{label}>").format(url=pull.url, label=pull.label) if pull.url else pull.label
            return UPDATE_OFFER.format(files=changed, pull=shown), [(Action.PULL_REQUEST, UPDATE_LABEL)]
        remote = self.row.repo or self.service.channel(self.row.channel_id or "").repo or ""
        if has_forge(self.config, remote):
            return PULL_REQUEST_OFFER.format(files=changed), [(Action.PUSH, None), (Action.PULL_REQUEST, None)]
        return PUSH_OFFER.format(files=changed), [(Action.PUSH, None)]

    async def _finish_job(self, renderer: ThreadRenderer, slack: SlackOut) -> None:
        """A job run's turn ended: its summary in the thread, and in the channel the job pausing itself."""

        async def post(text: str, in_channel: bool = False) -> None:
            if not in_channel:
                await renderer.notice(text)
                return
            try:
                await slack.post(self.row.channel_id or "", text)
            except Exception as e:  # noqa: BLE001 - the pause holds; its announcement is a courtesy
                record_error(
                    self.proc.engine,
                    failed_where(e, "chat.postMessage"),
                    f"chat.postMessage: {e}",
                    session_id=self.session_id,
                )

        try:
            await finish_run(
                self.proc.engine,
                self.config,
                self.session_id,
                self.finished,
                self.failure,
                self.workspace,
                post,
                list(self.proc.secrets),
            )
        except Exception as e:
            log.exception("session %s: the job run's summary failed", self.session_id)
            record_error(
                self.proc.engine, "job", f"the run's summary failed: {describe_error(e)}", session_id=self.session_id
            )

    async def _instructions(self, workspace: Path) -> str:
        """What this turn's system prompt adds: the channel's instructions, then the repository's own files as the
        workspace holds them now (read without following links); what was used is recorded for `status`."""
        channel = self.service.channel(self.row.channel_id or "")
        files = await asyncio.to_thread(read_repo_files, workspace, channel.instructionFiles)
        operator = channel.instructions if isinstance(channel.instructions, str) else None
        used = {
            "channel": len(operator) if operator else None,
            "files": [{"path": f.path, "size": f.size, "cut": f.cut} for f in files if f.text is not None],
            "skipped": [{"path": f.path, "why": f.skipped} for f in files if f.skipped],
        }
        await asyncio.to_thread(set_instructions_used, self.proc.engine, self.session_id, used)
        return extra_instructions(operator, files)

    def _agent_config(self) -> Any:
        return self._setting()[0]

    def _setting(self) -> tuple[AgentConfig, frozenset[str | None]]:
        """The agent config the turn runs with, its yolo the thread's (workers.asking), and the requesters whose
        calls run without asking besides those an approver granted (a running job's prompt, under its yolo):
        resolved once a turn."""
        if self.setting is None:
            self.setting = self._resolve()
        return self.setting

    def _resolve(self) -> tuple[AgentConfig, frozenset[str | None]]:
        agent = self.config.agent
        job = self.running.job if self.running is not None else None
        own = bool(self.row.agent_name) and self.row.agent_name in agent.mmConfigs
        if own:  # a job's own agent
            agent = load_agent_file(agent.mmConfigs[self.row.agent_name or ""])
        agent = with_thread_network(self.service, agent, self.row.channel_id or "", job, own)
        agent = agent.with_tool_call_cap(self.config.service.worker.maxToolCallsPerAnswer)
        model_name = self._model_name()
        if model_name is not None and (model := self.config.service.models.get(model_name)) is not None:
            agent = agent.model_copy(update={"model": model})
        if self.row.kind != SessionKind.JOB and self.config.service.workspaces.files.maxAttachments:
            # A thread's answer can attach files (workers.attachments): the model is told how.
            prompt = (agent.systemPrompt or DEFAULT_SYSTEM_PROMPT) + attach_hint(self.config.service.workspaces.files)
            agent = agent.model_copy(update={"systemPrompt": prompt})
        setting = thread_setting(self.service, agent, self.row.channel_id or "", self.row.yolo, job)
        return agent.model_copy(update={"yolo": setting.default}), setting.standing

    def _model_name(self) -> str | None:
        """The `models` entry the turn runs with: the thread's `model=`, else the channel's (None: the config's
        `model`). A job's own agent (`agent:`) keeps its own."""
        if self.row.agent_name:
            return None
        return self.row.model or self.service.channel(self.row.channel_id or "").model

    def _running_job(self) -> RunningJob | None:
        def reread() -> Config:
            self.proc.config_file.ask()
            self.config = self.proc.config
            return self.config

        return job_of_session(self.proc.engine, self.config, self.session_id, reread)

    async def _preface(self, client: Any, renderer: ThreadRenderer) -> str:
        """What goes before a new conversation's first messages: the thread's earlier messages, for context; none
        in a thread that was purged (they hold what was purged; what came after is in the log), whose first turn
        since says so."""
        row = self.row
        if not (row.turn and row.turn.fresh):
            return ""
        if row.purged_at is not None:
            if not row.has_log:
                await renderer.notice(PURGED.format(when=f"{row.purged_at:%Y-%m-%d %H:%M} UTC"))
            return ""
        return await self._thread_context(client)

    async def _thread_context(self, client: Any) -> str:
        """A session started by a mention inside an existing thread: what was said before, for the model."""
        row = self.row
        if not row.channel_id or not row.thread_ts or row.first_message_ts == row.thread_ts:
            return ""
        try:
            response = await client.conversations_replies(channel=row.channel_id, ts=row.thread_ts, limit=200)
        except Exception as e:  # noqa: BLE001 - the turn goes on without the context, and says why in the errors
            where = failed_where(e, "conversations.replies")
            record_error(self.proc.engine, where, f"conversations.replies: {e}", session_id=self.session_id)
            return ""
        earlier = [
            m
            for m in response.get("messages", [])
            if not m.get("bot_id") and row.first_message_ts and float(m.get("ts", 0)) < float(row.first_message_ts)
        ][-CONTEXT_MESSAGES:]
        lines = "\n".join(f"<@{m.get('user', '?')}>: {m.get('text', '')}" for m in earlier)[-CONTEXT_CHARS:]
        return THREAD_CONTEXT.format(lines=lines) if lines else ""


def _title(tool: str, arguments: str | None) -> str:
    """A call's short name for a sentence (`bash: make test`): its command's or path's first line, escaped."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        args = {}
    detail = args.get("command") or args.get("path") if isinstance(args, dict) else None
    return display.head_line(display.visible(f"{tool}: {detail}" if detail else tool)[0])


# --- housekeeping -----------------------------------------------------------------------------------------------


FORGET_EVERY_S = 3600.0
_forgot = [-FORGET_EVERY_S]  # when this process last forgot old skipped and missed runs (monotonic)


def housekeep() -> list[str]:
    """Find the work the broker lost, and the approvals nobody answered (the sessions to enqueue again); purge
    what retention says and remove purged threads' workspaces; make the workspaces fit the disk."""
    proc = process()
    engine, config = proc.engine, proc.config
    release_expired_leases(engine)
    for run_id in close_stale_runs(engine, utcnow()):
        record_error(engine, "housekeeping", f"job run {run_id}: closed as failed, its end was never recorded")
    if time.monotonic() - _forgot[0] > FORGET_EVERY_S:  # a scan of job_runs: hourly is enough
        _forgot[0] = time.monotonic()
        forget_unrun(engine, utcnow())
        forget_finished(engine)
        forget_seen_events(engine)
        forget_assistant_contexts(engine)
    gone = expire_approvals(engine)
    for row in gone:
        metrics.waited(row, "expired")
    expired = {row.session_id for row in gone}
    stranded = set(sessions_with_work(engine, quiet_s=config.service.worker.housekeepingSeconds))
    ws = config.service.workspaces
    try:
        housekeep_retention(engine, config, proc.secrets)
    except Exception as e:
        log.exception("housekeeping: retention failed")
        record_error(engine, "housekeeping", f"retention: {describe_error(e)}")
    try:
        sweep(
            config.workspaces_root,
            max_age_days=ws.maxAgeDays,
            max_total_mb=ws.maxTotalMB,
            protected=_protected(engine),
        )
    except OSError as e:
        record_error(engine, "housekeeping", f"sweeping the workspaces: {describe_error(e)}")
    if expired or stranded:
        log.info("housekeeping: %d expired approval(s), %d session(s) re-enqueued", len(expired), len(stranded))
    return sorted(expired | stranded)


def _protected(engine: Engine) -> set[str]:
    """Sessions whose workspace is in use or will be: not idle, or held by a worker."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Session.id).where((Session.status != SessionStatus.IDLE) | Session.lease_owner.is_not(None))
        )
        return set(rows.scalars())
