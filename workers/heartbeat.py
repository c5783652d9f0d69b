"""Liveness and readiness for an orchestrator, as files an exec probe reads (no port, no broker traffic):

- **alive** (`MM_HEARTBEAT_FILE`, default /tmp/mm-heartbeat): touched every few seconds by a thread of the
  worker (and by the scheduler's tick) while the process runs. A process that no longer beats is hung and is
  restarted. It does not depend on the broker: a broker outage must not restart workers whose running turns
  do not need it.
- **ready** (`MM_READY_FILE`, default /tmp/mm-ready): present while the worker's consumer is connected to the
  broker and takes tasks; Celery stops the consumer's steps when the connection is lost (removing it) and
  starts them again once it is back. A worker that is not ready takes no turns, and is not restarted for it.

`mm-bot probe live|ready` (commands/probe.py) reads them.
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


def heartbeat_file() -> Path:
    return Path(os.environ.get(HEARTBEAT_ENV) or "/tmp/mm-heartbeat")


def ready_file() -> Path:
    return Path(os.environ.get(READY_ENV) or "/tmp/mm-ready")


def beat() -> None:
    _touch(heartbeat_file())


def age(now: float | None = None) -> float | None:
    """Seconds since the last beat; None when there was none (or the file cannot be read)."""
    try:
        return (time.time() if now is None else now) - heartbeat_file().stat().st_mtime
    except OSError:
        return None


def _touch(path: Path) -> None:
    try:
        path.touch()
        os.utime(path)
    except OSError:
        pass  # a read-only or missing directory: the probe then says the file is missing, which is the truth


class Heartbeat(bootsteps.StartStopStep):
    """The worker's beat, from a thread of its own while the worker runs (Celery's timer stops with the
    broker's connection on some transports)."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.stopping = threading.Event()

    def start(self, parent: Any) -> None:
        def run() -> None:
            while not self.stopping.is_set():
                beat()
                self.stopping.wait(EVERY_S)

        threading.Thread(target=run, name="mm-heartbeat", daemon=True).start()

    def stop(self, parent: Any) -> None:
        self.stopping.set()


class Ready(bootsteps.StartStopStep):
    """The ready file, while the consumer is connected and consuming."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        _touch(ready_file())

    def stop(self, parent: Any) -> None:
        with contextlib.suppress(OSError):
            ready_file().unlink()

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)
