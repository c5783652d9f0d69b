"""The sessions' hand-off to the workers in a process of its own (bot.hand_off), with the real child process and
the real broker (Redis): what the bot writes is published once each; a child killed is started again; what was
written before the bot's shutdown is published; what is not a hand-off is refused on both sides; a child that
does not read makes the bot refuse rather than hold the messages in memory."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from bot import hand_off
from bot.hand_off import HandOff, HandOffError
from mmbot_helpers import free_port
from test_bot_inbound import BROKER_DB, Turns, wait_for
from workers.celery_app import TURNS_QUEUE, app
from workers.publish import RedisPublisher
from workers.tasks import run_session

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)


@pytest.fixture(scope="module")
def broker_url(redis_url: str) -> str:
    return urlsplit(redis_url)._replace(path=f"/{BROKER_DB}").geturl()


@pytest.fixture
def turns(broker_url: str) -> Iterator[Turns]:
    client = redis.Redis.from_url(broker_url)
    found = Turns(client)
    made: set[str] = set()
    found.made = made  # type: ignore[attr-defined] - the sessions this test handed off, removed at its end
    yield found
    found.remove(made)
    client.close()


def env_for(broker_url: str) -> dict[str, str]:
    return os.environ | {"CELERY_BROKER_URL": broker_url}


def sessions(turns: Turns, n: int) -> list[str]:
    made = [str(uuid.uuid4()) for _ in range(n)]
    turns.made.update(made)  # type: ignore[attr-defined]
    return made


def test_every_session_written_is_published_once_and_those_written_before_the_close_too(
    broker_url: str, turns: Turns
) -> None:
    first, *ids = sessions(turns, 51)

    async def main() -> None:
        handing = HandOff(env=env_for(broker_url))
        await handing.start()
        await handing.enqueue(first)  # once it is published the child is up (its start takes seconds on a busy machine)
        await asyncio.to_thread(wait_for, lambda: turns.of(first), "the first session published", 120)
        for session_id in ids:
            await handing.enqueue(session_id)
        await handing.close()  # at once: the child publishes what it was given before it ends
        assert handing.pid is None

    asyncio.run(main())
    for session_id in ids:
        assert turns.of(session_id) == 1, session_id


def test_a_child_killed_is_started_again_and_the_sessions_after_are_published(
    broker_url: str, turns: Turns, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hand_off, "RESTART_S", 0.5)
    before, after = sessions(turns, 1), sessions(turns, 1)
    caplog.set_level(logging.INFO, "mm.bot.hand_off")

    async def main() -> None:
        handing = HandOff(env=env_for(broker_url))
        await handing.start()
        await handing.enqueue(before[0])
        first = handing.pid
        assert first is not None
        await asyncio.to_thread(wait_for, lambda: turns.of(before[0]), "the first session published", 120)
        os.kill(first, signal.SIGKILL)
        while handing.pid in (None, first):
            # Lost in the dead pipe, or refused while no child runs: housekeeping's, either way; nothing breaks.
            with contextlib.suppress(HandOffError):
                await handing.enqueue(str(uuid.uuid4()))
            await asyncio.sleep(0.05)
        await handing.enqueue(after[0])
        await asyncio.to_thread(wait_for, lambda: turns.of(after[0]), "the session after published", 120)
        await handing.close()

    asyncio.run(main())
    assert turns.of(after[0]) == 1
    assert any("exited (code -9); starting it again" in r.getMessage() for r in caplog.records)


def test_what_is_not_a_session_id_is_refused_by_the_bot_and_skipped_by_the_child(broker_url: str, turns: Turns) -> None:
    async def refused(text: str) -> str:
        handing = HandOff(env=env_for(broker_url))
        try:
            await handing.enqueue(text)
        except HandOffError as exc:
            return str(exc)
        finally:
            await handing.close()
        raise AssertionError(f"{text!r} was handed off")

    assert asyncio.run(refused('x"}\n{"session": "y')).endswith("is not a session's id")
    # The child reads lines from anyone who holds its pipe: what is not a hand-off is said and skipped.
    good = sessions(turns, 1)[0]
    lines = [
        b"not json\n",
        b'{"session": 7}\n',
        b'{"session": "../../etc"}\n',
        b"[]\n",
        json.dumps({"session": good}).encode() + b"\n",
    ]
    child = subprocess.run(
        [sys.executable, "-m", "bot.hand_off"],
        input=b"".join(lines),
        env=env_for(broker_url),
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    said = child.stderr.decode()
    assert said.count("read a line that is not a hand-off") == 4, said
    assert turns.of(good) == 1


def test_a_child_that_does_not_read_makes_the_bot_refuse_instead_of_holding_the_messages() -> None:
    async def main() -> str:
        handing = HandOff(argv=["sleep", "60"])  # takes nothing from its pipe
        try:
            for _ in range(100_000):
                await handing.enqueue(str(uuid.uuid4()))
        except HandOffError as exc:
            return str(exc)
        finally:
            await handing.close()  # killed: it does not end when its pipe ends
        raise AssertionError("100,000 hand-offs were taken by a child that reads nothing")

    said = asyncio.run(main())
    assert said.startswith("the hand-off process is behind ("), said


def test_the_messages_written_together_are_those_celery_writes_field_for_field(broker_url: str, turns: Turns) -> None:
    """workers.publish writes kombu's envelope itself: on the real Redis, its message for a session is the one
    Celery's send_task writes for the same session, but for the ids each message draws; several are pushed in one
    command, and a worker (BRPOP, from the list's tail) takes them in the order given."""
    same, *several = sessions(turns, 4)
    with app.connection_for_write(broker_url) as connection:
        app.send_task(run_session.name, args=[same], queue=run_session.queue, ignore_result=True, connection=connection)
    publisher = RedisPublisher(app, broker_url)
    try:
        publisher.publish(run_session.name, run_session.queue, [[same]])
        publisher.publish(run_session.name, run_session.queue, [[s] for s in several])
    finally:
        publisher.close()

    ours = {*several, same}
    written = [m for m in map(json.loads, turns.client.lrange(TURNS_QUEUE, 0, -1)) if argument(m) in ours]
    taken_first_to_last = [argument(m) for m in reversed(written)]
    assert taken_first_to_last == [same, same, *several]
    by_celery, by_us = (without_ids(m) for m in reversed(written[-2:]))
    assert by_us == by_celery
    assert by_celery["headers"]["task"] == run_session.name and by_celery["properties"]["delivery_mode"] == 2


def argument(message: dict[str, Any]) -> str:
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    return args[0]


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    """The message with the ids every message draws anew (the task's, and kombu's delivery tag) taken out, after
    checking that they are there and agree with each other."""
    headers, properties = dict(message["headers"]), dict(message["properties"])
    task_id = headers.pop("id")
    assert uuid.UUID(task_id) and headers.pop("root_id") == task_id == properties.pop("correlation_id")
    assert uuid.UUID(properties.pop("delivery_tag"))
    return message | {"headers": headers, "properties": properties}


def test_a_broker_that_refuses_is_said_for_each_session_and_the_child_goes_on() -> None:
    """Nothing listens where the broker should be: each session read is said in the bot's words (housekeeping
    enqueues it later), in one line each, and the child reads on until its pipe ends."""
    ids = [str(uuid.uuid4()) for _ in range(3)]
    child = subprocess.run(
        [sys.executable, "-m", "bot.hand_off"],
        input=b"".join(json.dumps({"session": s}).encode() + b"\n" for s in ids),
        env=env_for(f"redis://127.0.0.1:{free_port()}/0"),
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    said = [line for line in child.stderr.decode().splitlines() if "could not enqueue session" in line]
    assert [next(s for s in ids if s in line) for line in said] == ids, said
    assert all(line.endswith("housekeeping will") for line in said), said


def test_the_lines_right_behind_the_first_are_read_with_it_and_the_pipe_end_ends_the_reading() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"one\n")
        late = threading.Timer(0.05, lambda: os.write(write_end, b"two\nthr"))
        late.start()
        lines = hand_off.lines_read(read_end, gather_s=1.0)
        assert next(lines) == [b"one", b"two"]  # read together: one publish
        late.join()
        os.write(write_end, b"ee\n")
        os.close(write_end)
        write_end = -1
        assert list(lines) == [[b"three"]]
    finally:
        os.close(read_end)
        if write_end != -1:
            os.close(write_end)
