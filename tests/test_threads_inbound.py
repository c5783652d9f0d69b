"""The whole path, from a signed Slack request to the answer in the thread: the real bot (`mm-bot serve`, over
HTTP and over Socket Mode), a real `celery worker`, PostgreSQL, a Redis of the test's own, the Slack emulator
and the scripted model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from chatops.schema import Session
from mm_testkit.redis_server import OwnRedis
from playground.signed import SlackEventSender
from threads_support import CHANNEL, SECRET, Stack, stack

pytestmark = [pytest.mark.timeout(240), pytest.mark.process]


@pytest.fixture
def threads(tmp_path: Path, fresh_pg_url: str) -> Iterator[Stack]:
    server = OwnRedis(tmp_path / "redis")
    server.start()
    try:
        with stack(tmp_path, fresh_pg_url, server.url) as s:
            s.start_worker()
            yield s
    finally:
        server.stop()


def session_of(s: Stack, channel: str, thread_ts: str) -> str:
    def find() -> str | None:
        with s.engine.connect() as conn:
            return conn.execute(
                select(Session.id).where(Session.channel_id == channel, Session.thread_ts == thread_ts)
            ).scalar_one_or_none()

    return s.wait(find, message=f"the session of {channel}/{thread_ts}")


def answered(s: Stack, session_id: str, turns: int = 1) -> None:
    s.wait(lambda: s.turns_ended(session_id) >= turns and s.status(session_id) == "idle", message="the answer")


def test_a_mention_over_http_is_answered_in_its_thread_and_a_retry_starts_nothing(threads: Stack) -> None:
    base = threads.start_bot()
    with SlackEventSender(base, SECRET, bot_user_id=threads.slack.bot_user_id) as sender:
        mention = f"<@{threads.slack.bot_user_id}> run: echo over-http"
        response = sender.app_mention(mention, channel=CHANNEL, user="U0ALICE", event_id="Ev0MENTION")
        assert response.status_code == 200
        root = sender.last_payload["event"]["ts"]
        session_id = session_of(threads, CHANNEL, root)
        answered(threads, session_id)
        # Slack's retry of the delivery (it did not see our ack in time): acked, and no second turn.
        again = {"channel": CHANNEL, "user": "U0ALICE", "ts": root, "event_id": "Ev0MENTION", "retry_num": 1}
        retried = sender.app_mention(mention, **again)
        assert retried.status_code == 200
        time.sleep(3)  # time enough for a second turn to show, were there one
        assert threads.turns_ended(session_id) == 1
        text = threads.thread_text(root)
        assert "🛠️ bash: echo over-http" in text and "done: over-http" in text and "⚙ 1 command(s)" in text
        assert threads.slack.calls_to("chat.delete")  # the status message, removed at the end

        # A reply in the thread, without a mention, is the same session's next turn.
        assert sender.message("thanks, and now?", channel=CHANNEL, user="U0ALICE", thread_ts=root).status_code == 200
        answered(threads, session_id, 2)
        assert "answer: thanks, and now?" in threads.thread_text(root)


def test_a_mention_over_socket_mode_delivered_twice_is_one_turn(threads: Stack) -> None:
    threads.start_bot(socket=True)
    text = f"<@{threads.slack.bot_user_id}> hello over the socket"
    envelope = threads.slack.push_app_mention(text, channel=CHANNEL, user="U0ALICE")
    threads.slack.wait_for_ack(envelope)
    payload = threads.slack.last_pushed_payload
    # Slack redelivers in a new envelope, with the same event and no retry header.
    threads.slack.wait_for_ack(threads.slack.push("events_api", payload))
    root = payload["event"]["ts"]
    session_id = session_of(threads, CHANNEL, root)
    answered(threads, session_id)
    time.sleep(3)
    assert threads.turns_ended(session_id) == 1
    assert "answer: hello over the socket" in threads.thread_text(root)


def test_a_direct_message_and_an_assistant_thread_are_answered(threads: Stack) -> None:
    base = threads.start_bot()
    dm = "D0ALICE"
    threads.slack.add_channel(dm, "alice")
    with SlackEventSender(base, SECRET, bot_user_id=threads.slack.bot_user_id) as sender:
        assert sender.message("what is here?", channel=dm, user="U0ALICE", channel_type="im").status_code == 200
        root = sender.last_payload["event"]["ts"]
        answered(threads, session_of(threads, dm, root))
        assert "answer: what is here?" in threads.thread_text(root, dm), threads.slack.messages(dm, root)

        # Slack's assistant surface: the thread is started (greeted, with prompts), then the user writes in it.
        thread_ts = sender.new_ts()
        started = {
            "type": "assistant_thread_started",
            "assistant_thread": {"user_id": "U0ALICE", "channel_id": dm, "thread_ts": thread_ts, "context": {}},
        }
        assert sender.event(started).status_code == 200
        asked = sender.message("why is CI red?", channel=dm, user="U0ALICE", thread_ts=thread_ts, channel_type="im")
        assert asked.status_code == 200
        answered(threads, session_of(threads, dm, thread_ts))
        assert "answer: why is CI red?" in threads.thread_text(thread_ts, dm)

        def statuses() -> list[str]:
            calls = threads.slack.calls_to("assistant.threads.setStatus")
            return [c.params["status"] for c in calls if c.params.get("thread_ts") == thread_ts]

        assert statuses()[0] == "is thinking…"
        threads.wait(lambda: statuses()[-1] == "", message="the status cleared at the end")
