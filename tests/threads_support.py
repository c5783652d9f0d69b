"""The whole service for end-to-end tests: `celery worker` processes started as a user starts them, a Redis of
the test's own (so that it can be flushed and restarted), PostgreSQL, the Slack emulator and the scripted model.

Messages reach the workers the way the bot hands them over (`record_message`, then `enqueue_session`), or
through the real bot when a test is about the inbound side.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, select

from chatops import db
from chatops.inbox import Recorded, record_message
from chatops.schema import JobRun, JobTrigger, Session, SessionEvent
from mm_testkit.redis_server import OwnRedis as OwnRedis  # moved there (bench/ uses it); re-exported
from mmbot_helpers import MM_BOT, clean_env, free_port, stop, wait_healthy
from playground.model_server import ModelServer, Reply, ToolCall
from playground.signed import SlackEventSender
from playground.slack_api import SlackEmulator

CHANNEL = "C0THREADS"
SECRET = "threads-signing-secret"


def policy(request: dict[str, Any]) -> Reply:
    """The scripted model of these tests, answering by what it is asked, whatever the order of the sessions:

    - `run: <command>` in the user's message → a bash call with that command, then an answer quoting its output;
    - `read: <path>` → a read_file call, then the same;
    - `write: <path>` → a write_file call writing "written by the model" there, then the same;
    - anything else → "answer: <the message>".
    """
    messages = request["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return Reply(text=f"done: {last['content'].strip()[:200]}")
    text = last["content"] or ""
    if m := re.search(r"run: (.+)$", text, re.S):
        return Reply(tool_calls=[ToolCall("bash", {"command": m.group(1).strip()})])
    if m := re.search(r"read: (\S+)", text):
        return Reply(tool_calls=[ToolCall("read_file", {"path": m.group(1)})])
    if m := re.search(r"write: (\S+)", text):
        return Reply(tool_calls=[ToolCall("write_file", {"path": m.group(1), "content": "written by the model\n"})])
    return Reply(text=f"answer: {text.strip()[-200:]}")


def reads_shared_files(request: dict[str, Any]) -> Reply:
    """The model: reads the first file a message says arrived (`[files: <path> (…)]`), then quotes it."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(text=f"done: {last['content'].strip()[:200]}")
    if m := re.search(r"\[files: (\S+) \(", text_of(last["content"])):
        return Reply(tool_calls=[ToolCall("read_file", {"path": m.group(1)})])
    return Reply(text=f"answer: {text_of(last['content']).strip()[-300:]}")


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """A message's text, whether it is a string or content parts (with images)."""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if part.get("type") == "text")
    return content or ""


def config(channel: str = "{yolo: true}", *extra: str) -> str:
    return "\n".join(
        [
            "sandbox: none",  # these tests are about the service; the sandbox has its own
            "bash: {network: false}",
            "channels:",
            f"  default: {channel}",
            "worker: {leaseSeconds: 3, housekeepingSeconds: 1, concurrency: 20}",
            *extra,
            "",
        ]
    )


@dataclass(frozen=True)
class Posted:
    session_id: str
    ts: str
    thread_ts: str
    recorded: Recorded


