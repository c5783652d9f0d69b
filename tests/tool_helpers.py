"""Shared by the tool tests: a context on a real workspace, and calling a tool the way the loop does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mm_core.config import AgentConfig
from mm_core.tools.base import Tool, ToolContext


def make_ctx(workspace: Path, **config: Any) -> ToolContext:
    return ToolContext(workspace=workspace, config=AgentConfig(**config))


def call(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> str:
    return asyncio.run(tool.run(args, ctx))


def preview(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> str:
    return asyncio.run(tool.preview(args, ctx))
