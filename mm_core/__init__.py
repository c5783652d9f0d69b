"""mm_core: the agent core, a plain library (no Slack, no Celery, no database).

Front ends use what is listed here: an `Agent` on a session's log (`Store`), an async context manager, driven by
`send`, `start` (a turn whose message the front end appended), `resume` (with a person's `Decision`s), `stop`,
`new` and `compact`, optionally bounded by a `Budget` asked before each model call; the typed events it emits
while it works; and
`mm_core.display` for what to show of them. Everything else is the core's own business.
"""

from mm_core.agent import Agent, Budget, TurnInProgress
from mm_core.config import AgentConfig
from mm_core.errors import CoreError
from mm_core.events import (
    CallsDropped,
    Counters,
    Emit,
    Error,
    Event,
    ModelCalled,
    NetworkUsed,
    PendingCall,
    PermissionRequested,
    Status,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    Usage,
)
from mm_core.log import CallStatus, Decision, Fenced, FileStore, MemoryStore, Outcome, Store
from mm_core.model import ModelError, ModelHttp

__all__ = [
    "Agent",
    "AgentConfig",
    "Budget",
    "CallStatus",
    "CallsDropped",
    "CoreError",
    "Counters",
    "Decision",
    "Emit",
    "Error",
    "Event",
    "Fenced",
    "FileStore",
    "MemoryStore",
    "ModelCalled",
    "ModelError",
    "ModelHttp",
    "NetworkUsed",
    "Outcome",
    "PendingCall",
    "PermissionRequested",
    "Status",
    "Store",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "TurnFinished",
    "TurnInProgress",
    "Usage",
]
