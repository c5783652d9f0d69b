"""What reaches the bot's endpoint is answered in time and in one log line, whatever the database does and
whatever the bytes are: the real bot (`mm-bot serve`), PostgreSQL (directly, or behind a proxy that can fall
silent), the Slack emulator, raw sockets.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from chatops.schema import InboxMessage, SlackRequest
from playground.signed import FORM, signed_headers
from test_record_before_ack import ALICE, BOB, bot_log, requests, sender, stalls_on_purpose, threads, waiting_on
from threads_support import CHANNEL, SECRET, Stack

pytestmark = [pytest.mark.timeout(180), pytest.mark.process]

__all__ = ["threads"]  # the fixture, shared with test_record_before_ack

SLACK_LIMIT_S = 3.0  # Slack's: an ack later than this is a failure (a slash command shows one)
SILENT = "I could not take `/mm status`: my database did not answer; nothing was done, try again."
STRANGER = b"STRANGER-BYTES-7f3a"


# --- a slow or silent database before the ack --------------------------------------------------------------


def timed(call: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_a_slash_command_the_locked_table_cannot_record_is_answered_in_time_and_not_done(threads: Stack) -> None:
    with sender(threads, threads.start_bot()) as slack, threads.engine.connect() as blocker:
        stalls_on_purpose(blocker)
        blocker.execute(text("LOCK TABLE slack_requests IN EXCLUSIVE MODE"))  # the record waits for it
        answer, took = timed(lambda: slack.slash_command("/mm", "status", user=ALICE, channel=CHANNEL))
        assert waiting_on("slack_requests", blocker) is False  # its wait ended with the answer
        blocker.rollback()
    assert answer.status_code == 200 and took < SLACK_LIMIT_S
    assert answer.text == SILENT  # its lock wait timed out: certain, nothing kept
    assert requests(threads) == []  # nothing kept: nothing will be done


class Proxy:
    """A TCP proxy in front of PostgreSQL that can fall silent: connections are accepted and stay open, and
    nothing passes either way (a database that accepts connections and never answers)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.silent = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._wait_while_silent()
        upstream = socket.create_connection(self.target)
        self._sockets += [client, upstream]
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self._wait_while_silent()
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _wait_while_silent(self) -> None:
        while self.silent.is_set():
            time.sleep(0.02)

    def close(self) -> None:
        self.silent.clear()
        self.server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def proxy(threads: Stack) -> Iterator[Proxy]:
    url = make_url(threads.database_url)
    found = Proxy((url.host or "127.0.0.1", url.port or 5432))
    threads.extra_env["DATABASE_URL"] = url.set(port=found.port).render_as_string(hide_password=False)
    yield found
    found.close()


def test_a_silent_database_gets_every_request_an_answer_in_time_and_the_bot_ends_on_sigterm(
    threads: Stack, proxy: Proxy
) -> None:
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", "help", user=ALICE, channel=CHANNEL).status_code == 200  # it answers
        proxy.silent.set()
        for _ in range(3):  # more than once: the threads a silent database holds do not hold the next request
            answer, took = timed(lambda: slack.slash_command("/mm", "status", user=ALICE, channel=CHANNEL))
            assert (answer.status_code, answer.text, took < SLACK_LIMIT_S) == (200, SILENT, True)
            event, took = timed(lambda: slack.app_mention("<@U0BOT> hello", channel=CHANNEL, user=ALICE))
            assert (event.status_code, took < SLACK_LIMIT_S) == (500, True)  # not acked: Slack sends it again
        health = httpx.get(f"{slack.url.rsplit('/slack', 1)[0]}/healthz", timeout=SLACK_LIMIT_S).json()
        assert health["database"] is False
        proxy.silent.clear()  # the threads it held go on: what their listeners gave up on is not kept
        log = threads.tmp / "bot.log"
        threads.wait(lambda: "was given up before its commit" in log.read_text(), timeout=30)
        assert slack.slash_command("/mm", "help", user=BOB, channel=CHANNEL).status_code == 200
        threads.wait(lambda: len(requests(threads)) == 2 and all(r[1] == "done" for r in requests(threads)))
    with threads.engine.connect() as conn:  # the two `help`s, and none of the `status`es
        kept = conn.execute(select(SlackRequest.payload)).scalars().all()
    assert sorted(p["text"] for p in kept) == ["help", "help"]
    proxy.silent.set()  # and silent again, with threads stuck in it: SIGTERM still ends the bot
    with sender(threads, f"http://127.0.0.1:{bot_port(threads)}") as slack:
        slack.slash_command("/mm", "status", user=ALICE, channel=CHANNEL)
    assert threads.bot is not None
    threads.bot.send_signal(signal.SIGTERM)
    assert threads.bot.wait(timeout=30) == 0
    assert "Traceback" not in bot_log(threads)


def bot_port(threads: Stack) -> int:
    assert threads.bot is not None
    return int(threads.bot.args[threads.bot.args.index("--port") + 1])  # type: ignore[union-attr]


# --- malformed HTTP, over a raw socket ---------------------------------------------------------------------


