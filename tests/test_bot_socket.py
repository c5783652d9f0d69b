"""`mm-bot serve --socket` as a real process, on Socket Mode against the Slack emulator: envelopes in, acks out."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatops import db
from mmbot_helpers import MM_BOT, clean_env, free_port, mm_bot, stop, wait_healthy
from playground.slack_api import SlackEmulator
from test_bot_serve import NOWHERE

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)


def socket_env(slack: SlackEmulator, tmp: Path, app_token: str) -> dict[str, str]:
    # No SLACK_SIGNING_SECRET: Socket Mode does not need it (the socket itself is authenticated).
    return clean_env(
        SLACK_API_URL=slack.url,
        SLACK_BOT_TOKEN=slack.bot_token,
        SLACK_APP_TOKEN=app_token,
        DATABASE_URL=f"sqlite:///{tmp / 'mm.sqlite3'}",
        CELERY_BROKER_URL=NOWHERE,
    )


@pytest.fixture(scope="module")
def slack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlackEmulator]:
    """The emulator, with `mm-bot serve --socket` connected to it."""
    tmp = tmp_path_factory.mktemp("socket")
    with SlackEmulator() as emulator:
        port = free_port()
        env = socket_env(emulator, tmp, emulator.app_token)
        db.migrate(env["DATABASE_URL"])  # the bot records each message before it acks it
        process = subprocess.Popen(
            [MM_BOT, "serve", "--socket", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            health = wait_healthy(f"http://127.0.0.1:{port}", process)
            assert health["slack"] is True and health["missing"] == []
            # /slack/events is not served in Socket Mode: Slack's requests come over the socket only.
            assert httpx.post(f"http://127.0.0.1:{port}/slack/events", content=b"{}").status_code in (404, 405)
            emulator.wait_for_socket_connections(1, timeout=30)
            yield emulator
        finally:
            stop(process)


def test_a_mention_is_acked_over_the_socket(slack: SlackEmulator) -> None:
    envelope_id = slack.push_app_mention("<@U0BOT> fix the tests", channel="C0TEST", user="U0ALICE")
    assert slack.wait_for_ack(envelope_id, timeout=30) == {"envelope_id": envelope_id}
    # Bolt's token check (auth.test) went to SLACK_API_URL with the bot token, not the app-level one.
    assert slack.calls_to("auth.test")[0].headers["Authorization"] == f"Bearer {slack.bot_token}"


def test_the_approve_button_is_acked_over_the_socket(slack: SlackEmulator) -> None:
    envelope_id = slack.push_block_action("approve", "call_1", user="U0ALICE", channel="C0TEST")
    assert slack.wait_for_ack(envelope_id, timeout=30)["envelope_id"] == envelope_id


def test_the_slash_command_is_acked_over_the_socket(slack: SlackEmulator) -> None:
    envelope_id = slack.push_slash_command("/mm", "help", user="U0ALICE", channel="C0TEST")
    assert slack.wait_for_ack(envelope_id, timeout=30)["envelope_id"] == envelope_id


def test_after_a_refresh_request_the_bot_reconnects_and_keeps_acking(slack: SlackEmulator) -> None:
    opened = len(slack.calls_to("apps.connections.open"))
    slack.disconnect("refresh_requested")
    slack.wait_for_socket_connections(2, timeout=30)
    assert len(slack.calls_to("apps.connections.open")) == opened + 1
    envelope_id = slack.push_message("stop", channel="C0TEST", user="U0ALICE", thread_ts="1700000000.000100")
    assert slack.wait_for_ack(envelope_id, timeout=30) == {"envelope_id": envelope_id}


@pytest.mark.parametrize(
    ("token", "error"),
    [("xapp-1-A0TESTAPP-1-wrong", "invalid_auth"), ("xoxb-test-token", "not_allowed_token_type")],
    ids=["wrong-app-token", "bot-token-instead"],
)
def test_a_refused_app_token_stops_serve_with_one_clear_line(tmp_path: Path, token: str, error: str) -> None:
    with SlackEmulator() as slack:
        result = mm_bot(
            "serve", "--socket", "--port", str(free_port()), env=socket_env(slack, tmp_path, token), cwd=tmp_path
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and token not in result.stderr
    assert f"mm-bot serve: Slack refused SLACK_APP_TOKEN ({error}): it must be the app-level token" in result.stderr
    assert "docs/slack-app.md" in result.stderr
    assert "listening" not in result.stdout
