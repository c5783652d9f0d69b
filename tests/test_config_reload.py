"""Every process reads the config file again when it changes (chatops/reload.py): the scheduler also on SIGHUP,
the bot's commands at their next use, a worker when a run names a job it has not read yet. A file that no longer
loads is reported, and the last good config stays in use."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from chatops.config import load_config
from chatops.jobs import record_manual_run
from chatops.reload import ConfigFile
from chatops.schema import JobRun, JobRunStatus

JOB = '  - {{name: {name}, schedule: "0 3 * * *", channel: C0JOBS, prompt: tidy}}\n'


def write(path: Path, *names: str, mtime: int) -> None:
    path.write_text("jobs:\n" + "".join(JOB.format(name=n) for n in names))
    os.utime(path, (mtime, mtime))  # a change the reader sees, whatever the file system's clock resolution


def names(config_file: ConfigFile) -> list[str]:
    return [j.name for j in config_file.current().service.jobs]


def test_the_config_follows_its_file_and_a_broken_file_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mm.yaml"
    write(path, "first", mtime=1_700_000_000)
    config_file = ConfigFile(load_config(path), check_s=0)
    assert names(config_file) == ["first"]
    write(path, "first", "second", mtime=1_700_000_100)
    assert names(config_file) == ["first", "second"]

    path.write_text("jobs: [\n")
    os.utime(path, (1_700_000_200, 1_700_000_200))
    with caplog.at_level(logging.ERROR, logger="mm.config"):
        assert names(config_file) == ["first", "second"]
    assert "the config no longer loads; the previous one stays in use until it is fixed" in caplog.text
    assert f"{path}:" in caplog.text  # where the problem is, as at start-up

    write(path, "third", mtime=1_700_000_300)
    assert names(config_file) == ["third"]

    # Looked at once a second at most (here: an hour); asking reads it at once, changed or not (SIGHUP).
    config_file = ConfigFile(load_config(path), check_s=3600)
    write(path, "fourth", mtime=1_700_000_400)
    assert names(config_file) == ["third"]
    config_file.ask()
    assert names(config_file) == ["fourth"]


def test_sighup_makes_the_scheduler_read_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.celery_app import app
    from workers.scheduler import JobScheduler

    path = tmp_path / "mm.yaml"
    write(path, "first", mtime=1_700_000_000)
    monkeypatch.setenv("MM_CONFIG", str(path))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'mm.sqlite3'}")

    class Patient(JobScheduler):
        CONFIG_CHECK_S = 3600.0  # on its own it would not look at the file for an hour

    scheduler = Patient(app=app, schedule_filename=str(tmp_path / "beat"), lazy=True)
    try:
        assert names(scheduler.config_file) == ["first"]
        write(path, "other", mtime=1_700_000_100)
        assert names(scheduler.config_file) == ["first"]
        os.kill(os.getpid(), signal.SIGHUP)
        assert names(scheduler.config_file) == ["other"]
    finally:
        scheduler.engine.dispose()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the scheduler's handler, not this test process's


def test_a_job_added_by_an_edit_is_listed_by_the_bot_and_started_by_a_worker_that_had_not_read_it(
    tmp_path: Path, engine: Engine
) -> None:
    from bot.authorize import Approvers
    from bot.jobs import JobCommands
    from workers.jobs import claim_run

    path = tmp_path / "mm.yaml"
    write(path, "first", mtime=1_700_000_000)
    bot_config = ConfigFile(load_config(path), check_s=0)
    worker_config = ConfigFile(load_config(path), check_s=3600)  # it would not look again for an hour
    commands = JobCommands(engine, bot_config, Approvers(lambda: bot_config.current().service), None)
    assert "second" not in asyncio.run(commands.answer(None, "jobs", "U0ADA"))[0]

    write(path, "first", "second", mtime=1_700_000_100)
    assert "*second*" in asyncio.run(commands.answer(None, "jobs", "U0ADA"))[0]
    run_id = record_manual_run(engine, "second", "U0ADA", datetime.now(UTC))
    start = claim_run(engine, worker_config, run_id)
    assert start is not None and start.job.name == "second"
    with engine.connect() as conn:
        assert conn.execute(select(JobRun.status).where(JobRun.id == run_id)).scalar_one() == JobRunStatus.RUNNING

    # A job this pod's copy of the file does not have yet: the run waits to be sent again …
    early = record_manual_run(engine, "coming", "U0ADA", datetime.now(UTC))
    assert claim_run(engine, worker_config, early) is None
    # … and one still unknown ten minutes on fails, saying why.
    gone = record_manual_run(engine, "removed", "U0ADA", datetime.now(UTC) - timedelta(minutes=11))
    assert claim_run(engine, worker_config, gone) is None
    with engine.connect() as conn:
        statuses = dict(conn.execute(select(JobRun.id, JobRun.status).where(JobRun.id.in_([early, gone]))).all())
        error = conn.execute(select(JobRun.error).where(JobRun.id == gone)).scalar_one()
    assert statuses == {early: JobRunStatus.SCHEDULED, gone: JobRunStatus.FAILED}
    assert error == "the job is no longer in the config"


def test_a_configmap_s_symlink_swap_and_a_deleted_file_and_what_only_a_restart_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Kubernetes mounts a ConfigMap as mm.yaml -> ..data/mm.yaml, ..data -> ..<timestamp>/, and swaps ..data.
    first, second = tmp_path / "..2026_01", tmp_path / "..2026_02"
    for folder, name, lease in ((first, "first", 30), (second, "second", 5)):
        folder.mkdir()
        (folder / "mm.yaml").write_text(
            "jobs:\n" + JOB.format(name=name) + f"worker: {{leaseSeconds: {lease}}}\nworkspaces: {{root: /w/{name}}}\n"
        )
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "mm.yaml").symlink_to("..data/mm.yaml")
    config_file = ConfigFile(load_config(tmp_path / "mm.yaml", environ={}), check_s=0)
    assert names(config_file) == ["first"]
    (tmp_path / "..data.tmp").symlink_to(second.name)
    os.replace(tmp_path / "..data.tmp", tmp_path / "..data")
    with caplog.at_level(logging.WARNING, logger="mm.config"):
        config = config_file.current()
    assert [j.name for j in config.service.jobs] == ["second"]
    # The lease keeper's pace and the running threads' files stay as the process started with them.
    assert (config.service.worker.leaseSeconds, config.workspaces_root) == (30, Path("/w/first"))
    assert "workspaces.root, worker changed: this process keeps the old value until it restarts" in caplog.text

    (tmp_path / "..data").unlink()  # gone: the last good config stays
    with caplog.at_level(logging.ERROR, logger="mm.config"):
        assert names(config_file) == ["second"]
    assert "the config no longer loads" in caplog.text
