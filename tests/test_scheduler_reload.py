"""The scheduler reads its jobs again when the config file changes and on SIGHUP, and keeps the jobs it had when
the new file does not load (saying why)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

from workers.celery_app import app
from workers.scheduler import JobScheduler

JOB = '  - {{name: {name}, schedule: "0 3 * * *", channel: C0JOBS, prompt: tidy}}\n'


def write(path: Path, *names: str, mtime: int) -> None:
    path.write_text("jobs:\n" + "".join(JOB.format(name=n) for n in names))
    os.utime(path, (mtime, mtime))  # a change the scheduler sees, whatever the file system's clock resolution


def test_the_jobs_follow_the_file_and_sighup_and_a_broken_file_keeps_the_last_good_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "mm.yaml"
    write(config, "first", mtime=1_700_000_000)
    monkeypatch.setenv("MM_CONFIG", str(config))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'mm.sqlite3'}")
    scheduler = JobScheduler(app=app, schedule_filename=str(tmp_path / "beat"), lazy=True)
    names = lambda: [j.name for j in scheduler.config.service.jobs]  # noqa: E731 - read again at each look
    assert names() == ["first"]

    write(config, "first", "second", mtime=1_700_000_100)
    scheduler._reload()
    assert names() == ["first", "second"]

    config.write_text("jobs: [\n")
    os.utime(config, (1_700_000_200, 1_700_000_200))
    with caplog.at_level(logging.ERROR, logger="mm.scheduler"):
        scheduler._reload()
    assert names() == ["first", "second"]
    assert "the config no longer loads; the scheduler keeps the jobs it had" in caplog.text

    # The file fixed without its time changing (a copy that kept it): SIGHUP says to read it anyway.
    write(config, "third", mtime=1_700_000_200)
    scheduler._reload()
    assert names() == ["first", "second"]
    os.kill(os.getpid(), signal.SIGHUP)
    scheduler._reload()
    assert names() == ["third"]
    scheduler.engine.dispose()
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the scheduler's handler, not this test process's
