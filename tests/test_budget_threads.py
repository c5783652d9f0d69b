"""Budgets end to end on real parts: the real bot (`mm-bot serve`), a `celery worker`, PostgreSQL, a Redis of the
test's own, the Slack emulator and the scripted model, each of whose answers costs 500 tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from chatops.inbox import session_of
from chatops.schema import Error as ErrorRow
from chatops.schema import ModelUsage, SessionEvent
from mmbot_helpers import free_port
from playground.model_server import Reply
from playground.signed import SlackEventSender
from test_operations import sample, scrape
from threads_support import CHANNEL, SECRET, OwnRedis, Stack, config, finished, policy, run_now, stack

pytestmark = [pytest.mark.timeout(240), pytest.mark.process]

APPROVER, ALICE, EVE = "U0BOB", "U0ALICE", "U0EVE"


def costly(request: dict[str, Any]) -> Reply:
    """The threads' model (threads_support.policy), each answer 400 prompt and 100 completion tokens."""
    return dataclasses.replace(policy(request), usage=(400, 100))


@pytest.fixture
def threads(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis, request: pytest.FixtureRequest) -> Iterator[Stack]:
    text = config("{yolo: true, approvers: [U0BOB]}", request.param)
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=text) as s:
        s.model.always(costly)
        # Picked once the stack's own servers listen (test_operations.py says why).
        s.extra_env |= {"MM_METRICS_PORT": str(free_port())}
        for user, name in ((APPROVER, "bob"), (ALICE, "alice"), (EVE, "eve")):
            s.slack.add_user(user, name)
        s.start_worker()
        yield s


def idle(threads: Stack, session_id: str, turns: int) -> Any:
    return lambda: threads.turns_ended(session_id) >= turns and threads.status(session_id) == "idle"


def outcomes(threads: Stack, session_id: str) -> list[str]:
    with threads.engine.connect() as conn:
        payloads = conn.execute(
            select(SessionEvent.payload)
            .where(SessionEvent.session_id == session_id, SessionEvent.kind == "turn_ended")
            .order_by(SessionEvent.seq)
        )
        return [p["outcome"] for p in payloads.scalars()]


@pytest.mark.parametrize("threads", ["budgets: {threadTokens: 400}"], indirect=True)
def test_a_thread_budget_ends_the_turn_with_its_line_and_the_recap_shows_the_use(threads: Stack) -> None:
    first = threads.post("<@U0BOT> run: echo within-budget")
    threads.wait(idle(threads, first.session_id, 1), message="the turn the budget ends")
    text = threads.thread_text(first.thread_ts)
    # The call the first answer asked for ran and was shown; then no second model call, and the line says why.
    assert "🛠️ bash: echo within-budget" in text and "done:" not in text
    line = "⛔ This thread's budget of 400 tokens is used (500). An approver can raise it: `@mm budget 800`."
    assert line in text
    assert "⚙ 1 command(s) · 500 tokens\n💰 this thread: 500 / 400 tokens" in text  # the recap, and under it the use
    assert len(threads.model.requests) == 1
    assert outcomes(threads, first.session_id) == ["budget"]
    with threads.engine.connect() as conn:
        usage = conn.execute(
            select(ModelUsage.channel_id, ModelUsage.model, ModelUsage.prompt_tokens, ModelUsage.completion_tokens)
        ).all()
        errors = conn.execute(select(ErrorRow.where, ErrorRow.message).where(ErrorRow.session_id == first.session_id))
        assert [tuple(e) for e in errors] == [("budget", line)]
    assert [tuple(u) for u in usage] == [(CHANNEL, "test-model", 400, 100)]
    metrics = scrape(int(threads.extra_env["MM_METRICS_PORT"]))
    assert sample(metrics, "mm_budget_stops_total", budget="thread_tokens") == 1
    assert sample(metrics, "mm_turns_finished_total", outcome="budget") == 1

    # The thread's next turn is ended before it calls the model at all.
    threads.post("and again?", thread_ts=first.thread_ts)
    threads.wait(idle(threads, first.session_id, 2), message="the next turn, refused")
    assert threads.thread_text(first.thread_ts).count(line) == 2
    assert len(threads.model.requests) == 1
    assert outcomes(threads, first.session_id) == ["budget", "budget"]


