"""A request carried out again says nothing false and repeats no visible effect: the real bot (`mm-bot serve`, one
or two of them), PostgreSQL and the Slack emulator; no worker.

Each test kills (SIGKILL) or stalls (SIGSTOP) a bot at a point the emulator or the database makes certain: a Web
API call held before Slack carries it out (the effect never happened), its answer held after (the effect
happened and the bot never learnt it), or the record's own write waiting on a lock. Then a bot carries the
request out from its record, and each effect is counted.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from chatops.buttons import Action, ButtonValue
from chatops.schema import (
    Approval,
    InboxMessage,
    JobRun,
    JobState,
    RequestKind,
    RequestState,
    Session,
    SessionStatus,
    SlackRequest,
)
from chatops.store import request_approval, set_approval_message, set_status
from mmbot_helpers import MM_BOT, free_port, stop, wait_healthy
from playground.slack_api import ANSWER
from test_record_before_ack import (
    ALICE,
    APPROVERS,
    BOB,
    HELD,
    kill_bot,
    requests,
    running_session,
    sender,
    stalls_on_purpose,
)
from threads_support import CHANNEL, SECRET, Stack, config, stack

pytestmark = [pytest.mark.timeout(240), pytest.mark.process]

JOBS = "C0JOBS"
JOB = "tidy"


@pytest.fixture
def threads(tmp_path: Path, fresh_pg_url: str) -> Iterator[Stack]:
    # A claim renewed every two thirds of a second: a killed bot's requests are taken over within seconds.
    text = config(
        f"{{yolo: false, approvers: [{APPROVERS}]}}",
        "bot: {claimSeconds: 2}",
        f"jobs:\n  - {{name: {JOB}, schedule: '0 3 * * *', channel: {JOBS}, prompt: tidy up}}",
    )
    with stack(tmp_path, fresh_pg_url, "memory://", config=text) as s:
        s.slack.add_usergroup(APPROVERS, "approvers", [BOB])
        s.slack.add_channel(JOBS, "jobs")
        yield s


def done_by_a_replay(threads: Stack, kind: RequestKind) -> None:
    """The request is done by a later attempt. A done request is never claimed again, so what is counted
    afterwards is final."""
    threads.wait(
        lambda: [(k, s) for k, s, attempts in requests(threads) if attempts >= 2] == [(kind, RequestState.DONE)],
        timeout=40,
        message="the replay",
    )


def lines(threads: Stack, channel: str, thread_ts: str | None, said: str) -> list[dict[str, Any]]:
    return [m for m in threads.slack.messages(channel, thread_ts) if said in (m.get("text") or "")]


def told(threads: Stack, user: str) -> list[str]:
    """Everything said to `user` alone: ephemerals, and the answers through response URLs (the tests' only
    person to answer is `user`)."""
    ephemerals = [e.get("text") or "" for e in threads.slack.ephemerals if e.get("to_user") == user]
    return ephemerals + [r["body"].get("text") or "" for r in threads.slack.responses]


# --- 4: a replay finishes quietly what was left ----------------------------------------------------------------


def test_a_click_whose_bot_died_after_deciding_shows_the_decision_and_tells_nobody_anything(threads: Stack) -> None:
    session, root = running_session(threads)
    set_status(threads.engine, session, SessionStatus.AWAITING_APPROVAL)
    request_approval(threads.engine, call_id="call_rp1", session_id=session, tool="bash", requested_by=ALICE)
    shown = threads.slack.add_message(CHANNEL, "may I run `make test`?", threads.slack.bot_user_id, thread_ts=root)
    set_approval_message(threads.engine, "call_rp1", shown["ts"])
    value = ButtonValue(session, "call_rp1").encode()
    threads.slack.hold("chat.update")  # the decision's display: the bot dies deciding, before showing it
    with sender(threads, threads.start_bot()) as slack:
        click = slack.block_action(
            Action.APPROVE, value, user=BOB, channel=CHANNEL, message_ts=shown["ts"], thread_ts=root
        )
        assert click.status_code == 200
    threads.slack.wait_for_held("chat.update")
    kill_bot(threads)
    threads.slack.release("chat.update")  # the dead bot's call is dropped: the message still has its buttons
    threads.start_bot()
    done_by_a_replay(threads, RequestKind.CLICK)
    with threads.engine.connect() as conn:
        decided = conn.execute(select(Approval.state, Approval.decided_by).where(Approval.call_id == "call_rp1"))
        assert tuple(decided.one()) == ("approved", BOB)
    message = threads.slack.message(CHANNEL, shown["ts"])
    assert message is not None and "actions" not in str(message.get("blocks"))  # shown decided, buttons gone
    assert f"<@{BOB}>" in str(message.get("blocks"))
    assert len([c for c in threads.slack.calls_to("chat.update") if c.params.get("ts") == shown["ts"]]) == 1
    assert told(threads, BOB) == []  # nobody hears "already approved by you: your click changed nothing"


def test_a_thread_stop_whose_bot_died_after_announcing_it_is_announced_once(threads: Stack) -> None:
    session, root = running_session(threads)
    threads.slack.hold("chat.postMessage" + ANSWER)  # the line is in the thread; the bot never hears so
    with sender(threads, threads.start_bot()) as slack:
        assert slack.app_mention("<@U0BOT> stop", channel=CHANNEL, user=BOB, thread_ts=root).status_code == 200
    threads.slack.wait_for_held("chat.postMessage" + ANSWER)
    kill_bot(threads)
    threads.slack.release("chat.postMessage" + ANSWER)
    threads.start_bot()
    done_by_a_replay(threads, RequestKind.COMMAND)
    assert len(lines(threads, CHANNEL, root, "asked me to stop")) == 1
    with threads.engine.connect() as conn:
        assert conn.execute(select(Session.stop_requested_at).where(Session.id == session)).scalar() is not None
    assert told(threads, BOB) == []


def test_a_job_paused_by_a_bot_that_died_before_announcing_it_is_announced_once(threads: Stack) -> None:
    threads.slack.hold("chat.postMessage")  # the announcement in the job's channel: the bot dies before it
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", f"job pause {JOB}", user=BOB, channel=CHANNEL).status_code == 200
    threads.slack.wait_for_held("chat.postMessage")
    kill_bot(threads)
    threads.slack.release("chat.postMessage")
    threads.start_bot()
    done_by_a_replay(threads, RequestKind.SLASH)
    announced = lines(threads, JOBS, None, f"paused *{JOB}*")
    assert len(announced) == 1 and f"<@{BOB}>" in announced[0]["text"]
    said = told(threads, BOB)
    assert len(said) == 1 and "paused" in said[0] and "already" not in said[0]
    with threads.engine.connect() as conn:
        assert conn.execute(select(JobState.paused).where(JobState.job_name == JOB)).scalar() is True


# --- 5: `/mm job run` records one run -------------------------------------------------------------------------


@pytest.mark.alone  # a bot killed while a lock holds its write: the waits are timed
def test_a_job_run_whose_bot_died_after_recording_the_run_records_one(threads: Stack) -> None:
    """The bot is killed once the run is recorded and while its next write to the request waits on a lock."""
    threads.slack.hold(HELD)  # who may run jobs: the bot waits there, the request recorded
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", f"job run {JOB}", user=BOB, channel=CHANNEL).status_code == 200
    threads.slack.wait_for_held(HELD)
    with threads.engine.connect() as blocker:
        stalls_on_purpose(blocker)
        blocker.execute(text("SELECT id FROM slack_requests FOR UPDATE"))  # every write to the request waits
        threads.slack.release(HELD)

        def recorded_and_waiting() -> bool:
            with threads.engine.connect() as conn:
                runs = conn.execute(select(JobRun.id).where(JobRun.job_name == JOB)).all()
            return len(runs) == 1 and carrying_out_waits(blocker)

        threads.wait(recorded_and_waiting, timeout=30, message="the run recorded, the request's write waiting")
        kill_bot(threads)
        blocker.rollback()
    threads.start_bot()
    done_by_a_replay(threads, RequestKind.SLASH)
    with threads.engine.connect() as conn:
        runs = conn.execute(select(JobRun.id, JobRun.requested_by).where(JobRun.job_name == JOB)).all()
    assert [r.requested_by for r in runs] == [BOB]


def carrying_out_waits(conn: Any) -> bool:
    """Whether the bot's carrying out waits on the lock this connection holds: a write of the request's progress
    or of its end (not the background renewal of its claim, which waits there too). pg_stat_activity is the
    server's: only this test's database counts, as other tests run beside it (`make test`'s workers). The
    server keeps what a transaction first read of it for the rest of that transaction, and `conn` holds the lock in
    one: its snapshot is cleared at each look, or a first look before the write came would be its answer for good."""
    conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    return bool(
        conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() "
                "AND datname = current_database() AND (query LIKE '%progress=%' OR query LIKE '%done_at=%')"
            )
        ).scalar_one()
    )


# --- 6: a bot that stalls, a replica that takes over ----------------------------------------------------------


def second_bot(threads: Stack) -> subprocess.Popen[bytes]:
    """Another `mm-bot serve` on the same database: a replica, with a log of its own."""
    port = free_port()
    log = open(threads.tmp / "bot2.log", "ab")  # noqa: SIM115 - the process's own, closed with it
    env = threads.env | {"SLACK_SIGNING_SECRET": SECRET}
    argv = [MM_BOT, "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(argv, env=env, cwd=threads.tmp, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(f"http://127.0.0.1:{port}", process)
    return process


def test_a_prompt_whose_bot_stalled_after_posting_its_root_is_taken_over_in_that_thread(threads: Stack) -> None:
    """Bot A posts the root and stalls (SIGSTOP) before it keeps the root's ts; replica B takes the request over,
    finds the root A posted (its metadata names the request) and goes on there: one thread. A, woken, stops."""
    prompt = "what changed last week?"
    threads.slack.hold("chat.postMessage")
    replica = second_bot(threads)
    try:
        with sender(threads, threads.start_bot()) as slack:
            assert slack.slash_command("/mm", prompt, user=ALICE, channel=CHANNEL).status_code == 200
        threads.slack.wait_for_held("chat.postMessage")
        assert threads.bot is not None
        os.kill(threads.bot.pid, signal.SIGSTOP)
        threads.slack.release("chat.postMessage")  # A's root reaches Slack; A, stopped, cannot keep its ts
        threads.wait(lambda: lines(threads, CHANNEL, None, f"asked: {prompt}"), timeout=30, message="A's root")
        done_by_a_replay(threads, RequestKind.SLASH)  # by B
        os.kill(threads.bot.pid, signal.SIGCONT)
        threads.wait(lambda: "taken over by another bot" in (threads.tmp / "bot.log").read_text(), timeout=30)
    finally:
        stop(replica)
    [root] = lines(threads, CHANNEL, None, f"asked: {prompt}")
    with threads.engine.connect() as conn:
        rows = conn.execute(
            select(InboxMessage.text)
            .join(Session, Session.id == InboxMessage.session_id)
            .where(Session.channel_id == CHANNEL, Session.thread_ts == root["ts"])
        ).all()
    assert [r.text for r in rows] == [prompt]


# --- 7: Slack failing for a while -----------------------------------------------------------------------------


def test_a_request_slack_fails_more_often_than_the_attempts_is_carried_out_once_it_answers(threads: Stack) -> None:
    """Slack's own trouble (`internal_error`) on five tries: waited out with a growing wait, never counted toward
    the three attempts that give a request up; then the root is posted once."""
    threads.slack.fail("chat.postMessage", "internal_error", times=5)
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", "tidy the readme", user=ALICE, channel=CHANNEL).status_code == 200
    threads.wait(lambda: requests(threads) == [(RequestKind.SLASH, RequestState.DONE, 6)], timeout=90, message="done")
    assert len(lines(threads, CHANNEL, None, "asked: tidy the readme")) == 1
    assert [c.response.get("ok") for c in threads.slack.calls_to("chat.postMessage")] == [False] * 5 + [True]
    assert told(threads, ALICE) == []
    with threads.engine.connect() as conn:
        assert conn.execute(select(SlackRequest.failures)).scalar_one() == 0


def test_a_request_slack_failed_for_25_minutes_is_given_up_once_said_where_the_person_reads_it(
    threads: Stack,
) -> None:
    """Slack keeps failing the root's post, and the command's response URL is gone: the give-up comes once the
    request is 25 minutes old (by the database's clock), as an ephemeral, once."""
    threads.slack.fail("chat.postMessage", "service_unavailable", times=10_000)
    with sender(threads, threads.start_bot()) as slack:
        gone = "http://127.0.0.1:9/gone"  # nothing listens there
        answer = slack.slash_command("/mm", "tidy the docs", user=ALICE, channel=CHANNEL, response_url=gone)
        assert answer.status_code == 200
    threads.wait(lambda: len(threads.slack.calls_to("chat.postMessage")) >= 2, message="a retry")
    with threads.engine.begin() as conn:  # 26 minutes pass, on the database's clock
        conn.execute(text("UPDATE slack_requests SET received_at = received_at - interval '26 minutes'"))
    threads.wait(lambda: requests(threads) and requests(threads)[0][1] == RequestState.FAILED, timeout=60)
    threads.wait(lambda: told(threads, ALICE), message="the give-up, told")
    assert told(threads, ALICE) == [
        "Slack kept failing, so I gave up on `/mm tidy the docs` after 26 minutes; the errors are in my log."
    ]


def test_a_give_up_whose_record_fails_is_told_once(threads: Stack) -> None:
    """Three failures of our own give the request up; recording that fails (the database refuses the state) on
    the first tries, so the give-up is tried again: the person hears it once, when it is recorded."""
    threads.slack.fail("chat.postMessage", "invalid_blocks", times=10_000)  # an answer about what was asked
    with threads.engine.begin() as conn:
        conn.execute(text("ALTER TABLE slack_requests ADD CONSTRAINT no_give_up CHECK (state <> 'failed') NOT VALID"))
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", "hello there", user=BOB, channel=CHANNEL).status_code == 200
    log = threads.tmp / "bot.log"
    threads.wait(lambda: log.read_text().count("gave up on the slash request") >= 2, timeout=60, message="give-ups")
    with threads.engine.begin() as conn:
        conn.execute(text("ALTER TABLE slack_requests DROP CONSTRAINT no_give_up"))
    threads.wait(lambda: requests(threads) and requests(threads)[0][1] == RequestState.FAILED, timeout=60)
    threads.wait(lambda: threads.slack.responses, message="the give-up, told")
    assert [r["body"]["text"] for r in threads.slack.responses] == [
        "Something went wrong on my side, so I gave up on `/mm hello there` after 3 attempts; the error is in my log."
    ]
