"""The bot's inbound side against the durable floor and a bare slack-bolt app (not a test): signed requests
POSTed to `/slack/events` (`app_mention` events, or with `--kind` `/mm` slash commands or button clicks), the
requests acked per second and the ack latency (p50, p99), the three apps measured in one run.

- the real bot: `mm-bot serve` as an operator starts it, recording each message in a migrated scratch
  PostgreSQL database before it acks (every event is a new top-level message, so a new session) and enqueuing
  the session on Redis after the ack (nothing consumes that queue: its database is flushed at the end); a
  slash command (`/mm status` from someone without a session: answered through its response URL) or a click
  (Approve naming a session that does not exist: answered with an ephemeral sentence) is carried out after
  the ack, and the real bot answers every one;
- the durable floor: the least an app can do that keeps its promise, a slack-bolt AsyncApp whose listeners
  write each request in one PostgreSQL transaction (async psycopg, a connection of a small pool each) before
  they ack, and nothing else (this file, re-executed with `--floor-app PORT`, on the same scratch database);
- the bare app: a slack-bolt AsyncApp in a process of its own (this file, re-executed with `--bare-app PORT`),
  with the same signing secret, `process_before_response=True`, its client on the same Slack emulator, and an
  `app_mention`, a `message`, a `/mm` and a button listener that only ack; served by aiohttp (`app.web_app()`)
  the same way (the floor is served the same way too).

The load: N distinct events per app from a few users in one channel, built before the clock starts and signed
right before each run, sent with a fixed number in flight, one client per app with its connections kept alive.
A closed loop: at concurrency C an app that is saturated answers in about C / throughput, so the p99 of a
saturated app is mostly its queue; `--concurrency 1` gives the latency of one event alone. The client is
aiohttp's: httpx.AsyncClient (`--client httpx`) spends 2-3 ms of CPU per request at 16 in flight, against
~0.3 ms, and holds some requests back for 100-400 ms, so that against the bare app it measures itself. Each app
gets a warm-up first; then the runs alternate, bare, floor and real, then real, floor and bare, ... so that
whatever else the machine does hits all three. Every ack must be a 200, the real bot must have recorded and
enqueued every event and the floor must have written every request: anything else is an error (exit 1). The
targets are printed, met or missed, and do not change the exit code:

    throughput of the real bot ≥ 0.7 x the floor's;  p99 ack latency of the real bot ≤ 1.5 x the floor's.

    .venv/bin/python bench/bench_inbound.py                  # 1000 events per app, 4 in flight
    .venv/bin/python bench/bench_inbound.py --quick          # 300 per app: does it work
    .venv/bin/python bench/bench_inbound.py --kind slash     # `/mm status`; --kind click: Approve clicks
    .venv/bin/python bench/bench_inbound.py -n 4000 --concurrency 32 --rounds 4

PostgreSQL: MM_BENCH_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres), where a database
`bench_<random>` is created, migrated, and dropped at the end. Redis: `--redis` (default
redis://127.0.0.1:6379/14), whose database must be empty at the start; it is flushed at the end. Beside each run
the CPU used by the app's process, this process (the load and the emulator), PostgreSQL and every other
process, so that a saturated client or a busy machine shows. `--py-spy FILE` records the real bot with py-spy
(the stacks holding the GIL, raw format) over its measured runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from support import bench_database, machine_jiffies, named

from chatops.buttons import Action, ButtonValue
from chatops.config import ENVIRONMENT
from playground.signed import SlackEventSender, signed_headers
from playground.slack_api import SlackEmulator

SECRET = "bench-inbound-signing-secret"
CHANNEL = "C0BENCHIN"
USERS = ("U0ALICE", "U0BOB", "U0CAROL", "U0DAVE", "U0ERIN")
EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
TURNS_QUEUE = "turns"  # workers.celery_app.TURNS_QUEUE: where the bot enqueues a session
MM_BOT = str(Path(sys.executable).parent / "mm-bot")
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
# What the configuration reads from the environment (and the model key the example config names): the servers
# start from none of this process's.
CONFIG_ENV = (*ENVIRONMENT, "MODEL_API_KEY")
TICK = os.sysconf("SC_CLK_TCK")
# Against the durable floor (the bare app's figures are printed beside them, for what bolt alone costs).
TARGET_THROUGHPUT, TARGET_P99 = 0.7, 1.5
APPS = ("bare", "floor", "real")
FLOOR_POOL = 8  # the floor's connections: more than the requests in flight at the default concurrency
CONFIG = "sandbox: none\nchannels:\n  default: {yolo: false}\n"
KINDS = {"mention": "app_mention events", "slash": "`/mm status` commands", "click": "Approve clicks"}


# --- the bare app (its own process) ----------------------------------------------------------------------------


def bolt_app() -> Any:
    """A slack-bolt AsyncApp configured as bot.app.create_app configures the real one (its client on the emulator)."""
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = os.environ["SLACK_API_URL"]
    # slack_sdk joins method names onto base_url, so it must end with a slash (slackio.slack_client.api_base).
    client = AsyncWebClient(token=os.environ["SLACK_BOT_TOKEN"], base_url=api if api.endswith("/") else api + "/")
    return AsyncApp(
        client=client,
        signing_secret=os.environ["SLACK_SIGNING_SECRET"],
        url_verification_enabled=True,
        process_before_response=True,
    )


def serve(app: Any, port: int, context: Any = None) -> None:
    """Served by aiohttp like `mm-bot serve` (no access log), with a /healthz of its own; `context`: a cleanup
    context of the aiohttp app (what it opens at start and closes at the end)."""
    from aiohttp import web

    web_app = app.web_app(path=EVENTS_PATH, port=port)

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pid": os.getpid()})

    if context is not None:
        web_app.cleanup_ctx.append(context)
    web_app.router.add_get(HEALTH_PATH, health)
    web.run_app(web_app, host="127.0.0.1", port=port, access_log=None, print=None)


def bare_app(port: int) -> None:
    """A slack-bolt app that only acks."""
    from slack_bolt.async_app import AsyncAck

    app = bolt_app()

    async def only_ack(ack: AsyncAck) -> None:
        await ack()

    app.event("app_mention")(only_ack)
    app.event("message")(only_ack)
    app.command("/mm")(only_ack)
    app.action(re.compile(".*"))(only_ack)
    serve(app, port)


# --- the durable floor (its own process) -----------------------------------------------------------------------

FLOOR_TABLE = "bench_floor"
FLOOR_INSERT = f"INSERT INTO {FLOOR_TABLE} (kind, channel, ts, user_id, body) VALUES (%s, %s, %s, %s, %s)"


def floor_app(port: int) -> None:
    """The bare app, whose listeners first write the request in one PostgreSQL transaction (async psycopg, on a
    connection of a pool of FLOOR_POOL made at start) and then ack: nothing else, the floor of a durable ack."""
    import psycopg
    from aiohttp import web
    from slack_bolt.async_app import AsyncAck

    app = bolt_app()
    pool: asyncio.Queue[psycopg.AsyncConnection] = asyncio.Queue()

    async def write(kind: str, channel: str | None, ts: str | None, user: str | None, body: str) -> None:
        conn = await pool.get()
        try:
            async with conn.transaction():
                await conn.execute(FLOOR_INSERT, (kind, channel, ts, user, body))
        finally:
            pool.put_nowait(conn)

    async def event(ack: AsyncAck, event: dict) -> None:
        await write(event.get("type") or "", event.get("channel"), event.get("ts"), event.get("user"), event["text"])
        await ack()

    async def command(ack: AsyncAck, command: dict) -> None:
        where, who = command.get("channel_id"), command.get("user_id")
        await write("slash", where, command.get("trigger_id"), who, command["text"])
        await ack()

    async def action(ack: AsyncAck, action: dict, body: dict) -> None:
        user = (body.get("user") or {}).get("id")
        await write("click", (body.get("channel") or {}).get("id"), action.get("action_ts"), user, action["value"])
        await ack()

    app.event("app_mention")(event)
    app.event("message")(event)
    app.command("/mm")(command)
    app.action(re.compile(".*"))(action)

    async def connect(_app: web.Application):
        url = os.environ["FLOOR_DATABASE_URL"]
        conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(FLOOR_POOL)]
        for conn in conns:
            pool.put_nowait(conn)
        yield
        for conn in conns:
            await conn.close()

    serve(app, port, connect)


def make_floor_table(libpq_url: str) -> None:
    import psycopg

    with psycopg.connect(libpq_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            f"CREATE TABLE {FLOOR_TABLE} (id bigserial PRIMARY KEY, kind text NOT NULL, channel text, ts text, "
            "user_id text, body text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )


def floor_rows(libpq_url: str) -> int:
    import psycopg

    with psycopg.connect(libpq_url, connect_timeout=5) as conn:
        found = conn.execute(f"SELECT count(*) FROM {FLOOR_TABLE}").fetchone()
        return found[0] if found else 0


# --- /proc --------------------------------------------------------------------------------------------------------


def process_cpu(pid: int, *, system: bool = False) -> float:
    """utime + stime of one process (all its threads), or with `system` stime alone (the kernel's share:
    syscalls, and threads taking turns at the GIL), in seconds; 0 for a process that is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[12]) + (0 if system else int(fields[11]))) / TICK


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuMark:
    app: float
    app_system: float
    bench: float
    postgres: dict[int, float]  # by process: backends come and go
    machine: tuple[int, int]

    @staticmethod
    def now(app_pid: int) -> CpuMark:
        postgres = {pid: process_cpu(pid) for pid in named("postgres")}
        app, system = process_cpu(app_pid), process_cpu(app_pid, system=True)
        return CpuMark(app, system, self_cpu(), postgres, machine_jiffies())

    def postgres_since(self, before: CpuMark) -> float:
        """What PostgreSQL's processes used between the marks (a backend that ended meanwhile is not counted)."""
        return sum(cpu - before.postgres.get(pid, 0.0) for pid, cpu in self.postgres.items())


