"""Session state derived from the event log. Nothing here is stored: every answer is a function of the entries.

- The conversation starts after the last Reset (`new`).
- The turn in progress is the span after the last TurnEnded that begins with a user message.
- A tool call with no result is pending; one with a ToolStarted and no result was interrupted.
- Who asked for the turn (its requesters) are the authors of its user messages. "Approve all" (a Decision with
  `all`) grants them: their later turns run without asking, until `yolo off` or `new`; a turn that anyone else
  asked for too asks again. `yolo on|off` is the switch for everyone. `asking` is the one answer to "does this
  turn ask, and for whom", for the loop and for what a front end says of it.

The loop asks these questions at every step and the log only grows, so the answers are kept up to date as
entries are appended (`append`) rather than found again by scanning the whole log: a step then costs the same
at the tenth message as at the five hundredth (bench/bench_loop.py). The definitions written as scans over the
entries are kept in tests/test_state_incremental.py, which checks that both agree on random logs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
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
    YoloSet,
    asked_answer,
    from_dict,
)
from mm_core.loopdetect import LoopDetector

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
# What the request says instead of a shared image it leaves out: the model takes no images, or the image is
# older than the latest message with images (so a thread's requests do not grow by its images turn after turn).
# The image is still a file in the workspace, named in the message's `[files: …]` line.
IMAGE_LEFT_OUT = "[image {n} ({mime}): not in this request; its file is in the files line]"
_IMAGE_TYPE = re.compile(r"data:(image/[a-z0-9.+-]{1,40});base64,")


class SessionState:
    """The conversation since the last Reset, and what follows from it."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.entries: list[Entry] = []
        self._close_turn()
        # Over the whole conversation.
        self._results: dict[str, ToolResult] = {}
        self._started: set[str] = set()
        self._decisions: dict[str, Decision] = {}
        self._yolo: bool | None = None  # set by `yolo on|off`; None: the config's
        self._grants: set[str | None] = set()  # the requesters an approver's "Approve all" covers
        self._nested: dict[str, list[dict[str, Any]]] = {}  # an asked agent's entries, by scope (its call id)
        self._arguments: dict[str, str] = {}  # call id → the arguments the model sent
        # Built on first use, then kept up to date by `append`; None: build it again from the entries.
        self._detector: LoopDetector | None = None
        self._transcript: _Transcript | None = None
        for entry in entries:
            self.append(entry)

    @classmethod
    def of(cls, log: list[Entry]) -> SessionState:
        start = max((i + 1 for i, e in enumerate(log) if isinstance(e, Reset)), default=0)
        return cls(log[start:])

    def _close_turn(self) -> None:
        """No turn is open: the turn's facts are those of no entries. They count again from its first message."""
        self._turn_start: int | None = None
        self._last_assistant: AssistantMessage | None = None
        self._steps = 0
        self._failure: str | None = None
        self._cancelled = False
        self._requesters: set[str | None] = set()  # the authors of the turn's user messages
        self._results_by_tool: dict[str, int] = {}  # the recap's counters, before they are named
        self._usage = Usage()
        self._asked_usage = Usage()  # the answers of the agents the turn asked (ask_agent), at any depth

    def append(self, entry: Entry) -> None:
        """The log's next entry. Each answer below is updated in O(1), but the messages of a tool result's
        answer, which are built again (O(the calls of that answer))."""
        index = len(self.entries)
        self.entries.append(entry)
        if isinstance(entry, TurnEnded):
            self._close_turn()
        elif isinstance(entry, UserMessage) and self._turn_start is None:
            self._turn_start = index
        in_turn = self._turn_start is not None
        if isinstance(entry, UserMessage) and in_turn:
            self._requesters |= requesters_of(entry.author)
        if isinstance(entry, AssistantMessage):
            for call in entry.tool_calls:
                if call.id in self._results:  # its result came first: only a replay knows which arguments count
                    self._detector = None
                self._arguments[call.id] = call.arguments
            if in_turn:
                self._last_assistant = entry
                self._steps += 1
                self._usage = self._usage + Usage(entry.prompt_tokens, entry.completion_tokens)
        elif isinstance(entry, ToolResult):
            self._results[entry.call_id] = entry
            self._started.discard(entry.call_id)
            if in_turn and entry.status != CallStatus.DROPPED:  # the recap counts the tools' responses
                self._results_by_tool[entry.tool] = self._results_by_tool.get(entry.tool, 0) + 1
                if entry.status == CallStatus.CANCELLED:
                    self._cancelled = True
            if self._detector is not None and entry.status == CallStatus.OK:
                self._detector.record(entry.tool, self._arguments.get(entry.call_id, ""), entry.output)
        elif isinstance(entry, ToolStarted):
            self._started.add(entry.call_id)
        elif isinstance(entry, ToolSuspended):
            self._started.discard(entry.call_id)
        elif isinstance(entry, Decision):
            self._decisions[entry.call_id] = entry
            if entry.all and entry.approved:
                self._grants |= self._requesters
        elif isinstance(entry, YoloSet):
            self._yolo = entry.on
            if not entry.on:
                self._grants.clear()
        elif isinstance(entry, ErrorRecord):
            if in_turn:
                self._failure = entry.message
        elif isinstance(entry, Nested):
            self._nested.setdefault(entry.scope, []).append(entry.entry)
            if in_turn and (tokens := asked_answer(entry)) is not None:
                self._asked_usage = self._asked_usage + Usage(tokens[0], tokens[1])
        if self._transcript is not None:
            if isinstance(entry, Compaction):
                self._transcript = None  # what the model sees changes as a whole: built again when asked
            else:
                self._transcript.add(entry)

    # -- the turn ---------------------------------------------------------------------------------
    def turn_start(self) -> int | None:
        """Index of the user message that opened the turn in progress, or None when no turn is open."""
        return self._turn_start

    def turn_entries(self) -> list[Entry]:
        start = self.turn_start()
        return [] if start is None else self.entries[start:]

    def steps(self) -> int:
        """The model's answers in the turn."""
        return self._steps

    def results(self) -> dict[str, ToolResult]:
        return dict(self._results)

    def started(self) -> set[str]:
        """Calls that started and neither finished nor suspended since: running, or cut off by a crash."""
        return set(self._started)

    def decisions(self) -> Mapping[str, Decision]:
        """The decisions by call id (the last one for a call, were there two), read-only."""
        return MappingProxyType(self._decisions)

    def last_assistant(self) -> AssistantMessage | None:
        """The model's latest answer in the turn."""
        return self._last_assistant

    def pending(self) -> list[ToolCallRequest]:
        """Calls of the turn's latest model answer that have no result yet."""
        last = self.last_assistant()
        if last is None:
            return []
        return [c for c in last.tool_calls if c.id not in self._results]

    def open_calls(self) -> set[str]:
        """The calls a decision may be for: the turn's calls without a result, and those of the asked agents
        (ask_agent) running inside them, at any depth. A decision for any other call is stale."""
        pending = {c.id for c in self.pending()}
        open_ids = set(pending)
        for scope in pending:
            if scope in self._nested:
                open_ids |= SessionState.of([from_dict(e) for e in self._nested[scope]]).open_calls()
        return open_ids

    def failure(self) -> str | None:
        """The error that ended the turn in progress, when a crash came before its end mark."""
        return self._failure

    def cancelled(self) -> bool:
        """A call of the turn ended cancelled: the turn was being stopped (perhaps when the process died)."""
        return self._cancelled

    def answered(self) -> bool:
        """The model's latest answer in this turn had no tool calls: the turn is over but for its end mark."""
        last = self.last_assistant()
        return last is not None and not last.tool_calls and self.entries[-1] is last

    def requesters(self) -> frozenset[str | None]:
        """Who asked for the turn in progress: the authors of its user messages (None for a message nobody wrote:
        the terminal's person, a job's prompt). Empty when no turn is open."""
        return frozenset(self._requesters)

    def grants(self) -> frozenset[str | None]:
        """The requesters whose calls run without asking: those of the turns an approver approved all of, since
        the last `yolo off` (or `new`)."""
        return frozenset(self._grants)

    def granted(self) -> bool:
        """The turn in progress runs without asking: everyone who asked for it is granted (grants). A turn that
        someone else asked for too asks again."""
        return bool(self._requesters) and self._requesters <= self._grants

    def yolo(self) -> bool | None:
        """What `yolo on|off` set for this conversation, the latest; None: nothing (the config decides)."""
        return self._yolo

    def counters(self, counter_of: dict[str, str | None]) -> Counters:
        """The recap counters of the turn; `counter_of` maps a tool name to its counter (Tool.counter)."""
        counts = {"commands": 0, "file_ops": 0, "skills": 0, "lsp": 0}
        for tool, results in self._results_by_tool.items():
            key = counter_of.get(tool)
            if key:
                counts[key] += results
        return Counters(**counts)

    def usage(self) -> Usage:
        """The tokens of the turn's model calls."""
        return self._usage

    def spent(self) -> Usage:
        """What the turn has spent on the model: its own answers' tokens (usage) and those of the agents it asked, at
        any depth: what a budget counts."""
        return self._usage + self._asked_usage

    def loop_detector(self) -> LoopDetector:
        """The detector as it stood after the last call (`compact` does not reset it): a copy, for the caller
        to record the calls it runs into."""
        if self._detector is None:  # replayed from the log once, then kept up to date by `append`
            self._detector = LoopDetector()
            for e in self.entries:
                if isinstance(e, ToolResult) and e.status == CallStatus.OK:
                    self._detector.record(e.tool, self._arguments.get(e.call_id, ""), e.output)
        return LoopDetector(self._detector.last, self._detector.run)

    # -- what the model sees ----------------------------------------------------------------------
    def messages(self, system_prompt: str, vision: bool = False) -> list[dict[str, Any]]:
        """The request's messages. With `vision` (the model in use takes images: `model.vision`), the images of
        the latest user message that has any go as image parts; every other image is IMAGE_LEFT_OUT text, so
        what a request carries does not depend on the model a message arrived under, nor grow with the
        thread's images. The dicts are shared with the next calls' lists: read them, never change them."""
        if self._transcript is None:
            self._transcript = _Transcript.of(self.entries)
        return self._transcript.messages(system_prompt, vision)


