"""Typed events the turn emits for front ends (the terminal, the Slack renderer, the tests).

Front ends subscribe to these and nothing else: they never reach into the loop. `agent` names the asked
agent (ask_agent) whose event it is, None for the agent the user talks to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Status:
    """A spinner line: "Thinking", "Composing a tool call", "Fetching"."""

    text: str
    agent: str | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str
    agent: str | None = None


@dataclass(frozen=True)
class ToolCallStarted:
    call_id: str
    tool: str
    arguments: dict[str, Any]
    # The reference's display line, emoji included: "🛠️  bash: ls", "📖 read_skill: go".
    title: str
    agent: str | None = None


@dataclass(frozen=True)
class ToolCallFinished:
    call_id: str
    tool: str
    output: str
    # Up to previewLines lines of the output, or "(no output)".
    preview: str
    status: str = "ok"  # ok | rejected | cancelled | interrupted | error
    agent: str | None = None


@dataclass(frozen=True)
class PendingCall:
    call_id: str
    tool: str
    arguments: dict[str, Any]
    title: str
    # What a person judges: the command, or the diff the edit would make.
    preview: str
    agent: str | None = None


@dataclass(frozen=True)
class PermissionRequested:
    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Counters:
    commands: int = 0
    file_ops: int = 0
    skills: int = 0
    lsp: int = 0

    def recap(self) -> str:
        """The reference's recap line: `⚙ N command(s) 📝 N file op(s) 📖 N skill(s) 🔎 N lsp call(s)`."""
        parts = []
        if self.commands:
            parts.append(f"⚙ {self.commands} command(s)")
        if self.file_ops:
            parts.append(f"📝 {self.file_ops} file op(s)")
        if self.skills:
            parts.append(f"📖 {self.skills} skill(s)")
        if self.lsp:
            parts.append(f"🔎 {self.lsp} lsp call(s)")
        return " ".join(parts)


@dataclass(frozen=True)
class TurnFinished:
    # answered | suspended | cancelled | failed | max_turns
    outcome: str
    answer: str = ""
    counters: Counters = field(default_factory=Counters)
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class Error:
    message: str
    where: str = "generation"
    agent: str | None = None


Event = Status | TextDelta | ToolCallStarted | ToolCallFinished | PermissionRequested | TurnFinished | Error
