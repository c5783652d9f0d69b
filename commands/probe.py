"""`mm-bot probe live|ready`: the exec probes of a worker or scheduler pod (docs/operations.md).

Both read files the process keeps (workers/heartbeat.py): no port, no broker traffic, a Python start each.
live: the process's heartbeat is fresh. ready: the worker's consumer is connected and takes turns.
"""

from __future__ import annotations

from workers.heartbeat import age, heartbeat_file, ready_file


def live(max_age: float) -> tuple[bool, str]:
    seconds = age()
    if seconds is None:
        return False, f"no heartbeat at {heartbeat_file()}: the worker or scheduler has not started"
    if seconds > max_age:
        return False, f"the last heartbeat is {seconds:.0f}s old (more than {max_age:g}s): the process is stuck"
    return True, f"alive: the last heartbeat is {seconds:.0f}s old"


def ready(max_age: float) -> tuple[bool, str]:
    alive, said = live(max_age)
    if not alive:
        return False, said
    if not ready_file().exists():
        return False, f"not taking turns: no {ready_file()} (the worker is starting, or lost the broker)"
    return True, "ready: connected to the broker, taking turns"
