"""How many in-flight turns one worker host carries: N concurrent sessions x K tool rounds on `mm-bot worker`
(one process by default), against the scripted model answering each request after a fixed latency, with
everything real in between: PostgreSQL, a Redis of the bench's own, the Slack emulator for the rendering.

The claim (issue 10): a host with 2 cores carries at least 200 in-flight turns when the model takes 2 s per
response. Measured in one run, and printed against the targets:

- wall time from the first hand-off to the last turn's end mark, against the ideal: ramp + (K+1) x latency (the
  scripted stream itself adds a few ms per answer, shown as the worker's mean model call);
- the CPU time of the worker process trees (/proc/<pid>/stat, before and after), and beside it what PostgreSQL,
  the bench's Redis, the bench's own servers and the rest of the machine used, so that a saturated machine or
  a saturated model server / emulator shows;
- the peak RSS of the worker process trees (VmRSS summed and sampled every 100 ms);
- a step outside the model (from an answer's last byte to the next request's first: the log's writes, the tool,
  the rendering; slackio/metrics.py), from the workers' own /metrics histograms, interpolated within their
  buckets as Prometheus' histogram_quantile does (a warm-up turn's steps are subtracted);
- the in-flight turns reached (sessions in status `running`, sampled every 100 ms);
- per turn: Slack Web API calls, database transactions, database connections opened;

and next to the worker, the in-process core on the same script: N mm_core Agents under asyncio.gather in this
process, sharing model connections, on a MemoryStore and on the database store (one event loop: each synchronous
append stalls every agent), timing the same gap from the ModelCalled events.

    .venv/bin/python bench/bench_turns.py                  # 200 sessions x 3 rounds, 2 s per answer (minutes)
    .venv/bin/python bench/bench_turns.py --quick          # 20 x 2, 0.5 s: does it work
    .venv/bin/python bench/bench_turns.py -n 200 -k 3 --latency 2 --ramp 0 --workers 1

Arrivals: the hand-offs are spread evenly over `--ramp` seconds, one model latency by default: the steady state
of 200 turns in flight whose steps arrive at random, ~N / latency steps a second. `--ramp 0` hands all N over at
once, so every session's steps fall due in the same instant (K+1 bursts of N steps): the worst case for the step
gap, whose p50 is then about half of N steps' CPU time.
PostgreSQL: MM_BENCH_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres), where a database
`bench_<random>` is created, migrated, and dropped at the end. Profile the worker with `--py-spy FILE` (pip
install py-spy): the stacks holding the GIL, in py-spy's raw (collapsed) format.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text
from support import bench_database, machine_jiffies, named

from chatops import db
from chatops.config import ENVIRONMENT, load_config
from chatops.inbox import record_message
from chatops.store import DbStore, ensure_session
from mm_core import Agent
from mm_core.events import Error, Event, ModelCalled
from mm_core.log import MemoryStore, Store
from mm_core.model import ModelHttp
from mm_testkit.redis_server import OwnRedis, free_port
from playground.model_server import ModelServer, Reply, ToolCall
from playground.slack_api import SlackEmulator

CHANNEL = "C0BENCH"
WARM_CHANNEL = "C0BENCHWARM"
CORE_CHANNEL = "C0BENCHCORE"
FILE = "notes.txt"
PROMPT = f"<@U0BOT> read {FILE}, a few times"
ANSWER = "Read it. The notes say the bench works."
MM_BOT = str(Path(sys.executable).parent / "mm-bot")
# What the configuration reads from the environment, and the worker's metrics endpoint: the workers start from
# none of this process's.
CONFIG_ENV = (*ENVIRONMENT, "MODEL_API_KEY", "MM_METRICS_PORT", "MM_METRICS_HOST")
STEP_METRIC = "mm_step_outside_model_seconds"
MODEL_METRIC = "mm_model_call_seconds"
SAMPLE_EVERY = 0.1
TICK = os.sysconf("SC_CLK_TCK")
TARGET_RATIO, TARGET_RSS_MIB, TARGET_P50, TARGET_P99 = 1.2, 1024, 0.030, 0.150


# --- the script -------------------------------------------------------------------------------------------------


def script(rounds: int, latency: float) -> Callable[[dict[str, Any]], Reply]:
    """Answers by the conversation's state, whatever the order of the sessions: a read_file call until the
    session has `rounds` tool results, then the answer; each after `latency` seconds."""

    def answer(request: dict[str, Any]) -> Reply:
        done = sum(1 for m in request["messages"] if m["role"] == "tool")
        if done < rounds:
            return Reply(tool_calls=[ToolCall("read_file", {"path": FILE})], delay=latency)
        return Reply(text=ANSWER, delay=latency)

    return answer


def notes() -> str:
    """The small file the model reads: 20 lines, more than a preview shows (the rendering uploads the rest)."""
    return "".join(f"line {i}: the bench reads this small file\n" for i in range(1, 21))


def config_yaml(concurrency: int) -> str:
    return "\n".join(
        [
            "sandbox: none",  # about the service: read_file never reaches the sandbox anyway
            "bash: {network: false}",
            "channels:",
            "  default: {yolo: true}",
            f"worker: {{concurrency: {concurrency}, leaseSeconds: 30, housekeepingSeconds: 30}}",
            "",
        ]
    )


# --- /proc --------------------------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command's name (state first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree(roots: list[int]) -> list[int]:
    """The processes and their live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def cpu_seconds(pids: list[int], *, reaped: bool = True) -> float:
    """utime + stime of the processes (with `reaped`, and of the children they waited for)."""
    total = 0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            total += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return total / TICK