@dataclass
class Stack:
    tmp: Path
    database_url: str
    broker_url: str
    slack: SlackEmulator
    model: ModelServer
    config: str = ""
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    bot: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        (self.tmp / "mm.yaml").write_text(self.config or config())
        # Where the sandbox's user can reach its workspace: pytest's tmp_path is root's alone, and a root worker
        # refuses a workspaces directory its commands could not reach.
        self.workspaces = Path(tempfile.mkdtemp(prefix="mm-threads-")) / "workspaces"
        os.chmod(self.workspaces.parent, 0o711)
        db.migrate(self.database_url)
        self.engine: Engine = db.engine_for(self.database_url)
        self.model.always(policy)
        self.slack.add_channel(CHANNEL, "threads")

    @property
    def env(self) -> dict[str, str]:
        return (
            clean_env(
                MM_CONFIG=str(self.tmp / "mm.yaml"),
                DATABASE_URL=self.database_url,
                CELERY_BROKER_URL=self.broker_url,
                SLACK_API_URL=self.slack.url,
                SLACK_BOT_TOKEN=self.slack.bot_token,
                MM_MODEL_URL=self.model.url,
                MM_MODEL="test-model",
                MM_WORKSPACES=str(self.workspaces),
            )
            | self.extra_env
        )

    # -- workers ------------------------------------------------------------------------------------------------

    def start_worker(self, name: str = "w1", *, beat: bool = True, extra: tuple[str, ...] = ()) -> None:
        argv = [MM_BOT, "worker", "--", "--hostname", f"{name}@%h", "--without-mingle", "--without-gossip"]
        if beat:
            argv += ["-B", "--schedule", str(self.tmp / f"beat-{name}")]
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the worker's own, closed with it
        self.workers[name] = subprocess.Popen(
            [*argv, *extra], env=self.env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT, process_group=0
        )

    def kill_worker(self, name: str = "w1") -> None:
        """kill -9: no warm shutdown, no acknowledgement, the lease left to expire."""
        process = self.workers.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop_all(self) -> None:
        for name in list(self.workers):
            self.kill_worker(name)
        if self.bot is not None:
            stop(self.bot)
        shutil.rmtree(self.workspaces.parent, ignore_errors=True)

    def log_of(self, name: str = "w1") -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_bot(self, *, socket: bool = False, port: int | None = None) -> str:
        """`mm-bot serve` (HTTP, or Socket Mode against the emulator) on this stack, on `port` (a free one unless
        given: a test whose environment names the bot's URL picks it first); its base URL."""
        port = port or free_port()
        env = self.env | ({"SLACK_APP_TOKEN": self.slack.app_token} if socket else {"SLACK_SIGNING_SECRET": SECRET})
        log = open(self.tmp / "bot.log", "ab")  # noqa: SIM115 - the bot's own, closed with it
        argv = [MM_BOT, "serve", "--host", "127.0.0.1", "--port", str(port), *(["--socket"] if socket else [])]
        self.bot = subprocess.Popen(argv, env=env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, self.bot)
        if socket:
            self.slack.wait_for_socket_connections(1, timeout=30)
        return base

    # -- messages -----------------------------------------------------------------------------------------------

    def post(
        self,
        text: str,
        *,
        thread_ts: str | None = None,
        user: str = "U0ALICE",
        enqueue: bool = True,
        team_id: str | None = None,
    ) -> Posted:
        """What the bot does with a message: recorded first, then the hand-off (which may be lost). With the
        sender's `team_id` (as Slack's events carry it), the worker streams its answer to them."""
        ts = self.slack.add_message(CHANNEL, text, user, thread_ts=thread_ts)["ts"]
        recorded = record_message(
            self.engine,
            channel_id=CHANNEL,
            thread_ts=thread_ts or ts,
            message_ts=ts,
            user_id=user,
            text=text,
            team_id=team_id,
        )
        if enqueue:
            self.enqueue(recorded.session_id)
        return Posted(recorded.session_id, ts, thread_ts or ts, recorded)

    def enqueue(self, session_id: str) -> None:
        from kombu.connection import Connection

        from workers.celery_app import app
        from workers.tasks import run_session

        # A connection of its own: the test process's Celery app was configured for another broker.
        with Connection(self.broker_url) as conn:
            app.send_task(run_session.name, args=[session_id], queue="turns", connection=conn)

    # -- what happened ------------------------------------------------------------------------------------------

    def thread_text(self, thread_ts: str, channel: str = CHANNEL) -> str:
        """Every message of the thread as a person reads it: its blocks' texts, else its text."""
        return "\n".join(_readable(m) for m in self.slack.messages(channel, thread_ts))

    def workspace(self, session_id: str) -> Path:
        from workers.workspaces import workspace_path

        return workspace_path(self.workspaces, session_id)

    def status(self, session_id: str) -> str:
        with self.engine.connect() as conn:
            return conn.execute(select(Session.status).where(Session.id == session_id)).scalar_one()

    def log_kinds(self, session_id: str) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(SessionEvent.kind).where(SessionEvent.session_id == session_id).order_by(SessionEvent.seq)
            )
            return list(rows.scalars())

    def turns_ended(self, session_id: str) -> int:
        return self.log_kinds(session_id).count("turn_ended")

    def wait(self, what: Callable[[], Any], timeout: float = 60, message: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := what():
                return value
            for name, process in self.workers.items():
                if process.poll() is not None:
                    raise AssertionError(f"worker {name} exited ({process.returncode}):\n{self.log_of(name)[-3000:]}")
            time.sleep(0.1)
        # The workers' logs and the bots' (`bot`, and a replica's `bot2`): what each was doing when time ran out.
        names = [*self.workers, *(n for n in ("bot", "bot2") if (self.tmp / f"{n}.log").exists())]
        logs = "\n".join(f"--- {n}\n{self.log_of(n)[-3000:]}" for n in names)
        raise AssertionError(f"timed out waiting: {message or what}\n{logs}")


def git(*args: str, cwd: Path | None = None) -> str:
    """Plain git with no config but the repository's; in `cwd` as its owner, as the model's commands run in a
    workspace (a root worker's belong to the sandbox's user)."""
    owner = os.stat(cwd).st_uid if cwd is not None and os.geteuid() == 0 else None
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"},
        user=owner,
        group=owner,
        extra_groups=[] if owner is not None else None,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def repositories(tmp: Path) -> tuple[Path, Path]:
    """A repository with one commit (README.md on main) and a bare clone of it, to clone from and push to."""
    origin = tmp / "origin"
    origin.mkdir()
    (origin / "README.md").write_text("a repository\n")
    for args in (["init", "-q", "-b", "main"], ["add", "README.md"], ["commit", "-q", "-m", "start"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=origin, check=True)
    bare = tmp / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(origin), str(bare)], check=True)
    return origin, bare


