"""One thread per worker process that keeps its sessions' leases alive and delivers stop requests.

Every turn a process runs holds its session's lease under the process's owner name. Rather than each turn
renewing its own lease and polling its own stop flag (two queries per turn per tick: 400 a second for 200
turns), this keeper renews all of them in one UPDATE every third of the lease, and asks in one indexed SELECT
twice a second which of them someone asked to stop. A stop cancels the turn's asyncio task on its own loop;
the turn loop's cancellation then kills a running bash command or model call and closes the log cleanly.
A session whose renewal did not come back was taken over (this process was too slow, or paused): its turn is
cancelled too, and the store's fencing already refuses its writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import Engine

from chatops.inbox import renew_held, stops_for

log = logging.getLogger("mm.worker")
STOP_POLL_SECONDS = 0.5


class Cancelled(StrEnum):
    """Why the keeper cancelled a turn; the turn reads it to say the right thing."""

    STOP = "stop"  # a person asked
    LOST = "lost"  # the lease went to another worker


@dataclass
class _Held:
    loop: asyncio.AbstractEventLoop
    task: asyncio.Task[object]
    reason: Cancelled | None = None
    # Only while the turn itself runs: a cancellation elsewhere (a clone, a notice) would cut the work around
    # the turn short; the stop flag stays set, and the turn's start or the next poll acts on it.
    cancellable: bool = False


@dataclass
class LeaseKeeper:
    engine: Engine
    ttl: float
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    _held: dict[str, _Held] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def hold(self, session_id: str, task: asyncio.Task[object]) -> None:
        with self._lock:
            self._held[session_id] = _Held(task.get_loop(), task)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mm-lease-keeper", daemon=True)
                self._thread.start()

    def drop(self, session_id: str) -> Cancelled | None:
        """Stop keeping the session; why its turn was cancelled, if it was."""
        with self._lock:
            held = self._held.pop(session_id, None)
        return held.reason if held else None

    def cancellable(self, session_id: str, yes: bool) -> None:
        with self._lock:
            if (held := self._held.get(session_id)) is not None:
                held.cancellable = yes
                if not yes:
                    held.reason = None  # handled: a later stop of the same task must act again

    def reason(self, session_id: str) -> Cancelled | None:
        with self._lock:
            held = self._held.get(session_id)
            return held.reason if held else None

    def _cancel(self, session_id: str, reason: Cancelled) -> None:
        with self._lock:
            held = self._held.get(session_id)
            if held is None or held.reason is not None or not held.cancellable:
                return
            held.reason = reason
        held.loop.call_soon_threadsafe(held.task.cancel)

    def _run(self) -> None:
        next_renewal = time.monotonic() + self.ttl / 3
        while True:
            time.sleep(STOP_POLL_SECONDS)
            with self._lock:
                held = set(self._held)
            if not held:
                continue
            try:
                for session_id in set(stops_for(self.engine, self.owner)) & held:
                    self._cancel(session_id, Cancelled.STOP)
                if time.monotonic() >= next_renewal:
                    next_renewal = time.monotonic() + self.ttl / 3
                    kept = renew_held(self.engine, self.owner, self.ttl, held=held)
                    with self._lock:  # only sessions held since before the renewal can have been lost
                        lost = (held & set(self._held)) - kept
                    for session_id in lost:
                        log.warning("session %s: lease lost to another worker; stopping its turn here", session_id)
                        self._cancel(session_id, Cancelled.LOST)
            except Exception:
                log.exception("lease keeper: the database did not answer")
