"""Celery beat's scheduler for `mm-bot beat`: housekeeping's entries and the jobs of the config, fired by one
scheduler at a time.

Every scheduler started (one by mistake, or a second replica) ticks, but only the one holding the leadership
lease in the database fires anything (chatops/jobs.py); another takes over within a lease when it stops, and
the job runs' uniqueness stays the last guard. The jobs come from the config, read again on SIGHUP and when the
file changes; a config that no longer loads is reported and the previous one kept.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from typing import Any

from celery.beat import PersistentScheduler

from chatops import db
from chatops.config import load_config
from chatops.jobs import Cursor, fire_due, give_up_leadership, take_leadership
from chatops.reload import CHECK_S, ConfigFile
from chatops.schedule import next_fire
from chatops.schema import JobRunStatus, utcnow
from workers.celery_app import HOUSEKEEPING_QUEUE
from workers.heartbeat import beat
from workers.tasks import enqueue_job_run, housekeeping

log = logging.getLogger("mm.scheduler")

LEASE_S = 30.0  # a scheduler that stops renewing is replaced within this
TICK_S = LEASE_S / 3


class JobScheduler(PersistentScheduler):
    CONFIG_CHECK_S = CHECK_S  # how often the config file is looked at (SIGHUP: at once)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.cursor = Cursor()
        self.leading = False
        self.config_file = ConfigFile(load_config(), check_s=self.CONFIG_CHECK_S)
        self.config = self.config_file.current()
        self.engine = db.engine_for(self.config.database_url)
        every = self.config.service.worker.housekeepingSeconds
        app = kwargs["app"] if "app" in kwargs else args[0]  # Celery's beat passes it by name
        app.conf.beat_schedule = {
            "housekeeping": {
                "task": housekeeping.name,
                "schedule": every,
                "options": {"queue": HOUSEKEEPING_QUEUE, "expires": every},
            }
        }
        super().__init__(*args, **kwargs)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, lambda _signum, _frame: self.config_file.ask())

    def tick(self, *args: Any, **kwargs: Any) -> float:
        beat()  # `mm-bot probe live`: the loop runs, whatever a tick meets
        try:
            return self._tick(*args, **kwargs)
        except Exception:  # a database or broker blip: beat (and housekeeping with it) must go on
            log.exception("the scheduler's tick failed; it tries again in %ss", TICK_S)
            return TICK_S

    def _tick(self, *args: Any, **kwargs: Any) -> float:
        now = utcnow()
        self.config = self.config_file.current()
        leading = take_leadership(self.engine, self.owner, LEASE_S, now)
        if leading != self.leading:
            log.info("scheduler %s %s the jobs", self.owner, "now fires" if leading else "no longer fires")
            self.cursor.reset()  # taking over: catch up from the database, not from what this one saw before
            self.leading = leading
        if not leading:
            return TICK_S
        jobs = self.config.service.jobs
        for run in fire_due(self.engine, jobs, self.cursor, now, self.config.service.scheduler.missedGrace):
            if run.status == JobRunStatus.SCHEDULED:
                log.info("job %s: run %s for %s", run.job, run.run_id, run.scheduled_for.isoformat())
                enqueue_job_run(run.run_id)
            else:
                log.warning("job %s: %s was missed (no scheduler ran then)", run.job, run.scheduled_for.isoformat())
        housekeeping = super().tick(*args, **kwargs)
        upcoming = [next_fire(j.schedule, j.timezone, now) for j in jobs if j.enabled]
        until_next = min(((t - utcnow()).total_seconds() for t in upcoming), default=TICK_S)
        return max(0.1, min(housekeeping, TICK_S, until_next + 0.05))

    def close(self) -> None:
        if self.leading:
            give_up_leadership(self.engine, self.owner)  # the next scheduler need not wait for the lease
        super().close()
        self.engine.dispose()
