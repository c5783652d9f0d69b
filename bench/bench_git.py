"""Figures for the worker's git on a workspace (not a test): what running it with the model's power costs.

A checkout of 5,000 files in 50 directories, prepared as a thread's workspace is; medians of N runs of
`changed_files` (three files changed: what a turn's end and a summary run) and of `push_workspace` (one more
file changed each time, pushed to a new branch of a local bare repository), in each sandbox mode; and
`measure_workspace` (the walk after a command) on a tree of 20,000 files. Beside each wall time, the CPU time
of this process and the children it waited for: what runs inside bubblewrap's pid namespace is not all counted,
so compare CPU between the worker and `sandbox: none` only.

Run: .venv/bin/python bench/bench_git.py [runs, default 15]  (as root, as CI runs: a root worker's workspace
belongs to uid 10001)
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.tools.sandbox import measure_workspace
from workers.push import changed_files, push_workspace
from workers.workspaces import hand_over, prepare, start_commit


def git(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@x", *args], cwd=cwd, check=True, capture_output=True
    )


def median_ms(runs: int, step: Callable[[int], object]) -> tuple[float, float]:
    """The median wall time of `step` and its median CPU time (this process's and its children's, user and
    system: what a shared machine's load does not inflate), in milliseconds."""
    took, cpu = [], []
    for i in range(runs):
        started, used = time.perf_counter(), _cpu()
        step(i)
        took.append(time.perf_counter() - started)
        cpu.append(_cpu() - used)
    return statistics.median(took) * 1000, statistics.median(cpu) * 1000


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_mode(top: Path, target: Path, sandbox: str, runs: int) -> None:
    agent = AgentConfig.model_validate({"sandbox": sandbox})
    root, session = top / f"workspaces-{sandbox}", "b" * 32
    ws = prepare(root, session, str(target), "main").path
    start = start_commit(root, session)
    for i in range(3):
        (ws / f"d{i}" / "f0.txt").write_text("changed\n")
    hand_over(ws)  # what the model changed is its own
    changed, changed_cpu = median_ms(runs, lambda _: changed_files(ws, agent, start))

    def push(i: int) -> None:
        (ws / "d9" / "f1.txt").write_text(f"run {i}\n")
        hand_over(ws)
        push_workspace(ws, agent, str(target), f"mm/{sandbox}-{i}", "m", None, start=start)

    pushed, pushed_cpu = median_ms(runs, push)
    print(
        f"sandbox {sandbox}: changed_files {changed:.0f} ms ({changed_cpu:.0f} ms CPU), "
        f"push {pushed:.0f} ms ({pushed_cpu:.0f} ms CPU), medians of {runs}"
    )


def main(runs: int) -> None:
    top = Path(tempfile.mkdtemp(prefix="mm-bench-git-"))
    top.chmod(0o711)  # the sandbox's user reaches its workspace through it
    try:
        seed = top / "seed"
        seed.mkdir()
        git("init", "-q", "-b", "main", cwd=seed)
        for d in range(50):
            (seed / f"d{d}").mkdir()
            for f in range(100):
                (seed / f"d{d}" / f"f{f}.txt").write_text(f"{d} {f}\n" * 20)
        git("add", ".", cwd=seed)
        git("commit", "-qm", "start", cwd=seed)
        target = top / "target.git"
        git("clone", "-q", "--bare", str(seed), str(target))
        for sandbox in ("none", "auto"):
            bench_mode(top, target, sandbox, runs)
        tree = top / "tree"
        for d in range(200):
            (tree / f"d{d}").mkdir(parents=True)
            for f in range(100):
                (tree / f"d{d}" / f"f{f}").write_bytes(b"x" * 100)
        walked, walked_cpu = median_ms(runs, lambda _: measure_workspace(str(tree)))
        print(f"measure_workspace, 20,000 files: {walked:.0f} ms ({walked_cpu:.0f} ms CPU), medians of {runs}")
    finally:
        shutil.rmtree(top)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run as root: a root worker's workspace belongs to the sandbox's user")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
