"""A clock a test moves by hand, to stand in for a module's `time` (monkeypatch.setattr(module, "time", clock)).

The module's deadlines, ttls and renewals are then decided on readings the test chose, to the tick; asyncio and
the rest of the process keep the real clock. `sleep` is the real one: a polling thread still polls.
"""

from __future__ import annotations

import time


class HandClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)
