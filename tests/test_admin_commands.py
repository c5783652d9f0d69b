"""`/mm audit` and `/mm purge` through the real bot (`mm-bot serve`) and the Slack emulator: signed slash commands,
recorded before the ack and carried out after it; the config's `admins` (a person, or a user group) get the audit
as a file in their direct messages and purge a thread by its link, everyone else gets a refusal that changes
nothing. The calls are rows inserted through the schema (tests/audit_support.py)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from audit_support import new_channel, thread_ts_of, two_person_call
from chatops import db
from chatops.schema import Session, SessionEvent
from mmbot_helpers import MM_BOT, clean_env, free_port, stop, wait_healthy
from playground.signed import SlackEventSender
from playground.slack_api import SlackEmulator

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

SECRET = "admin-signing-secret"
ADMIN, IN_GROUP, EVE = "U0ADMIN", "U0GRACE", "U0EVE"
ADMINS_GROUP = "S0ADMINS"
TYPED_IN = "C0TYPEDIN"  # where the commands are typed: nothing of the export may land there


@dataclass
class Bot:
    slack: SlackEmulator
    sender: SlackEventSender
    engine: Engine
    log: Path

    def slash(self, text: str, user: str) -> str:
        """`/mm text` from `user`; the answer Slack shows them (through the command's response URL)."""
        before = len(self.slack.responses)
        url = self.slack.response_url(user, TYPED_IN)
        assert self.sender.slash_command("/mm", text, user=user, channel=TYPED_IN, response_url=url).status_code == 200
        self.wait(lambda: len(self.slack.responses) > before, f"the answer to /mm {text}")
        return self.slack.responses[before]["body"]["text"]

    def wait(self, what: Callable[[], Any], message: str, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := what():
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {message}\n{self.log.read_text()[-3000:]}")


@pytest.fixture
def bot(tmp_path: Path) -> Iterator[Bot]:
    database_url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    db.migrate(database_url)
    (tmp_path / "mm.yaml").write_text(f"admins: [{ADMIN}, {ADMINS_GROUP}]\n")
    with SlackEmulator() as slack:
        for user, name in ((ADMIN, "ada"), (IN_GROUP, "grace"), (EVE, "eve")):
            slack.add_user(user, name)
        slack.add_usergroup(ADMINS_GROUP, "admins", [IN_GROUP])
        port = free_port()
        env = clean_env(
            MM_CONFIG=str(tmp_path / "mm.yaml"),
            SLACK_API_URL=slack.url,
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_SIGNING_SECRET=SECRET,
            DATABASE_URL=database_url,
            CELERY_BROKER_URL="memory://",  # nothing here hands work to a worker
        )
        log = tmp_path / "bot.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [MM_BOT, "serve", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        engine = db.engine_for(database_url)
        try:
            wait_healthy(base, process)
            sender = SlackEventSender(
                base,
                SECRET,
                team_id=slack.team_id,
                api_app_id=slack.app_id,
                bot_user_id=slack.bot_user_id,
                response_url=slack.response_url,
            )
            with sender:
                yield Bot(slack, sender, engine, log)
        finally:
            stop(process)
            engine.dispose()


def uploaded(slack: SlackEmulator) -> list[tuple[str, dict[str, Any], bytes]]:
    """Every file the bot uploaded, with the conversation it went to."""
    found = []
    for channel in slack.channels:
        for message in slack.messages(channel):
            for file in message.get("files") or []:
                found.append((channel, file, slack.uploads[file["id"]]))
    return found


def test_mm_audit_from_a_non_admin_is_refused_and_changes_nothing(bot: Bot) -> None:
    two_person_call(bot.engine, new_channel())
    said = bot.slash("audit", EVE)
    assert said.startswith("Only the bot's admins may export the audit")
    assert f"<@{ADMIN}>" in said and f"`{ADMINS_GROUP}`" in said and "Nothing was changed." in said
    assert not bot.slack.calls_to("conversations.open") and not uploaded(bot.slack)


def test_an_admin_gets_the_audit_as_a_file_in_their_direct_messages(bot: Bot) -> None:
    channel = new_channel()
    session_id, call_id = two_person_call(bot.engine, channel)
    said = bot.slash("audit 2026-01-01 jsonl", ADMIN)
    assert "📋 The audit of 1 tool call(s) since 2026-01-01T00:00:00Z is in your direct messages with me" in said

    [(where, file, content)] = uploaded(bot.slack)
    assert where.startswith("D") and bot.slack.channels[where]["user"] == ADMIN  # the admin's DM, nowhere else
    assert file["name"].startswith("mm-audit-") and file["name"].endswith(".jsonl")
    [record] = [json.loads(line) for line in content.decode().splitlines()]
    ts = thread_ts_of(bot.engine, session_id)
    assert record["call_id"] == call_id and record["requested_by"] == ["U0ALICE"] and record["rule"] == "prod-deploy"
    assert [(d["by"], d["vote"], d["at"]) for d in record["decisions"]] == [
        ("U0BOB", "approve", "2026-01-05T09:02:00Z"),
        ("U0CAROL", "approve", "2026-01-05T09:04:00Z"),
    ]
    # The link is built on the workspace's address, which auth.test gives.
    assert record["permalink"] == f"https://{bot.slack.domain}.slack.com/archives/{channel}/p{ts.replace('.', '')}"
    assert not bot.slack.messages(TYPED_IN)


def test_a_member_of_an_admins_group_gets_csv_by_default_and_a_bad_time_is_said(bot: Bot) -> None:
    two_person_call(bot.engine, new_channel())
    said = bot.slash("audit yesterday", IN_GROUP)
    assert said.startswith("since: expected a date or time") and said.endswith("Nothing was exported.")
    assert not uploaded(bot.slack)
    said = bot.slash("audit 2099-01-01", IN_GROUP)
    assert said == "No tool call was asked since 2099-01-01T00:00:00Z: there is nothing to export."
    assert not uploaded(bot.slack)
    bot.slash("audit 3650d", IN_GROUP)
    [(_, file, content)] = uploaded(bot.slack)
    assert file["name"].endswith(".csv")
    [row] = list(csv.DictReader(io.StringIO(content.decode())))
    assert row["decisions"].startswith("approve by U0BOB at 2026-01-05T09:02:00Z")


def test_an_admin_purges_a_thread_by_its_link_once_and_a_non_admin_may_not(bot: Bot) -> None:
    channel = new_channel()
    session_id, _ = two_person_call(bot.engine, channel)
    ts = thread_ts_of(bot.engine, session_id)
    link = f"https://{bot.slack.domain}.slack.com/archives/{channel}/p{ts.replace('.', '')}"

    refused = bot.slash(f"purge {link}", EVE)
    assert refused.startswith("Only the bot's admins may purge a thread") and purged_at(bot.engine, session_id) is None

    said = bot.slash(f"purge {link}", ADMIN)
    assert said.startswith(f"🧹 Purged the thread {ts} of <#{channel}>: 3 log entry(ies), 1 message(s) and 1 tool")
    assert purged_at(bot.engine, session_id) is not None and not log_entries(bot.engine, session_id)
    again = bot.slash(f"purge {link}", ADMIN)
    assert again.startswith("That thread was purged on ") and "nothing more to remove" in again

    assert bot.slash("purge https://example.com/nothing", ADMIN).startswith("expected a Slack message link")
    assert bot.slash("purge", ADMIN).startswith("Say `/mm purge LINK`")


def test_a_prompt_that_starts_with_audit_is_still_a_prompt() -> None:
    from bot.admin import is_admin_command

    assert is_admin_command("audit") and is_admin_command("audit 7d csv") and is_admin_command("PURGE https://x")
    assert not is_admin_command("audit the dependencies for known CVEs")
    assert not is_admin_command("purge the build cache please")


def purged_at(engine: Engine, session_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Session.purged_at).where(Session.id == session_id)).scalar_one()


def log_entries(engine: Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(SessionEvent.seq).where(SessionEvent.session_id == session_id)).all())
