"""Session state derived from the event log. Nothing here is stored: it is recomputed from the entries.

- The conversation starts after the last Reset (`new`).
- The turn in progress is the span after the last TurnEnded that begins with a user message.
- A tool call with no result is pending; one with a ToolStarted and no result was interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mm_core.events import Counters, Usage
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Compaction,
    Decision,
    Entry,
    ErrorRecord,
    Nested,
    Reset,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    ToolSuspended,
    TurnEnded,
    UserMessage,
    from_dict,
)
from mm_core.loopdetect import LoopDetector

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


@dataclass
class SessionState:
    entries: list[Entry]  # since the last Reset

    @classmethod
    def of(cls, log: list[Entry]) -> SessionState:
        start = max((i + 1 for i, e in enumerate(log) if isinstance(e, Reset)), default=0)
        return cls(log[start:])

    # -- the turn ---------------------------------------------------------------------------------
    def turn_start(self) -> int | None:
        """Index of the user message that opened the turn in progress, or None when no turn is open."""
        last_end = max((i for i, e in enumerate(self.entries) if isinstance(e, TurnEnded)), default=-1)
        for i in range(last_end + 1, len(self.entries)):
            if isinstance(self.entries[i], UserMessage):
                return i
        return None

    def turn_entries(self) -> list[Entry]:
        start = self.turn_start()
        return [] if start is None else self.entries[start:]

    def steps(self) -> int:
        return sum(isinstance(e, AssistantMessage) for e in self.turn_entries())

    def results(self) -> dict[str, ToolResult]:
        return {e.call_id: e for e in self.entries if isinstance(e, ToolResult)}

    def started(self) -> set[str]:
        """Calls that started and neither finished nor suspended since: running, or cut off by a crash."""
        running: set[str] = set()
        for e in self.entries:
            if isinstance(e, ToolStarted):
                running.add(e.call_id)
            elif isinstance(e, (ToolResult, ToolSuspended)):
                running.discard(e.call_id)
        return running

    def decisions(self) -> dict[str, Decision]:
        return {e.call_id: e for e in self.entries if isinstance(e, Decision)}

    def last_assistant(self) -> AssistantMessage | None:
        for e in reversed(self.turn_entries()):
            if isinstance(e, AssistantMessage):
                return e
        return None

    def pending(self) -> list[ToolCallRequest]:
        """Calls of the turn's latest model answer that have no result yet."""
        last = self.last_assistant()
        if last is None:
            return []
        done = self.results()
        return [c for c in last.tool_calls if c.id not in done]

    def open_calls(self) -> set[str]:
        """The calls a decision may be for: the turn's calls without a result, and those of the asked agents
        (ask_agent) running inside them, at any depth. A decision for any other call is stale."""
        open_ids = {c.id for c in self.pending()}
        nested: dict[str, list[Entry]] = {}
        for e in self.entries:
            if isinstance(e, Nested) and e.scope in open_ids:
                nested.setdefault(e.scope, []).append(from_dict(e.entry))
        for log in nested.values():
            open_ids |= SessionState.of(log).open_calls()
        return open_ids

    def failure(self) -> str | None:
        """The error that ended the turn in progress, when a crash came before its end mark."""
        errors = [e.message for e in self.turn_entries() if isinstance(e, ErrorRecord)]
        return errors[-1] if errors else None

    def cancelled(self) -> bool:
        """A call of the turn ended cancelled: the turn was being stopped (perhaps when the process died)."""
        return any(isinstance(e, ToolResult) and e.status == CallStatus.CANCELLED for e in self.turn_entries())

    def answered(self) -> bool:
        """The model's latest answer in this turn had no tool calls: the turn is over but for its end mark."""
        last = self.last_assistant()
        return last is not None and not last.tool_calls and self.entries[-1] is last

    def approve_all(self) -> bool:
        return any(e.all and e.approved for e in self.entries if isinstance(e, Decision))

    def counters(self, counter_of: dict[str, str | None]) -> Counters:
        """The recap counters of the turn; `counter_of` maps a tool name to its counter (Tool.counter)."""
        counts = {"commands": 0, "file_ops": 0, "skills": 0, "lsp": 0}
        for e in self.turn_entries():
            if isinstance(e, ToolResult):
                key = counter_of.get(e.tool)
                if key:
                    counts[key] += 1
        return Counters(**counts)

    def usage(self) -> Usage:
        total = Usage()
        for e in self.turn_entries():
            if isinstance(e, AssistantMessage):
                total = total + Usage(e.prompt_tokens, e.completion_tokens)
        return total

    def loop_detector(self) -> LoopDetector:
        """The detector as it stood after the last call, replayed from the log (`compact` does not reset it)."""
        detector = LoopDetector()
        args = {c.id: c.arguments for e in self.entries if isinstance(e, AssistantMessage) for c in e.tool_calls}
        for e in self.entries:
            if isinstance(e, ToolResult) and e.status == CallStatus.OK:
                detector.record(e.tool, args.get(e.call_id, ""), e.output)
        return detector

    # -- what the model sees ----------------------------------------------------------------------
    def messages(self, system_prompt: str) -> list[dict[str, Any]]:
        entries, summary = self.entries, None
        for i, e in enumerate(self.entries):
            if isinstance(e, Compaction):
                summary, keep_from = e.summary, e.keep_from
                entries = [x for x in self.entries[keep_from:i]] + self.entries[i + 1 :]
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
        if summary is not None:
            messages.append({"role": "user", "content": SUMMARY_PREFIX + summary})
        results = {e.call_id: e for e in entries if isinstance(e, ToolResult)}
        for e in entries:
            if isinstance(e, UserMessage):
                messages.append({"role": "user", "content": e.text})
            elif isinstance(e, AssistantMessage):
                messages.append(assistant_message(e))
                # Results go right after their call, whatever came between them in the log.
                for call in e.tool_calls:
                    if call.id in results:
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.id].output})
        return messages


def assistant_message(e: AssistantMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": e.text or None}
    if e.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in e.tool_calls
        ]
    return message