def system_seconds(pids: list[int]) -> float:
    """stime alone: the kernel's share (context switches and futex waits of threads taking turns at the GIL)."""
    return sum(int(fields[12]) for pid in pids if (fields := _stat(pid)) is not None) / TICK


def status_field(pid: int, name: str) -> int:
    """A number from /proc/<pid>/status (VmRSS and VmHWM in KiB, Threads), 0 for a process that is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def thread_cpu(thread: threading.Thread) -> float:
    """The CPU time of one thread of this process."""
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def server_thread(server: object) -> threading.Thread:
    """The thread a mm_testkit server runs in (named after its class)."""
    name = type(server).__name__
    return next(t for t in threading.enumerate() if t.name == name)


# --- the histogram ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    buckets: list[tuple[float, float]]  # cumulative (le, count), +Inf last
    sum: float = 0.0
    count: float = 0.0

    def __add__(self, other: Histogram) -> Histogram:
        if not self.buckets or not other.buckets:
            return self if self.buckets else other
        buckets = [(le, a + b) for (le, a), (_, b) in zip(self.buckets, other.buckets, strict=True)]
        return Histogram(buckets, self.sum + other.sum, self.count + other.count)

    def __sub__(self, other: Histogram) -> Histogram:
        """What was observed between two scrapes of the same process."""
        if not other.buckets:
            return self
        buckets = [(le, a - b) for (le, a), (_, b) in zip(self.buckets, other.buckets, strict=True)]
        return Histogram(buckets, self.sum - other.sum, self.count - other.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


def histogram(metrics: str, name: str) -> Histogram:
    for family in text_string_to_metric_families(metrics):
        if family.name == name:
            buckets = sorted((float(s.labels["le"]), s.value) for s in family.samples if s.name == f"{name}_bucket")
            values = {s.name: s.value for s in family.samples}
            return Histogram(buckets, values.get(f"{name}_sum", 0.0), values.get(f"{name}_count", 0.0))
    return Histogram([])


def observed(after: list[str], before: list[str], name: str) -> Histogram:
    """What the processes observed between the two scrapes, summed over the processes."""
    total = Histogram([])
    for a, b in zip(after, before, strict=True):
        total = total + (histogram(a, name) - histogram(b, name))
    return total


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> tuple[float, bool] | None:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in. (value, True) when the rank
    is past the last finite bound: the value is then that bound, a lower bound of the truth."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower, True
            if count == below:
                return bound, False
            return lower + (bound - lower) * (rank - below) / (count - below), False
        lower, below = bound, count
    return lower, True


def bucketed(values: list[float], bounds: list[float]) -> list[tuple[float, float]]:
    return [(b, float(sum(1 for v in values if v <= b))) for b in bounds]


def exact(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


# --- the services ---------------------------------------------------------------------------------------------------


@dataclass
class Services:
    tmp: Path
    database_url: str
    redis: OwnRedis
    model: ModelServer
    slack: SlackEmulator

    @property
    def env(self) -> dict[str, str]:
        return {
            "MM_CONFIG": str(self.tmp / "mm.yaml"),
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": self.redis.url,
            "SLACK_API_URL": self.slack.url,
            "SLACK_BOT_TOKEN": self.slack.bot_token,
            "MM_MODEL_URL": self.model.url,
            "MM_MODEL": "test-model",
            "MM_WORKSPACES": str(self.tmp / "workspaces"),
        }


def post_all(s: Services, engine: Engine, n: int, channel: str = CHANNEL) -> list[str]:
    """What the bot does with each message, minus the hand-off: recorded, with the thread's workspace (an empty
    one, as the worker makes it without a repository) holding the file the model asks for."""
    from workers.workspaces import prepare

    sessions = []
    for _ in range(n):
        ts = s.slack.add_message(channel, PROMPT, "U0ALICE")["ts"]
        recorded = record_message(
            engine, channel_id=channel, thread_ts=ts, message_ts=ts, user_id="U0ALICE", text=PROMPT
        )
        workspace = prepare(s.tmp / "workspaces", recorded.session_id, None, None)
        (workspace.path / FILE).write_text(notes())
        sessions.append(recorded.session_id)
    return sessions


def enqueue_all(s: Services, sessions: list[str], ramp: float) -> None:
    """The bot's hand-off, as `Stack.post` makes it: one message per session on the turns queue, spread evenly
    over `ramp` seconds."""
    from workers.celery_app import app
    from workers.tasks import run_session

    began = time.monotonic()
    with app.connection_for_write(s.redis.url) as conn:
        for i, session_id in enumerate(sessions):
            if ramp and (wait := began + ramp * i / len(sessions) - time.monotonic()) > 0:
                time.sleep(wait)
            app.send_task(run_session.name, args=[session_id], queue="turns", connection=conn)


# The bench's own transactions on its database (polling, sampling), so that the workers' can be told apart.
OWN_TRANSACTIONS = [0]


def ended(engine: Engine, channel: str = CHANNEL) -> int:
    OWN_TRANSACTIONS[0] += 1
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(DISTINCT e.session_id) FROM session_events e JOIN sessions s ON s.id = e.session_id "
                "WHERE e.kind = 'turn_ended' AND s.channel_id = :c"
            ),
            {"c": channel},
        ).scalar_one()


def database_counters(engine: Engine) -> tuple[int, int]:
    """(transactions, connections opened) on the bench's database so far, the bench's own left out."""
    OWN_TRANSACTIONS[0] += 1
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database WHERE datname = current_database()"
            )
        ).one()
        return int(row[0]) - OWN_TRANSACTIONS[0], int(row[1])


# --- the worker side ------------------------------------------------------------------------------------------------


class Workers:
    """`mm-bot worker` processes, as an operator starts them, each serving its metrics on a port of its own."""

    def __init__(self, s: Services, count: int):
        self.s = s
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen[bytes]] = []

    def log_path(self, i: int) -> Path:
        return self.s.tmp / f"worker{i}.log"

    def log(self, i: int) -> str:
        path = self.log_path(i)
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- worker {i}\n{self.log(i)[-3000:]}" for i in range(len(self.ports)))

    def start(self) -> None:
        base = {k: v for k, v in os.environ.items() if k not in CONFIG_ENV} | self.s.env
        for i, port in enumerate(self.ports):
            argv = [MM_BOT, "worker", "--", "--hostname", f"bench{i}@%h", "--without-mingle", "--without-gossip"]
            log = open(self.log_path(i), "ab")  # noqa: SIM115 - the worker's own, closed with it
            env = base | {"MM_METRICS_PORT": str(port)}
            self.processes.append(
                subprocess.Popen(argv, env=env, cwd=self.s.tmp, stdout=log, stderr=subprocess.STDOUT, process_group=0)
            )
        deadline = time.monotonic() + 60
        while not all(" ready." in self.log(i) for i in range(len(self.ports))):
            self.check()
            if time.monotonic() > deadline:
                raise SystemExit(f"the workers were not ready within 60 s:\n{self.logs()}")
            time.sleep(0.1)

    def check(self) -> None:
        for p in self.processes:
            if p.poll() is not None:
                raise SystemExit(f"a worker exited ({p.returncode}):\n{self.logs()}")

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def scrape(self) -> list[str]:
        return [httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text for port in self.ports]

    def warm_up(self, engine: Engine) -> None:
        """A turn on every worker before the measured ones: a worker that has served a turn has imported the
        turn's modules and made its engine (the first task does, holding the import lock while every other
        thread of the process waits on it)."""
        deadline = time.monotonic() + 120
        while not all(histogram(m, MODEL_METRIC).count for m in self.scrape()):
            enqueue_all(self.s, post_all(self.s, engine, 1, WARM_CHANNEL), 0)
            warmed = ended(engine, WARM_CHANNEL)
            while ended(engine, WARM_CHANNEL) == warmed:
                self.check()
                if time.monotonic() > deadline:
                    raise SystemExit(f"the warm-up turns did not end:\n{self.logs()}")
                time.sleep(0.05)


@dataclass
class Sampled:
    peak_rss_kib: int = 0
    peak_threads: int = 0
    peak_running: int = 0
    peak_connections: int = 0


class Sampler:
    """Every 100 ms: the workers' RSS and threads, the sessions running, the database's connections."""

    def __init__(self, roots: list[int], engine: Engine):
        self.roots, self.engine = roots, engine
        self.figures = Sampled()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        pids, refreshed = list(self.roots), 0.0
        f = self.figures
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                if time.monotonic() - refreshed > 1.0:  # the trees rarely change: walk /proc once a second
                    pids, refreshed = tree(self.roots), time.monotonic()
                f.peak_rss_kib = max(f.peak_rss_kib, sum(status_field(p, "VmRSS") for p in pids))
                f.peak_threads = max(f.peak_threads, sum(status_field(p, "Threads") for p in pids))
                running, connections = conn.execute(
                    text(
                        "SELECT (SELECT count(*) FROM sessions WHERE status = 'running' AND channel_id = :c), "
                        "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database())"
                    ),
                    {"c": CHANNEL},
                ).one()
                conn.commit()
                OWN_TRANSACTIONS[0] += 1
                f.peak_running = max(f.peak_running, running)
                f.peak_connections = max(f.peak_connections, connections)
                self._stop.wait(SAMPLE_EVERY)


@dataclass
class WorkerRun:
    wall: float
    ended: int
    cpu: float
    system: float
    sampled: Sampled
    hwm_kib: int
    steps: Histogram
    model_calls: Histogram
    postgres_cpu: float
    redis_cpu: float
    machine_busy: float  # CPU seconds of the whole machine over the run
    model_thread_cpu: float
    slack_thread_cpu: float
    bench_cpu: float
    slack_calls: int
    transactions: int
    connections_opened: int
    errors: Sequence[Any] = ()  # (where, message, count) of the errors recorded, the commonest first
    answered: int = 0
    tool_results: int = 0


def py_spy(pid: int, output: str) -> subprocess.Popen[bytes]:
    """`py-spy record` of a worker: the stacks holding the GIL, without pausing the process."""
    spy = str(Path(sys.executable).parent / "py-spy")
    argv = [spy, "record", "--pid", str(pid), "--gil", "--nonblocking", "--format", "raw", "-o", output]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_workers(s: Services, engine: Engine, args: argparse.Namespace) -> WorkerRun:
    n, rounds, latency, ramp = args.sessions, args.rounds, args.latency, args.ramp
    workers = Workers(s, args.workers)
    spies: list[subprocess.Popen[bytes]] = []
    try:
        workers.start()
        workers.warm_up(engine)
        sessions = post_all(s, engine, n)
        if args.py_spy:
            spies = [py_spy(pid, args.py_spy + (f".{i}" if i else "")) for i, pid in enumerate(workers.pids)]
            time.sleep(1)  # py-spy attaches
        timeout = ramp + (rounds + 1) * latency * 10 + 60
        model_thread, slack_thread = server_thread(s.model), server_thread(s.slack)
        redis_pid = s.redis.process.pid if s.redis.process else 0
        metrics_before = workers.scrape()
        slack_before = len(s.slack.calls)
        engine.dispose()
        counters_before = database_counters(engine)
        before = (
            cpu_seconds(tree(workers.pids)),
            system_seconds(tree(workers.pids)),
            cpu_seconds(named("postgres"), reaped=False),
            cpu_seconds([redis_pid]),
            machine_jiffies(),
            thread_cpu(model_thread),
            thread_cpu(slack_thread),
            resource.getrusage(resource.RUSAGE_SELF),
        )
        with Sampler(workers.pids, engine) as sampler:
            began = time.monotonic()
            enqueue_all(s, sessions, ramp)
            while (done := ended(engine)) < n:
                workers.check()
                if time.monotonic() - began > timeout:
                    print(f"only {done} of {n} turns ended within {timeout:g} s: the figures below are partial")
                    break
                time.sleep(0.05)
            wall = time.monotonic() - began
            pids = tree(workers.pids)
            cpu = cpu_seconds(pids) - before[0]
            system = system_seconds(pids) - before[1]
            busy, total = machine_jiffies()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            metrics = workers.scrape()
            run = WorkerRun(
                wall=wall,
                ended=done,
                cpu=cpu,
                system=system,
                sampled=sampler.figures,
                hwm_kib=sum(status_field(p, "VmHWM") for p in pids),
                steps=observed(metrics, metrics_before, STEP_METRIC),
                model_calls=observed(metrics, metrics_before, MODEL_METRIC),
                postgres_cpu=cpu_seconds(named("postgres"), reaped=False) - before[2],
                redis_cpu=cpu_seconds([redis_pid]) - before[3],
                machine_busy=(busy - before[4][0]) / max(1, total - before[4][1]) * (os.cpu_count() or 1) * wall,
                model_thread_cpu=thread_cpu(model_thread) - before[5],
                slack_thread_cpu=thread_cpu(slack_thread) - before[6],
                bench_cpu=usage.ru_utime + usage.ru_stime - before[7].ru_utime - before[7].ru_stime,
                slack_calls=len(s.slack.calls) - slack_before,
                transactions=0,
                connections_opened=0,
            )
        # A backend reports its counters when it exits (or once a second at most while busy, or after 10 s idle).
        workers.stop()
        engine.dispose()
        transactions, connections = database_counters(engine)
        run.transactions, run.connections_opened = (
            transactions - counters_before[0],
            connections - counters_before[1],
        )
        with engine.connect() as conn:
            outcomes = conn.execute(
                text(
                    "SELECT e.payload->>'outcome' FROM session_events e JOIN sessions s ON s.id = e.session_id "
                    "WHERE e.kind = 'turn_ended' AND s.channel_id = :c"
                ),
                {"c": CHANNEL},
            ).scalars()
            run.answered = sum(1 for o in outcomes if o == "answered")
            run.tool_results = conn.execute(
                text(
                    "SELECT count(*) FROM session_events e JOIN sessions s ON s.id = e.session_id "
                    "WHERE e.kind = 'tool_result' AND s.channel_id = :c"
                ),
                {"c": CHANNEL},
            ).scalar_one()
            run.errors = conn.execute(
                text('SELECT "where", left(message, 160), count(*) FROM errors GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 3')
            ).all()
        return run
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(30)
        workers.stop()


# --- the in-process core ----------------------------------------------------------------------------------------


@dataclass
class CoreRun:
    name: str
    wall: float
    gaps: list[float]
    cpu: float  # this process without the model server's and the emulator's threads
    answered: int
    errors: dict[str, int]


def run_core(s: Services, name: str, make_store: Callable[[int], tuple[Store, str]], n: int, ramp: float) -> CoreRun:
    config = load_config(s.tmp / "mm.yaml", environ=s.env).agent  # the workers' agent configuration
    gaps: list[float] = []
    errors: dict[str, int] = {}

    def clock() -> Callable[[Event], None]:
        last: list[float] = []

        def emit(event: Event) -> None:
            if isinstance(event, ModelCalled) and event.agent is None:
                if last:
                    gaps.append(max(0.0, event.started - last[0]))
                last[:] = [event.finished]
            elif isinstance(event, Error):
                errors[event.message] = errors.get(event.message, 0) + 1

        return emit

    # One set of model connections for all the agents of the loop, as a worker process shares them (ModelHttp).
    http = ModelHttp()
    agents = []
    for i in range(n):
        workspace = s.tmp / "core" / name / str(i)
        workspace.mkdir(parents=True)
        (workspace / FILE).write_text(notes())
        store, session_id = make_store(i)
        agents.append(Agent(config, store, session_id, workspace, model_http=http, emit=clock()))

    async def one(i: int, agent: Agent) -> str:
        await asyncio.sleep(ramp * i / n)
        try:
            return (await agent.send(PROMPT)).outcome
        finally:
            await agent.resources.aclose()

    async def everything() -> list[str]:
        try:
            return await asyncio.gather(*(one(i, a) for i, a in enumerate(agents)))
        finally:
            await http.aclose()

    servers = [server_thread(s.model), server_thread(s.slack)]
    usage, others = resource.getrusage(resource.RUSAGE_SELF), sum(thread_cpu(t) for t in servers)
    began = time.monotonic()
    outcomes = asyncio.run(everything())
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    cpu -= sum(thread_cpu(t) for t in servers) - others
    return CoreRun(name, wall, gaps, cpu, sum(1 for o in outcomes if o == "answered"), errors)


def memory_store(_i: int) -> tuple[Store, str]:
    return MemoryStore(), "bench"


def db_store(engine: Engine) -> Callable[[int], tuple[Store, str]]:
    store = DbStore(engine)

    def make(i: int) -> tuple[Store, str]:
        return store, ensure_session(engine, channel_id=CORE_CHANNEL, thread_ts=f"{i}.000000", requester="U0ALICE")

    return make


# --- the report ---------------------------------------------------------------------------------------------------


def ms(seconds: float | None) -> str:
    return "     —" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:6.1f}"


def report(args: argparse.Namespace, w: WorkerRun, cores: list[CoreRun]) -> None:
    n, k, latency, ramp = args.sessions, args.rounds, args.latency, args.ramp
    ideal = ramp + (k + 1) * latency
    ratio = w.wall / ideal
    buckets = w.steps.buckets
    gaps_seen = int(buckets[-1][1]) if buckets else 0
    p50, p99 = histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
    rss_mib = w.sampled.peak_rss_kib / 1024
    cores_available = os.cpu_count() or 1
    steps = n * (k + 1)
    plural = "es" if args.workers > 1 else ""

    print(
        f"{args.workers} `mm-bot worker` process{plural} (threads pool, concurrency {args.concurrency} each) on "
        f"{cores_available} cores: {n} sessions x {k} tool rounds (read_file), model {latency:g} s per answer, "
        f"hand-offs spread over {ramp:g} s"
    )
    print(f"  {'figure':34s} {'measured':46s} {'target':>11s}")
    rows: list[tuple[str, str, str, bool | None]] = [
        ("wall time / ideal", f"{w.wall:.2f} s / {ideal:.2f} s = {ratio:.2f}x", f"≤ {TARGET_RATIO:.1f}x", ratio <= 1.2),
        ("in-flight turns reached", f"{w.sampled.peak_running} running at once", f"≥ {n}", w.sampled.peak_running >= n),
        (
            "peak RSS, worker processes",
            f"{rss_mib:.0f} MiB (VmHWM {w.hwm_kib / 1024:.0f} MiB)",
            f"≤ {TARGET_RSS_MIB} MiB",
            rss_mib <= TARGET_RSS_MIB,
        ),
        (
            "CPU, worker processes",
            f"{w.cpu:.1f} s ({w.system / max(w.cpu, 1e-9):.0%} system) = {w.cpu / w.wall:.0%} of a core; "
            f"{w.cpu / n * 1000:.0f} ms/turn, "
            f"{w.cpu / steps * 1000:.1f} ms/step",
            "—",
            None,
        ),
    ]
    for label, q, target in (("p50", p50, TARGET_P50), ("p99", p99, TARGET_P99)):
        value = f"{'>' if q and q[1] else ''}{ms(q[0] if q else None).strip()} ms (of {gaps_seen} gaps)"
        rows.append(
            (f"step outside the model, {label}", value, f"≤ {target * 1000:.0f} ms", bool(q) and q[0] <= target)
        )
    for label, value, target, ok in rows:
        print(f"  {label:34s} {value:46s} {target:>11s}  {'' if ok is None else 'PASS' if ok else 'MISS'}")
    print("  (the step gap: the workers' histogram, interpolated within its buckets like histogram_quantile)")
    complete = w.answered == n and w.tool_results == n * k
    print(
        f"  turns answered {w.answered}/{n}, tool results {w.tool_results}/{n * k}, errors recorded "
        f"{sum(count for *_, count in w.errors)}" + ("" if complete else "   ← NOT every turn ran as scripted")
    )
    for where, message, count in w.errors:
        print(f"      {count} x {where}: {message}")
    mean = w.model_calls.mean
    print(
        f"  per turn: {w.slack_calls / n:.1f} Slack calls, {w.transactions / n:.1f} database transactions, "
        f"{w.connections_opened / n:.2f} database connections opened"
        + (f"; a model call as the workers saw it: {mean * 1000:.0f} ms" if mean is not None else "")
    )

    print("the machine during the run (CPU seconds; % of the wall time, a core = 100%)")

    def share(seconds: float) -> str:
        return f"{seconds:.1f} s ({seconds / w.wall:.0%})"

    others = w.machine_busy - (w.cpu + w.postgres_cpu + w.redis_cpu + w.bench_cpu)
    print(
        f"  all: {share(w.machine_busy)} of {cores_available} cores; workers {share(w.cpu)}, PostgreSQL server "
        f"{share(w.postgres_cpu)}, Redis {share(w.redis_cpu)}, bench process {share(w.bench_cpu)}, "
        f"other processes {share(others)}"
    )
    if others / w.wall > 0.2:
        print("  ← other processes were busy on this machine: the figures are pessimistic")
    print(
        f"  in the bench process: model server thread {share(w.model_thread_cpu)}, Slack emulator thread "
        f"{share(w.slack_thread_cpu)}"
        + (
            "   ← near a full core: the bench's servers may be what limits the run"
            if max(w.model_thread_cpu, w.slack_thread_cpu, w.bench_cpu) / w.wall > 0.8
            else ""
        )
    )
    print(
        f"  peaks: {w.sampled.peak_threads} threads in the workers, {w.sampled.peak_connections} database connections"
    )

    bounds = [b for b, _ in buckets]
    print("a step outside the model, side by side (ms), and the same script's wall time")
    print(f"  {'':46s} {'p50':>6s} {'p99':>6s} {'gaps':>6s} {'wall/ideal':>11s} {'CPU/step':>9s}")
    print(
        f"  {'worker (histogram, interpolated)':46s} {ms(p50[0] if p50 else None)} {ms(p99[0] if p99 else None)} "
        f"{gaps_seen:6d} {ratio:10.2f}x {w.cpu / steps * 1000:6.1f} ms"
    )
    for core in cores:
        print(
            f"  {'core in-process, ' + core.name + ' (exact)':46s} {ms(exact(core.gaps, 0.5))} "
            f"{ms(exact(core.gaps, 0.99))} {len(core.gaps):6d} {core.wall / ideal:10.2f}x "
            f"{core.cpu / steps * 1000:6.1f} ms" + ("" if core.answered == n else f"   ← {core.answered}/{n} answered")
        )
        for message, count in sorted(core.errors.items(), key=lambda item: -item[1])[:3]:
            print(f"      {count} x {message[:150]}")
        if bounds:
            i50, i99 = (histogram_quantile(q, bucketed(core.gaps, bounds)) for q in (0.5, 0.99))
            print(f"  {'  the same, interpolated in those buckets':46s} {ms(i50 and i50[0])} {ms(i99 and i99[0])}")
    if cores and bounds and p50 and p99:
        i50, i99 = (histogram_quantile(q, bucketed(cores[0].gaps, bounds)) for q in (0.5, 0.99))
        if i50 and i99 and i50[0] and i99[0]:
            name = cores[0].name
            print(f"  worker / core ({name}), same buckets: p50 {p50[0] / i50[0]:.1f}x, p99 {p99[0] / i99[0]:.1f}x")
    print("  (CPU/step of the in-process rows: this process without the model server's and the emulator's threads)")


# --- main ---------------------------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("-n", "--sessions", type=int, default=200, help="concurrent sessions (200)")
    parser.add_argument("-k", "--rounds", type=int, default=3, help="tool rounds per turn (3)")
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model answer (2)")
    parser.add_argument("--ramp", type=float, help="spread the hand-offs over this many seconds (one latency)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (1)")
    parser.add_argument("--concurrency", type=int, help="worker.concurrency (the sessions per worker + 10%%)")
    parser.add_argument("--core", default="memory,db", help="in-process rows: memory, db, memory,db (default), none")
    parser.add_argument("--quick", action="store_true", help="20 sessions x 2 rounds, 0.5 s: does it work")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (the workers' logs)")
    parser.add_argument("--py-spy", metavar="FILE", help="record the workers with py-spy (GIL holders, raw format)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.rounds, args.latency = 20, 2, 0.5
    if args.ramp is None:
        args.ramp = args.latency
    per_worker = math.ceil(args.sessions / args.workers)
    args.concurrency = args.concurrency or per_worker + max(1, per_worker // 10)
    return args


def main() -> None:
    args = parse()
    with contextlib.ExitStack() as stack:
        tmp = (
            Path(tempfile.mkdtemp(prefix="bench_turns_"))
            if args.keep
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_turns_")))
        )
        tmp.chmod(0o711)  # a root worker hands the workspaces to an unprivileged user, who must reach them
        database_url = stack.enter_context(bench_database())
        redis = OwnRedis(tmp / "redis")
        redis.start()
        stack.callback(redis.stop)
        model = stack.enter_context(ModelServer())
        slack = stack.enter_context(SlackEmulator())
        s = Services(tmp, database_url, redis, model, slack)
        (tmp / "mm.yaml").write_text(config_yaml(args.concurrency))
        model.always(script(args.rounds, args.latency))
        slack.add_channel(CHANNEL, "bench")
        slack.add_channel(WARM_CHANNEL, "bench-warm-up")
        os.environ.update(s.env)  # the hand-off goes through the Celery app, which reads the workers' configuration
        engine = db.engine_for(database_url)
        stack.callback(engine.dispose)

        w = run_workers(s, engine, args)
        if args.keep:
            print(f"(the workers' logs: {tmp}/worker*.log)")
        cores: list[CoreRun] = []
        for name in args.core.split(","):
            model.requests.clear()  # the server keeps every request: do not let it grow across runs
            if name == "memory":
                cores.append(run_core(s, "MemoryStore", memory_store, args.sessions, args.ramp))
            elif name == "db":
                cores.append(run_core(s, "DbStore, one loop", db_store(engine), args.sessions, args.ramp))
        report(args, w, cores)


if __name__ == "__main__":
    main()
