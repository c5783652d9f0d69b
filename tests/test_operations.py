"""What an operator watches: the log (plain or JSON, the session a line is about, no secret in any line), the
metrics every process serves, and the liveness and readiness a pod's probes ask for."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from chatops import logs
from mm_testkit.redis_server import OwnRedis
from mmbot_helpers import MM_BOT, free_port
from playground.model_server import Fail
from playground.signed import SlackEventSender
from threads_support import CHANNEL, SECRET, click, config, repositories, stack, waiting_message

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

TOKEN_IN_REPO = "planted"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def logged(monkeypatch: pytest.MonkeyPatch, fmt: str, secrets: list[str]) -> tuple[io.StringIO, logging.Logger]:
    monkeypatch.setenv(logs.FORMAT_ENV, fmt)
    out = io.StringIO()
    logs.setup_logging(secrets, stream=out)
    return out, logging.getLogger("mm.test")


def test_json_lines_carry_the_session_and_no_secret_reaches_them(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    out, log = logged(monkeypatch, "json", ["xoxb-1234-secret", 'quote"secret'])
    token = logs.session_id.set("0123abcd")
    try:
        log.info("posting with %s to postgresql://mm:hunter2@db:5432/mm", "xoxb-1234-secret")
        try:
            raise RuntimeError('the API said: bad token xoxb-1234-secret and quote"secret')
        except RuntimeError:
            log.exception("a call failed")
    finally:
        logs.session_id.reset(token)
    log.warning("no session here", extra={"job": "nightly"})
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["level"], line["logger"], line["session_id"]) for line in lines] == [
        ("INFO", "mm.test", "0123abcd"),
        ("ERROR", "mm.test", "0123abcd"),
        ("WARNING", "mm.test", None),
    ]
    assert lines[0]["message"] == "posting with *** to postgresql://mm:***@db:5432/mm"
    assert "RuntimeError: the API said: bad token *** and ***" in lines[1]["exc_info"]
    assert lines[2]["job"] == "nightly" and "T" in lines[2]["time"]
    assert "xoxb-1234-secret" not in out.getvalue() and "hunter2" not in out.getvalue()


def test_redacting_a_long_line_costs_linear_time_and_still_masks_a_password() -> None:
    # A tool's 8 MB line of letters: an unbounded scheme made each start scan to the end (minutes; the
    # suite's timeout fails it). The password of a URL at its end is masked all the same.
    line = "y" * (8 << 20) + " https://bot:pw-4711@example.com/x"
    said = logs.redact(line, [])
    assert said.endswith(f"https://bot:{logs.MASK}@example.com/x") and "pw-4711" not in said


def test_plain_lines_name_the_session_and_a_bad_format_is_said_and_kept_plain(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    out, log = logged(monkeypatch, "yaml", ["s3cr3t-value"])
    token = logs.session_id.set("feed")
    log.info("value s3cr3t-value")
    logs.session_id.reset(token)
    first, second = out.getvalue().splitlines()
    assert "WARNING mm.logs: MM_LOG_FORMAT='yaml' is neither `plain` nor `json`" in first
    assert second.endswith("INFO mm.test [session feed]: value ***")


# --- a real worker: metrics after a turn, a planted secret kept out of Slack and the log --------------------


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of Prometheus' text format (labels given must match; others may be there)."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def test_a_turn_shows_in_the_metrics_and_a_planted_secret_reaches_neither_slack_nor_the_log(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    origin, _ = repositories(tmp_path)
    # The database URL carries a password (trust auth ignores it): a secret the worker knows, like its token.
    parts = urlsplit(fresh_pg_url)
    database_url = parts._replace(
        netloc=f"{parts.username or 'postgres'}:pg-pass-4321@{parts.hostname}:{parts.port}"
    ).geturl()
    channel = f"{{yolo: true, repo: {origin}}}"
    with stack(tmp_path, database_url, own_redis.url, config=config(channel)) as s:
        # Picked once the stack's own servers listen: one of them could take a port chosen before (a 404).
        metrics_port = free_port()
        s.extra_env |= {"MM_METRICS_PORT": str(metrics_port), "MM_LOG_FORMAT": "json"}
        token = s.slack.bot_token
        # The repository holds the token (a file the model reads out) and the tool fails saying it.
        (origin / "leak.sh").write_text(f"echo {token}; echo pg-pass-4321 >&2; exit 3\n")
        subprocess.run(["git", "add", "leak.sh"], cwd=origin, check=True)
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "leak"],
            cwd=origin,
            check=True,
        )
        s.start_worker()
        posted = s.post("run: sh leak.sh")
        s.wait(lambda: "done:" in s.thread_text(posted.thread_ts), message="the answer quoting the output")
        # Then the model fails, its error quoting the token.
        s.model.script(Fail(500, message=f"upstream rejected the key {token} at postgresql://u:pg-pass-4321@h/x"))
        second = s.post("again", thread_ts=posted.thread_ts)
        s.wait(lambda: s.turns_ended(second.session_id) >= 2, message="the failed turn ended")

        text = scrape(metrics_port)
        assert (sample(text, "mm_turns_started_total") or 0) >= 2
        assert (sample(text, "mm_turns_finished_total", outcome="answered") or 0) >= 1
        assert (sample(text, "mm_turns_finished_total", outcome="failed") or 0) >= 1  # the model's error
        assert sample(text, "mm_turns_running") == 0
        assert (sample(text, "mm_tool_call_seconds_count", tool="bash") or 0) >= 1
        assert (sample(text, "mm_model_call_seconds_count") or 0) >= 2
        assert (sample(text, "mm_model_tokens_total", kind="prompt") or 0) > 0
        assert sample(text, "mm_queue_depth", queue="turns") == 0

        messages = s.slack.messages(CHANNEL, posted.thread_ts)
        assert "***" in json.dumps(messages)  # the output was posted, masked
        leaks = [m for m in messages if token in json.dumps(m) or "pg-pass-4321" in json.dumps(m)]
        assert not leaks, json.dumps(leaks)
        log = s.log_of()
        assert token not in log and "pg-pass-4321" not in log
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        assert lines and all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
        about_session = [line for line in lines if line.get("session_id") == posted.session_id]
        assert any("upstream rejected the key ***" in json.dumps(line) for line in about_session), about_session


def test_probes_say_live_and_ready_and_a_broker_outage_makes_a_worker_unready_but_not_dead(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    with stack(tmp_path, fresh_pg_url, own_redis.url) as s:
        files = {"MM_HEARTBEAT_FILE": str(tmp_path / "heartbeat"), "MM_READY_FILE": str(tmp_path / "ready")}
        env = s.env | files

        def probe(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [MM_BOT, "probe", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
            )

        before = probe("live")
        assert before.returncode == 1 and f"no heartbeat at {tmp_path / 'heartbeat'}" in before.stderr
        s.extra_env |= files
        s.start_worker(beat=False)
        ready = s.wait(lambda: (r := probe("ready")).returncode == 0 and r, message="the worker is ready")
        assert "connected to the broker, taking turns" in ready.stdout and probe("live").returncode == 0

        own_redis.stop()  # the broker goes away: the worker takes nothing, and lives on
        lost = s.wait(lambda: (r := probe("ready")).returncode == 1 and r, message="the worker is unready")
        assert "no " in lost.stderr and "lost the broker" in lost.stderr
        time.sleep(12)  # longer than a beat: the heartbeat goes on without the broker
        assert probe("live", "--max-age", "11").returncode == 0
        own_redis.start()
        s.wait(lambda: probe("ready").returncode == 0, timeout=90, message="ready again once the broker is back")

        s.kill_worker()
        old = time.time() - 120
        os.utime(tmp_path / "heartbeat", (old, old))
        stale = probe("ready", "--max-age", "60")
        assert stale.returncode == 1 and "old (more than 60s): the process is stuck" in stale.stderr


def test_migrate_check_waits_for_the_schema_and_lets_a_rolled_back_release_run(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    env = {**os.environ, "DATABASE_URL": url, "MM_CONFIG": str(tmp_path / "none.yaml")}
    (tmp_path / "none.yaml").write_text("{}\n")

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [MM_BOT, "migrate", "--check"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )

    empty = check()
    assert empty.returncode == 1 and "at the empty schema, the code needs" in empty.stderr
    subprocess.run([MM_BOT, "migrate"], env=env, cwd=tmp_path, check=True, capture_output=True, timeout=60)
    ready = check()
    assert ready.returncode == 0 and "as the code needs" in ready.stdout
    engine = create_engine(url)
    with engine.begin() as conn:  # what a newer release's migration leaves
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed0099'"))
    engine.dispose()
    newer = check()
    assert newer.returncode == 0 and "newer than this code's" in newer.stdout


def test_the_bot_counts_approval_waits_and_the_worker_slack_s_429s_and_errors(
    tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis
) -> None:
    approver = "U0BOB"
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=config(f"{{yolo: false, approvers: [{approver}]}}")) as s:
        bot_metrics, worker_metrics = free_port(), free_port()  # once the stack's own servers listen
        s.extra_env |= {"MM_METRICS_PORT": str(worker_metrics)}
        s.start_worker()
        s.extra_env |= {"MM_METRICS_PORT": str(bot_metrics)}
        base = s.start_bot()
        # Slack answers the worker's first post with a 429 (it waits Retry-After and posts again), and refuses a
        # status update once.
        s.slack.rate_limit("chat.postMessage", times=1, retry_after=1)
        s.slack.fail("chat.update", "ratelimited_but_not_really", times=1)
        posted = s.post("run: echo gated-output", user="U0ALICE")
        message = waiting_message(s, posted.thread_ts)
        with SlackEventSender(base, SECRET, response_url=s.slack.response_url) as sender:
            click(sender, message, "approve", approver, posted.thread_ts)
        s.wait(lambda: "done: gated-output" in s.thread_text(posted.thread_ts), message="the approved turn's answer")

        bot = scrape(bot_metrics)
        assert (sample(bot, "mm_approval_wait_seconds_count", decision="approved") or 0) == 1
        worker = scrape(worker_metrics)
        assert (sample(worker, "mm_slack_rate_limited_total", method="chat.postMessage") or 0) >= 1
        # Counted by whichever process Slack refused (the worker updates its status, the bot the approval).
        refused = [sample(text, "mm_slack_api_errors_total", method="chat.update") or 0 for text in (bot, worker)]
        assert sum(refused) == 1
        assert (sample(worker, "mm_turns_finished_total", outcome="suspended") or 0) >= 1


def test_a_worker_whose_loop_stopped_refreshing_stops_beating_and_a_stale_ready_file_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from commands.probe import ready
    from workers import heartbeat

    monkeypatch.setenv(heartbeat.HEARTBEAT_ENV, str(tmp_path / "heartbeat"))
    monkeypatch.setenv(heartbeat.READY_ENV, str(tmp_path / "ready"))
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.05)
    (tmp_path / "ready").touch()  # a previous container's, left in the pod's /tmp by a kill -9
    step = heartbeat.Heartbeat(None)
    step.start(None)
    try:
        assert not (tmp_path / "ready").exists()  # not this worker's word: removed at start
        assert ready(60)[0] is False
        (tmp_path / "ready").touch()  # the consumer connected
        assert ready(60) == (True, "ready: connected to the broker, taking turns")
        old = time.time() - heartbeat.STALE_S - 5  # the consumer's loop stopped refreshing it
        os.utime(tmp_path / "ready", (old, old))
        time.sleep(0.3)  # the beat thread has seen it (it looks every 0.05 s here)
        os.utime(tmp_path / "heartbeat", (old, old))
        time.sleep(0.5)
        assert (heartbeat.age(tmp_path / "heartbeat") or 0) > heartbeat.STALE_S  # no beat: liveness will fail
        (tmp_path / "heartbeat").touch()  # were it fresh, the stale ready file would still say not ready
        stuck = ready(60)
        assert stuck[0] is False and "old (the worker's loop is stuck)" in stuck[1], stuck
        os.utime(tmp_path / "heartbeat", (old, old))
        (tmp_path / "ready").unlink()  # the broker is gone instead: the beat goes on
        time.sleep(0.5)
        assert (heartbeat.age(tmp_path / "heartbeat") or 99) < 1
    finally:
        step.stop(None)
