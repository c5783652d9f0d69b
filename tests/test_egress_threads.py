"""The egress policy through the real parts (issue 26): the bot, a `celery worker` running the command in its
sandbox with the worker's own egress proxy, PostgreSQL, Redis, the Slack emulator and the scripted model; the
reached server lives in the test's network lab (mm_testkit/netlab.py), at an address the guard calls public.

The worker resolves names with the system's resolver (no test resolver can be given to a worker process), so
the allowed host is written as its address, and the refused one is refused by name before any lookup.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_testkit.fixtures_kit import needs_bwrap
from mm_testkit.netlab import Lab, serve_each
from playground.signed import SlackEventSender
from threads_support import CHANNEL, SECRET, OwnRedis, config, policy, stack

pytestmark = [pytest.mark.timeout(240), pytest.mark.process]


def sandboxed(channel: str, *extra: str) -> str:
    """The stack's config with the sandbox on (its default leaves the sandbox to the sandbox's own tests)."""
    return config(channel, *extra).replace("sandbox: none", "sandbox: bwrap")


ALICE = "U0ALICE"
ANSWER = b"hello from the lab"


@pytest.fixture
def lab_site(lab: Lab) -> Iterator[int]:
    """A plain HTTP server on the lab's public address: its port. Each connection gets one answer."""
    listener = lab.listen(lab.public)

    def answer(conn: socket.socket, _peer: tuple[str, int]) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(ANSWER), ANSWER))

    serve_each(listener, answer)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@needs_bwrap
def test_a_threads_hosts_reached_and_refused_reach_the_model_the_thread_status_and_the_log(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis, lab: Lab, lab_site: int
) -> None:
    allowed = f"{lab.public}:{lab_site}"
    text = sandboxed("{yolo: true}", f"network: {{allow: ['{allowed}']}}")
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=text) as s:
        s.model.always(policy)
        s.start_worker()
        base = s.start_bot()
        with SlackEventSender(base, SECRET, response_url=s.slack.response_url) as sender:
            command = (
                f"curl -sS http://{allowed}/; echo; curl -sS -o /dev/null https://exfil.example.com/; "
                f"exec 3<>/dev/tcp/{lab.public}/{lab_site} && echo raw-connected || echo raw-refused"
            )
            posted = s.post(f"run: {command}", user=ALICE)
            s.wait(lambda: s.turns_ended(posted.session_id) >= 1 and s.status(posted.session_id) == "idle")
            output = next(m["content"] for m in s.model.messages() if m["role"] == "tool")
            # The allowed host answered through the proxy; the other was refused by name, and the model reads why.
            assert ANSWER.decode() in output, output
            assert "network: host exfil.example.com is not in this channel's allow-list" in output, output
            # A raw connection to the allowed address itself has nowhere to go: only the proxy's port is there.
            assert "raw-refused" in output and "raw-connected" not in output, output
            # The thread gets one line for the refusal.
            thread = s.thread_text(posted.thread_ts)
            assert "🚫 network: host exfil.example.com is not in this channel's allow-list" in thread, thread
            # `status` names the policy and the hosts the turn reached and was refused.
            sender.app_mention("<@U0BOT> status", channel=CHANNEL, user=ALICE, thread_ts=posted.thread_ts)
            status = s.wait(
                lambda: [
                    m.get("text") or ""
                    for m in s.slack.ephemerals
                    if m.get("to_user") == ALICE and "*Status:*" in (m.get("text") or "")
                ],
                message="status",
            )[0]
            assert f"*Network:* allow-list: {allowed}" in status, status
            assert f"last reached {lab.public} (1)" in status and "refused exfil.example.com" in status, status
            # The worker's log says each host once.
            log = s.log_of("w1")
            assert log.count(f"network: reached {lab.public}") == 1, log
            assert log.count("network: refused exfil.example.com") == 1, log


@needs_bwrap
def test_network_off_gives_a_threads_commands_no_network_at_all(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis, lab: Lab, lab_site: int
) -> None:
    text = sandboxed("{yolo: true, network: 'off'}", "network: {allow: ['registries']}")
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=text) as s:
        s.model.always(policy)
        s.start_worker()
        posted = s.post(
            f"run: env | grep -ci proxy; cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
            f"exec 3<>/dev/tcp/{lab.public}/{lab_site} && echo raw-connected || echo raw-refused"
        )
        s.wait(lambda: s.turns_ended(posted.session_id) >= 1 and s.status(posted.session_id) == "idle")
        output = next(m["content"] for m in s.model.messages() if m["role"] == "tool")
        lines = [line.strip() for line in output.splitlines()]
        assert lines[0] == "0", output  # no proxy variable: there is no proxy to reach
        assert "lo" in lines and not any(line.startswith(("tap", "eth")) for line in lines), output
        assert "raw-refused" in output and "raw-connected" not in output, output
