"""What a front end shows of a turn, computed once from its events; each front end only lays it out.

The terminal (`mm-bot run`) and the Slack thread show the same things: a line per tool call with the tool's
icon, the first lines of its result, the permission prompt, errors, and the recap after the turn. Their
texts follow the reference's display; only the layout differs (dim text and padding in a terminal, code
blocks and buttons in Slack).
"""

from __future__ import annotations

from dataclasses import dataclass

from mm_core.events import (
    CallsDropped,
    Counters,
    Error,
    PendingCall,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from mm_core.log import CallStatus, Outcome

PROMPT_ICON = "🔐"
# One-shot mode (`mm-bot run -p`, a scheduled job) has nobody to ask: a gated call is rejected. The model is
# told so in the reference's words; the person reading the output is told why, and how to allow it.
ONESHOT_REJECTED = (
    "{tool} was not run: one-shot mode cannot ask for approval — set `yolo: true` in the config to allow "
    "such calls, or run it interactively"
)


@dataclass(frozen=True)
class CallLine:
    """`🛠️ bash: ls -la`, under the name of the asked agent that made the call, if any."""

    icon: str
    title: str
    agent: str | None = None

    @property
    def text(self) -> str:
        return f"{self.icon} {self.title}"


@dataclass(frozen=True)
class Prompt:
    """The permission prompt of one gated call: its line, and what a person judges it by."""

    call_id: str
    line: CallLine
    # The command or the diff; empty when it would only repeat the line.
    details: tuple[str, ...]


def call_line(event: ToolCallStarted | PendingCall) -> CallLine:
    return CallLine(event.icon, event.title, event.agent)


def result_lines(event: ToolCallFinished) -> tuple[str, ...]:
    """The lines shown under a call once it returned: its first `previewLines` lines, or what the tool shows
    in their place, "(no output)" when there was none."""
    return tuple(event.preview.splitlines())


def prompt(call: PendingCall) -> Prompt:
    # For bash the preview is the command, which the line already shows after "bash: ".
    repeats = call.preview == call.title.split(": ", 1)[-1]
    details = () if not call.preview or repeats else tuple(call.preview.splitlines())
    return Prompt(call.call_id, call_line(call), details)


def oneshot_note(event: ToolCallFinished) -> str | None:
    """What to tell the person when one-shot mode rejected a call (nobody was there to ask)."""
    return ONESHOT_REJECTED.format(tool=event.tool) if event.status == CallStatus.REJECTED else None


def error_line(event: Error) -> str:
    return event.message


def dropped_line(event: CallsDropped) -> str:
    """The one line a thread gets for an answer's calls beyond maxToolCallsPerAnswer (not one per call)."""
    return (
        f"✂️ The model asked for {event.asked} tool calls in one answer; only the first {event.carried} are taken "
        f"up, the other {event.asked - event.carried} were not run."
    )


def counters_line(counters: Counters) -> str:
    """The reference's recap: `⚙ N command(s) 📝 N file op(s) 📖 N skill(s) 🔎 N lsp call(s)`, zeros left out."""
    parts = []
    if counters.commands:
        parts.append(f"⚙ {counters.commands} command(s)")
    if counters.file_ops:
        parts.append(f"📝 {counters.file_ops} file op(s)")
    if counters.skills:
        parts.append(f"📖 {counters.skills} skill(s)")
    if counters.lsp:
        parts.append(f"🔎 {counters.lsp} lsp call(s)")
    return " ".join(parts)


def recap(event: TurnFinished) -> str | None:
    """The turn's last line: its counters and the tokens it used; None while it waits for a person."""
    if event.outcome in (Outcome.SUSPENDED, Outcome.IDLE):
        return None
    counters = counters_line(event.counters)
    tokens = f"{event.usage.total_tokens:,} tokens"
    return f"{counters} · {tokens}" if counters else tokens
