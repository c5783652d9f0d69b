"""Running the real `mm-bot` console script in tests: a clean environment, free ports, waiting for /healthz,
and finding every process a command left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from chatops.config import ENVIRONMENT
from mm_testkit.ports import free_port as free_port  # where the tests have always taken it from
from mm_testkit.processes import descendants

MM_BOT = str(Path(sys.executable).parent / "mm-bot")

# Everything the config reads from the environment (and the model key the example config names): a test
# starts from none of it.
CONFIG_ENV = (*ENVIRONMENT, "MODEL_API_KEY")


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONFIG_ENV}
    env.update(values)
    return env


def mm_bot(*args: str, env: Mapping[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MM_BOT, *args], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)


def wait_healthy(base: str, process: subprocess.Popen, timeout: float = 30) -> dict:
    """/healthz's answer from `process` (or the bot it started: `mm-bot dev`), known by the pid it reports. Until
    it listens, whatever answers there is another test's server: the port was picked free and may have been taken
    before the process bound it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with code {process.returncode} before answering /healthz")
        try:
            response = httpx.get(f"{base}/healthz", timeout=2)
            if response.status_code == 200 and response.json().get("pid") in ours(process.pid):
                return response.json()
        except (httpx.HTTPError, ValueError, AttributeError):  # not answering yet, or not a bot's JSON
            pass
        time.sleep(0.1)
    raise AssertionError(f"{base}/healthz did not answer within {timeout}s")


def ours(pid: int) -> set[int]:
    return {pid, *(p.pid for p in descendants(pid))}


def session_processes(sid: int) -> list[str]:
    """The live (not zombie) processes of session `sid`, as "pid cmdline" strings."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, session.
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(f"{entry.name} {cmdline.strip()}")
    return found


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
