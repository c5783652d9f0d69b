"""The inbound side end to end: `mm-bot serve` (over HTTP and over Socket Mode) records each message in
PostgreSQL before it acks and enqueues the session on the broker (Redis) after; Slack is the emulator."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from sqlalchemy import Engine, select, text

from bot.handlers import HELLO, QUEUED, SUGGESTED_PROMPTS
from chatops import db
from chatops.schema import InboxMessage, Session, SessionStatus
from chatops.store import set_status
from mmbot_helpers import MM_BOT, clean_env, free_port, stop, wait_healthy
from playground.signed import SlackEventSender
from playground.slack_api import SlackEmulator
from test_bot_serve import SIGNING_SECRET, Bot
from test_bot_socket import socket_env
from test_record_before_ack import stalls_on_purpose, waiting_on

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

TURNS_QUEUE = "turns"
# The broker's database on the test Redis: the bot's task messages land in its `turns` list, where the tests
# count them; only the messages of this module's sessions are removed afterwards.
BROKER_DB = 15
WAIT = 15.0


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if value := predicate():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)


def new_channel(prefix: str = "C") -> str:
    """A channel of the test's own: the run's database is shared by every module."""
    return f"{prefix}0IN{uuid.uuid4().hex[:8].upper()}"


class Turns:
    """The broker's `turns` queue, read from Redis: which sessions the bot enqueued, and how often."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def _messages(self) -> list[tuple[Any, str]]:
        found = []
        for raw in self.client.lrange(TURNS_QUEUE, 0, -1):
            args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
            found.append((raw, args[0]))
        return found

    def of(self, session_id: str) -> int:
        return sum(1 for _, sid in self._messages() if sid == session_id)

    def wait(self, session_id: str, count: int = 1) -> None:
        wait_for(lambda: self.of(session_id) >= count, f"session {session_id} enqueued {count} time(s)")
        time.sleep(0.3)  # a second enqueue, if there were one, has had its time too
        assert self.of(session_id) == count

    def remove(self, session_ids: set[str]) -> None:
        for raw, sid in self._messages():
            if sid in session_ids:
                self.client.lrem(TURNS_QUEUE, 0, raw)


@pytest.fixture(scope="module")
def engine(pg_url: str) -> Iterator[Engine]:
    db.migrate(pg_url)
    engine = db.engine_for(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def broker_url(redis_url: str) -> str:
    return urlsplit(redis_url)._replace(path=f"/{BROKER_DB}").geturl()


@pytest.fixture(scope="module")
def turns(broker_url: str, engine: Engine) -> Iterator[Turns]:
    client = redis.Redis.from_url(broker_url)
    queue = Turns(client)
    yield queue
    # Every message of a session of this run's database, whichever test enqueued it (its ids are UUIDs).
    with engine.connect() as conn:
        queue.remove(set(conn.execute(select(Session.id)).scalars()))
    client.close()


@contextlib.contextmanager
def serving(tmp: Path, slack: SlackEmulator, env: dict[str, str], *args: str) -> Iterator[tuple[Bot, Path]]:
    """`mm-bot serve` and its log, in a file (a pipe nobody reads would fill up and stall it)."""
    port, log = free_port(), tmp / "bot.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [MM_BOT, "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, process, timeout=60)
        yield Bot(base, slack, process), log
    finally:
        stop(process)


def http_env(slack: SlackEmulator, database_url: str, broker_url: str) -> dict[str, str]:
    return clean_env(
        SLACK_API_URL=slack.url,
        SLACK_BOT_TOKEN=slack.bot_token,
        SLACK_SIGNING_SECRET=SIGNING_SECRET,
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=broker_url,
    )


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory, pg_url: str, engine: Engine, broker_url: str) -> Iterator[Bot]:
    tmp = tmp_path_factory.mktemp("inbound")
    with SlackEmulator() as slack, serving(tmp, slack, http_env(slack, pg_url, broker_url)) as (bot, _log):
        yield bot


@pytest.fixture
def sender(bot: Bot) -> Iterator[SlackEventSender]:
    with bot.sender() as sender:
        yield sender


@pytest.fixture(scope="module")
def socket_slack(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, engine: Engine, broker_url: str
) -> Iterator[SlackEmulator]:
    tmp = tmp_path_factory.mktemp("inbound-socket")
    with SlackEmulator() as slack:
        env = socket_env(slack, tmp, slack.app_token) | {"DATABASE_URL": pg_url, "CELERY_BROKER_URL": broker_url}
        with serving(tmp, slack, env, "--socket"):
            slack.wait_for_socket_connections(1, timeout=30)
            yield slack


