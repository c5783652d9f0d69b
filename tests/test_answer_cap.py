"""At most `worker.maxToolCallsPerAnswer` calls of one model answer are carried out, end to end: a real
`mm-bot worker`, PostgreSQL, Redis, the Slack emulator and the scripted model answering with 150 calls at once.
Without the bound each call became a Slack message (an approval to ask, in a gated channel) and a row of App
Home's pending list: minutes of Slack's rate limit for the thread and the token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from chatops.schema import Approval, SessionEvent
from playground.model_server import Reply, ToolCall
from threads_support import OwnRedis, Stack, approval_messages, config, stack

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

MANY = 150
CAP = 16
LINE = (
    f"✂️ The model asked for {MANY} tool calls in one answer; only the first {CAP} are taken up, the other "
    f"{MANY - CAP} were not run."
)


def flood(request: dict[str, Any]) -> Reply:
    """150 commands in the first answer; then an answer saying how many results came back."""
    results = [m for m in request["messages"] if m["role"] == "tool"]
    if results:
        return Reply(text=f"got {len(results)} results")
    return Reply(tool_calls=[ToolCall("bash", {"command": f"echo {i} > f{i}"}) for i in range(MANY)])


@pytest.fixture
def threads(request: pytest.FixtureRequest, tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[Stack]:
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config(request.param)) as s:
        s.model.always(flood)
        s.start_worker()
        yield s


def results(threads: Stack, session_id: str) -> list[dict[str, Any]]:
    with threads.engine.connect() as conn:
        payloads = conn.execute(
            select(SessionEvent.payload)
            .where(SessionEvent.session_id == session_id, SessionEvent.kind == "tool_result")
            .order_by(SessionEvent.seq)
        ).scalars()
        return [p if isinstance(p, dict) else json.loads(p) for p in payloads]


@pytest.mark.parametrize("threads", ["{yolo: false, approvers: [U0BOB]}"], indirect=True)
def test_a_gated_thread_is_asked_at_most_the_cap_and_told_the_rest_did_not_run(threads: Stack) -> None:
    posted = threads.post("make 150 files")
    threads.wait(lambda: threads.status(posted.session_id) == "awaiting_approval", message="the waiting turn")
    asked = approval_messages(threads, posted.thread_ts)
    assert len(asked) == CAP
    with threads.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Approval)).scalar_one() == CAP  # App Home's list
    assert threads.thread_text(posted.thread_ts).count(LINE) == 1
    dropped = [r for r in results(threads, posted.session_id) if r["status"] == "dropped"]
    assert len(dropped) == MANY - CAP
    assert {r["output"] for r in dropped} == {
        f"[error: not run — the answer asked for {MANY} tool calls and at most {CAP} of one answer are carried "
        f"out: the first {CAP} were taken up, this one was not — ask for it again in a later answer if it is "
        "still needed]"
    }
    assert not list(threads.workspace(posted.session_id).glob("f*"))


@pytest.mark.parametrize("threads", ["{yolo: true}"], indirect=True)
def test_with_yolo_at_most_the_cap_run(threads: Stack) -> None:
    posted = threads.post("make 150 files")
    threads.wait(
        lambda: threads.turns_ended(posted.session_id) >= 1 and threads.status(posted.session_id) == "idle",
        message="the turn",
    )
    made = sorted(p.name for p in threads.workspace(posted.session_id).glob("f*"))
    assert made == sorted(f"f{i}" for i in range(CAP))
    text = threads.thread_text(posted.thread_ts)
    assert text.count(LINE) == 1 and f"got {MANY} results" in text
    assert text.count("bash: echo") == CAP  # one line per call carried out, none for the others
    assert f"⚙ {CAP} command(s)" in text
