"""The hand-off of sessions to the workers, after the ack, in a process of its own.

Telling the workers that a session has work is one Celery message on the broker. Celery builds and publishes it
in 0.7 ms of CPU alone and 1.5-2 ms beside the bot's requests (bench/bench_inbound.py): more than the record
and the ack of the message together, and on a thread of the bot it holds the same interpreter as the event
loop that acks. So the bot writes one line a session into the pipe of a child process (`python -m
bot.hand_off`, started with the server), and the bot's part is a write to a pipe. The child publishes the lines
it reads at once, and those that come within GATHER_S after, together: on a Redis broker in one LPUSH of the
messages Celery builds (workers.publish, half of `send_task`'s cost a message, a quarter when four are read at
once), with Celery's own `send_task` on any other broker and for a traced hand-off.

Nothing is lost with it. A session is handed off only once its message, click or command is recorded, and
housekeeping enqueues every session with work that nobody took (chatops.sessions.sessions_with_work): what a
child that dies had not published yet, or what the bot could not write because the child was behind
(BACKLOG_MOST), or gone, is published by housekeeping within its interval. The child:
- logs each publish that failed in the bot's words ("could not enqueue session S (...); housekeeping will"),
  in the bot's log (it writes to the bot's stderr, with the same redaction of secrets);
- publishes in the trace of the request that asked (the line carries its trace context: slackio.traces);
- ends when its pipe ends: the bot closing it at shutdown (the child publishes what it was given, for at most
  CLOSE_S), or the bot dying. It ignores SIGINT and SIGTERM, which a terminal or a process manager sends to
  the whole group: the bot's shutdown is what ends it, after what was written is published;
- is started again by the bot when it exits, at most once every RESTART_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import select
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from bot.errors import BotError
from slackio import traces
from workers.publish import RedisPublisher
from workers.tasks import enqueue_session, run_session

log = logging.getLogger("mm.bot.hand_off")

# What the pipe may hold unread (the child behind: a broker that does not answer, each publish waiting for its
# timeout): past it a hand-off is refused, and housekeeping enqueues the session instead.
BACKLOG_MOST = 256 * 1024
# How long the child gets at shutdown to publish what it was given; how often it may be started again.
CLOSE_S = 5.0
RESTART_S = 5.0
# The most the child reads from its pipe at once (a line is ~60 bytes, ~1,000 bytes with a trace's context).
READ_MOST = 64 * 1024
# How long the child waits, once a line came, for the lines right behind it, which are then one publish: the
# child's CPU a message, 600 messages a second, is 0.33 ms with no wait, 0.21 ms with 10 ms, 0.13 ms with 30 ms
# (measured beside the bot, whose acks share the cores). A turn starts that much later at most.
GATHER_S = 0.02
# A session's id as the database makes it (chatops.schema.new_id); anything else is not written to the pipe.
SESSION_ID = re.compile(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}")


class HandOffError(BotError):
    """The session could not be handed off now: it waits for housekeeping."""


class HandOff:
    """The bot's side: the child process, started with the server (or at the first hand-off) and again when
    it exits; `enqueue` writes a line into its pipe and never waits for it."""

    def __init__(self, argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> None:
        self._argv = argv or [sys.executable, "-m", "bot.hand_off"]
        self._env = dict(env) if env is not None else None  # the bot's own when None
        self._child: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._started_at = -RESTART_S
        self._closed = False
        self._tried = asyncio.Event()  # set once the first start was tried

    async def start(self) -> None:
        """Start the child, and keep it running (again when it exits) until `close`."""
        if self._closed:
            return
        if self._watch is None:
            self._watch = asyncio.create_task(self._keep_running())
        await self._tried.wait()

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        child = self._child
        return child.pid if child is not None and child.returncode is None else None

    async def enqueue(self, session_id: str) -> None:
        """Hand the session to the workers; HandOffError when it cannot be now (housekeeping will)."""
        if not SESSION_ID.fullmatch(session_id):
            raise HandOffError(f"{session_id[:40]!r} is not a session's id")
        await self.start()
        child = self._child
        if child is None or child.returncode is not None or child.stdin is None or child.stdin.is_closing():
            raise HandOffError("the hand-off process is not running (it is started again within seconds)")
        backlog = child.stdin.transport.get_write_buffer_size()
        if backlog > BACKLOG_MOST:
            raise HandOffError(f"the hand-off process is behind ({backlog:,} bytes not yet read)")
        line: dict[str, Any] = {"session": session_id}
        if (trace := traces.carrier()) is not None:
            line["trace"] = trace
        child.stdin.write(json.dumps(line).encode() + b"\n")

    async def _keep_running(self) -> None:
        while not self._closed:
            wait = self._started_at + RESTART_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._started_at = time.monotonic()
            try:
                self._child = child = await asyncio.create_subprocess_exec(
                    *self._argv, stdin=asyncio.subprocess.PIPE, env=self._env
                )
            except OSError as exc:
                log.error("could not start the hand-off process (%s); trying again in %.0f s", exc, RESTART_S)
                continue
            finally:
                self._tried.set()
            log.info("the hand-off process %d started", child.pid)
            code = await child.wait()
            if not self._closed:
                log.warning("the hand-off process exited (code %s); starting it again", code)

    async def close(self) -> None:
        """End the child once it has published what it was given (CLOSE_S at most, then it is killed)."""
        self._closed = True
        self._tried.set()
        child = self._child
        if child is not None and child.returncode is None:
            if child.stdin is not None:
                child.stdin.close()
            try:
                await asyncio.wait_for(child.wait(), CLOSE_S)
            except TimeoutError:
                log.warning("the hand-off process did not end within %.0f s; killed", CLOSE_S)
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch


# --- the child process ----------------------------------------------------------------------------------------------


def parse(line: bytes) -> tuple[str, Any] | None:
    """A line of the pipe: its session and its trace's context (None when traces are off); None, said, when it
    is not a hand-off."""
    try:
        said: Any = json.loads(line)
        session_id = said["session"]
        if not isinstance(session_id, str) or not SESSION_ID.fullmatch(session_id):
            raise ValueError("not a session's id")
    except (ValueError, TypeError, KeyError) as exc:
        log.error("the hand-off process read a line that is not a hand-off (%s); skipped", type(exc).__name__)
        return None
    return session_id, said.get("trace")


def publish(lines: list[bytes], publisher: RedisPublisher | None) -> None:
    """The lines read at once, their sessions published: those without a trace together in one command where
    the broker allows it (workers.publish), each traced one through Celery in its trace. What fails is said,
    and left to housekeeping."""
    untraced = []
    for session_id, trace in filter(None, map(parse, lines)):
        if trace is None and publisher is not None:
            untraced.append(session_id)
            continue
        with traces.attached(trace):
            try:
                enqueue_session(session_id)
            except Exception as exc:  # noqa: BLE001 - that session waits for housekeeping; the next one is published
                log.warning("could not enqueue session %s (%s); housekeeping will", session_id, exc)
    if untraced and publisher is not None:
        try:
            publisher.publish(run_session.name, run_session.queue, [[session_id] for session_id in untraced])
        except Exception as exc:  # noqa: BLE001 - as above, for each of them
            for session_id in untraced:
                log.warning("could not enqueue session %s (%s); housekeeping will", session_id, exc)


def lines_read(fd: int, gather_s: float = GATHER_S) -> Iterator[list[bytes]]:
    """The pipe's whole lines, what it holds when read and what comes within `gather_s` after, until it ends
    (an unfinished last line is one too)."""
    rest = b""
    while chunk := os.read(fd, READ_MOST):
        if gather_s > 0 and len(chunk) < READ_MOST:
            # One wake-up for the lines right behind, not one each. At the pipe's end the read below is empty,
            # and the next one ends the loop.
            time.sleep(gather_s)
            if select.select([fd], [], [], 0)[0]:
                chunk += os.read(fd, READ_MOST - len(chunk))
        *whole, rest = (rest + chunk).split(b"\n")
        if whole:
            yield whole
    if rest:
        yield [rest]


def main() -> int:
    from bot.logging_setup import setup_logging
    from chatops.config import load_config
    from chatops.secrets import secrets_of
    from workers.celery_app import app, traced

    # The bot's shutdown ends this process, by closing the pipe, once what it holds is published.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    setup_logging(secrets_of(load_config()))
    traced("mm-bot")
    publisher = RedisPublisher.for_app(app)
    for lines in lines_read(sys.stdin.fileno()):
        publish(lines, publisher)
    return 0


if __name__ == "__main__":
    sys.exit(main())