class _Transcript:
    """The conversation as the model is sent it, kept as the log grows: each entry's messages are built once,
    when it is appended, and a tool result only rebuilds the messages of the answer that called it."""

    def __init__(self, summary: str | None, entries: Iterable[Entry]) -> None:
        self.summary = summary
        self.pieces: list[list[dict[str, Any]]] = []  # per user message or answer, its messages
        self._answers: dict[int, AssistantMessage] = {}  # piece index → the answer it is made of
        self._calls: dict[str, list[int]] = {}  # call id → the pieces of the answers that made that call
        self._results: dict[str, ToolResult] = {}
        # The latest user message with images: its piece, and its message with the images shown.
        self._imaged: tuple[int, dict[str, Any]] | None = None
        for entry in entries:
            self.add(entry)

    @classmethod
    def of(cls, entries: list[Entry]) -> _Transcript:
        """After a compaction the model gets its summary, the entries it kept (from `keep_from`), and what
        followed it; the latest compaction is the one that counts."""
        for i in reversed(range(len(entries))):
            e = entries[i]
            if isinstance(e, Compaction):
                return cls(e.summary, entries[e.keep_from : i] + entries[i + 1 :])
        return cls(None, entries)

    def add(self, entry: Entry) -> None:
        if isinstance(entry, UserMessage):
            if entry.images:
                self._imaged = len(self.pieces), {"role": "user", "content": user_content(entry, shown=True)}
            self.pieces.append([{"role": "user", "content": user_content(entry, shown=False)}])
        elif isinstance(entry, AssistantMessage):
            piece = len(self.pieces)
            self._answers[piece] = entry
            for call in entry.tool_calls:
                self._calls.setdefault(call.id, []).append(piece)
            self.pieces.append(self._answer(assistant_message(entry), entry))
        elif isinstance(entry, ToolResult):
            self._results[entry.call_id] = entry
            for piece in self._calls.get(entry.call_id, ()):
                self.pieces[piece] = self._answer(self.pieces[piece][0], self._answers[piece])

    def _answer(self, message: dict[str, Any], answer: AssistantMessage) -> list[dict[str, Any]]:
        # Results go right after their call, in the order of the calls, whatever came between them in the log.
        piece = [message]
        for call in answer.tool_calls:
            if call.id in self._results:
                piece.append({"role": "tool", "tool_call_id": call.id, "content": self._results[call.id].output})
        return piece

    def messages(self, system_prompt: str, vision: bool) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
        if self.summary is not None:
            messages.append({"role": "user", "content": SUMMARY_PREFIX + self.summary})
        shown, with_images = self._imaged if vision and self._imaged is not None else (-1, {})
        for i, piece in enumerate(self.pieces):
            messages += [with_images] if i == shown else piece
        return messages


