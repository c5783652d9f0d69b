"""The Celery application: `celery -A workers.celery_app worker` or `mm-bot worker`.

The configuration is read lazily (when Celery first needs it), so importing this module never reads mm.yaml:
the bot imports it to enqueue work, tests import it before they set the environment.
"""

from __future__ import annotations

import warnings
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning

# Celery warns when its worker runs as root, and a root worker is what lets ours run each command as its
# workspace's owner, an unprivileged user, and never as root inside bubblewrap (mm_core/tools/sandbox.py). The
# warning's other concern, pickled messages, does not apply: the worker accepts JSON only.
warnings.filterwarnings(
    "ignore", message="You're running the worker with superuser privileges", category=SecurityWarning
)

app = Celery("mm")


def settings() -> dict[str, Any]:
    from chatops.config import load_config

    config = load_config()
    broker = config.broker_url
    values: dict[str, Any] = {
        "broker_url": broker,
        # The database is the source of truth and the broker only carries "session S has work": a message
        # is acknowledged once its task has finished, a worker that dies mid-task gives the message back,
        # and each worker holds one message at a time so a long agent turn never strands queued work.
        # A message that is lost anyway only delays work (housekeeping re-enqueues it from the database).
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Results live in the database; only tasks that say so (ping) keep a Celery result.
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
    }
    if broker.startswith(("redis://", "rediss://")):
        values["result_backend"] = broker
        values["result_expires"] = 3600
    return values


# A callable: Celery calls it the first time it reads its configuration, not now.
app.add_defaults(settings)


@app.task(name="mm.ping", ignore_result=False)
def ping() -> str:
    """Answers "pong": proves a worker is up and reachable through the broker."""
    return "pong"