# --- the services -------------------------------------------------------------------------------------------------


def clean_env(**values: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CONFIG_ENV} | values


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def broker(url: str) -> Iterator[str]:
    """The Redis database the bot enqueues on: empty at the start (it is flushed at the end, so it must hold
    nothing of anyone else's), flushed at the end."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        if keys := client.dbsize():
            raise SystemExit(f"{url} holds {keys} keys, not this bench's: pass --redis with an empty database")
        yield url
    finally:
        with contextlib.suppress(redis.RedisError):
            client.flushdb()
        client.close()


class Server:
    """An app under test: a process listening on a port of its own, its output in a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], tmp: Path, port: int) -> None:
        self.name, self.port, self.log_path = name, port, tmp / f"{name}.log"
        with self.log_path.open("w") as out:
            self.process = subprocess.Popen(
                argv, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, process_group=0
            )
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + EVENTS_PATH

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def check(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"{self.name} exited with code {self.process.returncode}:\n{self.log()}")

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(self.base + HEALTH_PATH, timeout=2)
                if response.status_code == 200 and response.json().get("pid") == self.pid:
                    return
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: {HEALTH_PATH} did not answer within {timeout:g} s:\n{self.log()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.process.wait()


# --- the load -----------------------------------------------------------------------------------------------------


class Events:
    """Distinct request bodies of one kind as Slack sends them (playground's SlackEventSender builds them, into
    a transport that keeps them instead of sending): `mention`, each a new top-level message with its own ts
    and event_id; `slash`, `/mm status` with its own trigger id and response URL; `click`, Approve with its own
    action_ts, naming a session that does not exist."""

    def __init__(self, slack: SlackEmulator, kind: str) -> None:
        self.bodies: list[bytes] = []
        self.kind, self.bot_user_id = kind, slack.bot_user_id
        self.sender = SlackEventSender(
            "http://127.0.0.1:9",
            SECRET,
            team_id=slack.team_id,
            api_app_id=slack.app_id,
            bot_user_id=slack.bot_user_id,
            response_url=slack.response_url,
        )
        self.sender.http.close()
        self.sender.http = httpx.Client(transport=httpx.MockTransport(self._keep))
        self.content_types: dict[int, str] = {}
        self.made = 0

    def _keep(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.read())
        self.content_types[len(self.bodies) - 1] = request.headers["Content-Type"]
        return httpx.Response(200)

    def make(self, n: int) -> list[tuple[bytes, str]]:
        start = len(self.bodies)
        for _ in range(n):
            self.made += 1
            user = USERS[self.made % len(USERS)]
            if self.kind == "slash":
                self.sender.slash_command("/mm", "status", user=user, channel=CHANNEL)
            elif self.kind == "click":
                value = ButtonValue(str(uuid.uuid4()), f"call_{self.made}").encode()
                self.sender.block_action(
                    Action.APPROVE, value, user=user, channel=CHANNEL, message_ts=self.sender.new_ts()
                )
            else:
                said = f"<@{self.bot_user_id}> bench message {self.made}: why does the nightly build fail on main?"
                self.sender.app_mention(said, channel=CHANNEL, user=user)
        return [(self.bodies[i], self.content_types[i]) for i in range(start, len(self.bodies))]

    def close(self) -> None:
        self.sender.close()


def signed(bodies: list[tuple[bytes, str]]) -> list[tuple[bytes, dict[str, str]]]:
    """Each body with its headers, signed now (bolt accepts a timestamp within five minutes)."""
    stamp = int(time.time())
    return [(body, signed_headers(SECRET, body, content_type, stamp)) for body, content_type in bodies]


@dataclass
class Run:
    app: str
    round: int
    requests: int = 0
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    app_cpu: float = 0.0
    app_system: float = 0.0
    bench_cpu: float = 0.0
    postgres_cpu: float = 0.0
    machine_busy: float = 0.0  # cores busy on average over the run

    @property
    def rate(self) -> float:
        return self.requests / self.wall if self.wall else math.nan


class Client:
    """The load's HTTP client, one per app (its connections kept alive across runs): aiohttp's by default,
    httpx's with `--client httpx` (slower by far at 16 in flight: see the module's docstring)."""

    def __init__(self, kind: str, concurrency: int) -> None:
        self.kind = kind
        if kind == "httpx":
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            self.httpx = httpx.AsyncClient(timeout=30, limits=limits)
        else:
            self.aiohttp = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency), timeout=aiohttp.ClientTimeout(total=30)
            )

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        """The status and (for a failure) the start of the body."""
        if self.kind == "httpx":
            response = await self.httpx.post(url, content=body, headers=headers)
            return response.status_code, "" if response.status_code == 200 else response.text[:120]
        async with self.aiohttp.post(url, data=body, headers=headers) as response:
            text = await response.text()
            return response.status, "" if response.status == 200 else text[:120]

    async def aclose(self) -> None:
        await (self.httpx.aclose() if self.kind == "httpx" else self.aiohttp.close())


