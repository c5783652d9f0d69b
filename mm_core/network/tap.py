"""What one command's connections through the egress proxy did: the hosts reached, refused, or that failed.

The proxy's thread records; the command's side reads a snapshot once the command is done (the bash tool says
which hosts were refused and why; the front end shows where the command went).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TapRecord:
    """A snapshot: `reached`, host -> the tunnels opened and requests answered; `refused`, host -> the first
    refusal's text (the policy's or the SSRF guard's); `failed`, host -> the first failure's text (not resolved,
    not reached, a TLS handshake the command broke off)."""

    reached: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)
    # Refusals and failures for hosts past MAX_HOSTS, counted and not kept (hosts reached past it go uncounted).
    unkept: int = 0


# The most hosts a tap keeps of each kind: a command trying endless names must not grow the worker's memory, nor
# the text the model reads.
MAX_HOSTS = 100


class Tap:
    """The record of one listener of the proxy (thread-safe), and its switch: `close()` stops serving it."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self._lock = threading.Lock()
        self._reached: Counter[str] = Counter()
        self._refused: dict[str, str] = {}
        self._failed: dict[str, str] = {}
        self._unkept = 0
        self._closed = threading.Event()

    def reach(self, host: str) -> None:
        with self._lock:
            if host in self._reached or len(self._reached) < MAX_HOSTS:
                self._reached[host] += 1

    def refuse(self, host: str, text: str) -> None:
        with self._lock:
            self._keep(self._refused, host, text)

    def fail(self, host: str, text: str) -> None:
        with self._lock:
            self._keep(self._failed, host, text)

    def _keep(self, kept: dict[str, str], host: str, text: str) -> None:
        if host not in kept:
            if len(kept) < MAX_HOSTS:
                kept[host] = text
            else:
                self._unkept += 1

    def snapshot(self) -> TapRecord:
        with self._lock:
            return TapRecord(dict(self._reached), dict(self._refused), dict(self._failed), self._unkept)

    @property
    def reached(self) -> Mapping[str, int]:
        return self.snapshot().reached

    @property
    def refused(self) -> Mapping[str, str]:
        return self.snapshot().refused

    @property
    def failed(self) -> Mapping[str, str]:
        return self.snapshot().failed

    def close(self) -> None:
        """Stops serving: the listener and every connection it accepted are closed (soon after: returns at
        once; `wait_closed` waits)."""
        self._stop()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Whether the listener and its connections are closed, waiting up to `timeout` seconds for it."""
        return self._closed.wait(timeout)

    def mark_closed(self) -> None:
        """Called by the proxy once everything of this listener is closed."""
        self._closed.set()