def session_of(engine: Engine, channel: str, thread_ts: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(Session.id, Session.status, Session.assistant_thread, Session.requester, Session.team_id).where(
                Session.channel_id == channel, Session.thread_ts == thread_ts
            )
        ).first()


def inbox(engine: Engine, session_id: str) -> list[tuple[str | None, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(InboxMessage.message_ts, InboxMessage.user_id, InboxMessage.text)
            .where(InboxMessage.session_id == session_id)
            .order_by(InboxMessage.id)
        )
        return [(user, message, ts) for ts, user, message in rows]


def sessions_in(engine: Engine, channel: str) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(Session.id).where(Session.channel_id == channel)).all())


def mention(sender: SlackEventSender, channel: str, said: str = "fix the tests", **options: Any) -> str:
    """A mention that starts a thread; its ts (the thread's root)."""
    response = sender.app_mention(f"<@U0BOT> {said}", channel=channel, user="U0ALICE", **options)
    assert response.status_code == 200, response.text
    return sender.last_payload["event"]["ts"]


# --- channels ------------------------------------------------------------------------------------------------


def test_a_mention_starts_a_session_in_its_thread_recorded_and_enqueued(
    sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    channel = new_channel()
    root = mention(sender, channel)
    found = session_of(engine, channel, root)
    # Acked means recorded: the row is there the moment the answer is.
    assert found is not None and found.status == SessionStatus.QUEUED and found.requester == "U0ALICE"
    assert not found.assistant_thread
    assert inbox(engine, found.id) == [("U0ALICE", "fix the tests", root)]
    turns.wait(found.id)
    # The same post's `message` twin (another event id) finds its row: one message, one turn.
    twin = sender.message("<@U0BOT> fix the tests", channel=channel, user="U0ALICE", ts=root)
    assert twin.status_code == 200
    assert inbox(engine, found.id) == [("U0ALICE", "fix the tests", root)]
    turns.wait(found.id)


def test_a_slack_connect_persons_session_names_their_own_team(
    sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    # A person of another workspace in a shared channel: the event names their team (`user_team`), and a stream
    # to them must name it (Slack refuses the installation's team for them), so the session keeps theirs.
    channel, ts = new_channel(), sender.new_ts()
    guest = {"type": "app_mention", "user": "U0GUEST", "text": "<@U0BOT> hi", "ts": ts, "channel": channel}
    assert (
        sender.event(guest | {"team": "T0GUEST", "user_team": "T0GUEST", "source_team": "T0GUEST"}).status_code == 200
    )
    found = session_of(engine, channel, ts)
    assert found is not None and (found.requester, found.team_id) == ("U0GUEST", "T0GUEST")
    turns.wait(found.id)
    # One of the workspace's own: its team, as the event says it.
    channel, ts = new_channel(), sender.new_ts()
    own = guest | {"user": "U0ALICE", "ts": ts, "channel": channel, "team": sender.team_id}
    assert sender.event(own).status_code == 200
    assert session_of(engine, channel, ts).team_id == sender.team_id


def test_a_reply_in_the_thread_continues_the_session_without_a_mention(
    sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    channel = new_channel()
    root = mention(sender, channel)
    sid = session_of(engine, channel, root).id
    turns.wait(sid)
    assert sender.message("and run the linter", channel=channel, user="U0BOB", thread_ts=root).status_code == 200
    reply_ts = sender.last_payload["event"]["ts"]
    assert inbox(engine, sid) == [("U0ALICE", "fix the tests", root), ("U0BOB", "and run the linter", reply_ts)]
    assert sessions_in(engine, channel) == 1
    turns.wait(sid, 2)  # queued already: the extra hint is harmless, and covers a turn that was just ending
    # A mention inside the thread continues it too, its mention taken off the text.
    sender.app_mention("<@U0BOT>: and the docs", channel=channel, user="U0ALICE", thread_ts=root)
    assert inbox(engine, sid)[-1][:2] == ("U0ALICE", "and the docs")
    assert sessions_in(engine, channel) == 1


def test_channel_talk_without_a_session_is_ignored(sender: SlackEventSender, engine: Engine) -> None:
    channel = new_channel()
    assert sender.message("lunch?", channel=channel, user="U0ALICE").status_code == 200
    top = sender.last_payload["event"]["ts"]
    assert sender.message("yes", channel=channel, user="U0BOB", thread_ts=top).status_code == 200
    assert sessions_in(engine, channel) == 0


def test_bots_and_edits_never_record(bot: Bot, sender: SlackEventSender, engine: Engine) -> None:
    channel = new_channel()
    root = mention(sender, channel)
    sid = session_of(engine, channel, root).id
    others = [
        # another bot, in a thread the bot follows; and one posting as a bot_message
        {"type": "message", "user": "U0OTHER", "bot_id": "B0OTHER", "text": "beep", "thread_ts": root},
        {"type": "message", "subtype": "bot_message", "bot_id": "B0OTHER", "text": "beep", "thread_ts": root},
        # the bot itself (bolt drops its own events before any listener)
        {"type": "message", "user": bot.slack.bot_user_id, "bot_id": bot.slack.bot_id, "text": "hi", "thread_ts": root},
        # an edit, a deletion, a join
        {
            "type": "message",
            "subtype": "message_changed",
            "message": {"user": "U0ALICE", "text": "fix all the tests", "ts": root, "thread_ts": root},
            "previous_message": {"user": "U0ALICE", "text": "fix the tests", "ts": root},
        },
        {"type": "message", "subtype": "message_deleted", "deleted_ts": root, "thread_ts": root},
        {"type": "message", "subtype": "channel_join", "user": "U0CAROL", "text": "joined", "thread_ts": root},
        # another bot mentioning ours
        {"type": "app_mention", "user": "U0OTHER", "bot_id": "B0OTHER", "text": "<@U0BOT> hi"},
    ]
    for event in others:
        ts = sender.new_ts()
        response = sender.event({"channel": channel, "channel_type": "channel", "ts": ts, "event_ts": ts} | event)
        assert response.status_code == 200, (event, response.text)
    assert [user for user, _, _ in inbox(engine, sid)] == ["U0ALICE"]
    assert sessions_in(engine, channel) == 1


def test_a_message_while_the_turn_runs_is_kept_and_the_thread_told_it_is_queued(
    bot: Bot, sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    channel = new_channel()
    bot.slack.add_channel(channel, "queued")  # the bot answers there: Slack has it
    root = mention(sender, channel)
    sid = session_of(engine, channel, root).id
    turns.wait(sid)
    set_status(engine, sid, SessionStatus.RUNNING)
    assert sender.message("also the flaky one", channel=channel, user="U0BOB", thread_ts=root).status_code == 200
    assert inbox(engine, sid)[-1][:2] == ("U0BOB", "also the flaky one")
    said = wait_for(lambda: [m for m in bot.slack.messages(channel, root) if m.get("bot_id")], "the queued line")
    assert [m["text"] for m in said] == [QUEUED]
    assert session_of(engine, channel, root).status == SessionStatus.RUNNING
    turns.wait(sid, 2)


# --- direct messages and assistant threads -----------------------------------------------------------------


def test_a_direct_message_starts_a_thread_of_its_own_and_its_replies_continue_it(
    sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    dm = new_channel("D")
    assert sender.message("what does bot/ do?", channel=dm, user="U0ALICE", channel_type="im").status_code == 200
    root = sender.last_payload["event"]["ts"]
    found = session_of(engine, dm, root)
    assert found is not None and not found.assistant_thread
    turns.wait(found.id)
    assert (
        sender.message("and workers/?", channel=dm, user="U0ALICE", thread_ts=root, channel_type="im").status_code
        == 200
    )
    assert [said for _, said, _ in inbox(engine, found.id)] == ["what does bot/ do?", "and workers/?"]
    assert sessions_in(engine, dm) == 1


def test_an_assistant_thread_is_greeted_once_with_prompts_and_its_messages_recorded(
    bot: Bot, sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    dm, thread_ts = new_channel("D"), sender.new_ts()
    bot.slack.add_channel(dm, "alice")  # the assistant thread's DM, which the bot greets
    started = {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": "U0ALICE",
            "context": {"channel_id": "C0TEST", "team_id": bot.slack.team_id, "enterprise_id": None},
            "channel_id": dm,
            "thread_ts": thread_ts,
        },
    }
    assert sender.event(started, event_id="Ev0STARTED1").status_code == 200
    greeting = wait_for(lambda: bot.slack.messages(dm, thread_ts), "the greeting")
    assert [m["text"] for m in greeting] == [HELLO]
    prompts = wait_for(
        lambda: [
            c for c in bot.slack.calls_to("assistant.threads.setSuggestedPrompts") if c.params["channel_id"] == dm
        ],
        "the suggested prompts",
    )
    assert prompts[0].params["thread_ts"] == thread_ts and prompts[0].params["prompts"] == SUGGESTED_PROMPTS
    # Slack's retry of the same event greets nobody twice.
    assert sender.event(started, event_id="Ev0STARTED1", retry_num=1).status_code == 200
    time.sleep(0.5)
    assert len(bot.slack.messages(dm, thread_ts)) == 1

    asked = sender.message("why is CI red?", channel=dm, user="U0ALICE", thread_ts=thread_ts, channel_type="im")
    assert asked.status_code == 200
    found = session_of(engine, dm, thread_ts)
    assert found is not None and found.assistant_thread
    assert [said for _, said, _ in inbox(engine, found.id)] == ["why is CI red?"]
    turns.wait(found.id)


# --- retries and duplicates -----------------------------------------------------------------------------------


def test_a_retried_http_delivery_records_once_and_enqueues_once(
    sender: SlackEventSender, engine: Engine, turns: Turns
) -> None:
    channel = new_channel()
    root = mention(sender, channel, event_id="Ev0RETRIED1")
    sid = session_of(engine, channel, root).id
    for attempt, reason in ((1, "http_timeout"), (2, "http_error")):
        again = sender.app_mention(
            "<@U0BOT> fix the tests",
            channel=channel,
            user="U0ALICE",
            ts=root,
            event_id="Ev0RETRIED1",
            retry_num=attempt,
            retry_reason=reason,
        )
        assert again.status_code == 200
    assert len(inbox(engine, sid)) == 1
    turns.wait(sid)


class Payloads(SlackEventSender):
    """The sender's Events API bodies, not sent: what Slack puts in a Socket Mode envelope."""

    def send(self, *_args: Any, **_kwargs: Any) -> httpx.Response:
        return httpx.Response(200)


def test_over_the_socket_a_mention_is_recorded_and_an_envelope_sent_twice_counts_once(
    socket_slack: SlackEmulator, engine: Engine, turns: Turns
) -> None:
    channel = new_channel()
    with Payloads("http://127.0.0.1:9", "") as payloads:
        payloads.app_mention("<@U0BOT> bump the version", channel=channel, user="U0ALICE")
    payload, root = payloads.last_payload, payloads.last_payload["event"]["ts"]
    for _ in range(2):  # Slack redelivers in a new envelope, with the same event id and no retry header
        envelope_id = socket_slack.push("events_api", payload)
        assert socket_slack.wait_for_ack(envelope_id, timeout=30) == {"envelope_id": envelope_id}
        # Acked means recorded, over the socket too.
        found = session_of(engine, channel, root)
        assert found is not None and inbox(engine, found.id) == [("U0ALICE", "bump the version", root)]
    turns.wait(session_of(engine, channel, root).id)

    envelope_id = socket_slack.push_message("and tag it", channel=channel, user="U0BOB", thread_ts=root)
    socket_slack.wait_for_ack(envelope_id, timeout=30)
    assert [said for _, said, _ in inbox(engine, session_of(engine, channel, root).id)] == [
        "bump the version",
        "and tag it",
    ]


# --- what the ack waits for, and what it does not -------------------------------------------------------------


def test_the_ack_waits_for_the_record_and_the_server_stays_responsive(
    bot: Bot, sender: SlackEventSender, engine: Engine
) -> None:
    channel = new_channel()
    with engine.connect() as blocker, ThreadPoolExecutor(1) as pool:
        # A slow database: inserts into the inbox wait for this transaction.
        stalls_on_purpose(blocker)
        blocker.execute(text("LOCK TABLE inbox IN EXCLUSIVE MODE"))
        answer = pool.submit(mention, sender, channel)
        wait_for(lambda: waiting_on("inbox", blocker), "the record, waiting for the lock")
        assert not answer.done(), "acked before the message was recorded"
        # The record waits in a thread: the event loop still answers.
        assert httpx.get(f"{bot.base}/healthz", timeout=2).json()["database"] is True
        blocker.rollback()
        root = answer.result(timeout=WAIT)
    found = session_of(engine, channel, root)
    assert found is not None and len(inbox(engine, found.id)) == 1


def test_a_broker_that_refuses_does_not_fail_the_ack_and_the_message_is_kept(
    tmp_path: Path, pg_url: str, engine: Engine
) -> None:
    refusing = f"redis://127.0.0.1:{free_port()}/0"
    with (
        SlackEmulator() as slack,
        serving(tmp_path, slack, http_env(slack, pg_url, refusing)) as (bot, log),
        bot.sender() as sender,
    ):
        channel, sessions = new_channel(), []
        for said in ("fix the tests", "and the docs"):
            # The second may come while the first one's enqueue still retries: a record never waits on it.
            started = time.monotonic()
            root = mention(sender, channel, said)
            assert time.monotonic() - started < 3
            found = session_of(engine, channel, root)
            assert found is not None and inbox(engine, found.id) == [("U0ALICE", said, root)]
            sessions.append(found.id)

        def logged() -> bool:
            text = log.read_text()
            return all(f"could not enqueue session {sid}" in text for sid in sessions)

        wait_for(logged, "both failures in the log", timeout=90)