async def send_all(
    client: Client, url: str, requests: list[tuple[bytes, dict[str, str]]], concurrency: int, run: Run
) -> None:
    """`concurrency` requests in flight until every one is answered; each one's latency from send to response."""
    pending = iter(requests)

    async def one_at_a_time() -> None:
        for body, headers in pending:
            began = time.perf_counter()
            try:
                status, text = await client.post(url, body, headers)
            except (httpx.HTTPError, aiohttp.ClientError, TimeoutError) as exc:
                run.failures[type(exc).__name__] = run.failures.get(type(exc).__name__, 0) + 1
                continue
            run.latencies.append(time.perf_counter() - began)
            if status != 200:
                what = f"{status} {text}"
                run.failures[what] = run.failures.get(what, 0) + 1

    began = time.perf_counter()
    await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))
    run.wall = time.perf_counter() - began
    run.requests = len(requests)


async def measure(client: Client, server: Server, bodies: list[tuple[bytes, str]], concurrency: int, run: Run) -> Run:
    requests = signed(bodies)
    # A full collection of this process (~145,000 objects: the events of every run, made in advance) pauses the
    # load and the emulator for ~95 ms (measured), in whichever app's run it falls: one between runs, none in.
    gc.collect()
    gc.disable()
    try:
        before = CpuMark.now(server.pid)
        await send_all(client, server.url, requests, concurrency, run)
        after = CpuMark.now(server.pid)
    finally:
        gc.enable()
    run.app_cpu = after.app - before.app
    run.app_system = after.app_system - before.app_system
    run.bench_cpu = after.bench - before.bench
    run.postgres_cpu = after.postgres_since(before)
    busy, total = after.machine[0] - before.machine[0], after.machine[1] - before.machine[1]
    run.machine_busy = busy / max(1, total) * (os.cpu_count() or 1)
    server.check()
    return run


