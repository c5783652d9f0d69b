"""Liveness for an orchestrator: the worker and the scheduler touch a file while their loops run, and
`mm-bot probe live` (an exec probe: no port, no broker) says how old it is.

The worker's beat comes from Celery's own timer (a bootstep), the scheduler's from its tick: a process that no
longer beats is hung and is restarted. Whether a worker takes tasks is readiness (`mm-bot probe ready`: a ping
over the broker), which a broker outage fails without restarting anything.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import bootsteps

HEARTBEAT_ENV = "MM_HEARTBEAT_FILE"
DEFAULT_FILE = "/tmp/mm-heartbeat"
EVERY_S = 10.0


def heartbeat_file() -> Path:
    return Path(os.environ.get(HEARTBEAT_ENV) or DEFAULT_FILE)


def beat() -> None:
    path = heartbeat_file()
    try:
        path.touch()
        os.utime(path)
    except OSError:
        pass  # a read-only or missing directory: the probe then says the file is missing, which is the truth


def age(now: float | None = None) -> float | None:
    """Seconds since the last beat; None when there was none (or the file cannot be read)."""
    try:
        return (time.time() if now is None else now) - heartbeat_file().stat().st_mtime
    except OSError:
        return None


class Heartbeat(bootsteps.StartStopStep):
    """Beats from the worker's timer while the worker runs."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.tref: Any = None

    def start(self, parent: Any) -> None:
        beat()
        self.tref = parent.timer.call_repeatedly(EVERY_S, beat)

    def stop(self, parent: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