def raw(port: int, request: bytes, *, close_early: bool = False) -> bytes:
    """Send bytes to the bot as they are; its answer (b"" when the connection is closed first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        if close_early:
            return b""
        answer = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                answer += chunk
        return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_malformed_http_gets_a_400_and_one_line_without_its_bytes(threads: Stack) -> None:
    base = threads.start_bot()
    port = urlsplit(base).port or 0
    body = b"\x1f\x8b\x08\x00" + STRANGER  # gzip's magic, then no gzip at all
    headers = signed_headers(SECRET, body, "application/json") | {"Content-Encoding": "gzip"}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    start = f"POST /slack/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    assert status_of(raw(port, start.encode() + head.encode() + b"\r\n" + body)) == 400

    huge = b"X-Stranger: " + STRANGER * 2000 + b"\r\n"
    assert status_of(raw(port, b"POST /slack/events HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")) in (400, 431)
    chunked = b"POST /slack/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + STRANGER
    assert status_of(raw(port, chunked + b"\r\n0\r\n\r\n")) == 400
    cut = b"POST /slack/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + STRANGER
    raw(port, cut, close_early=True)
    not_http = STRANGER + b" / HTTP/1.1\r\n\r\n"
    assert status_of(raw(port, not_http)) == 400

    with sender(threads, base) as slack:  # and it goes on
        assert slack.app_mention("<@U0BOT> still here", channel=CHANNEL, user=ALICE).status_code == 200
    log = bot_log(threads)
    assert "Traceback" not in log and STRANGER.decode() not in log and "Unhandled exception" not in log
    assert "refused a request to the Slack endpoint: its body is not UTF-8" in log  # the gzip body, unread
    assert log.count("refused a malformed HTTP request") >= 2


# --- signed, but oddly shaped -----------------------------------------------------------------------------------


def interaction(body: dict[str, Any]) -> tuple[str, str]:
    return urlencode({"payload": json.dumps(body)}), FORM


def event(inner: Any) -> tuple[str, str]:
    envelope = {"type": "event_callback", "team_id": "T0TESTTEAM", "event_id": "Ev0ODD", "event": inner}
    return json.dumps(envelope), "application/json"


MENTION = {"type": "app_mention", "user": ALICE, "channel": CHANNEL, "ts": "1700000000.000100"}
CLICK = {
    "type": "block_actions",
    "user": {"id": BOB},
    "trigger_id": "1.2.3",
    "container": {"type": "message", "channel_id": CHANNEL, "message_ts": "1.1"},
    "actions": [{"action_id": "approve", "value": "x", "action_ts": "1.3"}],
}
ODD = {
    "event-a-string": event("app_mention"),
    "event-a-list": event([MENTION]),
    "text-a-number": event(MENTION | {"text": 7}),
    "channel-too-long": event(MENTION | {"text": "<@U0BOT> hi", "channel": "C" * 200}),
    "actions-a-dict": interaction(CLICK | {"actions": {"action_id": "approve"}}),
    "user-a-string": interaction(CLICK | {"user": BOB}),
    "view-a-number": interaction({"type": "view_submission", "user": {"id": BOB}, "view": 5}),
}


def test_signed_bodies_of_a_shape_no_listener_reads_are_acked_and_dropped_in_one_line(threads: Stack) -> None:
    with sender(threads, threads.start_bot()) as slack:
        for name, (body, content_type) in ODD.items():
            response = slack.send(body, content_type)
            assert response.status_code == 200, (name, response.status_code, response.text)
        assert slack.app_mention("<@U0BOT> still here", channel=CHANNEL, user=ALICE).status_code == 200
    log = bot_log(threads)
    assert "Traceback" not in log and "failed (" not in log
    assert log.count("dropped a signed Slack request of a shape no listener reads") == len(ODD)


def test_nul_characters_and_lone_surrogates_are_taken_out_of_what_is_kept(threads: Stack) -> None:
    with sender(threads, threads.start_bot()) as slack:
        said = slack.send(*event(MENTION | {"text": "<@U0BOT> fix\u0000 the \ud800tests"}))
        assert said.status_code == 200
        asked = slack.slash_command("/mm", "stop\u0000", user=BOB, channel=CHANNEL)
        assert asked.status_code == 200
    with threads.engine.connect() as conn:
        assert conn.execute(select(InboxMessage.text)).scalars().all() == ["fix the tests"]
    threads.wait(lambda: requests(threads) == [("slash", "done", 1)], message="the command, carried out")
    assert "Traceback" not in bot_log(threads)


# --- bounded requests ----------------------------------------------------------------------------------------


def test_a_slash_command_longer_than_a_message_is_refused_and_not_kept(threads: Stack) -> None:
    with sender(threads, threads.start_bot()) as slack:
        answer = slack.slash_command("/mm", "x" * 40_001, user=ALICE, channel=CHANNEL)
    assert answer.status_code == 200
    assert answer.text == (
        "I could not take `/mm " + "x" * 60 + "…`: it is 40,001 characters long and I take at most 40,000; "
        "nothing was done."
    )
    assert requests(threads) == []


def test_a_prompt_of_a_message_s_length_is_taken(threads: Stack, tmp_path: Path) -> None:
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", "y" * 40_000, user=ALICE, channel=CHANNEL).status_code == 200
    threads.wait(lambda: requests(threads) == [("slash", "done", 1)], message="the prompt, carried out")
