"""The `mm-bot` console script as a user runs it: init, migrate, beat, dev (with Ctrl-C), worker (with ping)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from chatops import db
from chatops.config import load_config
from commands.services import dev_broker
from mm_testkit.fixtures_kit import path_without
from mmbot_helpers import MM_BOT, clean_env, free_port, mm_bot, session_processes, stop, wait_healthy
from playground.server import host_allowed

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)


def test_init_writes_an_example_that_loads(tmp_path: Path) -> None:
    result = mm_bot("init", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "wrote mm.yaml" in result.stdout
    config = load_config(tmp_path / "mm.yaml", environ={})
    assert config.path == tmp_path / "mm.yaml"


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "custom.yaml"
    target.write_text("yolo: true\n")
    result = mm_bot("init", "--path", str(target), env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr and "--force" in result.stderr
    assert target.read_text() == "yolo: true\n"

    forced = mm_bot("init", "--path", str(target), "--force", env=clean_env(), cwd=tmp_path)
    assert forced.returncode == 0
    assert target.read_text() != "yolo: true\n"
    load_config(target, environ={})


def test_init_into_a_missing_directory_says_so(tmp_path: Path) -> None:
    result = mm_bot("init", "--path", str(tmp_path / "no" / "such" / "mm.yaml"), env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot write" in result.stderr and "Traceback" not in result.stderr


def test_bad_config_is_printed_as_file_line_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("yolo: true\nmaxTurns: many\nyloo: false\n")
    result = mm_bot("--config", "bad.yaml", "migrate", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    assert "bad.yaml:2: maxTurns: expected an integer" in result.stderr
    assert 'bad.yaml:3: yloo: unknown key (did you mean "yolo"?)' in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "var").exists()  # nothing was migrated


def test_config_named_by_mm_config_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    result = mm_bot("migrate", env=clean_env(MM_CONFIG=str(tmp_path / "gone.yaml")), cwd=tmp_path)
    assert result.returncode == 2
    assert "gone.yaml: no such file" in result.stderr and "Traceback" not in result.stderr


def test_migrate_on_sqlite_says_from_which_to_which_revision(tmp_path: Path, sqlite_url: str) -> None:
    env = clean_env(DATABASE_URL=sqlite_url)
    head = db.head_revision()
    first = mm_bot("migrate", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"from an empty database to {head}" in first.stdout
    assert db.current_revision(sqlite_url) == head
    again = mm_bot("migrate", env=env, cwd=tmp_path)
    assert again.returncode == 0 and f"already at {head}" in again.stdout


@pytest.mark.postgres
def test_migrate_on_postgres_masks_the_password(tmp_path: Path, fresh_pg_url: str) -> None:
    url = fresh_pg_url.replace("postgres@", "postgres:not-needed-pw@", 1)  # trust auth ignores the password
    result = mm_bot("migrate", env=clean_env(DATABASE_URL=url), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "not-needed-pw" not in result.stdout and ":***@" in result.stdout
    assert db.current_revision(fresh_pg_url) == db.head_revision()


@pytest.mark.parametrize("command", ["migrate", "dev"])
def test_an_unreachable_or_unusable_database_is_a_sentence_not_a_traceback(tmp_path: Path, command: str) -> None:
    closed = free_port()  # nothing listens there
    blocker = tmp_path / "file"
    blocker.write_text("")
    for url, reason in (
        (f"postgresql://mm:s3cret-pw@127.0.0.1:{closed}/mm", "connection refused"),
        (f"sqlite:///{blocker}/sub/mm.sqlite3", "Not a directory"),
        ("nonsense", "Could not parse"),
        ("mysql://mm:s3cret-pw@127.0.0.1/mm", "No module named"),  # a driver that is not installed
    ):
        result = (
            mm_bot(command, "--port", str(free_port()), env=clean_env(DATABASE_URL=url), cwd=tmp_path)
            if command == "dev"
            else mm_bot(command, env=clean_env(DATABASE_URL=url), cwd=tmp_path)
        )
        assert result.returncode == 1, (url, result.stderr)
        assert "Traceback" not in result.stderr and "s3cret-pw" not in result.stderr + result.stdout
        assert f"mm-bot {command}: cannot use the database" in result.stderr and reason in result.stderr
        assert "set DATABASE_URL" in result.stderr


def test_the_playground_listens_beyond_this_machine_only_when_told_that_it_is_unsafe(tmp_path: Path) -> None:
    result = mm_bot("playground", "--host", "0.0.0.0", "--port", str(free_port()), env=clean_env(), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "0.0.0.0 is not this machine's loopback address" in result.stderr
    assert "anyone who can reach 0.0.0.0 can post as any of its people" in result.stderr
    assert "pass --expose as well" in result.stderr
    assert not (tmp_path / "var").exists()  # refused before anything started


def test_the_page_answers_to_loopback_and_when_exposed_to_addresses_never_to_other_names() -> None:
    for host in ("127.0.0.1:3000", "localhost:3000", "LOCALHOST:3000", "127.0.0.2:80", "[::1]:3000", "localhost"):
        assert host_allowed(host, exposed=False) and host_allowed(host, exposed=True), host
    for host in ("192.168.1.20:3000", "[fe80::1]:3000", "10.0.0.5"):
        assert not host_allowed(host, exposed=False) and host_allowed(host, exposed=True), host
    for host in ("evil.example:3000", "localhost.evil.example", "127.0.0.1.nip.io:3000", ""):
        assert not host_allowed(host, exposed=False) and not host_allowed(host, exposed=True), host
    # The name the operator gave --host is theirs, not a rebound one; it counts only when exposed.
    assert host_allowed("MyBox:3000", exposed=True, bound="mybox")
    assert not host_allowed("mybox:3000", exposed=False, bound="mybox")
    assert not host_allowed("evil.example:3000", exposed=True, bound="mybox")


def test_unknown_command_is_a_usage_error(tmp_path: Path) -> None:
    result = mm_bot("sevre", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


# --- dev -----------------------------------------------------------------------------------------------------


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_dev_prints_only_its_own_lines_each_once_and_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    port, model_port = free_port(), free_port()
    # An embedded broker file of the test's own: a worker on the shared Redis could take other runs' messages.
    # And a machine without bubblewrap, as many laptops are: dev warns and starts its worker all the same.
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    # A bot token without its signing secret: dev starts the bot for Slack (without a token it would start the
    # playground, tests/test_playground.py) and says what is still missing.
    env = clean_env(
        CELERY_BROKER_URL=broker,
        MM_MODEL_URL=f"http://mm:model-pw-never-printed@127.0.0.1:{model_port}/v1",
        PATH=path_without("bwrap", tmp_path),
        SLACK_BOT_TOKEN="xoxb-dev-test",
    )
    process = subprocess.Popen(
        [MM_BOT, "dev", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    output: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while not any("ready; Ctrl-C stops everything" in line for line in output):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "dev exited early:\n" + "".join(output)
            output.append(line)
        assert (tmp_path / "var" / "mm.sqlite3").exists()
        base = f"http://127.0.0.1:{port}"
        health = wait_healthy(base, process)
        assert health["database"] is True and health["slack"] is False
        # Unverifiable requests are refused, not served.
        refused = httpx.post(f"{base}/slack/events", json={"type": "url_verification", "challenge": "x"})
        assert refused.status_code == 401
        children = session_processes(process.pid)
        assert len(children) >= 3, children  # dev, the bot, the worker (and its pool)

        os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    leftovers = session_processes(process.pid)
    assert leftovers == [], leftovers
    while (line := lines.get(timeout=10)) is not None:
        output.append(line)
    # No banner, no SecurityWarning of a root worker, no line of the children's own, each missing secret once.
    assert [re.sub(r"\(pid \d+\)", "(pid N)", line.rstrip("\n")) for line in output] == [
        f"mm-bot dev: database sqlite:///./var/mm.sqlite3 (migrated from an empty database to {db.head_revision()})",
        f"mm-bot dev: broker {broker}",
        "mm-bot dev: sandbox: bubblewrap is not installed, and you are root: bash commands and language servers "
        "are refused in directories root owns (they would run as root); install bubblewrap (apt-get install "
        "bubblewrap), or run as an unprivileged user"
        if os.geteuid() == 0
        else "mm-bot dev: sandbox: bubblewrap is not installed: bash commands run unsandboxed, with your access to "
        "files and the network; install bubblewrap (apt-get install bubblewrap) to confine each to its "
        "workspace, or set `sandbox: none` to say you mean it",
        f"mm-bot dev: bot listening on {base}: Slack's requests to {base}/slack/events, health at {base}/healthz",
        f"mm-bot dev: worker started (pid N) on {broker}",
        "mm-bot dev: scheduler: housekeeping and the config's 0 job(s) run in the worker",
        "mm-bot dev: no SLACK_SIGNING_SECRET: Slack's requests are refused (they cannot be verified) until you set "
        "it; see docs/slack-app.md",
        f"mm-bot dev: model: http://mm:***@127.0.0.1:{model_port}/v1 unreachable: connection refused — start your "
        "model server or set MM_MODEL_URL",
        "mm-bot dev: ready; Ctrl-C stops everything",
        "mm-bot dev: stopping",
    ]


def test_dev_falls_back_to_the_embedded_broker_when_the_default_redis_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    # CELERY_BROKER_URL is how the config learns the URL; dev_broker is told it was not the user's choice.
    config = load_config(environ={"CELERY_BROKER_URL": dead})
    url, note = dev_broker(config, {})
    assert url == f"sqla+sqlite:///{tmp_path / 'var' / 'broker.sqlite3'}"
    assert note is not None and "embedded broker" in note and "connection refused" in note
    # A broker the user named is used as is, even when it does not answer: a typo must fail loudly.
    assert dev_broker(config, {"CELERY_BROKER_URL": dead}) == (dead, None)


def test_dev_keeps_the_default_redis_when_it_answers(redis_url: str) -> None:
    config = load_config(environ={"CELERY_BROKER_URL": redis_url})
    assert dev_broker(config, {}) == (redis_url, None)


# --- worker --------------------------------------------------------------------------------------------------


def test_ping_runs_through_a_real_worker_on_redis(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_name = f"{redis_prefix}ping-{uuid.uuid4().hex[:8]}"  # this run's own queue: runs never collide
    env = clean_env(CELERY_BROKER_URL=redis_url)
    (tmp_path / "mm.yaml").write_text("sandbox: none\n")  # the broker is tested here, not the sandbox
    worker = subprocess.Popen(
        [
            MM_BOT,
            "worker",
            "--",
            "-Q",
            queue_name,
            "--pool",
            "solo",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    monkeypatch.setenv("CELERY_BROKER_URL", redis_url)
    from workers.celery_app import app

    app.conf.update(broker_url=redis_url, result_backend=redis_url)
    try:
        result = app.send_task("mm.ping", queue=queue_name)  # by name, as the bot enqueues
        assert result.get(timeout=60) == "pong"
        result.forget()
    finally:
        stop(worker)
        client = redis.Redis.from_url(redis_url)
        client.delete(*(list(client.scan_iter(match=f"*{queue_name}*")) or ["-"]))
        client.close()
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost and app.conf.worker_prefetch_multiplier == 1


def test_run_hands_its_arguments_to_the_terminal_front_end(tmp_path: Path) -> None:
    # --help included: it is the front end's, not mm-bot's.
    result = mm_bot("run", "--help", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: mm-bot run" in result.stdout and "-p PROMPT" in result.stdout


def test_options_a_command_does_not_have_are_refused(tmp_path: Path) -> None:
    result = mm_bot("migrate", "--bogus", env=clean_env(), cwd=tmp_path)
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr
