"""Shared by the tool tests: a context on a real workspace, and calling a tool the way the loop does."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from mm_core.config import AgentConfig
from mm_core.tools.base import Tool, ToolContext

# Every context a test made: its session's resources (disk guards, background jobs, language servers) are
# closed after the test, as a worker closes a session's. Left open, each disk guard kept an inotify instance,
# and a few hundred tests used up the uid's 128 for every later test.
_made: list[ToolContext] = []


def make_ctx(workspace: Path, **config: Any) -> ToolContext:
    ctx = ToolContext(workspace=workspace, config=AgentConfig(**config))
    _made.append(ctx)
    return ctx


def close_made() -> None:
    """Close the resources of the contexts made since the last call (on a loop of its own, in a thread: the
    test's loop, if it had one, may still be running)."""
    made = _made[:]
    _made.clear()
    if made:
        closing = threading.Thread(target=asyncio.run, args=(_close(made),))
        closing.start()
        closing.join()


async def _close(made: list[ToolContext]) -> None:
    for ctx in made:
        await ctx.resources.aclose()


def call(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> str:
    return asyncio.run(tool.run(args, ctx))


def preview(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> str:
    return asyncio.run(tool.preview(args, ctx))


# Named explicitly: a test module may import it under another name (`spaces as spaces_fixture`), so that its
# `spaces` parameters do not shadow an import; pytest registers it as "spaces" either way.
@pytest.fixture(name="spaces")
def spaces(tmp_path: Path) -> tuple[Path, Path]:
    """Two workspaces side by side, as a worker keeps them: ours (with mine.txt) and a sibling team's secret."""
    ws, sibling = tmp_path / "workspaces" / "team-a", tmp_path / "workspaces" / "team-b"
    ws.mkdir(parents=True)
    sibling.mkdir()
    (sibling / "secret.txt").write_text("team b's secret\n")
    (ws / "mine.txt").write_text("mine\n")
    return ws, sibling


def on_disk(root: Path) -> int:
    """What the entries under `root` (not root itself) take: each at its blocks, or a regular file at its
    apparent size when that is larger (as the disk guard counts them)."""
    total = 0
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            total += max(st.st_blocks * 512, st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return total