@dataclass(frozen=True)
class Asking:
    """Whether a conversation's gated calls run without asking, and for whom."""

    everyone: bool  # yolo: nobody is asked
    granted: frozenset[str | None]  # the requesters whose calls run without asking (None: a message nobody wrote)

    def asks(self, requesters: frozenset[str | None]) -> bool:
        """Whether a turn asked for by `requesters` asks before its gated calls: unless nobody is asked, or every
        one of them is granted (a turn that someone else asked for too asks again)."""
        return not (self.everyone or (requesters and requesters <= self.granted))


def asking(state: SessionState, default: bool, standing: frozenset[str | None] = frozenset()) -> Asking:
    """Whether the conversation asks, and for whom: `yolo on|off` said in it, else `default` (the front end's
    setting: the config, the channel, the thread's switch), for everyone; and the requesters an approver's "Approve
    all" granted, with `standing` (the front end's own grant: a job's yolo covers the job's prompt, `{None}`) while
    nobody said `yolo on|off` in the conversation (`yolo off` takes every grant back)."""
    chosen = state.yolo()
    return Asking(default if chosen is None else chosen, state.grants() | (standing if chosen is None else frozenset()))


def requesters_of(author: str | None) -> frozenset[str | None]:
    """The people a user message is from: the author, or the authors (comma-separated) of the messages a turn
    took together; None for a message nobody wrote."""
    return frozenset(author.split(",")) if author else frozenset({None})


def assistant_message(e: AssistantMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": e.text or None}
    if e.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in e.tool_calls
        ]
    return message


def user_content(message: UserMessage, shown: bool) -> str | list[dict[str, Any]]:
    """A user message's content on the wire: its text; with images `shown`, the OpenAI content parts (the text,
    then each image as an `image_url` part); else the text with an IMAGE_LEFT_OUT line for each image (plain
    text, which every model takes)."""
    if not message.images:
        return message.text
    if not shown:
        left_out = (IMAGE_LEFT_OUT.format(n=n, mime=image_type(url)) for n, url in enumerate(message.images, 1))
        return "\n".join([message.text, *left_out])
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.text}]
    return parts + [{"type": "image_url", "image_url": {"url": url}} for url in message.images]


def image_type(url: str) -> str:
    """The media type of an image's data URL (`image/png`), or `image` when it names none."""
    m = _IMAGE_TYPE.match(url)
    return m.group(1) if m else "image"
