"""Thread commands and `/mm`, end to end: signed mentions and slash commands to the real bot, real workers, the
scripted model. A command is the whole message, addressed to the bot."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from bot.commands import Command, parse
from playground.model_server import Reply
from playground.signed import FORM, SlackEventSender
from threads_support import CHANNEL, SECRET, OwnRedis, Stack, config, policy, stack

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

APPROVER, ALICE, EVE = "U0BOB", "U0ALICE", "U0EVE"


@pytest.fixture
def bot(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[tuple[Stack, SlackEventSender]]:
    reviewer = tmp_path / "reviewer.yaml"
    text = config(
        '{yolo: true, approvers: [U0BOB], repos: ["https://git.example.test/acme/*"]}',
        "mmConfigs: {reviewer: {config: reviewer.yaml, description: reviews changes}}",
    )
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=text) as threads:
        reviewer.write_text(f"model: {{url: {threads.model.url}, name: test-model}}\nsandbox: none\n")
        for user, name in ((APPROVER, "bob"), (ALICE, "alice"), (EVE, "eve")):
            threads.slack.add_user(user, name)
        threads.start_worker()
        base = threads.start_bot()
        with SlackEventSender(base, SECRET, response_url=threads.slack.response_url) as sender:
            yield threads, sender


def mention(sender: SlackEventSender, text: str, user: str = ALICE, thread_ts: str | None = None) -> str:
    ts = sender.new_ts()
    response = sender.app_mention(f"<@U0BOT> {text}", channel=CHANNEL, user=user, ts=ts, thread_ts=thread_ts)
    assert response.status_code == 200
    return ts


def session_of(threads: Stack, thread_ts: str) -> str:
    from chatops.inbox import session_of as find

    return threads.wait(lambda: find(threads.engine, CHANNEL, thread_ts), message="the session")


def ephemerals(threads: Stack, user: str) -> list[str]:
    return [m.get("text") or "" for m in threads.slack.ephemerals if m.get("to_user") == user]


def idle(threads: Stack, session_id: str, turns: int = 1) -> Any:
    return lambda: threads.turns_ended(session_id) >= turns and threads.status(session_id) == "idle"


@pytest.mark.parametrize(
    "text, command",
    [
        ("stop", Command("stop")),
        ("  STOP ", Command("stop")),
        ("yolo on", Command("yolo", ("on",))),
        ("ask reviewer look at it\nplease", Command("ask", ("reviewer", "look at it\nplease"))),
        ("repo https://x/y main", Command("repo", ("https://x/y", "main"))),
        ("stop the deploy script from failing", None),
        ("help me read this", None),
        ("yolo", None),
        ("new feature please", None),
    ],
)
def test_only_the_whole_message_is_a_command(text: str, command: Command | None) -> None:
    assert parse(text) == command


def test_stop_during_a_bash_call_ends_the_turn_within_seconds(bot) -> None:
    threads, sender = bot
    root = mention(sender, "run: sleep 60")
    session = session_of(threads, root)
    threads.wait(lambda: "bash: sleep 60" in threads.thread_text(root), message="the bash call")
    asked = time.monotonic()
    ts = mention(sender, "stop", thread_ts=root)
    # Slack's message twin of the mention: the same command, which must not run twice.
    twin = sender.message("<@U0BOT> stop", channel=CHANNEL, user=ALICE, ts=ts, thread_ts=root)
    assert twin.status_code == 200
    threads.wait(lambda: "⏹ Stopped." in threads.thread_text(root), timeout=15, message="the stop")
    assert time.monotonic() - asked < 10
    threads.wait(idle(threads, session), message="idle after the stop")
    assert threads.thread_text(root).count(f"<@{ALICE}> asked me to stop") == 1


def test_stop_during_generation_and_with_the_status_message_s_button(bot) -> None:
    threads, sender = bot
    threads.model.always(lambda request: Reply(text="slow answer", delay=60))
    root = mention(sender, "think hard")
    session = session_of(threads, root)

    def stop_button() -> dict[str, Any] | None:
        for m in threads.slack.messages(CHANNEL, root):
            for block in m.get("blocks") or []:
                if block.get("block_id") == "status":
                    return {"ts": m["ts"], "value": block["elements"][0]["value"]}
        return None

    found = threads.wait(stop_button, message="the status message with its Stop button")
    sender.block_action("stop", found["value"], user=EVE, channel=CHANNEL, message_ts=found["ts"], thread_ts=root)
    threads.wait(lambda: ephemerals(threads, EVE), message="eve may not stop it")
    sender.block_action("stop", found["value"], user=ALICE, channel=CHANNEL, message_ts=found["ts"], thread_ts=root)
    threads.wait(lambda: "⏹ Stopped." in threads.thread_text(root), timeout=15, message="the stop")
    threads.wait(idle(threads, session), message="idle after the stop")


def test_status_help_new_and_compact(bot) -> None:
    threads, sender = bot
    root = mention(sender, "first question")
    session = session_of(threads, root)
    threads.wait(idle(threads, session), message="the first turn")
    mention(sender, "second question", thread_ts=root)
    threads.wait(idle(threads, session, 2), message="the second turn")

    mention(sender, "status", thread_ts=root)
    threads.wait(lambda: any("*Status:* idle" in t for t in ephemerals(threads, ALICE)), message="the status")
    status = next(t for t in ephemerals(threads, ALICE) if "*Status:*" in t)
    assert "*Tokens:*" in status and "no (yolo)" in status
    mention(sender, "help", thread_ts=root)
    threads.wait(lambda: any("`compact`" in t for t in ephemerals(threads, ALICE)), message="the help")

    mention(sender, "compact", thread_ts=root)
    threads.wait(lambda: "🗜 compacted" in threads.thread_text(root), message="the compaction")
    assert "compaction" in threads.log_kinds(session)
    mention(sender, "new", thread_ts=root)
    threads.wait(lambda: "🆕 New conversation" in threads.thread_text(root), message="the new conversation")
    assert threads.log_kinds(session)[-1] == "reset"
    mention(sender, "third question", thread_ts=root)
    threads.wait(idle(threads, session, 3), message="the turn after new")
    assert [m["content"] for m in threads.model.messages() if m["role"] == "user"] == ["third question"]


def test_yolo_is_for_approvers_and_is_recorded_in_the_log(bot) -> None:
    threads, sender = bot
    root = mention(sender, "hello")
    session = session_of(threads, root)
    threads.wait(idle(threads, session), message="the first turn")
    mention(sender, "yolo off", user=EVE, thread_ts=root)
    threads.wait(lambda: ephemerals(threads, EVE), message="eve refused")
    assert "Only this channel's approvers may switch yolo" in ephemerals(threads, EVE)[0]
    mention(sender, "yolo off", user=APPROVER, thread_ts=root)
    threads.wait(lambda: "switched yolo off" in threads.thread_text(root), message="yolo off")
    threads.wait(lambda: "yolo" in threads.log_kinds(session), message="the log record")
    mention(sender, "run: echo gated-now", thread_ts=root)
    threads.wait(lambda: threads.status(session) == "awaiting_approval", message="the call now waits")

    # The approver's App Home lists the call with the same buttons; a click there decides it.
    sender.event({"type": "app_home_opened", "user": APPROVER, "channel": "D0BOB", "tab": "home"})
    homes = threads.wait(
        lambda: [v for v in threads.slack.views if v.get("user_id") == APPROVER and "gated-now" in str(v["blocks"])],
        message="the approver's home with the call",
    )
    actions = next(b for b in homes[-1]["blocks"] if b["type"] == "actions")
    approve = next(e for e in actions["elements"] if e["action_id"] == "approve")
    payload = {
        "type": "block_actions",
        "user": {"id": APPROVER, "username": "bob", "team_id": sender.team_id},
        "api_app_id": sender.api_app_id,
        "team": {"id": sender.team_id, "domain": sender.team_domain},
        "container": {"type": "view", "view_id": homes[-1]["id"]},
        "view": homes[-1],
        "trigger_id": sender.new_trigger_id(),
        "actions": [approve | {"block_id": actions["block_id"], "action_ts": sender.new_ts()}],
    }
    assert sender.send(urlencode({"payload": json.dumps(payload)}), FORM).status_code == 200
    threads.wait(idle(threads, session, 2), message="the call approved from App Home ran")
    assert "done: gated-now" in threads.thread_text(root)


def test_ask_sends_the_request_to_the_named_agent(bot) -> None:
    threads, sender = bot
    root = mention(sender, "hello")
    session = session_of(threads, root)
    threads.wait(idle(threads, session), message="the first turn")
    mention(sender, "ask nobody do it", thread_ts=root)
    threads.wait(lambda: any("no agent named `nobody`" in t for t in ephemerals(threads, ALICE)), message="refused")
    mention(sender, "ask reviewer check the spelling", thread_ts=root)
    threads.wait(idle(threads, session, 2), message="the asked turn")
    asked = [r for r in threads.model.requests if r.json["messages"][-1].get("content") == "check the spelling"]
    assert asked, "the reviewer got the prompt as its own request"
    assert "🗣" in threads.thread_text(root) or "ask_agent" in threads.thread_text(root)


def test_repo_before_the_first_turn_only_and_only_an_allowed_one(bot) -> None:
    threads, sender = bot
    root = sender.new_ts()
    threads.slack.add_message(CHANNEL, "a thread", ALICE)
    mention(sender, "repo file:///etc", thread_ts=root)
    threads.wait(lambda: ephemerals(threads, ALICE), message="file:// refused")
    assert "I can't work on that repository" in ephemerals(threads, ALICE)[0]
    mention(sender, "repo https://git.other.test/acme/app", thread_ts=root)
    threads.wait(lambda: len(ephemerals(threads, ALICE)) == 2, message="another host refused")
    mention(sender, "repo https://127.0.0.1/acme/app", thread_ts=root)
    threads.wait(lambda: len(ephemerals(threads, ALICE)) == 3, message="an internal address refused")
    mention(sender, "repo https://git.example.test/acme/app.git main", thread_ts=root)
    threads.wait(lambda: "📦 This thread works on" in threads.thread_text(root), message="the repository set")


def test_the_slash_command_answers_privately_and_starts_threads(bot) -> None:
    threads, sender = bot
    assert sender.slash_command("/mm", "help", user=ALICE, channel=CHANNEL).status_code == 200
    threads.wait(lambda: threads.slack.responses, message="the help, by the response URL")
    assert "`compact`" in threads.slack.responses[0]["body"]["text"]
    sender.slash_command("/mm", "what is in the repository?", user=ALICE, channel=CHANNEL)

    def started() -> str | None:
        roots = [m for m in threads.slack.messages(CHANNEL) if "asked: what is in the repository?" in m.get("text", "")]
        return roots[0]["ts"] if roots else None

    root = threads.wait(started, message="the new thread")
    session = session_of(threads, root)
    threads.wait(idle(threads, session), message="its turn")
    sender.slash_command("/mm", "status", user=ALICE, channel=CHANNEL)
    threads.wait(lambda: len(threads.slack.responses) == 2, message="the status")
    assert "*Status:* idle" in threads.slack.responses[1]["body"]["text"]
    roots = len(threads.slack.messages(CHANNEL))
    sender.slash_command("/mm", "repo file:///etc/passwd", user=ALICE, channel=CHANNEL)
    threads.wait(lambda: len(threads.slack.responses) == 3, message="the refusal")
    assert "I can't work on that repository" in threads.slack.responses[2]["body"]["text"]
    assert len(threads.slack.messages(CHANNEL)) == roots  # no thread was started for it


def test_app_home_shows_the_user_s_sessions_and_the_approvals_they_may_decide(bot) -> None:
    threads, sender = bot
    threads.model.always(policy)
    root = mention(sender, "hello")
    session = session_of(threads, root)
    threads.wait(idle(threads, session), message="the turn")
    response = sender.event({"type": "app_home_opened", "user": ALICE, "channel": "D0ALICE", "tab": "home"})
    assert response.status_code == 200
    view = threads.wait(lambda: [v for v in threads.slack.views if v.get("user_id") == ALICE], message="the home")
    text = str(view[-1]["blocks"])
    assert "Your sessions" in text and "idle" in text and "Nothing waits for your decision" in text


def test_the_bot_scrubs_a_secret_a_config_reload_brought(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    """Issue 21, second round: the bot computed its secrets once, at start, while the workers follow the config's
    reloads. An edit that names a new `model.apiKeyEnv` makes that key a secret of the bot's gateway too."""
    later = "sk-later-9f3c1e7a2b"
    text = config("{yolo: true}", "mmConfigs: {reviewer: {config: reviewer.yaml}}")
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=text, extra_env={"MM_LATER_KEY": later}) as threads:
        (tmp_path / "reviewer.yaml").write_text(f"model: {{url: {threads.model.url}, name: test-model}}\n")
        threads.slack.add_user(ALICE, "alice")
        base = threads.start_bot()
        with SlackEventSender(base, SECRET, response_url=threads.slack.response_url) as sender:
            mention(sender, f"ask {later} do it")  # not a secret yet: said as written
            threads.wait(lambda: any(later in t for t in ephemerals(threads, ALICE)), message="the first answer")
            (tmp_path / "mm.yaml").write_text(text + "model: {apiKeyEnv: MM_LATER_KEY}\n")
            time.sleep(1.5)  # the bot looks at its file once a second
            mention(sender, f"ask {later} do it")
            threads.wait(lambda: len(ephemerals(threads, ALICE)) == 2, message="the second answer")
            second = ephemerals(threads, ALICE)[1]
            assert "There is no agent named `***`" in second and later not in second
