"""The turn loop: one small class, readable in one sitting.

A turn is: the user's message → the model → the tool calls it asked for → their results → the model again,
until the model answers without tool calls or `maxTurns` is reached. Every fact is appended to the session's
log as it happens, and every decision is taken from the log, so the same code runs a fresh turn, resumes a
suspended one, and recovers one whose process was killed.

With `yolo` off, a call the reference gates does not run: the turn *suspends*. `run()` returns with the
pending calls named, nothing waits, and `resume(decisions)` continues the same turn later, in any process.
A front end that appends a turn's message itself (in its own transaction) runs the new turn with `start()`;
`async with Agent(...) as agent` closes the model client on the way out.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mm_core.config import AgentConfig
from mm_core.errors import CoreError
from mm_core.events import (
    CallsDropped,
    Emit,
    Error,
    ModelCalled,
    PendingCall,
    PermissionRequested,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    Usage,
    ignore,
)
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Compaction,
    Decision,
    Entry,
    ErrorRecord,
    Outcome,
    Reset,
    ScopedStore,
    Store,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    ToolSuspended,
    TurnEnded,
    UserMessage,
    shown_digest,
)
from mm_core.loopdetect import STOP_AT, LoopDetector, stop_text
from mm_core.model import ModelClient, ModelError, ModelHttp
from mm_core.policy import Action, Rule, Verdict, judge
from mm_core.state import SessionState, asking
from mm_core.tools import build_tools
from mm_core.tools.base import CANCELLED, Caller, Plan, SessionResources, SuspendTurn, Tool, ToolCancelled, ToolContext

DEFAULT_SYSTEM_PROMPT = (
    "You are mm, a coding agent working in a checkout of the user's repository (your working directory). "
    "Use the tools to look at the code, run commands and change files; check what you changed before you "
    "say it is done. Answer briefly and concretely."
)
INTERRUPTED = (
    "[error: interrupted — the process running this call stopped before it finished; it may have done part "
    "of its work: check before running it again]"
)
NOT_RUN = "[error: not run — the turn was stopped before this call]"
# The result of each call of an answer beyond maxToolCallsPerAnswer: the model reads it, nothing else runs it.
TOO_MANY_CALLS = (
    "[error: not run — the answer asked for {asked} tool calls and at most {cap} of one answer are carried "
    "out: the first {cap} were taken up, this one was not — ask for it again in a later answer if it is "
    "still needed]"
)
# An approved call that would now do something else than the person was shown (its file changed since, or the
# decision was for another version of it): it does not run, and a new call asks again.
CHANGED = (
    "[error: not run — what this call would do changed after it was approved (its preview is no longer the one "
    "the approver saw): make the call again to ask for a new approval]"
)
# `ask <agent> <prompt>`: the person's request as the model reads it, before the ask_agent call made for it.
ASK_REQUEST = "Ask the agent {agent}: {prompt}"
COMPACT_PROMPT = (
    "Summarise the conversation so far for your own later use: the task, what was decided, what was done "
    "(files changed, commands that mattered and their outcome) and what is left to do. Be complete but brief; "
    "this summary replaces the earlier messages."
)


NO_RULE = Verdict(Action.DEFAULT, 0, (), None, "")  # without policies every call is the tools' own gating's
# A file a call writes that could not be worked out: a path outside every workspace, which the policy reads as
# unknown (it meets every deny and ask path rule, and no allow rule).
UNKNOWN_PATH = "/"
# A front end's budget (Agent's `budget`): asked before each model call, by the agent and every agent it asks, with
# what the turn has spent so far (its asked agents' answers included); None lets the call go, a text ends the turn
# there (Outcome.BUDGET), and is its error and the line front ends show.
Budget = Callable[[Usage], "str | None"]


class _Spent:
    """What a turn has spent on the model, kept as it goes: one for the turn, shared with the agents it asks, whose
    answers reach the session's log (ScopedStore) but not the caller's state."""

    def __init__(self) -> None:
        self.usage = Usage()


class TurnInProgress(CoreError):
    """A message arrived while a turn is running or awaiting approval: the front end keeps it for later."""


class _LoopStopped(CoreError):
    pass


class _Changed(CoreError):
    """An approved call would now show something else than its approver was shown: it does not run (CHANGED)."""


def ask_entries(agent: str, prompt: str, author: str | None = None) -> list[Entry]:
    """The log entries of `ask <agent> <prompt>`: the request, and the ask_agent call that carries it."""
    call = ToolCallRequest(f"call_{uuid.uuid4().hex[:20]}", "ask_agent", json.dumps({"agent": agent, "prompt": prompt}))
    return [UserMessage(ASK_REQUEST.format(agent=agent, prompt=prompt), author), AssistantMessage("", (call,))]


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        store: Store,
        session_id: str,
        workspace: Path,
        *,
        tools: list[Tool] | None = None,
        model: ModelClient | None = None,
        api_key: str | None = None,
        model_http: ModelHttp | None = None,
        emit: Emit = ignore,
        resources: SessionResources | None = None,
        oneshot: bool = False,
        depth: int = 0,
        name: str | None = None,
        granted: frozenset[str | None] = frozenset(),
        instructions: str = "",
        policies: Sequence[Rule] = (),
        budget: Budget | None = None,
    ):
        self.config, self.store, self.session_id = config, store, session_id
        # Requesters whose calls run without asking besides those an approver granted in the conversation: the
        # front end's standing grant (a job's yolo covers the job's prompt, which nobody wrote: {None}).
        self.granted = granted
        # The approval policy (mm_core.policy): which calls run, ask (whom, how many) or are refused, over the tools'
        # own gating. Its asks hold whatever the yolo and the grants; its denials hold everywhere.
        self.policies = tuple(policies)
        self.workspace = Path(workspace)
        self.emit, self.oneshot, self.depth, self.name = emit, oneshot, depth, name
        self.resources = resources or SessionResources()
        if tools is None:
            tools, _warnings = build_tools(config, self.workspace)
        self.tools = {t.name: t for t in tools}
        # model_http: the process's connections to model servers, shared by its turns (None: the agent's own).
        self.model = model or ModelClient(config.model, api_key, config.watchdogTimeout, model_http)
        # What the front end adds for this turn (mm_core.instructions): after the agent's own, never instead of it.
        base = config.systemPrompt or DEFAULT_SYSTEM_PROMPT
        self.system_prompt = f"{base}\n\n{instructions}" if instructions else base
        self._state = SessionState()
        self.budget = budget
        self._spent = _Spent()
        self._asked = False  # an asked agent: the turn's spending is its caller's, not read from its own log

    # -- the log ----------------------------------------------------------------------------------
    async def load(self) -> SessionState:
        """The session as stored: read again, since another process may have written it."""
        self._state = SessionState.of(await self.store.load(self.session_id))
        return self._state

    def state(self) -> SessionState:
        """The session as this agent last read or wrote it. It is kept up to date as the agent appends (the
        loop asks it at every step, and deriving it again would cost a scan of the whole log each time), so
        it is the session *now*: read what you need from it before appending."""
        return self._state

    async def _append(self, entry: Entry) -> None:
        await self.store.append(self.session_id, entry)  # durable first: the log is the truth
        # After a reset the conversation is what follows it, as SessionState.of reads it from the log.
        if isinstance(entry, Reset):
            self._state = SessionState()
        else:
            self._state.append(entry)

    # -- what front ends call ---------------------------------------------------------------------
    async def send(self, text: str, author: str | None = None) -> TurnFinished:
        if (await self.load()).turn_start() is not None:
            raise TurnInProgress(self.session_id)
        await self._append(UserMessage(text, author))
        return await self._run()

    async def start(self) -> TurnFinished:
        """Run the new turn the front end opened in the log (it appended the turn's message itself: a store that
        takes a thread's messages in one transaction, or `ask_entries`); IDLE when no turn is open."""
        await self.load()
        return await self._run()

    async def resume(self, decisions: Iterable[Decision] = ()) -> TurnFinished:
        """Continue the turn: after approvals, or after the process that ran it died."""
        state = await self.load()
        waiting, known = state.open_calls(), set(state.decisions())
        for d in decisions:
            # The first decision on a call wins; one for a call that waits no more (a stale button) is dropped.
            if d.call_id in waiting and d.call_id not in known:
                known.add(d.call_id)
                await self._append(d)
        return await self._run()

    async def ask(self, agent: str, prompt: str, author: str | None = None) -> TurnFinished:
        """`ask <agent> <prompt>`: a turn in which the person's request goes to the asked agent, as the model
        would send it with ask_agent, and the model then answers with what the agent said. The call goes
        through the loop like any other (gated, shown, logged, resumable)."""
        if (await self.load()).turn_start() is not None:
            raise TurnInProgress(self.session_id)
        for entry in ask_entries(agent, prompt, author):
            await self._append(entry)
        return await self._run()

    async def stop(self) -> TurnFinished:
        """End a turn that is not running in this process (awaiting approval, or orphaned by a crash)."""
        state = await self.load()
        if state.turn_start() is None:
            return TurnFinished(Outcome.IDLE)
        await self._close_pending(state, CANCELLED, CallStatus.CANCELLED)
        return await self._end(Outcome.CANCELLED)

    async def new(self) -> None:
        """`new`: a fresh conversation. Background jobs, language servers and the loop detector go too."""
        if (await self.load()).turn_start() is not None:
            await self.stop()
        await self._append(Reset())
        await self.resources.aclose()

    async def aclose(self) -> None:
        """Close the model client (its connections, when they are the agent's own). The session's resources are
        the session's: `new` closes them."""
        await self.model.aclose()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def compact(self) -> str:
        """`compact`: the model summarises older history; the latest exchange is kept as it is."""
        state = await self.load()
        if state.turn_start() is not None:
            raise TurnInProgress(self.session_id)
        users = [i for i, e in enumerate(state.entries) if isinstance(e, UserMessage)]
        if len(users) < 2:
            return "nothing to compact yet"
        # A budget used up holds for a summary too: it is a model call of its own, sending the whole history.
        if self.budget is not None and (stop := self.budget(Usage())) is not None:
            return stop
        keep_from = users[-1]
        messages = SessionState(state.entries[:keep_from]).messages(self.system_prompt, self.config.model.vision)
        messages.append({"role": "user", "content": COMPACT_PROMPT})
        completion = await self.model.complete(messages, None, lambda e: None, self.name)
        await self._append(Compaction(completion.text.strip(), keep_from))
        return f"compacted {keep_from} earlier entries into a summary of {len(completion.text)} characters"

    # -- the loop ---------------------------------------------------------------------------------
    def spent(self) -> Usage:
        """What the turn in progress (or the one that just ended) has spent on the model: its answers' tokens, those
        of the agents it asked included, as its budget counts them."""
        return self._spent.usage

    async def _run(self) -> TurnFinished:
        if not self._asked:  # from the log: a resumed turn counts what it spent before
            self._spent.usage = self.state().spent()
        try:
            while True:
                state = self.state()
                if state.turn_start() is None:
                    return TurnFinished(Outcome.IDLE)
                if state.failure() is not None:  # it failed, and the process died before the end mark
                    return await self._close_failed(Outcome.FAILED)
                if state.cancelled():  # it was being cancelled when the process died: finish that, not the turn
                    await self._close_pending(state, CANCELLED, CallStatus.CANCELLED)
                    return await self._end(Outcome.CANCELLED)
                if state.answered():
                    return await self._end(Outcome.ANSWERED)
                if state.pending():
                    await self._drop_over_cap(state)
                    waiting = await self._run_calls(state)
                    if waiting:
                        return self._suspend(waiting)
                    continue
                if state.steps() >= self.config.maxTurns:
                    return await self._fail(
                        f"[error: the turn reached maxTurns ({self.config.maxTurns}) model calls without a "
                        f"final answer — ask again to continue, or raise maxTurns]",
                        Outcome.MAX_TURNS,
                    )
                if self.budget is not None and (stop := self.budget(self._spent.usage)) is not None:
                    return await self._fail(stop, Outcome.BUDGET, "budget")
                specs = [t.schema() for t in self.tools.values()]
                messages = state.messages(self.system_prompt, self.config.model.vision)
                answer = await self.model.complete(messages, specs, self.emit, self.name)
                # Models reuse ids (`call_0` in every answer, in every session); approvals are keyed by them.
                calls = tuple(
                    ToolCallRequest(f"call_{uuid.uuid4().hex[:20]}", c.name, c.arguments) for c in answer.tool_calls
                )
                await self._append(
                    AssistantMessage(
                        answer.text,
                        calls,
                        answer.usage.prompt_tokens,
                        answer.usage.completion_tokens,
                        self.name,
                    )
                )
                # The call's timing, for the worker's measure of a step outside the model.
                usage = answer.usage
                self._spent.usage = self._spent.usage + usage
                self.emit(
                    ModelCalled(
                        answer.started, answer.finished, usage.prompt_tokens, usage.completion_tokens, self.name
                    )
                )
        except (ModelError, _LoopStopped) as e:
            return await self._fail(str(e), Outcome.FAILED)
        except asyncio.CancelledError:
            await self._close_pending(self.state(), CANCELLED, CallStatus.CANCELLED)
            await self._end(Outcome.CANCELLED)
            raise

    async def _drop_over_cap(self, state: SessionState) -> None:
        """Answer the latest answer's calls beyond maxToolCallsPerAnswer with TOO_MANY_CALLS, before any of its
        calls runs or is asked for: each call keeps one result (the log stays a conversation the model API
        takes), none of them is shown, asked or counted, and the thread gets one line for them all. Read from
        the log, so a turn resumed elsewhere after a crash half-way drops the same calls."""
        cap, last = self.config.maxToolCallsPerAnswer, state.last_assistant()
        if cap is None or last is None or len(last.tool_calls) <= cap:
            return
        unanswered = {c.id for c in state.pending()}
        dropped = [c for c in last.tool_calls[cap:] if c.id in unanswered]
        if not dropped:
            return
        text = TOO_MANY_CALLS.format(asked=len(last.tool_calls), cap=cap)
        for call in dropped:
            await self._append(ToolResult(call.id, call.name, text, CallStatus.DROPPED, 0, self.name))
        self.emit(CallsDropped(len(last.tool_calls), cap, self.name))

    async def _run_calls(self, state: SessionState) -> list[PendingCall]:
        """Run the pending calls in order; return the ones that wait for a person, if any. A gated call a person
        decided follows the decision, whatever the yolo: rejected, it does not run; approved, it runs only if it
        would still show what they approved (a yolo given since does not bless another version of it)."""
        decisions, started = state.decisions(), state.started()
        yolo = self._yolo(state)
        detector = state.loop_detector()
        pending = state.pending()
        for i, call in enumerate(pending):
            tool = self.tools.get(call.name)
            args, problem = _parse(call, tool, list(self.tools))
            if call.id in started and not (tool and tool.resumable):
                await self._result(call, INTERRUPTED, CallStatus.INTERRUPTED)
                continue
            if tool is None or problem:
                await self._result(call, problem or "", CallStatus.ERROR)
                continue
            decision = decisions.get(call.id)
            verdict = await self._judge(call, tool, args)
            if verdict.action == Action.DENY:  # whatever the yolo, and even if approved before the rule came
                await self._result(call, tool.refusal(args), CallStatus.REJECTED, denied=verdict)
                continue
            if decision is not None and not decision.approved:  # a rejection stands, whatever a rule says since
                await self._result(call, tool.refusal(args), CallStatus.REJECTED, rule=verdict.rule)
                continue
            shown = None  # the digest of what the approver was shown, when the call must still show it to run
            if _asks(verdict, tool, args) and (decision is not None or verdict.action == Action.ASK or not yolo):
                if decision is None and not self.oneshot:
                    return await self._waiting(pending[i:], decisions)
                if decision is None or not decision.approved:
                    await self._result(call, tool.refusal(args), CallStatus.REJECTED, rule=verdict.rule)
                    continue
                shown = decision.shown
            try:
                await self._execute(call, tool, args, detector, shown, verdict)
            except SuspendTurn as suspended:  # an asked agent waits for approvals of its own
                await self._append(ToolSuspended(call.id, call.name))
                return list(suspended.calls)
        return []

    async def _judge(self, call: ToolCallRequest, tool: Tool, args: dict[str, Any]) -> Verdict:
        """The approval policy's verdict on the call (DEFAULT, without policies: the tool's own gating decides). A
        call whose arguments do not name every file it writes (an lsp rename) is worked out first, and judged by
        the files its plan writes too."""
        if not self.policies:
            return NO_RULE
        extra: tuple[str, ...] = ()
        if tool.name == "lsp" and tool.needs_approval(args) and any(rule.paths for rule in self.policies):
            try:
                extra = (await tool.plan(args, self._plan_context(call))).paths
            except Exception:  # noqa: BLE001 - the files it would write are unknown: judged as any path could be
                extra = (UNKNOWN_PATH,)
        # Off the event loop: reading a hostile command line of 100,000 characters takes a second or more, and the
        # loop carries the worker's other turns.
        return await asyncio.to_thread(judge, self.policies, call.name, args, self.workspace, extra)

    def _yolo(self, state: SessionState) -> bool:
        """Whether the turn's gated calls run without asking (mm_core.state.asking): `yolo on|off` said in the
        conversation, else the config, for everyone; an approver's "Approve all" (and the front end's standing
        grant) for the turns everyone who asked for is covered by."""
        return not asking(state, self.config.yolo, self.granted).asks(state.requesters())

    def _context(self, call: ToolCallRequest, tool: Tool) -> ToolContext:
        caller = None
        if tool.asks_agents:
            caller = Caller(
                self.state,
                self._yolo(self.state()),
                self.oneshot,
                self.config.model.url,
                self.model.api_key,
                lambda name, config, api_key, emit: self._asking(
                    Agent(
                        config.with_tool_call_cap(self.config.maxToolCallsPerAnswer),  # no deeper agent raises it
                        ScopedStore(self.store, self.session_id),
                        call.id,
                        self.workspace,
                        api_key=api_key,
                        model_http=self.model.http,  # an asked agent talks over the caller's connections
                        emit=emit,
                        resources=self.resources,
                        oneshot=self.oneshot,
                        depth=self.depth + 1,
                        name=name,
                        budget=self.budget,  # an asked agent spends its caller's budget
                        policies=self.policies,  # the team's rules hold for the agents it asks as for itself
                    )
                ),
            )
        return ToolContext(
            self.workspace, self.config, call.id, self.resources, self.emit, self.depth, self.name, caller
        )

    def _asking(self, asked: Agent) -> Agent:
        """An agent this one asks: its answers count in this turn's spending."""
        asked._spent, asked._asked = self._spent, True
        return asked

    async def _execute(
        self,
        call: ToolCallRequest,
        tool: Tool,
        args: dict,
        detector: LoopDetector,
        shown: str | None = None,
        verdict: Verdict = NO_RULE,
    ) -> None:
        await self._append(ToolStarted(call.id, call.name, self.name))
        self.emit(ToolCallStarted(call.id, call.name, args, tool.emoji, tool.title(args), self.name))
        began, status, rule = time.monotonic(), CallStatus.OK, verdict.rule
        try:
            output = await self._carry_out(call, tool, args, shown, verdict)
        except _Changed:
            await self._result(call, CHANGED, CallStatus.ERROR, began, rule=rule)
            return
        except ToolCancelled as e:
            await self._result(call, e.output, CallStatus.CANCELLED, began, rule=rule)
            raise asyncio.CancelledError from None
        except asyncio.CancelledError:
            await self._result(call, CANCELLED, CallStatus.CANCELLED, began, rule=rule)
            raise
        except SuspendTurn:
            raise
        except Exception as e:  # noqa: BLE001 - a broken tool is text for the model, not a dead turn
            output, status = f"[error: {call.name} failed: {type(e).__name__}: {e}]", CallStatus.ERROR
        run = detector.record(call.name, call.arguments, output) if status == CallStatus.OK else 0
        if run >= STOP_AT:  # the call's result is the error: _fail writes both, the error first
            raise _LoopStopped(stop_text(call.name))
        await self._result(call, LoopDetector.annotate(output, run), status, began, tool.shown(args, output), rule)

    async def _result(
        self,
        call: ToolCallRequest,
        output: str,
        status: CallStatus,
        began: float | None = None,
        shown: str | None = None,
        rule: str | None = None,
        *,
        denied: Verdict | None = None,
    ) -> None:
        ms = int((time.monotonic() - began) * 1000) if began is not None else 0
        rule = denied.rule if denied is not None else rule
        asked = ",".join(sorted(r for r in self.state().requesters() if r)) or None
        await self._append(ToolResult(call.id, call.name, output, status, ms, self.name, rule, asked))
        lines = output.splitlines()[: self.config.previewLines]
        preview = shown or ("\n".join(lines) if output.strip() else "(no output)")
        by, matched = (denied.rule, denied.matched) if denied is not None else (None, "")
        self.emit(ToolCallFinished(call.id, call.name, output, preview, status, self.name, by, matched))

    async def _carry_out(
        self, call: ToolCallRequest, tool: Tool, args: dict[str, Any], shown: str | None, verdict: Verdict
    ) -> str:
        """Run the call; an approved one only while it would still show what the approver was shown (`shown`, the
        digest). That check is the last step before the change: after ToolStarted is appended (a database commit),
        and the plan checked is the plan carried out when the tool has one (write_file, edit_file, lsp rename
        write the very text whose diff was approved); other tools run again from their arguments (bash's preview
        is the command itself)."""
        ctx = self._context(call, tool)
        if shown is None:
            return await tool.run(args, ctx)
        plan = await self._plan(call, tool, args)
        if shown_digest(call.name, args, plan.preview, _asked(verdict)) != shown:
            raise _Changed
        return await (plan.carry_out() if plan.carry_out is not None else tool.run(args, ctx))

    async def _waiting(self, calls: list[ToolCallRequest], decisions: Mapping[str, Decision]) -> list[PendingCall]:
        waiting = []
        for call in calls:
            tool = self.tools.get(call.name)
            args, problem = _parse(call, tool, list(self.tools))
            if tool is None or problem or call.id in decisions:
                continue
            verdict = await self._judge(call, tool, args)
            if verdict.action == Action.DENY or not _asks(verdict, tool, args):
                continue
            preview = (await self._plan(call, tool, args)).preview
            shown = shown_digest(call.name, args, preview, _asked(verdict))
            title = tool.title(args)
            waiting.append(
                PendingCall(
                    call.id,
                    call.name,
                    args,
                    tool.emoji,
                    title,
                    preview,
                    self.name,
                    shown,
                    verdict.rule,
                    verdict.matched,
                    max(1, verdict.approvals),
                    verdict.approvers or None,
                )
            )
        return waiting

    def _plan_context(self, call: ToolCallRequest) -> ToolContext:
        return ToolContext(self.workspace, self.config, call.id, self.resources, self.emit, self.depth, self.name)

    async def _plan(self, call: ToolCallRequest, tool: Tool, args: dict[str, Any]) -> Plan:
        """What a person judges the call by, computed now without writing anything, and how to carry out just that
        (Tool.plan)."""
        try:
            return await tool.plan(args, self._plan_context(call))
        except Exception as e:  # noqa: BLE001 - a person still decides, with what we could show
            return Plan(f"{tool.title(args)}\n(preview failed: {e})")

    # -- endings ----------------------------------------------------------------------------------
    def _suspend(self, waiting: list[PendingCall]) -> TurnFinished:
        self.emit(PermissionRequested(tuple(waiting)))
        finished = self._finished(Outcome.SUSPENDED)
        self.emit(finished)
        return finished

    async def _fail(self, message: str, outcome: Outcome, where: str = "generation") -> TurnFinished:
        # The error is the decision that ends the turn, so it is written first: a crash after it still ends it.
        await self._append(ErrorRecord(message, where))
        self.emit(Error(message, where, self.name))
        return await self._close_failed(outcome)

    async def _close_failed(self, outcome: Outcome) -> TurnFinished:
        state = self.state()
        started = state.started()
        for call in state.pending():  # the call the loop detector stopped gets the error as its result
            if call.id in started:
                await self._result(call, state.failure() or NOT_RUN, CallStatus.ERROR)
            else:
                await self._result(call, NOT_RUN, CallStatus.CANCELLED)
        return await self._end(outcome)

    async def _end(self, outcome: Outcome) -> TurnFinished:
        finished = self._finished(outcome)  # the recap of the turn, read before its end mark closes it
        await self._append(TurnEnded(outcome))
        self.emit(finished)
        return finished

    def _finished(self, outcome: Outcome) -> TurnFinished:
        state = self.state()
        last = state.last_assistant()
        counter_of = {name: tool.counter for name, tool in self.tools.items()}
        answer = last.text if last and outcome == Outcome.ANSWERED else ""
        return TurnFinished(outcome, answer, state.counters(counter_of), state.usage())

    async def _close_pending(self, state: SessionState, text: str, status: CallStatus) -> None:
        """Give every call without a result one, so the log stays a valid conversation."""
        for call in state.pending():
            await self._result(call, text, status)


def _asked(verdict: Verdict) -> list[Any] | None:
    """What a rule asks of a call, bound into its approval's digest (shown_digest); None when no rule asks."""
    if verdict.action != Action.ASK:
        return None
    return [verdict.rule, verdict.approvals, sorted(verdict.approvers)]


def _asks(verdict: Verdict, tool: Tool, args: dict[str, Any]) -> bool:
    """Whether the call needs a person: a rule says ask, or no rule matched and the tool's own gating asks (an
    `allow` rule lets a call the tool would gate run)."""
    return verdict.action == Action.ASK or (verdict.action == Action.DEFAULT and tool.needs_approval(args))


def _parse(call: ToolCallRequest, tool: Tool | None, names: list[str]) -> tuple[dict[str, Any], str | None]:
    if tool is None:
        return {}, f"[error: there is no tool named {call.name!r} — available tools: {', '.join(sorted(names))}]"
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError as e:
        return {}, f"[error: the arguments of {call.name} are not valid JSON ({e}) — send a JSON object]"
    if not isinstance(args, dict):
        return {}, f"[error: the arguments of {call.name} must be a JSON object]"
    return args, None
