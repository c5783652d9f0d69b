"""Liveness and readiness for an orchestrator, as files an exec probe reads (no port, no broker traffic). Only
where the environment names them (the chart does; each pod has its own /tmp), so that processes sharing a
machine's /tmp never speak for each other:

- **ready** (`MM_READY_FILE`): refreshed by the worker's consumer from its own event loop while it is connected
  to the broker. Celery stops the consumer's steps when the connection is lost (the file goes) and starts them
  again once it is back. A worker that is not ready takes no turns, and is not restarted for it.
- **alive** (`MM_HEARTBEAT_FILE`): touched by a thread of the worker while the consumer is either connected and
  fresh, or reconnecting (no ready file): a broker outage must not restart workers whose running turns do not
  need it, but an event loop that hangs (a stale ready file) stops the beat, and the worker is restarted. The
  scheduler beats from its tick.

`mm-bot probe live|ready` (commands/probe.py) reads them. A container restarted in the same pod starts by
removing what its predecessor left.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import bootsteps

HEARTBEAT_ENV = "MM_HEARTBEAT_FILE"
READY_ENV = "MM_READY_FILE"
EVERY_S = 10.0
STALE_S = 6 * EVERY_S  # a ready file this old: the consumer's loop is stuck


def heartbeat_file() -> Path | None:
    name = os.environ.get(HEARTBEAT_ENV)
    return Path(name) if name else None


def ready_file() -> Path | None:
    name = os.environ.get(READY_ENV)
    return Path(name) if name else None


def beat() -> None:
    _touch(heartbeat_file())


def age(path: Path | None, now: float | None = None) -> float | None:
    """Seconds since `path` was touched; None when it is not there (or cannot be read)."""
    try:
        return (time.time() if now is None else now) - path.stat().st_mtime if path is not None else None
    except OSError:
        return None


def _touch(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.touch()
        os.utime(path)
    except OSError:
        pass  # a read-only or missing directory: the probe then says the file is missing, which is the truth


def _remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


class Heartbeat(bootsteps.StartStopStep):
    """The worker's beat, from a thread of its own, while the consumer is fresh or reconnecting."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.stopping = threading.Event()

    def start(self, parent: Any) -> None:
        _remove(ready_file())  # a previous container's, in the same pod's /tmp: not this one's word

        def run() -> None:
            while not self.stopping.is_set():
                ready = age(ready_file())
                if ready is None or ready <= STALE_S:
                    beat()
                self.stopping.wait(EVERY_S)

        beat()
        threading.Thread(target=run, name="mm-heartbeat", daemon=True).start()

    def stop(self, parent: Any) -> None:
        self.stopping.set()


class Ready(bootsteps.StartStopStep):
    """The ready file, refreshed by the consumer's timer while it is connected and consuming."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.tref: Any = None

    def start(self, parent: Any) -> None:
        _touch(ready_file())
        self.tref = parent.timer.call_repeatedly(EVERY_S, lambda: _touch(ready_file()))

    def stop(self, parent: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        _remove(ready_file())

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)
