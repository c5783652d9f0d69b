"""The Celery application: `celery -A workers.celery_app worker` or `mm-bot worker`.

The configuration is read lazily (when Celery first needs it), so importing this module never reads mm.yaml:
the bot imports it to enqueue work, tests import it before they set the environment.

A worker starts only with the sandbox its config asks for: with `sandbox: auto` (the default) or `bwrap` and
no bubblewrap on the machine it refuses to start, in one sentence; with `sandbox: none` it starts and warns
once that commands run unsandboxed. `mm-bot dev` is the exception (a laptop may lack bubblewrap): it says so
itself and starts its worker with the hidden `--dev` option, which skips the check.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from typing import TYPE_CHECKING, Any

import click
from celery import Celery, signals
from celery.exceptions import SecurityWarning

from workers.heartbeat import Heartbeat, Ready

if TYPE_CHECKING:
    from celery.worker import WorkController

    from mm_core.config import AgentConfig

log = logging.getLogger("mm.worker")

# Celery warns when its worker runs as root, and a root worker is what lets ours run each command as its
# workspace's owner, an unprivileged user, and never as root inside bubblewrap (mm_core/tools/sandbox.py). The
# warning's other concern, pickled messages, does not apply: the worker accepts JSON only.
warnings.filterwarnings(
    "ignore", message="You're running the worker with superuser privileges", category=SecurityWarning
)

INSTALL_BWRAP = "install bubblewrap (apt-get install bubblewrap)"
UNSANDBOXED = (
    "`sandbox: none`: bash commands run unsandboxed, with this worker's access to files and the network (only "
    "the resource limits and the scrubbed environment apply)"
)

# Named queues, so that an operator can give housekeeping its own worker and a backlog of turns never delays it.
TURNS_QUEUE = "turns"
HOUSEKEEPING_QUEUE = "housekeeping"

app = Celery("mm", include=["workers.tasks"])
assert app.user_options is not None  # the instance's own (a defaultdict); the class's is None
app.user_options["worker"].add(
    click.Option(["--dev"], is_flag=True, hidden=True, help="started by `mm-bot dev`, which tells of the sandbox")
)
assert app.steps is not None  # the instance's own, as user_options
app.steps["worker"].add(Heartbeat)  # `mm-bot probe live`
app.steps["consumer"].add(Ready)  # `mm-bot probe ready`


def settings() -> dict[str, Any]:
    from kombu.entity import Queue

    from chatops.config import load_config

    config = load_config()
    broker, worker = config.broker_url, config.service.worker
    values: dict[str, Any] = {
        "broker_url": broker,
        # The database is the source of truth and the broker only carries "session S has work": a message
        # is acknowledged once its task has finished, a worker that dies mid-task gives the message back,
        # and each worker holds one message per free slot so a long agent turn never strands queued work.
        # A message that is lost anyway only delays work (housekeeping re-enqueues it from the database).
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Turns wait on the model most of the time: one process carries many, each in a thread with its own
        # event loop (workers/turns.py says why threads and not one shared loop).
        "worker_pool": "threads",
        "worker_concurrency": worker.concurrency,
        # Honoured by a prefork pool (housekeeping on a worker of its own); the threads pool ignores them,
        # so a turn enforces `worker.turnTimeLimit` itself.
        "task_soft_time_limit": worker.turnTimeLimit + 30,
        "task_time_limit": worker.turnTimeLimit + 60,
        "task_queues": [Queue(TURNS_QUEUE), Queue(HOUSEKEEPING_QUEUE)],
        "task_default_queue": TURNS_QUEUE,
        # Flower and `celery events` watch the workers through these. Not the "sent" event: publishing it
        # doubled the cost of the bot's one hand-off, which runs beside every ack (bench/bench_inbound.py).
        "worker_send_task_events": True,
        "task_send_sent_event": False,
        # Results live in the database; only tasks that say so (ping) keep a Celery result.
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        # Beat fires housekeeping (its entry made by the scheduler, which knows the task) and the config's jobs,
        # one scheduler at a time (workers/scheduler.py).
        "beat_scheduler": "workers.scheduler:JobScheduler",
    }
    if broker.startswith(("redis://", "rediss://")):
        # Redis gives an unacknowledged message to another worker after the visibility timeout: it must be
        # longer than the longest task, or a running turn would be delivered twice (the lease would still keep
        # the second copy from writing, but it would wait on it). Other transports take no such option (the
        # SQLAlchemy one hands its options to create_engine, which refuses it).
        values["broker_transport_options"] = {
            "visibility_timeout": int(worker.turnTimeLimit * 2 + 600),
            # A broker that goes silent (a half-open connection) is noticed and reconnected to, rather than
            # waited on for ever: the consumer then stops, and the worker says it is not ready.
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
            "socket_keepalive": True,
            "health_check_interval": 25,
        }
        values["result_backend"] = broker
        values["result_expires"] = 3600
    return values


# A callable: Celery calls it the first time it reads its configuration, not now.
app.add_defaults(settings)


def sandbox_problem(agent: AgentConfig) -> str | None:
    """Why commands cannot run as `agent.sandbox` asks on this machine (bubblewrap is missing), with the fix."""
    if agent.sandbox == "none" or shutil.which("bwrap"):
        return None
    return (
        f"bubblewrap is not installed, and `sandbox: {agent.sandbox}` needs it to confine bash commands: "
        f"{INSTALL_BWRAP}, or set `sandbox: none` to run them unsandboxed"
    )


@signals.worker_init.connect
def refuse_without_the_sandbox(sender: WorkController, **_: Any) -> None:
    # A signal rather than a check in `mm-bot worker`: every way of starting a worker passes here, before the
    # pool starts or a task is taken.
    if sender.options.get("dev"):
        return
    problem = sandbox_problem(_agent_config())
    if problem is not None:
        raise SystemExit(f"mm-bot worker: {problem}")  # Celery's signal would log an Exception and carry on


@signals.setup_logging.connect
def setup_logging(loglevel: Any = None, **_: Any) -> None:
    # Connected, this replaces Celery's own logging set-up (worker and beat alike): one format for every
    # process, the session a line is about, secrets redacted (chatops/logs.py).
    from chatops import logs
    from chatops.config import load_config
    from chatops.secrets import secrets_of

    logs.setup_logging(secrets_of(load_config()), level=loglevel or logging.INFO)


@signals.worker_init.connect
def serve_worker_metrics(**_: Any) -> None:
    # One endpoint per worker process: the pool runs threads, so this process holds all its turns' figures.
    from slackio.metrics import serve_metrics, watch_queue

    if serve_metrics():
        watch_queue(app, (TURNS_QUEUE, HOUSEKEEPING_QUEUE))


@signals.beat_init.connect
def serve_beat_metrics(**_: Any) -> None:
    from slackio.metrics import serve_metrics

    serve_metrics()


def traced(service: str) -> bool:
    """This process's traces when the OTEL_* variables ask for them (slackio.traces), with Celery's hand-off in
    them: the publisher's span puts the trace's context in the task message's headers, and the worker's span for
    the task continues it, so a turn is in the trace of the Slack request that asked for it."""
    from slackio import traces

    if not traces.configure(service):
        return False
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    return True


@signals.worker_init.connect
def trace_worker(**_: Any) -> None:
    # Before the pool takes a task; the threads pool runs every turn in this process.
    traced("mm-worker")


@signals.beat_init.connect
def trace_beat(**_: Any) -> None:
    traced("mm-beat")  # a no-op in a worker that embeds its beat (-B): configured once


@signals.worker_ready.connect
@signals.worker_process_init.connect
def freeze_what_is_loaded(**_: Any) -> None:
    # Once the process that runs the turns has started (the threads pool's, or a prefork child): what it loaded
    # is kept for its life, and no full collection pauses its turns to walk it again (chatops.heap).
    from chatops.heap import freeze_loaded

    freeze_loaded()


@signals.celeryd_after_setup.connect
def warn_when_unsandboxed(instance: WorkController, **_: Any) -> None:
    # Once Celery has set up its logging, so that the warning is a line of the worker's log like the others.
    if not instance.options.get("dev") and _agent_config().sandbox == "none":
        log.warning(UNSANDBOXED)
    # Sandboxed commands under a `network: open` (the top level's, a channel's or a job's) get no network when
    # its parts are missing: said once, here.
    from chatops.config import load_config
    from mm_core.tools.sandbox_network import network_report

    config = load_config()
    opened = [n for n in config.service.network_policies(config.agent) if n.policy == "open"]
    if not instance.options.get("dev") and opened and (report := network_report(config.agent.with_network(opened[0]))):
        log.warning(report)


def _agent_config() -> AgentConfig:
    from chatops.config import load_config

    return load_config().agent


@app.task(name="mm.ping", ignore_result=False)
def ping() -> str:
    """Answers "pong": proves a worker is up and reachable through the broker."""
    return "pong"
