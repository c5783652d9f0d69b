"""Approval policies, the two-person rule, reminders and escalation, end to end: real `celery worker` and
`mm-bot serve` processes, PostgreSQL, Redis, the Slack emulator, signed clicks and the scripted model. Time is
injected where it matters (the reminder and the escalation are housekeeping's, called here with `now`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from chatops.config import load_config
from chatops.schema import Approval, ApprovalDecision, ToolCall
from mm_testkit.redis_server import OwnRedis
from mmbot_helpers import clean_env, mm_bot
from playground.signed import SlackEventSender
from threads_support import (
    CHANNEL,
    SECRET,
    Stack,
    approval_messages,
    buttons,
    click,
    config,
    finished,
    run_now,
    stack,
    waiting_message,
)
from workers.nudges import nudge_waiting

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

ALICE, BOB, CAROL, DAVE, ERIN = "U0ALICE", "U0BOB", "U0CAROL", "U0DAVE", "U0ERIN"
POLICIES = """\
  policies:
    - {name: root wipe, tool: bash, commands: ["rm -rf /", "rm -rf /*"], deny: true}
    - {name: two-person push, tool: bash, commands: ["git push*"], ask: 2}
    - {name: CI files, paths: [".github/**"], ask: 2}
    - {name: sources, tool: write_file, paths: ["src/**"], allow: true}"""
GOVERNED = config(
    "{yolo: false, approvers: [U0BOB, U0CAROL, S0LEADS]}",
    "approvals:",
    "  timeout: 1h",
    "  remindAfter: 10m",
    "  escalateAfter: 20m",
    "  escalateTo: [S0ONCALL]",
    POLICIES,
)


def _stack(tmp_path: Path, pg: str, redis: OwnRedis, text: str) -> Iterator[tuple[Stack, SlackEventSender]]:
    with stack(tmp_path, pg, redis.url, config=text) as threads:
        for user, name in ((ALICE, "alice"), (BOB, "bob"), (CAROL, "carol"), (DAVE, "dave"), (ERIN, "erin")):
            threads.slack.add_user(user, name)
        threads.slack.add_usergroup("S0LEADS", "leads", [DAVE, ALICE])
        threads.slack.add_usergroup("S0ONCALL", "oncall", [ERIN])
        threads.start_worker()
        base = threads.start_bot()
        with SlackEventSender(base, SECRET, response_url=threads.slack.response_url) as sender:
            yield threads, sender


@pytest.fixture
def governed(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[tuple[Stack, SlackEventSender]]:
    yield from _stack(tmp_path, fresh_pg_url, own_redis, GOVERNED)


def shown(threads: Stack, message: dict[str, Any]) -> str:
    current = threads.slack.message(CHANNEL, message["ts"])
    assert current is not None
    return json.dumps(current["blocks"], ensure_ascii=False)


def ephemerals_to(threads: Stack, user: str) -> list[str]:
    return [m.get("text") or "" for m in threads.slack.ephemerals if m.get("to_user") == user]


def tool_outputs(threads: Stack) -> list[str]:
    return [m["content"] for m in threads.model.messages() if m["role"] == "tool"]


def idle(threads: Stack, session_id: str, turns: int = 1) -> Callable[[], bool]:
    return lambda: threads.turns_ended(session_id) >= turns and threads.status(session_id) == "idle"


def refused(threads: Stack, user: str, words: str) -> str:
    return threads.wait(
        lambda: next((t for t in ephemerals_to(threads, user) if words in t), None),
        message=f"{user} refused: {words} (told: {ephemerals_to(threads, user)})",
    )


def test_a_git_push_in_a_list_runs_only_after_two_distinct_approvers(governed) -> None:
    threads, sender = governed
    posted = threads.post("run: echo first && git push origin x; echo after", user=ALICE)
    message = waiting_message(threads, posted.thread_ts)
    text = shown(threads, message)
    assert "Rule “two-person push”" in text and "matched `git push origin x`" in text, text
    assert "needs 2 different approvers, not who asked" in text
    assert list(buttons(message)) == ["approve", "reject"]  # "Approve all" never covers a rule's call

    click(sender, message, "approve", ALICE, posted.thread_ts)  # the requester, though in S0LEADS
    refused(threads, ALICE, "the rule “two-person push” needs its approval from 2 other people")
    click(sender, message, "approve", BOB, posted.thread_ts)
    threads.wait(lambda: "1 of 2 so far: <@U0BOB>" in shown(threads, message), message="Bob's approval counted")
    click(sender, message, "approve", BOB, posted.thread_ts)  # the same approver again counts for nothing
    refused(threads, BOB, "You have already approved this call: it needs one more approval from someone else")
    assert threads.status(posted.session_id) == "awaiting_approval" and tool_outputs(threads) == []

    click(sender, message, "approve", DAVE, posted.thread_ts)  # a lead, through the channel's user group
    threads.wait(idle(threads, posted.session_id), message="the pushed turn")
    assert len(tool_outputs(threads)) == 1 and "first" in tool_outputs(threads)[0]
    assert "Approved by <@U0BOB> and <@U0DAVE>" in shown(threads, message)
    with threads.engine.connect() as conn:
        call = conn.execute(select(ToolCall.rule, ToolCall.requested_by, ToolCall.decision)).one()
        votes = conn.execute(select(ApprovalDecision.user_id, ApprovalDecision.vote, ApprovalDecision.rule)).all()
    assert tuple(call) == ("two-person push", ALICE, "approved")
    assert sorted(tuple(v) for v in votes) == [
        (BOB, "approve", "two-person push"),
        (DAVE, "approve", "two-person push"),
    ]

    # The audit, as an operator exports it, of the call the real flow recorded: who asked, the rule, both
    # approvers and when, the outcome.
    exported = mm_bot("audit", "--format", "jsonl", env=clean_env(DATABASE_URL=threads.database_url), cwd=threads.tmp)
    assert exported.returncode == 0, exported.stderr
    [record] = [json.loads(line) for line in exported.stdout.splitlines()]
    assert (record["requested_by"], record["rule"], record["needed"]) == ([ALICE], "two-person push", 2)
    assert [(d["by"], d["vote"]) for d in record["decisions"]] == [(BOB, "approve"), (DAVE, "approve")]
    assert all(d["at"].endswith("Z") for d in record["decisions"]) and record["outcome"] == "ok"


def test_an_edit_of_a_ci_file_asks_twice_while_a_source_file_is_written_without_asking(governed) -> None:
    threads, sender = governed
    source = threads.post("write: src/x.py", user=ALICE)
    threads.wait(idle(threads, source.session_id), message="the source edit, without asking")
    assert (threads.workspace(source.session_id) / "src" / "x.py").read_text() == "written by the model\n"
    assert approval_messages(threads, source.thread_ts) == []

    ci = threads.post("write: .github/workflows/ci.yml", user=ALICE)
    message = waiting_message(threads, ci.thread_ts)
    assert "Rule “CI files”" in shown(threads, message) and "needs 2 different approvers" in shown(threads, message)
    click(sender, message, "approve", CAROL, ci.thread_ts)
    threads.wait(lambda: "1 of 2 so far" in shown(threads, message), message="Carol's approval counted")
    assert not (threads.workspace(ci.session_id) / ".github").exists()
    click(sender, message, "approve", BOB, ci.thread_ts)
    threads.wait(idle(threads, ci.session_id), message="the CI edit, approved twice")
    assert (threads.workspace(ci.session_id) / ".github" / "workflows" / "ci.yml").exists()


def test_a_reminder_and_an_escalation_come_once_each_at_their_times(governed) -> None:
    threads, sender = governed
    posted = threads.post("run: echo waiting-for-someone", user=ALICE)
    message = waiting_message(threads, posted.thread_ts)
    with threads.engine.connect() as conn:
        asked = conn.execute(select(Approval.created_at)).scalar_one()
    config = load_config(threads.tmp / "mm.yaml", threads.env)

    def nudges(after: timedelta) -> int:
        return nudge_waiting(threads.engine, config, (), now=asked + after)

    assert nudges(timedelta(minutes=9)) == 0
    assert nudges(timedelta(minutes=10)) == 1
    assert nudges(timedelta(minutes=11)) == 0  # once
    reminder = threads.thread_text(posted.thread_ts).splitlines()
    line = next(x for x in reminder if x.startswith("⏰"))
    # The channel's approvers, a group by its members, never the requester (though one of the leads).
    assert line.startswith("⏰ <@U0BOB>, <@U0CAROL>, <@U0DAVE>: a call has waited 10 min for a decision")
    assert "echo waiting-for-someone" in line and ALICE not in line

    click(sender, message, "approve", ERIN, posted.thread_ts)  # on call, but not yet asked
    refused(threads, ERIN, "Only this channel's approvers may approve calls")
    assert nudges(timedelta(minutes=20)) == 1
    assert nudges(timedelta(minutes=30)) == 0
    escalated = next(x for x in threads.thread_text(posted.thread_ts).splitlines() if x.startswith("⏫"))
    assert escalated.startswith("⏫ No decision after 20 min, so <@U0ERIN> may now decide this call too")
    assert "escalated" in shown(threads, message) and "`S0ONCALL`" in shown(threads, message)
    # Erin may decide this call, not grant its requester the thread: no Approve all on an escalated call.
    current = threads.slack.message(CHANNEL, message["ts"])
    assert current is not None and list(buttons(current)) == ["approve", "reject"]
    click(sender, message, "approve", ERIN, posted.thread_ts)
    threads.wait(idle(threads, posted.session_id), message="the turn Erin approved")
    assert tool_outputs(threads) == ["waiting-for-someone\n"]


JOB = f'jobs: [{{name: wipe, schedule: "0 3 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "run: rm -rf /*"}}]'
YOLO = config("{yolo: true, approvers: [U0BOB, U0CAROL]}", "approvals:", "  timeout: never", POLICIES, JOB)


@pytest.fixture
def yolo(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[tuple[Stack, SlackEventSender]]:
    yield from _stack(tmp_path, fresh_pg_url, own_redis, YOLO)


def test_a_deny_rule_holds_in_a_yolo_channel_and_a_job_and_a_rule_s_ask_holds_without_expiry(yolo) -> None:
    threads, _sender = yolo
    posted = threads.post("run: rm -rf /", user=ALICE)
    threads.wait(idle(threads, posted.session_id), message="the refused turn")
    assert tool_outputs(threads) == ["[command rejected by the user]"]
    said = threads.thread_text(posted.thread_ts)
    assert "⛔ Refused by the approval policy's rule “root wipe” (it matched `rm -rf /`)" in said
    with threads.engine.connect() as conn:
        assert conn.execute(select(ToolCall.rule, ToolCall.status)).one() == ("root wipe", "rejected")

    # A job whose yolo is on: the rule refuses its call too.
    finished(threads, run_now(threads, "wipe"))
    with threads.engine.connect() as conn:
        calls = conn.execute(select(ToolCall.rule, ToolCall.status, ToolCall.session_id)).all()
    assert [(c.rule, c.status) for c in calls] == [("root wipe", "rejected")] * 2

    # A yolo channel runs a plain command without asking, but a rule's ask holds: two people, and no expiry.
    plain = threads.post("run: echo plain", user=ALICE)
    threads.wait(idle(threads, plain.session_id), message="the plain command, without asking")
    assert tool_outputs(threads)[-1] == "plain\n" and approval_messages(threads, plain.thread_ts) == []
    pushed = threads.post("run: echo yolo && git push origin main", user=ALICE)
    message = waiting_message(threads, pushed.thread_ts)
    with threads.engine.connect() as conn:
        row = conn.execute(select(Approval.expires_at, Approval.needed).where(Approval.rule.is_not(None))).one()
    assert tuple(row) == (None, 2)
    assert "expires" not in shown(threads, message) and "Rule “two-person push”" in shown(threads, message)
