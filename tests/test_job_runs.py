"""A job run end to end, on a real `celery worker` (with its beat) against PostgreSQL, its own Redis, the Slack
emulator and the scripted model: the root message and its thread, the summary, what changed, a clone that fails
with git's words, the failures in a row that pause the job, a run skipped while the previous one runs, and the
time limit."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import insert, select

from chatops.inbox import record_message
from chatops.schema import (
    Approval,
    InboxCommand,
    JobRun,
    JobRunStatus,
    JobState,
    JobTrigger,
    SchedulerLease,
    Session,
    SessionKind,
    ToolCall,
)
from chatops.store import DbStore, ensure_session
from mm_core.log import AssistantMessage, Outcome, TurnEnded, UserMessage
from mm_testkit.redis_server import OwnRedis
from mmbot_helpers import MM_BOT
from playground.model_server import Reply
from playground.signed import SlackEventSender
from threads_support import (
    CHANNEL,
    SECRET,
    Stack,
    approval_messages,
    click,
    config,
    finished,
    policy,
    repositories,
    run_now,
    run_row,
    stack,
)
from workers.jobs import NO_END

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

APPROVER, ALICE = "U0BOB", "U0ALICE"
JOBS = f"""jobs:
  - {{name: tidy, schedule: "0 3 29 2 *", channel: {CHANNEL}, yolo: true,
      prompt: "run: echo hi > new.txt && echo done"}}
  - {{name: broken, schedule: "0 4 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "hello", repo: /nonexistent/repo,
      maxFailures: 2}}
  - {{name: slow, schedule: "0 5 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "take your time", timeLimit: 2s}}
  - {{name: gated, schedule: "0 6 29 2 *", channel: {CHANNEL}, yolo: false, prompt: "run: echo approved-in-a-job"}}
  - {{name: pusher, schedule: "0 7 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "run: echo pushed > pushed.txt",
      repo: BARE, push: true, timezone: Pacific/Kiritimati}}
  - {{name: lost, schedule: "0 8 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "run: echo x > x.txt", repo: BARE,
      push: {{remote: /nonexistent/remote.git, branch: "chores/{{job}}-{{run}}"}}}}"""


@pytest.fixture
def jobs(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[Stack]:
    origin, bare = repositories(tmp_path)
    channel = f"{{yolo: false, repo: {origin}, approvers: [{APPROVER}]}}"  # the jobs say their own
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config(channel, JOBS.replace("BARE", str(bare)))) as s:
        s.model.always(policy)
        s.start_worker()
        yield s


def test_a_run_posts_its_thread_works_and_summarises_what_changed(jobs: Stack) -> None:
    run = finished(jobs, run_now(jobs, "tidy"))
    assert run.status == "succeeded" and run.error is None and run.session_id is not None
    root = jobs.slack.message(CHANNEL, run.root_ts or "")
    assert root is not None and root["text"] == "🔧 *tidy* started by <@U0ALICE> · `0 3 29 2 *` (UTC)"
    thread = jobs.wait(lambda: "succeeded in" in (t := jobs.thread_text(run.root_ts or "")) and t)
    assert "done: done" in thread  # the agent ran the prompt's command and answered
    summary = jobs.slack.messages(CHANNEL, run.root_ts)[-1]["text"]
    assert re.match(r"✅ \*tidy\* succeeded in \d+ s · ⚙ 1 command\(s\) · [\d,]+ tokens\n", summary), summary
    assert "new.txt (new)" in summary  # what changed in the workspace
    assert run.summary == summary
    with jobs.engine.connect() as conn:  # the job's yolo is never the session's
        assert conn.execute(select(Session.yolo).where(Session.id == run.session_id)).scalar_one() is None
    # The run has ended: a reply in its thread follows the channel (yolo off), not the job (yolo on).
    jobs.post("run: echo after-the-run", thread_ts=run.root_ts, user=ALICE)
    jobs.wait(lambda: approval_messages(jobs, run.root_ts or ""), message="the reply's call waits for an approver")
    assert "after-the-run" not in "".join(m["content"] for m in jobs.model.messages() if m["role"] == "tool")


def test_a_clone_that_fails_says_gits_words_and_failures_in_a_row_pause_the_job(jobs: Stack) -> None:
    first = finished(jobs, run_now(jobs, "broken"))
    assert first.status == "failed" and first.error is not None and "/nonexistent/repo" in first.error
    thread = jobs.wait(lambda: "failed after" in (t := jobs.thread_text(first.root_ts or "")) and t)
    assert "fatal: '/nonexistent/repo' does not appear to be a git repository" in thread  # git's own words
    second = finished(jobs, run_now(jobs, "broken"))
    assert second.status == "failed"
    paused = "⏸ *broken* paused itself after 2 failed runs in a row"
    jobs.wait(lambda: any(m["text"].startswith(paused) for m in jobs.slack.messages(CHANNEL)), message="the pause")
    with jobs.engine.connect() as conn:
        state = conn.execute(select(JobState.__table__).where(JobState.job_name == "broken")).one()
    assert state.paused and state.paused_by is None and state.consecutive_failures == 2
    # A reply in the failed run's thread is taken, told the workspace cannot be made, and not tried again and
    # again (housekeeping runs every second here).
    posted = jobs.post("why?", thread_ts=second.root_ts, user=ALICE)
    warnings = lambda: jobs.thread_text(second.root_ts or "").count("⚠️")  # noqa: E731
    jobs.wait(lambda: warnings() == 2 and jobs.status(posted.session_id) == "idle", message="one more warning")
    time.sleep(3)
    assert warnings() == 2 and jobs.status(posted.session_id) == "idle"


def test_a_run_due_while_the_previous_one_runs_is_skipped_and_the_time_limit_fails_a_run(jobs: Stack) -> None:
    jobs.model.always(Reply(text="thinking", stall_after=1, stall_for=60))
    slow = run_now(jobs, "slow")
    jobs.wait(lambda: run_row(jobs, slow).status == "running", message="the slow run runs")
    skipped = finished(jobs, run_now(jobs, "slow"))
    assert skipped.status == "skipped" and skipped.error == "the job's previous run was still running"
    run = finished(jobs, slow)
    assert run.status == "failed" and run.error == "it ran for longer than its time limit (2 s)"
    jobs.wait(lambda: "failed after" in jobs.thread_text(run.root_ts or ""), message="the summary")


@pytest.mark.alone  # real minute ticks: a scheduler slowed by other tests misses its tick
@pytest.mark.timeout(300)
def test_two_real_schedulers_give_one_run_a_tick_and_the_survivor_takes_over(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    minutely = f'jobs:\n  - {{name: minutely, schedule: "* * * * *", channel: {CHANNEL}, yolo: true, prompt: "hello"}}'
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config("{yolo: true}", minutely)) as s:
        s.model.always(policy)
        s.start_worker(beat=False)
        beats = {name: start_beat(s, name) for name in ("b1", "b2")}
        try:
            first = s.wait(lambda: runs_of(s, "minutely"), timeout=90, message="the first tick's run")
            # The scheduler that fired it goes away at once (kill -9: no hand-over); the other takes over within
            # its lease and fires the next tick, late if need be, once.
            with s.engine.connect() as conn:
                owner = conn.execute(select(SchedulerLease.owner)).scalar_one()
            leader = next(name for name, p in beats.items() if f":{p.pid}:" in owner)
            os.killpg(beats[leader].pid, signal.SIGKILL)
            beats[leader].wait()
            s.wait(lambda: len(runs_of(s, "minutely")) >= 2, timeout=150, message="the next tick's run")
            runs = runs_of(s, "minutely")
            ticks = [r.scheduled_for for r in runs]
            assert ticks[1] - ticks[0] == timedelta(minutes=1) and ticks[0] == first[0].scheduled_for
            assert all(t.second == 0 and t.microsecond == 0 for t in ticks)
            for run in runs[:2]:
                finished(s, run.id)
            runs = runs_of(s, "minutely")
            roots = [m["ts"] for m in s.slack.messages(CHANNEL) if m["text"].startswith("🔧 *minutely* started")]
            assert sorted(roots)[:2] == [r.root_ts for r in runs[:2]]  # one thread a tick: none fired twice
            assert {r.status for r in runs[:2]} == {"succeeded"}
        finally:
            for process in beats.values():
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def start_beat(s: Stack, name: str) -> subprocess.Popen[bytes]:
    log = open(s.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the scheduler's own, closed with it
    directory = s.tmp / name
    directory.mkdir()
    return subprocess.Popen(
        [MM_BOT, "beat"], env=s.env, cwd=directory, stdout=log, stderr=subprocess.STDOUT, process_group=0
    )


def runs_of(s: Stack, job: str) -> list[Any]:
    with s.engine.connect() as conn:
        return list(
            conn.execute(select(JobRun.__table__).where(JobRun.job_name == job).order_by(JobRun.scheduled_for)).all()
        )


def test_jobs_are_listed_run_now_paused_and_resumed_from_slack(jobs: Stack) -> None:
    base = jobs.start_bot()
    with SlackEventSender(base, SECRET, response_url=jobs.slack.response_url) as sender:

        def slash(text: str, user: str = APPROVER) -> str:
            before = len(jobs.slack.responses)
            assert sender.slash_command("/mm", text, user=user, channel=CHANNEL).status_code == 200
            jobs.wait(lambda: len(jobs.slack.responses) > before, message=f"the answer to /mm {text}")
            return jobs.slack.responses[before]["body"]["text"]

        listing = slash("jobs", user=ALICE)
        assert f"• *tidy* `0 3 29 2 *` (UTC) in <#{CHANNEL}> · next " in listing and "never run" in listing
        assert "Only this channel's approvers may run jobs" in slash("job run tidy", user=ALICE)
        assert "There is no job named `nope`" in slash("job run nope")
        assert slash("job run tidy") == f"🔧 <@{APPROVER}> started *tidy* now; its thread follows in <#{CHANNEL}>."
        jobs.wait(lambda: [r for r in runs_of(jobs, "tidy") if r.status == "succeeded"], message="the run")

        paused = slash("job pause tidy")
        assert paused.startswith(f"⏸ <@{APPROVER}> paused *tidy*")
        jobs.wait(lambda: any(m["text"] == paused for m in jobs.slack.messages(CHANNEL)), message="said in the channel")
        assert slash("job pause tidy") == "*tidy* is paused already."
        listing = slash("jobs", user=ALICE)
        assert f"⏸ paused (paused by <@{APPROVER}>)" in listing and "last ✅ succeeded" in listing
        slash("job run tidy")  # a paused job still runs when asked
        jobs.wait(lambda: len([r for r in runs_of(jobs, "tidy") if r.status == "succeeded"]) == 2, message="run 2")
        assert slash("job resume tidy").startswith(f"▶️ <@{APPROVER}> resumed *tidy*: its next run is ")
        assert "paused" not in slash("jobs", user=ALICE).split("\n")[0]
        assert [r.trigger for r in runs_of(jobs, "tidy")] == ["manual", "manual"]
        # App Home lists them as /mm jobs does.
        jobs.slack.add_user(ALICE, "alice")
        sender.app_home_opened(user=ALICE)
        home = jobs.wait(
            lambda: [v for v in jobs.slack.views if v.get("user_id") == ALICE and "Scheduled jobs" in str(v)],
            message="the jobs in App Home",
        )
        assert f"• *tidy* `0 3 29 2 *` (UTC) in <#{CHANNEL}>" in str(home[-1]["blocks"])
        # Asked again while a run still runs (this one waits for an approval): nothing more is started.
        slash("job run gated")
        jobs.wait(lambda: [r for r in runs_of(jobs, "gated") if r.status == "running"], message="gated runs")
        assert slash("job run gated") == (
            f"*gated* is running now (its thread is in <#{CHANNEL}>): "
            "a second run would be skipped, so none was started."
        )
        assert len(runs_of(jobs, "gated")) == 1


def test_a_gated_call_in_a_run_waits_for_an_approver_s_button(jobs: Stack) -> None:
    base = jobs.start_bot()
    run_id = run_now(jobs, "gated")
    root = jobs.wait(lambda: run_row(jobs, run_id).root_ts, message="the run's thread")
    prompt = jobs.wait(lambda: approval_messages(jobs, root), message="the approval message")[0]
    assert run_row(jobs, run_id).status == "running"  # waiting for a person, without holding a worker
    with SlackEventSender(base, SECRET, response_url=jobs.slack.response_url) as sender:
        click(sender, prompt, "approve", APPROVER, root)
    run = finished(jobs, run_id)
    assert run.status == "succeeded"
    thread = jobs.thread_text(root)
    assert "approved-in-a-job" in thread and f"Approved by <@{APPROVER}>" in thread


def test_approve_all_in_a_run_covers_the_run_s_prompt_and_ends_with_it(jobs: Stack) -> None:
    """Approve all in a run's thread covers the calls of the run's prompt (nobody wrote it): a reply afterwards,
    even by the person who ran the job, asks again."""
    base = jobs.start_bot()
    run_id = run_now(jobs, "gated")
    root = jobs.wait(lambda: run_row(jobs, run_id).root_ts, message="the run's thread")
    prompt = jobs.wait(lambda: approval_messages(jobs, root), message="the approval message")[0]
    with SlackEventSender(base, SECRET, response_url=jobs.slack.response_url) as sender:
        click(sender, prompt, "approve_all", APPROVER, root)
    assert finished(jobs, run_id).status == "succeeded"
    thread = jobs.thread_text(root)
    assert f"<@{APPROVER}> approved every call the job's prompt asks for in this thread" in thread
    assert "and every further call the job's prompt asks for in this thread" in thread
    jobs.post("run: echo after-the-run", thread_ts=root, user=ALICE)
    jobs.wait(lambda: len(approval_messages(jobs, root)) == 2, message="the reply's call waits for an approver")
    assert "after-the-run" not in "".join(m["content"] for m in jobs.model.messages() if m["role"] == "tool")


def test_a_run_s_changes_are_pushed_to_a_branch_and_a_failed_push_fails_the_run(jobs: Stack) -> None:
    run = finished(jobs, run_now(jobs, "pusher"))
    bare = jobs.tmp / "origin.git"
    local = run.scheduled_for.astimezone(ZoneInfo("Pacific/Kiritimati"))  # the job's date and time: UTC+14
    branch = f"mm/pusher/{local:%Y-%m-%d}-{run.id}"
    assert run.status == "succeeded" and run.pushed_branch == branch
    assert f"⬆️ Pushed `{branch}` to {bare} (" in run.summary
    shown = subprocess.run(
        ["git", "--git-dir", str(bare), "show", f"{branch}:pushed.txt"], capture_output=True, text=True, check=True
    )
    assert shown.stdout == "pushed\n"
    author = subprocess.run(
        ["git", "--git-dir", str(bare), "log", "-1", "--format=%an <%ae>%n%s", branch], capture_output=True, text=True
    ).stdout.splitlines()
    assert author == ["mm <mm@localhost>", f"pusher: run {run.id} of {local:%Y-%m-%d %H:%M} Pacific/Kiritimati"]

    lost = finished(jobs, run_now(jobs, "lost"))
    assert lost.status == "failed" and lost.pushed_branch is None
    assert lost.error.startswith(
        f"the push of `chores/lost-{lost.id}` failed: [git: git push --no-verify failed (exit 128): "
        "fatal: '/nonexistent/remote.git' does not appear to be a git repository"
    )
    jobs.wait(lambda: "❌ *lost* failed after" in jobs.thread_text(lost.root_ts), message="the summary says so")


def test_an_approval_nobody_answers_expires_and_fails_the_run(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    waiting = (
        f'jobs:\n  - {{name: unattended, schedule: "0 3 29 2 *", channel: {CHANNEL}, yolo: false, '
        'prompt: "run: echo nobody-approves"}\napprovals: {timeout: 2s}'
    )
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config(f"{{approvers: [{APPROVER}]}}", waiting)) as s:
        s.model.always(policy)
        s.start_worker()
        run = finished(s, run_now(s, "unattended"))
        assert run.status == "failed" and run.error == "a call waited for a decision until it expired"
        # The summary is posted once the run's row says how it ended: it may come a moment later.
        s.wait(lambda: "❌ *unattended* failed after" in s.thread_text(run.root_ts), message="the summary says so")
        assert "nobody-approves" in s.thread_text(run.root_ts)


# -- issue 21, second round: nobody rides on a job's yolo, and `status` says what the worker does ----------------------

EVE = "U0EVE"


def test_a_person_s_ask_in_a_run_s_thread_never_rides_on_the_job_s_yolo(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    """The reviewer's attack: between a run's turn ending and its close (its worker stopped there), the run is still
    running; a person's `ask` in its thread was taken then (take_command held back no one's command) and ran with
    the job's yolo: the asked agent worked, nobody approving. Now the command waits for the run's end, as messages
    do, and then asks; and the loop grants the job's yolo to the prompt nobody wrote alone."""
    jobs = f'jobs:\n  - {{name: tidy, schedule: "0 3 29 2 *", channel: {CHANNEL}, yolo: true, prompt: "hello"}}'
    text = config(f"{{yolo: false, approvers: [{APPROVER}]}}", "mmConfigs: {reviewer: {config: reviewer.yaml}}", jobs)
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=text) as s:
        (tmp_path / "reviewer.yaml").write_text(f"model: {{url: {s.model.url}, name: test-model}}\nsandbox: none\n")
        s.model.always(policy)
        # The run as a worker that stopped after its turn left it: the run running, its thread's turn ended.
        root = s.slack.add_message(CHANNEL, "🔧 *tidy* started", "U0BOT")["ts"]
        session = ensure_session(s.engine, channel_id=CHANNEL, thread_ts=root, kind=SessionKind.JOB)
        for entry in (UserMessage("hello"), AssistantMessage("answer: hello"), TurnEnded(Outcome.ANSWERED)):
            asyncio.run(DbStore(s.engine).append(session, entry))
        now = datetime.now(UTC)
        with s.engine.begin() as conn:
            run_id = conn.execute(
                insert(JobRun)
                .values(
                    job_name="tidy",
                    scheduled_for=now,
                    trigger=JobTrigger.MANUAL,
                    status=JobRunStatus.RUNNING,
                    started_at=now,
                    session_id=session,
                    channel_id=CHANNEL,
                    root_ts=root,
                )
                .returning(JobRun.id)
            ).scalar_one()
        # Eve's `@mm ask reviewer run: touch eve.txt`, as the bot records it.
        asked = s.slack.add_message(CHANNEL, "<@U0BOT> ask reviewer run: touch eve.txt", EVE, thread_ts=root)["ts"]
        request = {"agent": "reviewer", "prompt": "run: touch eve.txt"}
        record_message(
            s.engine,
            channel_id=CHANNEL,
            thread_ts=root,
            message_ts=asked,
            user_id=EVE,
            text=json.dumps(request),
            command=InboxCommand.ASK,
        )
        s.start_worker()
        s.enqueue(session)
        # The run is closed first (its end was never recorded); then Eve's request asks an approver.
        s.wait(lambda: approval_messages(s, root), message="Eve's request waiting for an approver")
        assert (run_row(s, run_id).status, run_row(s, run_id).error) == ("failed", NO_END)
        with s.engine.connect() as conn:
            assert conn.execute(select(Approval.tool, Approval.requested_by)).all() == [("ask_agent", EVE)]
            assert conn.execute(select(ToolCall.decision).where(ToolCall.tool == "ask_agent")).scalar_one() is None
        time.sleep(1)
        assert not (s.workspace(session) / "eve.txt").exists()
        asked_model = [r for r in s.model.requests if "run: touch eve.txt" in json.dumps(r.json["messages"][-1])]
        assert asked_model == []  # the reviewer never ran


