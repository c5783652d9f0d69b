"""The session as an append-only event log, and the store it is kept in.

Every fact about a session is an entry appended after it happened: the user's message, the model's answer
with its tool calls, each tool call starting and finishing, each approval decision, compactions, errors.
State is derived from the log, never kept beside it: a tool call with no result is pending; one that started
and has no result was interrupted. That is how a turn survives a suspension, a restart or a `kill -9`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from mm_core.errors import CoreError


class CallStatus(StrEnum):
    """How a tool call ended, as its result records it."""

    OK = "ok"
    REJECTED = "rejected"  # a person said no (or one-shot mode, which cannot ask)
    CANCELLED = "cancelled"  # the turn was stopped while it ran, or before it ran
    INTERRUPTED = "interrupted"  # the process running it died; it may have done part of its work
    ERROR = "error"  # bad arguments, an unknown tool, a tool that crashed, the loop detector's stop
    DROPPED = "dropped"  # beyond maxToolCallsPerAnswer: never run, never asked for, not a tool's response


class Outcome(StrEnum):
    """How a call to the turn loop ended (TurnFinished.outcome); all but `suspended` and `idle` end the turn
    and are recorded by TurnEnded."""

    ANSWERED = "answered"
    SUSPENDED = "suspended"  # gated calls wait for a person; resume() continues the same turn
    CANCELLED = "cancelled"
    FAILED = "failed"
    MAX_TURNS = "max_turns"
    # A budget the front end set was reached (Agent's `budget`): the turn ended before its next model call.
    BUDGET = "budget"
    IDLE = "idle"  # there was no turn to continue (a stale resume, a stop of an idle session)


@dataclass(frozen=True)
class UserMessage:
    text: str
    author: str | None = None
    kind: str = "user"
    # Images that go with the text to a model that takes them (`data:<mime>;base64,…` URLs): a person's shared
    # images, when the model's config says `vision` (workers.uploads).
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # the raw JSON text the model sent


@dataclass(frozen=True)
class AssistantMessage:
    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    agent: str | None = None
    kind: str = "assistant"


@dataclass(frozen=True)
class ToolStarted:
    call_id: str
    tool: str
    agent: str | None = None
    kind: str = "tool_started"


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    tool: str
    output: str
    status: CallStatus = CallStatus.OK
    duration_ms: int = 0
    agent: str | None = None
    # The approval policy's rule that decided how the call was treated (None: none matched), and who asked for
    # the turn it belongs to (comma-separated; None: nobody, a job's prompt): what the audit says of the call.
    rule: str | None = None
    requested_by: str | None = None
    kind: str = "tool_result"


@dataclass(frozen=True)
class ToolSuspended:
    """The call (ask_agent) is waiting for approvals inside it; it runs again, not anew, on resume."""

    call_id: str
    tool: str
    kind: str = "tool_suspended"


@dataclass(frozen=True)
class Nested:
    """An entry of an asked agent's own log, kept inside the caller's session (see ScopedStore)."""

    scope: str
    entry: dict[str, Any]
    kind: str = "nested"


def asked_answer(entry: Nested) -> tuple[int, int] | None:
    """The prompt and completion tokens of an asked agent's model answer that a Nested entry carries, at any depth
    (an asked agent's asked agent is one scope inside another); None when it carries another kind of entry."""
    data = entry.entry
    while data.get("kind") == "nested":
        data = data.get("entry") or {}
    if data.get("kind") != "assistant":
        return None
    return int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0)


@dataclass(frozen=True)
class Decision:
    """A person's answer to a gated call: what front ends pass to Agent.resume(), and the entry the turn acts
    on. The service decides who may give it and which click wins (the approvals table), then hands the
    winner over; the log keeps the first decision for each call and drops any later one."""

    call_id: str
    approved: bool
    by: str | None = None
    # "Approve all": every further call of the people who asked for this turn runs without asking, in this turn
    # and their later ones (SessionState.granted); a turn someone else asked for asks again.
    all: bool = False
    # What the person was shown of the call (shown_digest of its tool, arguments and preview, as PendingCall.shown
    # carried it): an approved call runs only while it would still show exactly that. None: the front end
    # vouches for it itself (a library caller deciding on the spot); the service always binds its decisions.
    shown: str | None = None
    kind: str = "approval"


def shown_digest(tool: str, arguments: dict[str, Any], preview: str, asked: list[Any] | None = None) -> str:
    """The fingerprint of a gated call as a person is shown it: its tool, the arguments it runs with (as parsed:
    what the tool gets) and its preview (the command, the diff it would make now). Two calls that would show or
    do anything different have different digests. `asked`: what an approval policy rule asked of it (the rule,
    how many people, whom), so that an approval given under one rule approves nothing once another decides the
    call (a config reloaded while it waited); a call no rule asked for digests as before rules existed."""
    fields: list[Any] = [tool, arguments, preview] + ([asked] if asked is not None else [])
    shown = json.dumps(fields, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(shown.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Compaction:
    summary: str
    # Entries before this index are summarised; the model sees the summary and then entries from here on.
    keep_from: int
    kind: str = "compaction"


@dataclass(frozen=True)
class ErrorRecord:
    message: str
    where: str = "generation"
    kind: str = "error"


@dataclass(frozen=True)
class TurnEnded:
    outcome: Outcome  # never suspended nor idle: those do not end a turn
    kind: str = "turn_ended"


@dataclass(frozen=True)
class YoloSet:
    """`yolo on|off` from a person allowed to: gated calls run without asking (on), whoever asked for them, or ask
    again (off), from the next call on. Off also ends every "Approve all" given before it."""

    on: bool
    by: str | None = None
    kind: str = "yolo"


@dataclass(frozen=True)
class Reset:
    """`new`: the conversation starts again from here; the loop detector forgets, and so does every "Approve all"
    given before it."""

    kind: str = "reset"


Entry = (
    UserMessage
    | AssistantMessage
    | ToolStarted
    | ToolResult
    | ToolSuspended
    | Nested
    | Decision
    | Compaction
    | ErrorRecord
    | TurnEnded
    | YoloSet
    | Reset
)

_KINDS: dict[str, type] = {
    "user": UserMessage,
    "assistant": AssistantMessage,
    "tool_started": ToolStarted,
    "tool_result": ToolResult,
    "tool_suspended": ToolSuspended,
    "nested": Nested,
    "approval": Decision,
    "compaction": Compaction,
    "error": ErrorRecord,
    "turn_ended": TurnEnded,
    "yolo": YoloSet,
    "reset": Reset,
}
_CALL_FIELDS = {f.name for f in fields(ToolCallRequest)}


def to_dict(entry: Entry) -> dict[str, Any]:
    data = asdict(entry)
    if isinstance(entry, UserMessage) and not entry.images:
        del data["images"]  # a message without images is stored as before them, readable by an older worker
    if isinstance(entry, ToolResult):
        # Likewise a result without them is stored as before them. A reader older than this version takes no field
        # it does not know: workers and bots of the release before it must not read sessions this one ran (see
        # docs/operations.md); from this version on, from_dict leaves such fields out.
        for key in ("rule", "requested_by"):
            if data[key] is None:
                del data[key]
    return data


def from_dict(data: dict[str, Any]) -> Entry:
    """An entry as stored. A field this version does not know (a later worker's, during a rolling upgrade or after
    a rollback) is left out, and an outcome it does not know reads as `failed`: the conversation stays readable,
    and a turn that ended stays ended."""
    cls = _KINDS[data["kind"]]
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    data = {key: value for key, value in data.items() if key in known}
    if unknown and cls is Decision:
        # A later version's decision may say something that narrows it: read without it, it approves nothing.
        data.update(approved=False, all=False)
    elif unknown and cls is YoloSet:
        data["on"] = False  # likewise a later version's switch lifts no asking
    if cls is AssistantMessage:
        calls = ({k: v for k, v in c.items() if k in _CALL_FIELDS} for c in data.get("tool_calls", ()))
        data["tool_calls"] = tuple(ToolCallRequest(**c) for c in calls)
    elif cls is ToolResult:
        data["status"] = _known(CallStatus, data.get("status", CallStatus.OK), CallStatus.ERROR)
    elif cls is TurnEnded:
        data["outcome"] = _known(Outcome, data["outcome"], Outcome.FAILED)
    elif cls is UserMessage:
        data["images"] = tuple(data.get("images", ()))
    return cls(**data)


def _known(enum: Any, value: Any, otherwise: Any) -> Any:
    try:
        return enum(value)
    except ValueError:
        return otherwise


class Fenced(CoreError):
    """The writer's lease was taken over: another worker owns the session now, and this one must stop."""


class Store(Protocol):
    """Where a session's log lives. The database implementation is chatops.store.DbStore."""

    async def load(self, session_id: str) -> list[Entry]: ...

    async def append(self, session_id: str, entry: Entry) -> None:
        """Append durably, or raise Fenced when the caller no longer holds the session."""


class MemoryStore:
    def __init__(self) -> None:
        self._logs: dict[str, list[Entry]] = {}
        self._lock = threading.Lock()

    async def load(self, session_id: str) -> list[Entry]:
        return self.entries(session_id)

    def entries(self, session_id: str) -> list[Entry]:
        """The log as it is now, without a coroutine: what `load` answers, for code that cannot await (an emit)."""
        with self._lock:
            return list(self._logs.get(session_id, []))

    async def append(self, session_id: str, entry: Entry) -> None:
        with self._lock:
            self._logs.setdefault(session_id, []).append(entry)


@dataclass
class FileStore:
    """One JSON line per entry, fsynced: the terminal front end's store, and the simplest durable one."""

    root: Path
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _path(self, session_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session_id)
        return Path(self.root) / f"{safe}.jsonl"

    async def load(self, session_id: str) -> list[Entry]:
        path = self._path(session_id)
        if not path.exists():
            return []
        entries = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                # A line torn by a crash mid-write is the only way a line can be bad; it was never acted on.
                continue
        return entries

    async def append(self, session_id: str, entry: Entry) -> None:
        path = self._path(session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(to_dict(entry), ensure_ascii=False) + "\n"
        with self._lock, open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


class ScopedStore:
    """The logs of the agents asked (ask_agent) inside one session, stored as Nested entries of it.

    An asked agent's session id is the id of the call that asked it (its scope), so it lives and dies with
    the caller's session, under the same lease, and a suspension inside it is persisted exactly like the
    caller's own. Agents asked by an asked agent nest the same way, one scope inside another.
    """

    def __init__(self, store: Store, session_id: str):
        self.store, self.session_id = store, session_id

    async def load(self, session_id: str) -> list[Entry]:
        return [
            from_dict(e.entry)
            for e in await self.store.load(self.session_id)
            if isinstance(e, Nested) and e.scope == session_id
        ]

    async def append(self, session_id: str, entry: Entry) -> None:
        await self.store.append(self.session_id, Nested(session_id, to_dict(entry)))
