"""`mm-bot probe live|ready`: the exec probes of a worker or scheduler pod (docs/operations.md).

Both read files the process keeps where MM_HEARTBEAT_FILE and MM_READY_FILE name them (workers/heartbeat.py):
no port, no broker traffic, a Python start each. live: the heartbeat is fresh. ready: the worker's consumer is
connected to the broker and its loop refreshes the ready file.
"""

from __future__ import annotations

from pathlib import Path

from workers.heartbeat import HEARTBEAT_ENV, READY_ENV, age, heartbeat_file, ready_file


def live(max_age: float) -> tuple[bool, str]:
    return _fresh(
        heartbeat_file(),
        max_age,
        unset=f"{HEARTBEAT_ENV} is not set: the process keeps no heartbeat to probe",
        missing="no heartbeat at {path}: the worker or scheduler has not started",
        stale="the last heartbeat is {seconds:.0f}s old (more than {max_age:g}s): the process is stuck",
        fine="alive: the last heartbeat is {seconds:.0f}s old",
    )


def ready(max_age: float) -> tuple[bool, str]:
    alive, said = live(max_age)
    if not alive:
        return False, said
    return _fresh(
        ready_file(),
        max_age,
        unset=f"{READY_ENV} is not set: the worker keeps no ready file to probe",
        missing="not taking turns: no {path} (the worker is starting, or lost the broker)",
        stale="not taking turns: {path} is {seconds:.0f}s old (the worker's loop is stuck)",
        fine="ready: connected to the broker, taking turns",
    )


def _fresh(path: Path | None, max_age: float, *, unset: str, missing: str, stale: str, fine: str) -> tuple[bool, str]:
    """Whether `path` was touched at most `max_age` ago, and the sentence that says so."""
    if path is None:
        return False, unset
    seconds = age(path)
    if seconds is None:
        return False, missing.format(path=path)
    if seconds > max_age:
        return False, stale.format(path=path, seconds=seconds, max_age=max_age)
    return True, fine.format(seconds=seconds)