def test_yolo_said_during_a_run_outlives_it_and_status_says_what_the_worker_does(jobs: Stack) -> None:
    """The reviewer's finding: `status` read the thread's setting (sessions.yolo) while the worker let the log's
    `yolo on|off` win, and a run's end reset the thread's setting even when an approver had said `yolo on` in it.
    The approver's switch is kept, and `status` asks the worker's own function."""
    base = jobs.start_bot()
    run_id = run_now(jobs, "gated")
    root = jobs.wait(lambda: run_row(jobs, run_id).root_ts, message="the run's thread")
    prompt = jobs.wait(lambda: approval_messages(jobs, root), message="the approval message")[0]
    with SlackEventSender(base, SECRET, response_url=jobs.slack.response_url) as sender:
        sender.app_mention("<@U0BOT> yolo on", channel=CHANNEL, user=APPROVER, thread_ts=root)
        jobs.wait(lambda: "switched this thread to yolo" in jobs.thread_text(root), message="yolo on")
        click(sender, prompt, "approve", APPROVER, root)
        assert finished(jobs, run_id).status == "succeeded"
        session = run_row(jobs, run_id).session_id
        jobs.wait(lambda: "yolo" in jobs.log_kinds(session), message="the switch taken into the log after the run")
        with jobs.engine.connect() as conn:
            assert conn.execute(select(Session.yolo).where(Session.id == session)).scalar_one() is True
        sender.app_mention("<@U0BOT> status", channel=CHANNEL, user=ALICE, thread_ts=root)

        def status() -> list[str]:
            return [m["text"] for m in jobs.slack.ephemerals if "*Status:*" in (m.get("text") or "")]

        said = jobs.wait(status, message="the status")[0]
        assert "*Asks before commands and edits:* no (yolo)" in said
    # And the worker does what it says: Alice's request runs without asking.
    jobs.post("run: echo after-the-run", thread_ts=root, user=ALICE)
    jobs.wait(
        lambda: "after-the-run\n" in [m["content"] for m in jobs.model.messages() if m["role"] == "tool"],
        message="Alice's request, run without asking",
    )
    assert len(approval_messages(jobs, root)) == 1
