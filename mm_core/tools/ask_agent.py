"""ask_agent: hand a task to another configured agent and return its answer, exactly as the reference.

Here the asked agent runs inside the same turn and workspace, as an Agent whose log is kept inside the
caller's session (ScopedStore). Its gated calls suspend the caller's turn through the same path as the
caller's own: the person's decisions come back with the caller's resume, and this tool, run again with the
same call id, resumes the asked agent where it stopped.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from mm_core.config import AgentConfig, AgentRef, read_yaml, with_refs_from
from mm_core.events import Event, PermissionRequested, TurnFinished
from mm_core.log import AssistantMessage, ErrorRecord, Outcome, TurnEnded, UserMessage
from mm_core.state import SessionState
from mm_core.tools.base import Caller, SuspendTurn, Tool, ToolCancelled, ToolContext
from mm_core.tools.text import truncate

MAX_DEPTH = 2
DESCRIPTION = (
    "Ask another agent to do a task and get its answer back. Each agent below has its own model, tools and "
    "instructions; pick the one whose purpose fits. Write the prompt as a complete, self-contained task: the "
    "agent does not see this conversation unless with_context is true."
)


# Said in the preview of a call that sends the conversation along: the approver approves that too.
WITH_CONTEXT = (
    "⚠ with_context: this conversation so far (its questions, answers and tool calls, up to {limit:,} characters) "
    "is sent to {agent} too{where}."
)
ELSEWHERE = ", at {endpoint} (model {model}), another endpoint than this agent's"
OTHER_MODEL = ", to its model {model}"


def load_agent_file(ref: AgentRef) -> AgentConfig:
    """The asked agent's config file: the operator's, never the workspace's (see config.with_refs_from, which
    made the path absolute when the config naming it was read). Its own mmConfigs are relative to it."""
    path = Path(ref.config)
    if not path.is_absolute():
        raise ValueError("the path is relative: give it in the operator's config, which resolves it")
    _, data = read_yaml(path.read_text(encoding="utf-8"))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{ref.config} is not a YAML mapping of config keys")
    return with_refs_from(AgentConfig.model_validate(data), path.parent)


def purpose(ref: AgentRef) -> str:
    if ref.description:
        return ref.description
    try:
        title = load_agent_file(ref).acp.title
    except (OSError, ValueError, ValidationError):
        title = None
    return title if title and title != "mm" else "(no description)"


class AskAgentTool(Tool):
    name = "ask_agent"
    emoji = "🗣"
    resumable = True  # the asked agent's log is kept in the caller's: a crash resumes it where it stopped
    asks_agents = True

    def __init__(self, config: AgentConfig):
        self.config = config

    def schema(self) -> dict[str, Any]:
        agents = "\n".join(f"  {name} — {purpose(ref)}" for name, ref in sorted(self.config.mmConfigs.items()))
        return {
            "name": self.name,
            "description": f"{DESCRIPTION}\nAgents:\n{agents}",
            "parameters": {
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "description": "The agent's name, as listed."},
                    "prompt": {"type": "string", "description": "The task, complete and self-contained."},
                    "with_context": {
                        "type": "boolean",
                        "description": "Send this conversation (questions, answers, tool calls) before the prompt.",
                        "default": False,
                    },
                },
                "required": ["agent", "prompt"],
            },
        }

    def needs_approval(self, args: dict[str, Any]) -> bool:
        return True

    def title(self, args: dict[str, Any]) -> str:
        name = str(args.get("agent", ""))
        first = str(args.get("prompt", "")).strip().splitlines()[:1]
        ref = self.config.mmConfigs.get(name)
        where = ""
        if ref is not None:
            try:
                model = load_agent_file(ref).model
                where = f" ({urlsplit(model.url).netloc or model.url}/{model.name})"
            except (OSError, ValueError, ValidationError):
                pass
        return f"ask_agent: {name}{where} — {first[0] if first else ''}"

    def shown(self, args: dict[str, Any], output: str) -> str | None:
        # The answer has already streamed, under the agent's name: the call itself only says how long it was.
        if output.startswith("[ask_agent:") or "\n[ask_agent:" in output:
            return None
        return f"{args.get('agent')} answered ({len(output)} characters)"

    async def preview(self, args: dict[str, Any], ctx: ToolContext) -> str:
        head = self.title(args)
        if _with_context(args):
            head += "\n" + self._context_note(str(args.get("agent", "")), ctx)
        return f"{head}\n\n{args.get('prompt', '')}"

    def _context_note(self, name: str, ctx: ToolContext) -> str:
        """WITH_CONTEXT, naming where the conversation goes when that is not where this agent's goes."""
        where = ""
        ref = self.config.mmConfigs.get(name)
        if ref is not None:
            try:
                model = load_agent_file(ref).model
            except (OSError, ValueError, ValidationError):
                model = None
            if model is not None and model.url != ctx.config.model.url:
                where = ELSEWHERE.format(endpoint=urlsplit(model.url).netloc or model.url, model=model.name)
            elif model is not None and model.name != ctx.config.model.name:
                where = OTHER_MODEL.format(model=model.name)
        return WITH_CONTEXT.format(limit=self.config.maxOutput, agent=name, where=where)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        name, prompt = args.get("agent"), args.get("prompt")
        if not isinstance(name, str) or name not in self.config.mmConfigs:
            return f'[ask_agent: unknown agent "{name}" — agents: {", ".join(sorted(self.config.mmConfigs))}]'
        if not isinstance(prompt, str) or not prompt.strip():
            return f"[ask_agent: the prompt is empty — say what {name} must do]"
        if ctx.depth + 1 > MAX_DEPTH:
            return (
                f"[ask_agent: {name} cannot be asked: agents may only be nested {MAX_DEPTH} levels deep (MM_ASK_DEPTH)]"
            )
        if ctx.caller is None:
            raise RuntimeError("ask_agent runs only inside a turn (ToolContext.caller is not set)")
        ref = self.config.mmConfigs[name]
        try:
            config = load_agent_file(ref)
        except (OSError, ValueError, ValidationError) as e:
            return f"[ask_agent: {name} failed: cannot load {ref.config}: {_first_line(e)}]"
        # The caller's network: a channel's (or a job's) policy is never widened by an agent it asks, whose file
        # cannot know the channel; only an asked agent whose own file says `network: off` keeps that.
        network = config.network if config.egress.policy == "off" else ctx.config.network
        yolo = ref.yolo if ref.yolo is not None else ctx.caller.yolo
        config = config.model_copy(update={"yolo": yolo, "network": network})
        return await self._ask(ctx.caller, name, config, prompt, _with_context(args), ctx)

    async def _ask(
        self, caller: Caller, name: str, config: AgentConfig, prompt: str, with_context: bool, ctx: ToolContext
    ) -> str:
        asked: list[PermissionRequested] = []

        def emit(event: Event) -> None:
            # The asked agent's text and tool calls stream through the turn; its requests and its end do not:
            # they come back to the caller as this call's suspension or result.
            if isinstance(event, PermissionRequested):
                asked.append(event)
            elif not isinstance(event, TurnFinished):
                ctx.emit(event)

        key_env = config.model.apiKeyEnv
        # Without a key of its own, an agent on the caller's endpoint uses the caller's key, and no other.
        same_endpoint = config.model.url == caller.model_url
        api_key = os.environ.get(key_env) if key_env else (caller.api_key if same_endpoint else None)
        agent = caller.ask(name, config, api_key, emit)
        state = await agent.load()
        try:
            if not state.entries:
                context = self._context(caller.state()) if with_context else ""
                result = await agent.send(f"{context}{prompt}")
            elif state.turn_start() is not None:
                # The caller's decisions for the asked agent's calls, and for those of any agent it asked.
                waiting = state.open_calls()
                decisions = [d for d in caller.state().decisions().values() if d.call_id in waiting]
                result = await agent.resume(decisions)
            else:
                result = None  # it finished before the caller's process stopped: read its answer from the log
        except asyncio.CancelledError:
            raise ToolCancelled(self._stopped(name, agent.state(), "cancelled")) from None
        finally:
            await agent.aclose()
        if result is not None and result.outcome == Outcome.SUSPENDED:
            raise SuspendTurn(asked[-1].calls if asked else ())
        state = agent.state()
        outcome = result.outcome if result is not None else _last_outcome(state)
        if outcome != Outcome.ANSWERED:
            errors = [e.message for e in state.entries if isinstance(e, ErrorRecord)]
            return self._stopped(name, state, errors[-1] if errors else outcome)
        answer = _answer(state)
        if not answer.strip():
            return f"[ask_agent: {name} gave no answer]"
        return truncate(answer, self.config.maxOutput)

    def _stopped(self, name: str, state: SessionState, reason: str) -> str:
        answered = "\n".join(e.text for e in state.entries if isinstance(e, AssistantMessage) and e.text)
        return f"{answered}\n[ask_agent: {name} stopped before finishing: {reason}]".lstrip("\n")

    def _context(self, state: SessionState) -> str:
        """The history the turn started from: questions, answers, one line per tool call, never outputs."""
        start = state.turn_start() or len(state.entries)
        lines: list[str] = []
        for e in state.entries[:start]:
            if isinstance(e, UserMessage):
                lines.append(f"user: {e.text}")
            elif isinstance(e, AssistantMessage):
                if e.text:
                    lines.append(f"assistant: {e.text}")
                lines += [f"tool call: {c.name} {c.arguments}" for c in e.tool_calls]
        kept: list[str] = []
        size = 0
        for line in reversed(lines):  # newest kept
            if size + len(line) + 1 > self.config.maxOutput:
                break
            kept.append(line)
            size += len(line) + 1
        if not kept:
            return ""
        return "The conversation so far:\n" + "\n".join(reversed(kept)) + "\n\nYour task:\n"


def _with_context(args: dict[str, Any]) -> bool:
    """Whether the call sends the conversation along: what runs and what the approver is shown read it alike."""
    return bool(args.get("with_context"))


def _answer(state: SessionState) -> str:
    for e in reversed(state.entries):
        if isinstance(e, AssistantMessage):
            return e.text
    return ""


def _last_outcome(state: SessionState) -> Outcome:
    ends = [e for e in state.entries if isinstance(e, TurnEnded)]
    return ends[-1].outcome if ends else Outcome.FAILED


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
