"""`mm-bot probe live|ready`: the exec probes of a worker or scheduler pod (docs/operations.md).

live: the process's loop still beats (workers/heartbeat.py): cheap, no network. ready: this host's Celery worker
answers a ping over the broker: it can take turns.
"""

from __future__ import annotations

import socket

from workers.heartbeat import age, heartbeat_file

PING_TIMEOUT_S = 5.0


def live(max_age: float) -> tuple[bool, str]:
    seconds = age()
    if seconds is None:
        return False, f"no heartbeat at {heartbeat_file()}: the worker or scheduler has not started its loop"
    if seconds > max_age:
        return False, f"the last heartbeat is {seconds:.0f}s old (more than {max_age:g}s): the loop is stuck"
    return True, f"alive: the last heartbeat is {seconds:.0f}s old"


def ready(node: str | None = None) -> tuple[bool, str]:
    from workers.celery_app import app

    node = node or f"celery@{socket.gethostname()}"
    try:
        replies = app.control.ping(destination=[node], timeout=PING_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - the broker's own words: a broker that is down is not ready
        return False, f"the broker could not be asked: {e}"
    if not any(node in reply for reply in replies):
        return False, f"{node} did not answer a ping within {PING_TIMEOUT_S:g}s"
    return True, f"{node} answers"
