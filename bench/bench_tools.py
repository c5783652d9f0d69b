"""Figures for the tools (not a test): edit_file's worst case, write_file's diff, the cost of the bash sandbox,
and what showing a call's text to an approver costs (escapes, look-alikes, blank runs) on large and hostile texts.

Run: .venv/bin/python bench/bench_tools.py [bash calls per mode, default 30]
"""

from __future__ import annotations

import asyncio
import difflib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from mm_core import display
from mm_core.config import AgentConfig, NetworkConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.bash import BashTool
from mm_core.tools.diff import diff, split_lines
from mm_core.tools.edit import EditFileTool
from mm_core.tools.files import WriteFileTool
from mm_core.tools.sandbox import SANDBOX_UID
from mm_core.tools.sandbox_network import internal_networks, network_tools

T = TypeVar("T")


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
    await ctx.resources.aclose()
    return (time.perf_counter() - started) / n


def bench_bash(ws: Path, n: int) -> None:
    tool = BashTool()
    if os.geteuid() == 0:  # a root worker runs commands as the workspace's owner, never as root
        ws.chmod(0o711)
        ws = ws / "bash-ws"
        ws.mkdir()
        os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    modes: list[tuple[str, AgentConfig]] = [("sandbox=none", AgentConfig(sandbox="none"))]
    if shutil.which("bwrap"):
        modes.append(("sandbox=bwrap, network off", AgentConfig(sandbox="bwrap", network=NetworkConfig(policy="off"))))
        if all(network_tools().values()):
            internal_networks()  # derived once per process: not a per-command cost
            modes.append(
                ("sandbox=bwrap, network open", AgentConfig(sandbox="bwrap", network=NetworkConfig(policy="open")))
            )
        modes.append(
            (
                "sandbox=bwrap, network allow (proxy)",
                AgentConfig(sandbox="bwrap", network=NetworkConfig(policy="allow")),
            )
        )
        credentials = NetworkConfig.model_validate(
            {"allow": ["github.com"], "credentials": [{"hosts": ["github.com"], "tokenEnv": "HOME"}]}
        )
        modes.append(("sandbox=bwrap, network allow + credentials", AgentConfig(sandbox="bwrap", network=credentials)))
    per_call = {
        label: asyncio.run(_calls(tool, ToolContext(workspace=ws, config=config), n)) for label, config in modes
    }
    for label, seconds in per_call.items():
        print(f"bash `true`, {label}: {seconds * 1000:.1f} ms per call ({n} calls)")
    labels = [label for label, _ in modes]
    if len(labels) > 1:
        base = per_call[labels[0]]
        print(
            f"  sandbox overhead: x{per_call[labels[1]] / base:.2f} "
            f"(+{(per_call[labels[1]] - base) * 1000:.1f} ms per call)"
        )
    if len(labels) > 4:
        off, on, proxied, credentialed = (per_call[label] for label in labels[1:5])
        print(
            f"  network setup, side by side: off {off * 1000:.1f} ms | open (slirp4netns + nft) {on * 1000:.1f} ms "
            f"(+{(on - off) * 1000:.1f} ms) | allow (the proxy's socket) {proxied * 1000:.1f} ms "
            f"(+{(proxied - off) * 1000:.1f} ms) | allow + credentials {credentialed * 1000:.1f} ms"
        )
        print(
            f"  allow over open: {(proxied - on) * 1000:+.1f} ms per call; with credentials "
            f"{(credentialed - on) * 1000:+.1f} ms (issue 26's bound: +20 ms)"
        )
    started = time.perf_counter()
    internal_networks.cache_clear()
    internal_networks()
    print(
        f"  the filter's ranges, derived from fetch_content's guard once per process: "
        f"{(time.perf_counter() - started) * 1000:.0f} ms"
    )


async def _with_stall(work: Awaitable[T]) -> tuple[T, float]:
    """The work's result, and the longest the event loop went without running a 1 ms ticker meanwhile: what
    every other turn on the same worker would have waited."""
    longest = 0.0
    done = False

    async def tick() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last - 0.001), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    try:
        return await work, longest
    finally:
        done = True
        await ticker


def bench_write_rewrite(ws: Path) -> None:
    """write_file rewriting a 2,000-line file whose every other line is blank: the diff shown before approval.

    difflib's own matcher (what the tools used before) is timed on a 600-line version beside it, because on
    2,000 lines it takes about a minute; the ratio is per line pair at the same size."""

    def text(n: int, salt: str) -> str:
        return "".join(f"{salt} {i}\n\n" for i in range(n))

    (ws / "big.txt").write_text(text(1000, "old"))
    ctx = ToolContext(workspace=ws, config=AgentConfig())
    started = time.perf_counter()
    args = {"path": "big.txt", "content": text(1000, "new")}
    preview, stall = asyncio.run(_with_stall(WriteFileTool().preview(args, ctx)))
    ours = time.perf_counter() - started
    print(
        f"write_file preview, 2,000-line rewrite between blank lines: {ours * 1000:.1f} ms "
        f"({len(preview.splitlines())} lines shown); longest event-loop stall meanwhile {stall * 1000:.1f} ms"
    )
    small_old, small_new = split_lines(text(300, "old")), split_lines(text(300, "new"))
    started = time.perf_counter()
    difflib.SequenceMatcher(None, small_old, small_new, autojunk=False).get_opcodes()
    plain = time.perf_counter() - started
    started = time.perf_counter()
    diff("".join(small_old), "".join(small_new))
    bounded = time.perf_counter() - started
    print(
        f"  600 lines: difflib's matcher {plain * 1000:.0f} ms, the bounded diff (rendered) {bounded * 1000:.1f} ms "
        f"(x{plain / bounded:.0f})"
    )


def bench_showing() -> None:
    """What a person is shown of a call's text, per megabyte: display.visible (escapes), lookalikes, padded and
    collapsed (blank runs), on a plain diff, a diff of accented and CJK text, and texts made to be slow."""
    texts = {
        "ASCII diff": "".join(f"+{i} │ x = compute({i})  # note\n" for i in range(30_000)),
        "accented and CJK diff": "".join(f"+{i} │ café = résumé({i})  # 中文注释\n" for i in range(30_000)),
        "look-alike words only": "r\u0430w " * 250_000,
        "a.a.a.a… (a scheme's search)": "é" + "a." * 500_000,
        "blank runs": ("x" + " " * 100 + "\n" * 20) * 8_000,
    }
    for name, text in texts.items():
        started = time.perf_counter()
        display.visible(text)
        display.lookalikes(text)
        display.padded(text)
        display.collapsed(text)
        took = time.perf_counter() - started
        print(f"showing {name}: {took * 1000 / (len(text) / 1e6):.0f} ms a million characters ({len(text):,})")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    bench_showing()
    with tempfile.TemporaryDirectory() as tmp:
        bench_edit_no_match(Path(tmp))
        bench_write_rewrite(Path(tmp))
        bench_bash(Path(tmp), n)


if __name__ == "__main__":
    main()
