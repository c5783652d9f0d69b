"""A purged thread with the real worker (`mm-bot worker`, its housekeeping, the scripted model, the Slack emulator):
the database part purged as `/mm purge` does it, the workspace removed by the worker; and a purged thread that
gets a new message starts afresh, says so, and is not handed its old messages or files."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatops.inbox import record_message
from chatops.retention import PurgeOutcome, purge_session
from chatops.schema import InboxCommand
from threads_support import CHANNEL, OwnRedis, Stack, stack

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)


def first_turn(threads: Stack) -> tuple[str, str, Path]:
    """A thread whose turn wrote a file into its workspace: its session, its ts and the file."""
    posted = threads.post("run: echo remembered > notes.txt")
    threads.wait(lambda: threads.turns_ended(posted.session_id) == 1, message="the first turn")
    threads.wait(lambda: threads.status(posted.session_id) == "idle", message="idle after it")
    notes = threads.workspace(posted.session_id) / "notes.txt"
    assert notes.read_text() == "remembered\n"
    return posted.session_id, posted.thread_ts, notes


def purge(threads: Stack, session_id: str) -> None:
    # The worker may still hold the session a moment after its turn (posting the offer of its changes): a purge
    # then says busy, and is asked again.
    def purged() -> object:
        done = purge_session(threads.engine, session_id, by="U0ADMIN", why="/mm purge")
        assert done is not None
        return done if done.outcome != PurgeOutcome.BUSY else None

    done = threads.wait(purged, message="the worker letting go of the session")
    assert done.outcome == PurgeOutcome.PURGED


def test_housekeeping_removes_a_purged_threads_workspace(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    with stack(tmp_path, fresh_pg_url, own_redis.url) as threads:
        threads.start_worker()  # with its scheduler: housekeeping every second (threads_support.config)
        session_id, _, notes = first_turn(threads)
        purge(threads, session_id)
        threads.wait(lambda: not notes.parent.exists(), timeout=30, message="the workspace removed by housekeeping")
        assert threads.log_kinds(session_id) == []


def test_a_purged_thread_that_gets_a_message_starts_afresh(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    with stack(tmp_path, fresh_pg_url, own_redis.url) as threads:
        threads.start_worker(beat=False)  # no housekeeping: the new turn itself must not find the old files
        session_id, root, notes = first_turn(threads)
        purge(threads, session_id)
        assert notes.exists()

        threads.post("what is in notes.txt?", thread_ts=root)
        threads.wait(lambda: threads.turns_ended(session_id) == 1, message="the turn after the purge")
        said = threads.thread_text(root)
        assert "🧹 This thread's history was purged on " in said and "I start afresh" in said
        [user] = [m["content"] for m in threads.model.messages() if m["role"] == "user"]
        assert user == "what is in notes.txt?"  # neither the purged conversation nor the thread's earlier messages
        assert threads.workspace(session_id).is_dir() and not notes.exists()
        assert not threads.slack.calls_to("conversations.replies")

        # `new`, then a message: a fresh conversation again, still without the thread's earlier (purged) messages.
        new = threads.slack.add_message(CHANNEL, "<@U0BOT> new", "U0ALICE", thread_ts=root)["ts"]
        record_message(
            threads.engine,
            channel_id=CHANNEL,
            thread_ts=root,
            message_ts=new,
            user_id="U0ALICE",
            text="",
            command=InboxCommand.NEW,
        )
        threads.post("and now?", thread_ts=root)
        threads.wait(lambda: threads.turns_ended(session_id) == 2, message="the turn after `new`")
        [user] = [m["content"] for m in threads.model.messages() if m["role"] == "user"]
        assert user == "and now?" and not threads.slack.calls_to("conversations.replies")
        assert threads.thread_text(root).count("history was purged") == 1