# --- the report ---------------------------------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def combined(app: str, runs: list[Run]) -> Run:
    mine = [r for r in runs if r.app == app]
    total = Run(app, 0)
    for r in mine:
        total.requests += r.requests
        total.wall += r.wall
        total.latencies += r.latencies
        for what, count in r.failures.items():
            total.failures[what] = total.failures.get(what, 0) + count
        total.app_cpu += r.app_cpu
        total.app_system += r.app_system
        total.bench_cpu += r.bench_cpu
        total.postgres_cpu += r.postgres_cpu
        total.machine_busy += r.machine_busy * r.wall
    total.machine_busy /= max(total.wall, 1e-9)
    return total


def others(r: Run) -> float:
    """The rest of the machine's CPU over the run, as a share of one core: Redis, and whatever else runs."""
    return max(0.0, r.machine_busy - (r.app_cpu + r.bench_cpu + r.postgres_cpu) / r.wall)


def row(label: str, r: Run) -> str:
    p50, p99 = quantile(r.latencies, 0.5) * 1000, quantile(r.latencies, 0.99) * 1000
    top = max(r.latencies, default=math.nan) * 1000
    failed = sum(r.failures.values())
    return (
        f"  {label:6s} {r.app:5s} {r.requests:8d} {r.rate:9.0f} {p50:7.1f} {p99:7.1f} {top:7.1f} "
        f"{r.app_cpu / max(r.requests, 1) * 1000:8.2f} {r.app_system / max(r.app_cpu, 1e-9):5.0%} "
        f"{r.app_cpu / r.wall:6.0%} {r.bench_cpu / r.wall:6.0%} "
        f"{r.postgres_cpu / r.wall:6.0%} {others(r):6.0%}" + (f"   {failed} FAILED" if failed else "")
    )


