"""Helpers shared by the turn-loop tests, importable from a child process (see agent_child.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mm_core.agent import Agent
from mm_core.config import AgentConfig
from mm_core.log import AssistantMessage, Entry, Store


def agent_config(model_url: str, **overrides: Any) -> AgentConfig:
    data: dict[str, Any] = {
        "model": {"url": model_url, "name": "test-model"},
        # The sandbox when it is installed (a root test run needs it: see needs_bwrap_when_root), without the
        # network, whose set-up the loop's tests do not need.
        "bash": {"network": False},
        "watchdogTimeout": "20s",
    }
    data.update(overrides)
    return AgentConfig.model_validate(data)


def make_agent(config: AgentConfig, store: Store, workspace: Path, session: str = "s1", **kw: Any) -> Agent:
    events: list = kw.pop("events", [])
    return Agent(config, store, session, workspace, emit=events.append, **kw)


def call_ids(log: list[Entry]) -> list[str]:
    """The ids the loop gave the model's tool calls, in order (it replaces the model's own: they repeat)."""
    return [c.id for e in log if isinstance(e, AssistantMessage) for c in e.tool_calls]
