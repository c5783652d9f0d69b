"""The seam between the turn loop and the tools.

A tool turns parsed arguments into text for the model. It never raises for an ordinary failure: the failure
is text, exactly as the reference words it. The loop owns everything around a call (approval, the event log,
the loop detector, counters, events); a tool owns only what it does.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from mm_core.config import AgentConfig
from mm_core.errors import CoreError
from mm_core.events import Emit, PendingCall, TurnFinished, ignore
from mm_core.log import Decision
from mm_core.state import SessionState

T = TypeVar("T")
# A call's result when the turn is stopped while it runs (or before it ran): the tool's and the loop's word.
CANCELLED = "[error: cancelled]"


class ToolRefusal(CoreError):
    """A call the tool will not carry out (a bad argument, a path outside the workspace, a missing sandbox);
    `text` is the answer for the model, worded as the reference words it."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class ToolCancelled(CoreError):
    """Raised by a tool from its cancellation handler to hand back what it had so far.

    `output` is the whole text for the model and already ends with `[error: cancelled]`.
    """

    def __init__(self, output: str):
        super().__init__(output)
        self.output = output


class SuspendTurn(CoreError):
    """Raised by a tool that runs an agent of its own (ask_agent) when that agent waits for approvals.

    `calls` are the mm_core.events.PendingCall the person must decide; the turn suspends with them, and on
    resume the tool is run again with the same call id and picks up where its agent stopped.
    """

    def __init__(self, calls: tuple[PendingCall, ...]):
        super().__init__(f"{len(calls)} call(s) await approval")
        self.calls = calls


class SessionResources:
    """Things a session keeps between calls and turns (language servers, background jobs, caches).

    Each resource is created on first use and closed when the session ends (`new`, workspace removed,
    worker shutdown), so a worker serving many sessions does not pile them up.
    """

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def get(self, key: str, factory: Callable[[], T | Awaitable[T]]) -> T:
        async with self._lock:
            if key not in self._items:
                made = factory()
                if asyncio.iscoroutine(made):
                    made = await made
                self._items[key] = made
            return self._items[key]

    def peek(self, key: str) -> Any | None:
        return self._items.get(key)

    async def aclose(self) -> None:
        items, self._items = list(self._items.values()), {}
        for item in reversed(items):
            close = getattr(item, "aclose", None)
            if close is not None:
                # Closing one resource must not stop the others.
                with contextlib.suppress(Exception):
                    await close()


class AskedAgent(Protocol):
    """An agent that a tool runs inside the current turn (ask_agent); mm_core.agent.Agent is one."""

    async def load(self) -> SessionState:
        """Its session as stored (empty before it was first asked)."""
        ...

    def state(self) -> SessionState:
        """Its session as it last read or wrote it."""
        ...

    async def send(self, text: str, author: str | None = None) -> TurnFinished: ...

    async def resume(self, decisions: Iterable[Decision] = ()) -> TurnFinished: ...

    async def aclose(self) -> None:
        """Release its model client; the session's resources stay with the session."""
        ...


@dataclass(frozen=True)
class Caller:
    """The agent whose call a tool runs, as seen by a tool that runs an agent of its own (ask_agent).

    The tools cannot import the loop (the loop imports them), so the loop hands this over.
    """

    # The caller's session now: its conversation (with_context) and the decisions it was given.
    state: Callable[[], SessionState]
    # The caller's permission: its config's yolo, or "approve all" given in its session.
    yolo: bool
    oneshot: bool
    model_url: str
    api_key: str | None
    # An agent named `name`, run with `config` in this turn's workspace one level deeper, whose log is kept
    # inside the caller's session under this call's id: asking it again with the same call id resumes it.
    ask: Callable[[str, AgentConfig, str | None, Emit], AskedAgent]


@dataclass(frozen=True)
class Plan:
    """A gated call worked out without doing anything: what a person judges it by (its preview), and, for a tool
    that can, how to carry out exactly that change. The loop checks the preview against what the approver was
    shown, then carries out this plan: the change that was checked is the change that is made, with no second
    working-out in between. Without `carry_out`, `Tool.run` works the change out again when it runs."""

    preview: str
    carry_out: Callable[[], Awaitable[str]] | None = None
    # The files carrying it out writes, when its arguments do not name them all (an lsp rename's): the approval
    # policy's path rules judge them too (mm_core/policy.py).
    paths: tuple[str, ...] = ()


@dataclass
class ToolContext:
    """What a tool may use while it runs."""

    workspace: Path
    config: AgentConfig
    call_id: str = ""
    resources: SessionResources = field(default_factory=SessionResources)
    # Front-end events (see mm_core.events); used by tools that stream (ask_agent) or show progress.
    emit: Emit = ignore
    # Nesting of ask_agent: 0 for the agent the user talks to.
    depth: int = 0
    # The name of the asked agent whose call this is, None for the main agent.
    agent: str | None = None
    # Set by the turn loop for the tools that ask for it (`Tool.asks_agents`).
    caller: Caller | None = None


class Tool(ABC):
    """One tool declared to the model."""

    name: ClassVar[str]
    # Which recap counter a response counts towards: "commands", "file_ops", "skills", "lsp", or None.
    counter: ClassVar[str | None] = None
    # The emoji of the reference's display line (🛠️ bash, 📝 edits, 📖 skills, 🔎 lsp, 🌐 fetch, 🗣 ask).
    emoji: ClassVar[str] = "🛠️"
    # Whether a call cut off by a crash is run again rather than reported interrupted: true only for a tool
    # whose progress is itself in the session log, so running it again continues it (ask_agent).
    resumable: ClassVar[bool] = False
    # Whether it runs agents of its own, and so needs the calling agent (ToolContext.caller).
    asks_agents: ClassVar[bool] = False

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """The OpenAI function declaration: {"name", "description", "parameters"}."""

    def needs_approval(self, args: dict[str, Any]) -> bool:
        """Whether this call is one the reference gates when `yolo` is off."""
        return False

    def refusal(self, args: dict[str, Any]) -> str:
        """The text the model gets when a person rejects the call."""
        return f"[{self.name} rejected by the user]"

    def title(self, args: dict[str, Any]) -> str:
        """The display line after the emoji, e.g. `bash: ls -la` or `lsp: definition main.go greet`."""
        return self.name

    async def preview(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """What a person needs to judge the call before it runs (the command, the diff), computed without
        writing anything. Whole: never cut to maxOutput (that bounds what the model reads), since a person
        approves all of it."""
        return self.title(args)

    async def plan(self, args: dict[str, Any], ctx: ToolContext) -> Plan:
        """The call worked out now, without writing anything (see Plan): its preview, and the way to make exactly
        that change when the tool can (write_file, edit_file, lsp rename)."""
        return Plan(await self.preview(args, ctx))

    def shown(self, args: dict[str, Any], output: str) -> str | None:
        """What front ends show of a result in place of its first `previewLines` lines; None for those."""
        return None

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Run the call and return the text for the model. Never raises for an ordinary failure."""


class PlannedTool(Tool):
    """A tool whose calls are worked out first, then carried out as worked out (write_file, edit_file, lsp): its
    preview is its plan's, and running it carries out the plan it works out then, as an approved call does."""

    async def preview(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return (await self.plan(args, ctx)).preview

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        carry_out = (await self.plan(args, ctx)).carry_out
        assert carry_out is not None, f"{self.name}: its plan has nothing to carry out"
        return await carry_out()