def report(args: argparse.Namespace, runs: list[Run]) -> tuple[Run, Run]:
    """The table, and the real bot against the floor (the targets) and the bare app; (floor, real)."""
    cores = os.cpu_count() or 1
    print(
        f"{args.requests} signed {KINDS[args.kind]} per app in {args.rounds} alternating runs, {args.concurrency} "
        f"in flight ({args.client} client, keep-alive), after {args.warmup} warm-up events each; {cores} cores"
    )
    head = ("run", "app", "requests", "events/s", "p50 ms", "p99 ms", "max ms", "CPU/ev ms", "app", "bench", "pg")
    print(f"  {head[0]:6s} {head[1]:5s} {head[2]:>8s} {head[3]:>9s} " + " ".join(f"{h:>7s}" for h in head[4:7]), end="")
    print(f" {head[7]:>8s} {'sys':>5s} {head[8]:>6s} {head[9]:>6s} {head[10]:>6s} {'other':>6s}")
    for r in runs:
        print(row(str(r.round), r))
    bare, floor, real = (combined(name, runs) for name in APPS)
    for total in (bare, floor, real):
        print(row("all", total))
    print(
        "  (CPU/ev: the app process's CPU per event, sys: the kernel's share of it; app / bench / pg / other: CPU\n"
        "   of the app process, of this process (the load and the emulator), of PostgreSQL and of every other\n"
        "   process (Redis, and whatever else runs on the machine), as a share of one core)"
    )
    throughput = real.rate / floor.rate
    p99 = quantile(real.latencies, 0.99) / quantile(floor.latencies, 0.99)
    print("real bot / durable floor (a bolt app that writes each request in one PostgreSQL transaction, then acks)")
    print(
        f"  throughput {throughput:5.2f}x   target ≥ {TARGET_THROUGHPUT:.1f}x   "
        f"{'PASS' if throughput >= TARGET_THROUGHPUT else 'MISS'}"
    )
    print(f"  p99 ack    {p99:5.2f}x   target ≤ {TARGET_P99:.1f}x   {'PASS' if p99 <= TARGET_P99 else 'MISS'}")
    p50 = quantile(real.latencies, 0.5) / quantile(floor.latencies, 0.5)
    print(f"  (p50 ack   {p50:5.2f}x; CPU per event {real.app_cpu / max(floor.app_cpu, 1e-9):.2f}x)")
    print(
        f"real bot / bare bolt app (only acks): throughput {real.rate / bare.rate:.2f}x, p99 ack "
        f"{quantile(real.latencies, 0.99) / quantile(bare.latencies, 0.99):.2f}x"
    )
    noisiest = max(runs, key=others)
    if others(noisiest) > 0.25:
        print(
            f"  ← other processes used {others(noisiest):.0%} of a core in a {noisiest.app} run (of {cores} cores): "
            "the figures are noisy; run again on a quiet machine"
        )
    busiest = max(runs, key=lambda r: r.bench_cpu / r.wall)
    if busiest.bench_cpu / busiest.wall > 0.85:
        print(
            f"  ← this process (the load) used {busiest.bench_cpu / busiest.wall:.0%} of a core in a {busiest.app} "
            "run: the client may be what limits that run's rate"
        )
    return floor, real


