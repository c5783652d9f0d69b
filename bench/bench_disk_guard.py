"""The disk guard (mm_core/tools/disk_guard.py): how far past `workspaceMB` a command gets, what the guard costs
the worker per event, and what it adds to an ordinary command.

1. Overshoot: commands writing as fast as they can into a workspace of `workspaceMB: 100`, `fileSizeMB: 50`
   (the attack tests' scenarios), each run `RUNS` times through the bash tool as the loop runs it; the most the
   workspace held when the command returned (the attack tests assert at most 150 MB).
2. The guard's CPU per event: a child process makes files and writes into them (about four events a file:
   create, modify, close... only create and modify are watched); the worker's CPU time (the guard's thread:
   the main thread only waits) over the events the guard read.
3. An ordinary command (`true`): with and without `workspaceMB`, the guard started; and the guard's start (its
   walk) on a tree of a checkout's size.

    .venv/bin/python bench/bench_disk_guard.py [runs]

Run as root it uses a workspace owned by uid 10001 (as the tests do); sandbox: none, so the figures are the
guard's and not bubblewrap's start-up.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.bash import BashTool
from mm_core.tools.disk_guard import DiskGuard

MIB = 1024 * 1024
WRITERS = {
    "dd, 40 files of 10 MB": "for i in $(seq 1 40); do dd if=/dev/zero of=f$i bs=1M count=10 status=none || exit; done",
    "4 parallel writers": "for w in 1 2 3 4; do (for i in $(seq 1 10); do head -c 10000000 /dev/zero > w$w-$i"
    " || exit; done) & done; wait",
    "fallocate, 20 of 50 MB": "for i in $(seq 1 20); do fallocate -l 50M a$i || exit; done",
    "4 yes > file at once": "for i in 1 2 3 4; do yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa > g$i & done; wait",
    "background job, 10 MB files": "nohup sh -c 'for i in $(seq 1 100); do head -c 10000000 /dev/zero > j$i;"
    " done' >/dev/null 2>&1 & sleep 3",
}


def workspace() -> Path:
    top = Path(tempfile.mkdtemp(prefix="mm-bench-guard-", dir="/var/tmp"))
    os.chmod(top, 0o711)
    ws = top / "ws"
    ws.mkdir()
    if os.geteuid() == 0:
        os.chown(ws, 10001, 10001)
    return ws


def held(root: Path) -> int:
    out = subprocess.run(["du", "-sb", "--apparent-size", str(root)], capture_output=True, text=True).stdout
    return int(out.split()[0])


def overshoot(runs: int) -> None:
    print(f"1. overshoot: workspaceMB 100, fileSizeMB 50, {runs} runs each")
    print(f"   {'writer':32} {'held (MB): max':>15} {'median':>8}")
    bash = BashTool()
    for name, command in WRITERS.items():
        figures = []
        for _ in range(runs):
            ws = workspace()
            limits = {"workspaceMB": 100, "fileSizeMB": 50}
            ctx = ToolContext(
                ws, AgentConfig.model_validate({"sandbox": "none", "bash": {"limits": limits, "timeout": 60}})
            )

            async def run(ws: Path = ws, ctx: ToolContext = ctx, command: str = command) -> int:
                await bash.run({"command": command}, ctx)
                size = held(ws)
                await ctx.resources.aclose()
                return max(size, held(ws))

            figures.append(asyncio.run(run()) / MIB)
            shutil.rmtree(ws.parent)
        print(f"   {name:32} {max(figures):15.1f} {statistics.median(figures):8.1f}")


def cpu_per_event(files: int) -> None:
    ws = workspace()
    guard = DiskGuard(str(ws), 1 << 40, lambda: None)
    guard.start()
    script = "\n".join(
        [
            "import os",
            f"for i in range({files}):",
            "    os.makedirs(f'd{i % 50}', exist_ok=True)",
            "    with open(f'd{i % 50}/f{i}', 'wb') as f:",
            "        f.write(b'x' * 4096)",
            "        f.write(b'y' * 4096)",
        ]
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script], cwd=ws, check=True)
    while guard.total < files * 8192:  # until the guard has read every event
        time.sleep(0.01)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # Watched events a file: CREATE, then MODIFY for each write (the kernel merges a MODIFY into the one
    # before it when the guard has not read it yet, so this is the most there were).
    events = files * 3
    print(f"2. guard CPU: {files:,} files in 50 directories, at most {events:,} events, in {wall:.2f} s")
    print(
        f"   {cpu:.3f} s of the worker's CPU: {cpu / events * 1e6:.1f} µs an event at least, "
        f"{cpu / files * 1e6:.1f} µs a file"
    )
    guard.close()
    shutil.rmtree(ws.parent)


def ordinary_command(runs: int) -> None:
    bash = BashTool()
    figures = {}
    for label, limits in (("without workspaceMB", {"workspaceMB": None}), ("with workspaceMB", {})):
        ws = workspace()
        ctx = ToolContext(ws, AgentConfig.model_validate({"sandbox": "none", "bash": {"limits": limits}}))

        async def run(ctx: ToolContext = ctx) -> list[float]:
            await bash.run({"command": "true"}, ctx)  # the guard starts here
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                await bash.run({"command": "true"}, ctx)
                times.append(time.perf_counter() - t)
            await ctx.resources.aclose()
            return times

        figures[label] = statistics.median(asyncio.run(run())) * 1000
        shutil.rmtree(ws.parent)
    print(f"3. `true`, median of {runs}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in figures.items()))
    print("   (with workspaceMB the walk after each command runs too, as before the guard)")
    ws = workspace()
    for d in range(2000):
        (ws / f"pkg{d % 200}" / f"mod{d}").mkdir(parents=True, exist_ok=True)
        for f in range(10):
            (ws / f"pkg{d % 200}" / f"mod{d}" / f"file{f}.py").write_bytes(b"x" * 2000)
    stops = threading.Event()
    guard = DiskGuard(str(ws), 1 << 40, stops.set)
    t = time.perf_counter()
    guard.start()
    start = time.perf_counter() - t
    print(f"   the guard's start on 2,200 directories and 20,000 files: {start * 1000:.0f} ms")
    guard.close()
    shutil.rmtree(ws.parent)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    overshoot(runs)
    cpu_per_event(20_000)
    ordinary_command(20)


if __name__ == "__main__":
    main()