@pytest.mark.parametrize("threads", ["budgets: {threadTokens: 50k}"], indirect=True)
def test_a_requester_lowers_the_thread_s_budget_and_only_an_approver_raises_it_above_the_channel_s(
    threads: Stack,
) -> None:
    base = threads.start_bot()
    with SlackEventSender(base, SECRET, response_url=threads.slack.response_url) as sender:

        def mention(text: str, user: str = ALICE, thread_ts: str | None = None) -> str:
            ts = sender.new_ts()
            response = sender.app_mention(f"<@U0BOT> {text}", channel=CHANNEL, user=user, ts=ts, thread_ts=thread_ts)
            assert response.status_code == 200
            return ts

        def privately(user: str, count: int) -> str:
            threads.wait(
                lambda: len([m for m in threads.slack.ephemerals if m.get("to_user") == user]) >= count,
                message=f"{user}'s answer {count}",
            )
            return [m.get("text") or "" for m in threads.slack.ephemerals if m.get("to_user") == user][count - 1]

        root = mention("hello")
        session = threads.wait(lambda: session_of(threads.engine, CHANNEL, root), message="the session")
        threads.wait(idle(threads, session, 1), message="the first turn")

        mention("budget 1k", thread_ts=root)  # Alice wrote in the thread: she may lower it
        set_line = f"💰 <@{ALICE}> set this thread's budget to 1k tokens (500 used so far)."
        threads.wait(lambda: set_line in threads.thread_text(root), message="the budget lowered, said in the thread")
        mention("budget 60k", thread_ts=root)  # above the channel's: only an approver
        assert privately(ALICE, 1) == (
            f"Only this channel's approvers may raise this thread's budget above 50k tokens (<@{APPROVER}>). "
            "Nothing was changed."
        )
        mention("budget lots", thread_ts=root)
        assert privately(ALICE, 2) == (
            'I can\'t set that budget: expected a number of tokens such as 20000, 20k or 1.5M, got "lots". '
            "Nothing was changed."
        )
        mention("budget 0", thread_ts=root)
        assert "(at least 1), got" in privately(ALICE, 3)
        mention("budget 10", user=EVE, thread_ts=root)  # Eve never wrote here
        assert privately(EVE, 1) == (
            "Only the people in this conversation and the channel's approvers may set its budget. Nothing was changed."
        )

        mention("second question", thread_ts=root)  # 500 of 1k used: the call is made, and uses the rest
        threads.wait(idle(threads, session, 2), message="the second turn")
        mention("third question", thread_ts=root)
        threads.wait(idle(threads, session, 3), message="the third turn, refused")
        assert "⛔ This thread's budget of 1k tokens is used (1k)." in threads.thread_text(root)
        assert outcomes(threads, session) == ["answered", "answered", "budget"]

        mention("budget 60k", user=APPROVER, thread_ts=root)
        threads.wait(lambda: f"<@{APPROVER}> set this thread's budget to 60k" in threads.thread_text(root))
        mention("fourth question", thread_ts=root)
        threads.wait(idle(threads, session, 4), message="the fourth turn")
        assert "answer: fourth question" in threads.thread_text(root)
        assert "💰 this thread: 1.5k / 60k tokens" in threads.thread_text(root)

        mention("budget", thread_ts=root)
        shown = privately(ALICE, 4)
        assert shown.startswith("💰 This thread's budgets:\n• this thread: 1.5k / 60k tokens\n")
        assert f"set here by <@{APPROVER}> (the channel's is 50k)" in shown
        assert outcomes(threads, session)[-1] == "answered"


JOBS = f"""jobs:
  - {{name: frugal, schedule: "0 3 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "run: echo frugal",
      budgets: {{threadTokens: 400}}}}
  - {{name: brief, schedule: "0 4 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "take your time",
      budgets: {{turnTime: 2s}}}}"""


@pytest.mark.parametrize("threads", [JOBS], indirect=True)
def test_a_job_run_over_its_budget_fails_with_the_budget_as_its_reason(threads: Stack) -> None:
    run = finished(threads, run_now(threads, "frugal"))
    said = "this thread's budget of 400 tokens is used (500)"
    assert run.status == "failed" and run.error == said
    summary = threads.wait(lambda: "failed after" in (t := threads.thread_text(run.root_ts or "")) and t)
    assert f": {said} · ⚙ 1 command(s) · 500 tokens" in summary
    assert "⛔ This thread's budget of 400 tokens is used (500)." in summary  # the line, before the summary

    # The job's turnTime lowers the worker's turn limit: the run stops there, and says which limit it was.
    threads.model.always(Reply(text="thinking", stall_after=1, stall_for=60))
    slow = finished(threads, run_now(threads, "brief"))
    assert slow.status == "failed" and slow.error == "it ran for longer than its time budget (2 s)"
    thread = threads.wait(lambda: "failed after" in (t := threads.thread_text(slow.root_ts or "")) and t)
    assert "⏱ This turn's budget of 2 s (`budgets.turnTime`) is used: the turn was stopped." in thread