# --- main ---------------------------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("-n", "--requests", type=int, default=1000, help="measured events per app (1000)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per app, n / rounds events each (2)")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up events per app, not measured (50)")
    parser.add_argument(
        "--redis", default=DEFAULT_REDIS_URL, help=f"the broker, an empty database ({DEFAULT_REDIS_URL})"
    )
    parser.add_argument("--kind", choices=tuple(KINDS), default="mention", help="what is sent (mention)")
    parser.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp", help="the load's (aiohttp)")
    parser.add_argument("--quick", action="store_true", help="300 events per app: does it work")
    parser.add_argument("--py-spy", metavar="FILE", help="record the real bot with py-spy (GIL holders, raw format)")
    parser.add_argument("--bare-app", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the bare app's process
    parser.add_argument("--floor-app", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the floor's process
    args = parser.parse_args()
    if args.quick:
        args.requests = 300
    args.rounds = max(1, min(args.rounds, args.requests))
    return args


def py_spy(pid: int, output: str) -> subprocess.Popen[bytes]:
    beside = Path(sys.executable).parent / "py-spy"
    spy = str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"
    # 1000 samples a second: the default 100 gives too few over a run of a few seconds.
    argv = [spy, "record", "--pid", str(pid), "--rate", "1000", "--gil", "--nonblocking", "--format", "raw"]
    argv += ["-o", output]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def check_the_record(database_url: str, redis_url: str, expected: int) -> list[str]:
    """What the real bot should have done with every mention it acked: one session and one inbox row each (in
    the database before the ack), and one message on the turns queue (after the ack: waited for)."""
    import redis
    from sqlalchemy import text

    from chatops import db

    problems = []
    engine = db.engine_for(database_url)
    try:
        with engine.connect() as conn:
            sessions = conn.execute(
                text("SELECT count(*) FROM sessions WHERE channel_id = :c"), {"c": CHANNEL}
            ).scalar_one()
            inbox = conn.execute(text("SELECT count(*) FROM inbox")).scalar_one()
    finally:
        engine.dispose()
    if sessions != expected or inbox != expected:
        problems.append(f"the real bot recorded {sessions} sessions and {inbox} messages of {expected} events")
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 30
        while (queued := client.llen(TURNS_QUEUE)) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        client.close()
    if queued != expected:
        problems.append(f"the real bot enqueued {queued} sessions of {expected} events")
    print(f"the real bot recorded {sessions} sessions, {inbox} messages and enqueued {queued}, of {expected} events")
    return problems


def check_the_answers(slack: SlackEmulator, kind: str, expected: int) -> list[str]:
    """The real bot answered every slash command (through its response URL) or click (an ephemeral sentence),
    after the ack: waited for. The bare app answers nothing."""

    def answered() -> int:
        return len(slack.responses) if kind == "slash" else len(slack.ephemerals)

    deadline = time.monotonic() + 60
    while answered() < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"the real bot answered {answered()} of {expected} {KINDS[kind]}")
    return [] if answered() == expected else [f"the real bot answered {answered()} of {expected} {KINDS[kind]}"]


def main() -> int:
    args = parse()
    if args.bare_app is not None:
        bare_app(args.bare_app)
        return 0
    if args.floor_app is not None:
        floor_app(args.floor_app)
        return 0
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_inbound_")))
        database_url = stack.enter_context(bench_database())
        redis_url = stack.enter_context(broker(args.redis))
        slack = stack.enter_context(SlackEmulator())
        slack.add_channel(CHANNEL, "bench-inbound")
        (tmp / "mm.yaml").write_text(CONFIG)
        slack_env = {
            "SLACK_API_URL": slack.url,
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": SECRET,
        }
        real_env = clean_env(
            **slack_env, DATABASE_URL=database_url, CELERY_BROKER_URL=redis_url, MM_CONFIG=str(tmp / "mm.yaml")
        )
        floor_url = database_url.replace("postgresql+psycopg://", "postgresql://", 1)  # libpq's form
        make_floor_table(floor_url)
        bare_port, floor_port, real_port = free_port(), free_port(), free_port()
        this = [sys.executable, str(Path(__file__).resolve())]
        real_argv = [MM_BOT, "serve", "--host", "127.0.0.1", "--port", str(real_port)]
        servers = {
            "bare": Server("bare", [*this, "--bare-app", str(bare_port)], clean_env(**slack_env), tmp, bare_port),
            "floor": Server(
                "floor",
                [*this, "--floor-app", str(floor_port)],
                clean_env(**slack_env, FLOOR_DATABASE_URL=floor_url),
                tmp,
                floor_port,
            ),
            "real": Server("real", real_argv, real_env, tmp, real_port),
        }
        for server in servers.values():
            stack.callback(server.stop)
        for server in servers.values():
            server.wait_healthy()

        events = Events(slack, args.kind)
        stack.callback(events.close)
        per_run = [args.requests // args.rounds + (i < args.requests % args.rounds) for i in range(args.rounds)]
        warm = {name: events.make(args.warmup) for name in servers}
        plan: list[tuple[int, str, list[tuple[bytes, str]]]] = []
        for i, count in enumerate(per_run):
            for name in APPS if i % 2 == 0 else reversed(APPS):
                plan.append((i + 1, name, events.make(count)))

        async def everything() -> list[Run]:
            async with contextlib.AsyncExitStack() as clients:
                client = {name: Client(args.client, args.concurrency) for name in servers}
                for c in client.values():
                    clients.push_async_callback(c.aclose)
                for name, server in servers.items():
                    warm_up = await measure(client[name], server, warm[name], args.concurrency, Run(name, 0))
                    if warm_up.failures:
                        raise SystemExit(f"{name}: the warm-up failed: {warm_up.failures}\n{server.log()}")
                spy = py_spy(servers["real"].pid, args.py_spy) if args.py_spy else None
                runs = []
                try:
                    for i, name, bodies in plan:
                        runs.append(await measure(client[name], servers[name], bodies, args.concurrency, Run(name, i)))
                finally:
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                        spy.wait(30)
                return runs

        runs = asyncio.run(everything())
        report(args, runs)
        expected = args.warmup + args.requests
        if args.kind == "mention":
            problems = check_the_record(database_url, redis_url, expected)
        else:
            problems = check_the_answers(slack, args.kind, expected)
        if (written := floor_rows(floor_url)) != expected:
            problems.append(f"the floor wrote {written} rows of {expected} requests")
        for r in runs:
            for what, count in r.failures.items():
                problems.append(f"{r.app} run {r.round}: {count} x {what}")
        if problems:
            print("ERRORS:\n  " + "\n  ".join(problems), file=sys.stderr)
            print(f"--- the real bot's log\n{servers['real'].log()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
