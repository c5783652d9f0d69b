"""Budgets end to end on real parts: a `celery worker`, PostgreSQL, a Redis of the
test's own, the Slack emulator and the scripted model, each of whose answers costs 500 tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from chatops.schema import Error as ErrorRow
from chatops.schema import ModelUsage, SessionEvent
from playground.model_server import Reply
from test_job_runs import finished, run_now
from threads_support import CHANNEL, OwnRedis, Stack, config, policy, stack

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

    # The thread's next turn is ended before it calls the model at all.
    threads.post("and again?", thread_ts=first.thread_ts)
    threads.wait(idle(threads, first.session_id, 2), message="the next turn, refused")
    assert threads.thread_text(first.thread_ts).count(line) == 2
    assert len(threads.model.requests) == 1
    assert outcomes(threads, first.session_id) == ["budget", "budget"]


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
