"""Typed events the turn emits for front ends (the terminal, the Slack renderer, the tests).

Front ends subscribe to these and nothing else: they never reach into the loop, and what they show of them
is computed once, in mm_core.display. `agent` names the asked agent (ask_agent) whose event it is, None for
the agent the user talks to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mm_core.log import CallStatus, Outcome


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
    # The reference's display line, in two parts: the tool's icon ("🛠️", "📖") and "bash: ls", "read_skill: go".
    icon: str
    title: str
    agent: str | None = None


@dataclass(frozen=True)
class ToolCallFinished:
    call_id: str
    tool: str
    output: str
    # Up to previewLines lines of the output, or "(no output)".
    preview: str
    status: CallStatus = CallStatus.OK
    agent: str | None = None
    # A call an approval policy rule refused (`deny`): the rule, and what of the call matched it.
    denied_by: str | None = None
    matched: str = ""


@dataclass(frozen=True)
class NetworkUsed:
    """What one bash call's commands reached through the egress proxy (`network: allow`), and what they were
    refused: (host, connections) and (host, the refusal's text), each host once, sorted."""

    call_id: str
    reached: tuple[tuple[str, int], ...]
    refused: tuple[tuple[str, str], ...]
    agent: str | None = None


@dataclass(frozen=True)
class PendingCall:
    call_id: str
    tool: str
    arguments: dict[str, Any]
    icon: str
    title: str
    # What a person judges: the command, or the diff the edit would make.
    preview: str
    agent: str | None = None
    # The digest of what the person is shown (mm_core.log.shown_digest): the Decision hands it back, and the call
    # runs only if it would still show exactly that.
    shown: str = ""
    # The approval policy's verdict (mm_core.policy): the rule that asks (None: the tool's own gating), what of the
    # call matched it, how many distinct people must approve, and whom it accepts (None: the front end's approvers).
    rule: str | None = None
    matched: str = ""
    needed: int = 1
    approvers: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PermissionRequested:
    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
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


@dataclass(frozen=True)
class TurnFinished:
    outcome: Outcome
    answer: str = ""
    counters: Counters = field(default_factory=Counters)
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class CallsDropped:
    """A model answer asked for more tool calls than maxToolCallsPerAnswer: the first `carried` go on (to run,
    or to be asked for), the other `asked - carried` were answered with an error and never ran."""

    asked: int
    carried: int
    agent: str | None = None


@dataclass(frozen=True)
class Error:
    message: str
    where: str = "generation"
    agent: str | None = None


@dataclass(frozen=True)
class ModelCalled:
    """One model call's timing (time.monotonic() when the request was sent and when its last byte arrived)
    and tokens."""

    started: float
    finished: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    agent: str | None = None


Event = (
    Status
    | TextDelta
    | ToolCallStarted
    | ToolCallFinished
    | NetworkUsed
    | PermissionRequested
    | CallsDropped
    | TurnFinished
    | Error
    | ModelCalled
)
# How the loop hands events to a front end.
Emit = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The front end of a turn nobody watches."""
