"""`mm-bot serve` as a real process, talking to the Slack emulator, receiving signed (and forged) requests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from chatops import db
from chatops.schema import Session
from mmbot_helpers import MM_BOT, clean_env, free_port, mm_bot, stop, wait_healthy
from playground.signed import SlackEventSender, stale_timestamp
from playground.slack_api import SlackEmulator

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

SIGNING_SECRET = "test-signing-secret-8f3a"
# Where these bots enqueue turns: kombu's in-process broker, which no worker reads (test_bot_inbound reads a
# real one).
NOWHERE = "memory://"


class Bot:
    def __init__(self, base: str, slack: SlackEmulator, process: subprocess.Popen, database_url: str = "") -> None:
        self.base, self.slack, self.process, self.database_url = base, slack, process, database_url

    def sender(self, **kwargs: Any) -> SlackEventSender:
        s = self.slack
        return SlackEventSender(
            self.base,
            SIGNING_SECRET,
            team_id=s.team_id,
            api_app_id=s.app_id,
            bot_user_id=s.bot_user_id,
            response_url=s.response_url,
            **kwargs,
        )


def start_serve(tmp: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [MM_BOT, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextlib.contextmanager
def running_bot(tmp: Path) -> Iterator[Bot]:
    """`mm-bot serve` against a fresh Slack emulator, answering /healthz; stopped afterwards."""
    with SlackEmulator() as slack:
        port = free_port()
        database_url = f"sqlite:///{tmp / 'mm.sqlite3'}"
        # The bot records each message before it acks it, so it needs the schema `mm-bot migrate` makes.
        db.migrate(database_url)
        env = clean_env(
            SLACK_API_URL=slack.url,
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
            DATABASE_URL=database_url,
            CELERY_BROKER_URL=NOWHERE,
        )
        process = start_serve(tmp, env, port)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, process)
            yield Bot(base, slack, process, database_url)
        finally:
            stop(process)


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bot]:
    with running_bot(tmp_path_factory.mktemp("serve")) as bot:
        yield bot


def test_healthz_says_ok_and_that_the_database_answers(bot: Bot) -> None:
    response = httpx.get(f"{bot.base}/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": True, "slack": True, "missing": [], "pid": bot.process.pid}


def test_url_verification_gets_its_challenge_back(bot: Bot) -> None:
    with bot.sender() as sender:
        response = sender.url_verification("challenge-4711")
    assert response.status_code == 200
    assert response.json() == {"challenge": "challenge-4711"}


def test_signed_mention_is_acked_and_auth_goes_to_the_emulator(bot: Bot) -> None:
    with bot.sender() as sender:
        response = sender.app_mention("<@U0BOT> fix the tests", channel="C0TEST", user="U0ALICE")
    assert response.status_code == 200
    # Bolt's token check (auth.test) went to SLACK_API_URL, with the bot token.
    assert bot.slack.calls_to("auth.test")


@pytest.mark.parametrize("action_id", ["approve", "reject", "approve_all", "stop"])
def test_each_button_is_acked(bot: Bot, action_id: str) -> None:
    with bot.sender() as sender:
        response = sender.block_action(
            action_id, "call_1", user="U0ALICE", channel="C0TEST", message_ts=sender.new_ts()
        )
    assert response.status_code == 200


def test_slash_command_and_thread_message_are_acked(bot: Bot) -> None:
    with bot.sender() as sender:
        assert sender.slash_command("/mm", "help", user="U0ALICE", channel="C0TEST").status_code == 200
        root = sender.new_ts()
        assert sender.message("stop", channel="C0TEST", user="U0ALICE", thread_ts=root).status_code == 200


@pytest.mark.parametrize(
    "forgery",
    [
        {"secret": "not-the-signing-secret"},
        {"timestamp": stale_timestamp()},
        {"tamper": True},
        {"omit_headers": ("X-Slack-Signature",)},
        {"omit_headers": ("X-Slack-Request-Timestamp",)},
    ],
    ids=["wrong-secret", "stale-timestamp", "tampered-body", "no-signature", "no-timestamp"],
)
def test_forged_requests_are_refused_with_401_and_record_nothing(bot: Bot, forgery: dict) -> None:
    with bot.sender() as sender:
        assert sender.app_mention("<@U0BOT> rm -rf /", channel="C0FORGED", user="U0EVE", **forgery).status_code == 401
        assert sender.url_verification("c", **forgery).status_code == 401
        value = '{"s":"00000000-0000-0000-0000-000000000000","c":"call_1"}'
        click = sender.block_action("approve", value, user="U0EVE", channel="C0FORGED", message_ts="1.1", **forgery)
        assert click.status_code == 401
        assert sender.slash_command("/mm", "yolo on", user="U0EVE", channel="C0FORGED", **forgery).status_code == 401
    engine = db.engine_for(bot.database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(Session.id).where(Session.channel_id == "C0FORGED")).first() is None
    finally:
        engine.dispose()
    assert not [m for m in bot.slack.ephemerals if m["channel"] == "C0FORGED"]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"\xff\xfe not json {", "application/json"),
        (b"{not json", "application/json"),
        (b"payload=%7Bnot+json", "application/x-www-form-urlencoded"),
    ],
    ids=["not-utf8", "bad-json", "bad-form-payload"],
)
def test_garbage_body_with_a_valid_signature_is_a_400(bot: Bot, body: bytes, content_type: str) -> None:
    with bot.sender() as sender:
        response = sender.send(body, content_type)
    assert response.status_code == 400
    assert httpx.get(f"{bot.base}/healthz").status_code == 200


@pytest.mark.parametrize(
    ("args", "names"),
    [((), ["SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"]), (("--socket",), ["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"])],
    ids=["http", "socket"],
)
def test_serve_without_secrets_exits_2_naming_them(tmp_path: Path, args: tuple[str, ...], names: list[str]) -> None:
    result = mm_bot("serve", "--port", str(free_port()), *args, env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    for name in names:
        assert name in result.stderr
    assert "docs/slack-app.md" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_the_database_down_still_answers_healthz_and_says_so(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        SLACK_BOT_TOKEN="xoxb-x",
        SLACK_SIGNING_SECRET="s",
        DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/nothing",
    )
    process = start_serve(tmp_path, env, port)
    try:
        health = wait_healthy(f"http://127.0.0.1:{port}", process)
    finally:
        stop(process)
    assert health["ok"] is True and health["database"] is False


def test_serve_with_a_database_url_it_cannot_use_says_so_without_a_traceback(tmp_path: Path) -> None:
    """Down is not broken: a server that does not answer is served around (above), a URL that can never work is
    refused at start-up, in one sentence."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    for url, reason in (
        ("nonsense", "Could not parse"),
        (f"sqlite:///{blocker}/sub/mm.sqlite3", "Not a directory"),
        ("mysql://mm:s3cret-pw@127.0.0.1/mm", "No module named"),
    ):
        env = clean_env(SLACK_BOT_TOKEN="xoxb-x", SLACK_SIGNING_SECRET="s", DATABASE_URL=url)
        result = mm_bot("serve", "--port", str(free_port()), env=env, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr and "s3cret-pw" not in result.stderr
        assert "mm-bot serve: cannot use the database" in result.stderr and reason in result.stderr


def test_a_forged_request_is_logged_as_refused_without_its_body(tmp_path: Path) -> None:
    marker = "forged-body-marker-7d1f"
    with running_bot(tmp_path) as bot, bot.sender() as sender:
        forged = sender.app_mention(f"<@U0BOT> {marker}", channel="C0TEST", user="U0EVE", secret="guessed")
        assert forged.status_code == 401
    log = bot.process.stdout.read() if bot.process.stdout else ""
    assert marker not in log
    refused = [line for line in log.splitlines() if "signature did not verify" in line]
    assert len(refused) == 1 and " WARNING " in refused[0], log
