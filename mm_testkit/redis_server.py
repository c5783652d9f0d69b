"""A redis-server of a test's (or a benchmark's) own, on a free port: flushed or restarted at will, and never
sharing keys with anything else on the machine.

    server = OwnRedis(tmp / "redis")
    server.start()
    ...  # server.url
    server.stop()
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from mm_testkit.ports import free_port


class OwnRedis:
    """A redis-server on a free port, in a directory of the test's: flushed or restarted at will."""

    def __init__(self, directory: Path):
        self.directory, self.port = directory, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen([*argv, "--dir", str(self.directory)], stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def flush(self) -> None:
        redis.Redis(port=self.port).flushall()

    def queued(self, queue: str = "turns") -> int:
        return int(redis.Redis(port=self.port).llen(queue))  # pyright: ignore[reportArgumentType]
