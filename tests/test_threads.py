"""Slack threads end to end on real parts: `celery worker` processes, PostgreSQL, a Redis of the test's own, the
Slack emulator and the scripted model. The bot's hand-off is reproduced as the bot does it (record, then
enqueue); tests/test_threads_inbound.py drives the same through the real bot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from chatops.schema import ToolCall as ToolCallRow
from mm_testkit.model_server import Reply
from threads_support import OwnRedis, Stack, policy, rabbitmq_vhost, stack

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def threads(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[Stack]:
    with stack(tmp_path, fresh_pg_url, own_redis.url) as s:
        yield s


@pytest.fixture(params=["redis", "rabbitmq", "sqlite"])
def any_broker(request: pytest.FixtureRequest, tmp_path: Path, fresh_pg_url: str) -> Iterator[Stack]:
    """The same stack on each broker the service supports: Redis (the default), RabbitMQ by URL, and the
    embedded SQLite broker of `mm-bot dev` (kombu's SQLAlchemy transport)."""
    if request.param == "redis":
        server = OwnRedis(tmp_path / "redis")
        server.start()
        try:
            with stack(tmp_path, fresh_pg_url, server.url) as s:
                yield s
        finally:
            server.stop()
    elif request.param == "rabbitmq":
        with rabbitmq_vhost() as url, stack(tmp_path, fresh_pg_url, url) as s:
            yield s
    else:
        with stack(tmp_path, fresh_pg_url, f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}") as s:
            yield s


def answered(s: Stack, session_id: str, turns: int = 1) -> Callable[[], bool]:
    return lambda: s.turns_ended(session_id) >= turns and s.status(session_id) == "idle"


def test_a_mention_becomes_an_answer_with_tool_lines_and_recap(threads: Stack) -> None:
    threads.start_worker()
    first = threads.post("<@U0BOT> run: echo hello-from-bash")
    thread_ts = first.thread_ts
    threads.wait(answered(threads, first.session_id), message="the first turn")
    text = threads.thread_text(thread_ts)
    assert "🛠️ bash: echo hello-from-bash" in text
    assert "hello-from-bash" in text.split("🛠️ bash: echo hello-from-bash", 1)[1]  # the preview
    assert "done: hello-from-bash" in text  # the answer
    assert "⚙ 1 command(s)" in text and "tokens" in text  # the recap

    # A reply in the thread, without a mention, continues the same session: the model sees the first turn.
    second = threads.post("and again?", thread_ts=thread_ts)
    assert second.session_id == first.session_id
    threads.wait(answered(threads, first.session_id, 2), message="the second turn")
    conversation = [m["content"] for m in threads.model.messages() if m["role"] == "user"]
    assert conversation[-2:] == ["<@U0BOT> run: echo hello-from-bash", "and again?"]
    assert "answer: and again?" in threads.thread_text(thread_ts)
    with threads.engine.connect() as conn:
        decisions = conn.execute(select(ToolCallRow.decision).where(ToolCallRow.session_id == first.session_id))
        assert list(decisions.scalars()) == ["auto"]  # yolo channel: it ran without asking, and the audit says so


def test_kill_9_during_a_model_call_another_worker_finishes_the_turn(any_broker: Stack) -> None:
    threads = any_broker
    slow = {"first": True}

    def slow_once(request: dict) -> Reply:
        reply = policy(request)
        if slow["first"] and request["messages"][-1]["role"] == "tool":
            slow["first"] = False
            reply.delay = 60  # the worker is killed while it waits for this answer
        return reply

    threads.model.always(slow_once)
    threads.start_worker("w1")
    posted = threads.post("run: echo once >> count.txt")
    threads.wait(lambda: not slow["first"], message="the slow model call")
    threads.kill_worker("w1")
    threads.start_worker("w2")
    threads.wait(answered(threads, posted.session_id), timeout=90, message="the resumed turn")
    text = threads.thread_text(posted.thread_ts)
    assert "resumed" in text
    assert text.count("🛠️ bash: echo once") == 1  # the completed call did not run again
    kinds = threads.log_kinds(posted.session_id)
    assert kinds.count("tool_started") == 1 and kinds.count("tool_result") == 1
    assert (threads.workspace(posted.session_id) / "count.txt").read_text() == "once\n"


def test_kill_9_during_a_bash_call_the_call_is_reported_interrupted_not_rerun(threads: Stack) -> None:
    threads.start_worker("w1")
    posted = threads.post("run: echo started >> ran.txt; sleep 60")
    marker = threads.workspace(posted.session_id) / "ran.txt"
    threads.wait(marker.exists, message="the bash call to start")
    threads.kill_worker("w1")
    threads.start_worker("w2")
    threads.wait(answered(threads, posted.session_id), timeout=90, message="the resumed turn")
    assert marker.read_text().count("started") == 1  # not run a second time
    # The model was told, in the core's words, that the call was cut off.
    tool_messages = [m["content"] for m in threads.model.messages() if m["role"] == "tool"]
    assert any("interrupted" in m for m in tool_messages)
    assert "resumed" in threads.thread_text(posted.thread_ts)


def test_flushed_and_restarted_redis_loses_no_queued_turn(threads: Stack, own_redis: OwnRedis) -> None:
    posted = [threads.post(f"message {i}") for i in range(3)]
    assert own_redis.queued() == 3
    own_redis.flush()  # the hand-offs are gone
    later = threads.post("message 3")
    own_redis.stop()  # and the broker goes away with one more queued
    own_redis.start()
    threads.start_worker()
    for recorded in [*posted, later]:
        threads.wait(answered(threads, recorded.session_id), message=f"session {recorded.session_id}")
    assert own_redis.queued() == 0


def test_messages_to_a_busy_thread_are_taken_in_order_by_the_next_turn(threads: Stack) -> None:
    gate = {"open": False}

    def held(request: dict) -> Reply:
        reply = policy(request)
        if not gate["open"] and request["messages"][-1]["content"] == "first":
            reply.delay = 3  # long enough for two more messages to arrive while the turn runs
        return reply

    threads.model.always(held)
    threads.start_worker("w1")
    threads.start_worker("w2")  # two workers: the lease keeps them from running the thread at once
    first = threads.post("first")
    thread_ts = first.thread_ts
    threads.wait(lambda: threads.status(first.session_id) == "running", message="the first turn to start")
    threads.post("second", thread_ts=thread_ts)
    threads.post("third", thread_ts=thread_ts, user="U0BOB")
    threads.wait(answered(threads, first.session_id, 2), message="both turns")
    users = [m["content"] for m in threads.model.messages() if m["role"] == "user"]
    assert users == ["first", "<@U0ALICE>: second\n\n<@U0BOB>: third"]
    assert threads.turns_ended(first.session_id) == 2
