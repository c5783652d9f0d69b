"""A test's own processes, found by descent from one it started, and followed by pid.

A test that asks "is the command's `sleep` gone?" must not answer it from every process on the machine: another
test (an xdist worker, a mutation run's copy of the tree) may run the same command at the same moment. So a
test finds the process among the descendants of a process it started itself (or of its own), keeps its pid and
start time, and later asks about that process alone. Descent is read from each process's parent pid
(`/proc/<pid>/stat`), since this kernel has no `/proc/<pid>/task/<tid>/children`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True)
class Process:
    pid: int
    # Clock ticks after boot at which it started: tells it from a later process given the same pid.
    started: int
    argv: tuple[str, ...]

    def alive(self) -> bool:
        """Still running: not gone, not a zombie, and not another process that reused the pid."""
        found = _stat(self.pid)
        return found is not None and found[0] != "Z" and found[2] == self.started


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None when it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces, parentheses and bytes that are no UTF-8 (a name
    # cut at 15 bytes): the fields after its last ")" are numbered from 3.
    fields = raw.rsplit(b")", 1)[1].split()
    try:
        return fields[0].decode("ascii"), int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _argv(pid: int) -> tuple[str, ...]:
    with contextlib.suppress(OSError):
        return tuple(a.decode(errors="replace") for a in (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[:-1])
    return ()


def descendants(root: int) -> list[Process]:
    """The live processes below `root` (children, their children, ...), as they are now."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None and found[0] != "Z":
            parents[int(entry.name)] = found[1]
    below: set[int] = {root}
    grew = True
    while grew:  # a pass per generation; the tree is a few levels deep
        grew = False
        for pid, parent in parents.items():
            if parent in below and pid not in below:
                below.add(pid)
                grew = True
    below.discard(root)
    found = []
    for pid in sorted(below):
        if (stat := _stat(pid)) is not None:
            found.append(Process(pid, stat[2], _argv(pid)))
    return found


def running(root: int, *argv: str) -> list[Process]:
    """The descendants of `root` whose command line is exactly `argv`."""
    return [p for p in descendants(root) if p.argv == argv]
