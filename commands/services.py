"""The processes one machine runs for `mm-bot dev` and `mm-bot playground`: the database migrated, a broker
picked (Redis on localhost, else an SQLite file that needs no server), the bot and a worker as children, and
all of them stopped on Ctrl-C (or SIGTERM). A child that dies takes the others down with it: a half-running
setup is harder to understand than a stopped one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from chatops import db
from chatops.config import Config
from chatops.secrets import mask_url
from commands.doctor import broker_reachable, sandbox_note

EMBEDDED_BROKER_FILE = Path("var") / "broker.sqlite3"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def dev_broker(config: Config, environ: dict[str, str] | os._Environ[str]) -> tuple[str, str | None]:
    """The broker for `dev`, and a note when it is not the configured one.

    A CELERY_BROKER_URL the user set is used as is (a wrong one should fail loudly, not be replaced); the
    default Redis is used when it answers, else kombu's SQLAlchemy transport on an SQLite file.
    """
    if environ.get("CELERY_BROKER_URL"):
        return config.broker_url, None
    reachable, reason = broker_reachable(config.broker_url, timeout=1.0)
    if reachable:
        return config.broker_url, None
    EMBEDDED_BROKER_FILE.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqla+sqlite:///{EMBEDDED_BROKER_FILE.absolute()}"
    return url, f"no Redis at {mask_url(config.broker_url)} ({reason}): using the embedded broker {url}"


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.process.poll() is None


def _start(name: str, argv: list[str], env: dict[str, str], stdout: int | None = None) -> Child:
    # Each child leads its own process group, so stopping it can reach its own children (Celery's pool),
    # and a terminal's Ctrl-C reaches only us: we stop the children in order, once.
    process = subprocess.Popen([sys.executable, "-m", "commands.cli", *argv], env=env, process_group=0, stdout=stdout)
    return Child(name, process)


def _stop(children: list[Child], speaker: Callable[[str], None]) -> None:
    for child in children:
        if child.alive():
            child.process.send_signal(signal.SIGTERM)  # warm shutdown: Celery finishes or gives back its task
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            speaker(f"{child.name} did not stop within {STOP_TIMEOUT:g}s; killing it")
        # Whatever is left in its group (a pool process that outlived its parent) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait()


def _wait_healthy(url: str, bot: Child) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and bot.alive():
        if answers_as(url, bot.process.pid):
            return True
        time.sleep(0.2)
    return False


def answers_as(url: str, pid: int) -> bool:
    """Whether the bot with that pid answers the health check at `url`: another process that took the port
    after check_port looked may answer it too, and then our bot is not listening."""
    try:
        response = httpx.get(url, timeout=1.0)
        return response.status_code == 200 and response.json().get("pid") == pid
    except (httpx.HTTPError, ValueError, AttributeError):  # not answering yet, or not a bot's JSON
        return False


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def prepare(config: Config, environ: dict[str, str] | os._Environ[str], speaker: Callable[[str], None]) -> str:
    """Migrate the database and pick the broker, saying both (and the sandbox's note); returns the broker URL."""
    before = db.current_revision(config.database_url)
    db.migrate(config.database_url)
    after = db.current_revision(config.database_url)
    change = f"migrated from {before or 'an empty database'} to {after}" if before != after else f"at {after}"
    speaker(f"database {mask_url(config.database_url)} ({change})")
    broker, note = dev_broker(config, environ)
    speaker(note or f"broker {mask_url(broker)}")
    # Where a worker would refuse to start, dev says it once and starts its worker anyway (`worker --dev`).
    if (sandbox := sandbox_note(config.agent)) is not None:
        speaker(f"sandbox: {sandbox}")
    return broker


def run_services(
    config_path: str | None,
    env: dict[str, str],
    host: str,
    port: int,
    ready: Callable[[list[Child]], None],
    speaker: Callable[[str], None],
) -> int:
    """Start the bot (on host:port) and a worker, call `ready` once the bot answers, and keep them until Ctrl-C,
    SIGTERM or the death of one; then stop both. Returns the exit code."""
    common = ["--config", str(Path(config_path).absolute())] if config_path else []
    children: list[Child] = []
    # Explicitly: a shell's background job starts with SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        children.append(_start("bot", [*common, "serve", "--host", host, "--port", str(port), "--dev"], env))
        # A quiet worker's stdout holds only Celery's notices of its own shutdown ("worker: Warm shutdown"), which
        # dev says in its own words; its log, and what tasks print, go to stderr.
        # The worker also runs the scheduler (-B) for housekeeping: one process fewer on a laptop. Fewer turns at
        # once than a production worker, since the embedded database is SQLite (one writer at a time).
        EMBEDDED_BROKER_FILE.parent.mkdir(parents=True, exist_ok=True)
        schedule = str(EMBEDDED_BROKER_FILE.parent / "celerybeat-schedule")
        worker = [*common, "worker", "--dev", "--", "--concurrency", "8", "-B", "--schedule", schedule]
        children.append(_start("worker", worker, env, stdout=subprocess.DEVNULL))
        base = f"http://{host}:{port}"
        if not _wait_healthy(f"{base}/healthz", children[0]):
            speaker(f"the bot did not answer on {base}/healthz; stopping")
            return 1
        ready(children)
        while True:
            for child in children:
                if not child.alive():
                    speaker(f"{child.name} exited with code {child.process.returncode}; stopping the others")
                    return 1
            time.sleep(0.3)
    except KeyboardInterrupt:
        speaker("stopping")
        return 0
    finally:
        # A second Ctrl-C must not abandon the children half-stopped; STOP_TIMEOUT bounds the wait.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(children, speaker)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