def run_now(s: Stack, job: str) -> int:
    """What `/mm job run` does: a run recorded, then handed to a worker."""
    from kombu.connection import Connection

    from workers.celery_app import app
    from workers.tasks import run_job

    with s.engine.begin() as conn:
        run_id = conn.execute(
            insert(JobRun)
            .values(job_name=job, scheduled_for=datetime.now(UTC), trigger=JobTrigger.MANUAL, requested_by="U0ALICE")
            .returning(JobRun.id)
        ).scalar_one()
    with Connection(s.broker_url) as conn:
        app.send_task(run_job.name, args=[run_id], queue="turns", connection=conn)
    return run_id


def run_row(s: Stack, run_id: int) -> Any:
    with s.engine.connect() as conn:
        return conn.execute(select(JobRun.__table__).where(JobRun.id == run_id)).one()


def finished(s: Stack, run_id: int) -> Any:
    return s.wait(lambda: (r := run_row(s, run_id)).finished_at is not None and r, message=f"run {run_id} finished")


# --- approvals in a thread --------------------------------------------------------------------------------


def approval_messages(threads: Stack, thread_ts: str) -> list[dict[str, Any]]:
    return [
        m
        for m in threads.slack.messages(CHANNEL, thread_ts)
        if any(b.get("block_id", "").startswith("approval:") for b in m.get("blocks") or [])
        or "🔐" in (m.get("text") or "")
    ]


def waiting_message(threads: Stack, thread_ts: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for m in approval_messages(threads, thread_ts):
            if any(b["type"] == "actions" for b in m.get("blocks") or []):
                return m
        return None

    return threads.wait(find, message="the approval message with its buttons")


def buttons(message: dict[str, Any]) -> dict[str, str]:
    actions = next(b for b in message["blocks"] if b["type"] == "actions")
    return {e["action_id"]: e["value"] for e in actions["elements"]}


def click(sender: SlackEventSender, message: dict[str, Any], action: str, user: str, thread_ts: str) -> None:
    response = sender.block_action(
        action, buttons(message)[action], user=user, channel=CHANNEL, message_ts=message["ts"], thread_ts=thread_ts
    )
    assert response.status_code == 200


def _readable(message: dict[str, Any]) -> str:
    texts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "rich_text_section":  # one line of rich text: its elements side by side
                texts.append("".join(e.get("text") or "" for e in node.get("elements") or []))
                return
            if isinstance(node.get("text"), str):
                texts.append(node["text"])
            for key, value in node.items():
                if key != "text" or not isinstance(value, str):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(message.get("blocks") or [])
    return "\n".join(texts) if texts else (message.get("markdown_text") or message.get("text") or "")


@contextlib.contextmanager
def stack(tmp: Path, database_url: str, broker_url: str, **kwargs: Any) -> Iterator[Stack]:
    with SlackEmulator() as slack, ModelServer() as model:
        s = Stack(tmp, database_url, broker_url, slack, model, **kwargs)
        try:
            yield s
        finally:
            s.stop_all()
            s.engine.dispose()


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A vhost of the test's own on the local RabbitMQ (guest/guest), deleted afterwards: the queue names are
    the product's, so runs must not share them."""
    name = f"mmtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    subprocess.run([ctl, "add_vhost", name], check=True, capture_output=True, timeout=60)
    subprocess.run(
        [ctl, "set_permissions", "-p", name, "guest", ".*", ".*", ".*"], check=True, capture_output=True, timeout=60
    )
    try:
        yield f"amqp://guest:guest@127.0.0.1:5672/{name}"
    finally:
        subprocess.run([ctl, "delete_vhost", name], capture_output=True, timeout=60)
