"""`mm-bot probe live|ready`: the exec probes of a worker or scheduler pod (docs/operations.md).

Both read files the process keeps where MM_HEARTBEAT_FILE and MM_READY_FILE name them (workers/heartbeat.py):
no port, no broker traffic, a Python start each. live: the heartbeat is fresh. ready: the worker's consumer is
connected to the broker and its loop refreshes the ready file.
"""

from __future__ import annotations

from workers.heartbeat import HEARTBEAT_ENV, READY_ENV, age, heartbeat_file, ready_file


def live(max_age: float) -> tuple[bool, str]:
    path = heartbeat_file()
    if path is None:
        return False, f"{HEARTBEAT_ENV} is not set: the process keeps no heartbeat to probe"
    seconds = age(path)
    if seconds is None:
        return False, f"no heartbeat at {path}: the worker or scheduler has not started"
    if seconds > max_age:
        return False, f"the last heartbeat is {seconds:.0f}s old (more than {max_age:g}s): the process is stuck"
    return True, f"alive: the last heartbeat is {seconds:.0f}s old"


def ready(max_age: float) -> tuple[bool, str]:
    alive, said = live(max_age)
    if not alive:
        return False, said
    path = ready_file()
    if path is None:
        return False, f"{READY_ENV} is not set: the worker keeps no ready file to probe"
    seconds = age(path)
    if seconds is None:
        return False, f"not taking turns: no {path} (the worker is starting, or lost the broker)"
    if seconds > max_age:
        return False, f"not taking turns: {path} is {seconds:.0f}s old (the worker's loop is stuck)"
    return True, "ready: connected to the broker, taking turns"
