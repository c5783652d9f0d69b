"""Figures for the tools (not a test): edit_file's worst case, and the cost of the bash sandbox.

Run: .venv/bin/python bench/bench_tools.py [bash calls per mode, default 30]
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

from mm_core.config import AgentConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.bash import BashTool
from mm_core.tools.edit import EditFileTool


def bench_edit_no_match(ws: Path) -> None:
    # ~1 MB of Go-like code where `}` and blank lines occur everywhere: the closest-region search's worst case.
    block = "func f{i}() {{\n\tcount := {i}\n\tprint(count)\n}}\n\n"
    text = "".join(block.format(i=i) for i in range(24000))
    (ws / "big.go").write_text(text)
    old = "func g() {\n    count := -1\n    print(count)\n}\n\n}\n}\n"
    ctx = ToolContext(workspace=ws, config=AgentConfig())
    started = time.perf_counter()
    out = asyncio.run(EditFileTool().run({"path": "big.go", "edits": [{"old": old, "new": "x"}]}, ctx))
    took = time.perf_counter() - started
    print(f"edit_file, no match in {len(text) / 1e6:.2f} MB ({text.count(chr(10))} lines): {took * 1000:.0f} ms")
    print("  " + out.splitlines()[-1])


async def _calls(tool: BashTool, ctx: ToolContext, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await tool.run({"command": "true"}, ctx)
    return (time.perf_counter() - started) / n


def bench_bash(ws: Path, n: int) -> None:
    tool = BashTool()
    modes: list[Literal["none", "bwrap"]] = ["none", "bwrap"] if shutil.which("bwrap") else ["none"]
    per_call = {
        m: asyncio.run(_calls(tool, ToolContext(workspace=ws, config=AgentConfig(sandbox=m)), n)) for m in modes
    }
    for mode, seconds in per_call.items():
        print(f"bash `true`, sandbox={mode}: {seconds * 1000:.1f} ms per call ({n} calls)")
    if "bwrap" in per_call:
        print(f"  sandbox overhead: x{per_call['bwrap'] / per_call['none']:.2f} "
              f"(+{(per_call['bwrap'] - per_call['none']) * 1000:.1f} ms per call)")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    with tempfile.TemporaryDirectory() as tmp:
        bench_edit_no_match(Path(tmp))
        bench_bash(Path(tmp), n)


if __name__ == "__main__":
    main()
