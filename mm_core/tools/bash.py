"""bash: one `bash -c` per call, its own process group, output through a temporary file.

Through a pipe, the call would wait for every process holding the write end, so `nohup serve &` would block
the turn for ever; a file lets the call return when the shell is done while the job keeps running. The jobs
are the session's: every process group started is kept in `ctx.resources["bash.jobs"]` and killed when the
session ends. How the process is started (environment, limits, sandbox) is sandbox.py's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
from typing import IO, Any

from mm_core.events import NetworkUsed
from mm_core.tools.args import check_object, get_str
from mm_core.tools.base import CANCELLED, Tool, ToolCancelled, ToolContext, ToolRefusal
from mm_core.tools.disk_guard import DiskGuard, SessionGuard, Unwatchable, WorkerLimit
from mm_core.tools.sandbox import measure_workspace, prepare
from mm_core.tools.sandbox_network import SandboxNetwork
from mm_core.tools.text import truncate

log = logging.getLogger(__name__)

TIMEOUT = "[error: {duration} timeout exceeded]"
EXIT_CODE = "[exit code: exit status {code}]"
TOO_LARGE = "[... output too large to read back in full ...]"
EMPTY_COMMAND = "[error: bash: the command is empty]"
NUL_IN_COMMAND = "[error: bash: the command holds a NUL byte, which no shell command can]"
CANNOT_START = "[error: bash: the command could not be started: {reason}]"
REFUSED = "[command rejected by the user]"
OVER_LIMIT = (
    "[error: the workspace holds {size} MB, over its limit of {limit} MB (bash.limits.workspaceMB) — "
    "delete files before going on]"
)
OVER_LIMIT_REFUSED = (
    "[error: bash: the workspace holds {size} MB, over its limit of {limit} MB "
    "(bash.limits.workspaceMB) — the command was not run: until it is back under, only plain "
    "rm, rmdir, du and ls commands run]"
)
# The disk guard (disk_guard.py) cannot follow the workspace's tree: `reason` completes "the workspace …".
UNWATCHABLE = (
    "[error: the command was stopped: the workspace {reason}, more than the disk guard of "
    "bash.limits.workspaceMB follows — delete files or directories before going on]"
)
UNWATCHABLE_REFUSED = (
    "[error: bash: the workspace {reason}, more than the disk guard of bash.limits.workspaceMB follows — "
    "the command was not run: until it is smaller, only plain rm, rmdir, du and ls commands run]"
)
# What still runs in a workspace over its limit: enough to find and delete what fills it, nothing that writes.
CLEANUP_COMMANDS = ("rm", "rmdir", "du", "ls")

READ_BACK = 1024 * 1024  # bytes read from each end of a very large output
MIB = 1024 * 1024
JOBS_KEY = "bash.jobs"
OVER_KEY = "bash.workspace_over"
GUARD_KEY = "bash.disk_guard"
# How long to wait for a killed process group's leader to be reaped before reading its output anyway.
KILL_GRACE = 5.0
SETTLE = 0.5


def go_duration(seconds: float) -> str:
    """A duration as Go prints it (`30s`, `1m30s`, `500ms`): the reference's timeout marker uses that form."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{int(hours)}h" if hours else ""
    if hours or minutes:
        out += f"{int(minutes)}m"
    return out + f"{round(secs, 9):g}s"


def append_marker(text: str, marker: str) -> str:
    """`marker` on its own line after `text`."""
    return f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{marker}"


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OverLimit:
    """Whether the session's workspace was over `bash.limits.workspaceMB` after its last command."""

    def __init__(self) -> None:
        self.over = False


def cleanup_only(command: str) -> bool:
    """A plain rm / rmdir / du / ls: no shell syntax that could write (redirection, expansion, a second
    command)."""
    if set(command) & set(";&|<>()$`\\\n"):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return bool(words) and words[0] in CLEANUP_COMMANDS


class BashJobs:
    """The process groups a session's commands started; closed when the session ends."""

    def __init__(self) -> None:
        self._procs: dict[int, asyncio.subprocess.Process] = {}

    def add(self, proc: asyncio.subprocess.Process) -> None:
        # Forget the groups that have emptied, so a pgid later reused by some other process is never killed.
        for pgid in [g for g in self._procs if not _group_alive(g)]:
            del self._procs[pgid]
        self._procs[proc.pid] = proc

    def pgids(self) -> list[int]:
        return [g for g in self._procs if _group_alive(g)]

    def kill_all(self) -> None:
        """Kill every group at once, the command's and the background jobs' (the disk guard, from its own
        thread); reaping them stays with the command and with aclose."""
        for pgid in list(self._procs):
            _kill_group(pgid)

    async def aclose(self) -> None:
        procs, self._procs = self._procs, {}
        for pgid in procs:
            _kill_group(pgid)
        for proc in procs.values():
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), KILL_GRACE)


def read_back(out: IO[bytes]) -> str:
    """The output file's text; above 2 MiB only its first and last MiB, with the reference's marker between."""
    size = os.fstat(out.fileno()).st_size
    out.seek(0)
    if size <= 2 * READ_BACK:
        return out.read(size).decode("utf-8", errors="replace")
    head = out.read(READ_BACK)
    out.seek(size - READ_BACK)
    tail = out.read(READ_BACK)
    return head.decode("utf-8", errors="replace") + "\n" + TOO_LARGE + "\n" + tail.decode("utf-8", errors="replace")


async def _read_all(fd: int) -> bytes:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    try:
        return await reader.read()
    finally:
        transport.close()


class BashTool(Tool):
    name = "bash"
    counter = "commands"
    emoji = "🛠️"

    def __init__(self, config: Any = None):
        # The configuration in force is the call's (ctx.config); this one is kept for the registry's sake.
        self.config = config

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "Run a shell command with bash in the project directory and get its output "
            "(stdout and stderr). No input can be typed: use non-interactive options.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The shell command to run."}},
                "required": ["command"],
            },
        }

    def needs_approval(self, args: dict[str, Any]) -> bool:
        return True

    def refusal(self, args: dict[str, Any]) -> str:
        return REFUSED

    def title(self, args: dict[str, Any]) -> str:
        return f"bash: {_command_text(args)}"

    async def preview(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return _command_text(args)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            command = get_str(check_object(args, self.name), self.name, "command")
        except ToolRefusal as e:
            return e.text
        if not command.strip():
            return EMPTY_COMMAND
        if "\x00" in command:  # an exec argument cannot hold one: the launch would raise
            return NUL_IN_COMMAND
        with tempfile.TemporaryFile() as out:
            return await self._run(command, ctx, out)

    async def _run(self, command: str, ctx: ToolContext, out: IO[bytes]) -> str:
        config = ctx.config
        limit_mb = config.bash.limits.workspaceMB
        over: OverLimit = await ctx.resources.get(OVER_KEY, OverLimit)
        jobs: BashJobs = await ctx.resources.get(JOBS_KEY, BashJobs)
        limit = limit_mb * MIB if limit_mb is not None else None
        guard = None
        if limit is not None:
            try:
                guard = await _guard(ctx, limit, jobs)
            except WorkerLimit as e:
                # The worker's limits, not the workspace: the command runs, bounded by the walk after it.
                log.warning("bash: the disk guard is off for this command: the workspace %s", e.reason)
            except Unwatchable as e:
                if not cleanup_only(command):
                    return UNWATCHABLE_REFUSED.format(reason=e.reason)
            # A background job passed the limit since the last command, or the walk at the guard's start
            # found the workspace over it.
            if guard is not None and (guard.tripped == "over" or guard.total > limit):
                over.over = True
        if over.over and limit_mb is not None and not cleanup_only(command):
            held = await _workspace_bytes(ctx)
            over.over = held > limit_mb * MIB
            if over.over:
                return OVER_LIMIT_REFUSED.format(size=-(-held // MIB), limit=limit_mb)
        # Under the limit: the guard stops this command (and every job) once it passes it. Over it, a cleanup
        # command runs with the guard left tripped.
        armed = guard if guard is not None and not over.over else None
        if armed is not None and limit is not None:
            armed.rearm(limit)
        elif guard is not None:
            guard.disarm()
        status_r, status_w = os.pipe()
        launch = None
        try:
            launch = prepare(config, ctx.workspace, command, status_w)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *launch.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=launch.cwd,
                    env=launch.env,
                    pass_fds=launch.pass_fds,
                    start_new_session=True,
                    preexec_fn=launch.preexec,
                    user=launch.user,
                    group=launch.group,
                    extra_groups=[] if launch.user is not None else None,
                )
            finally:
                launch.started()
        except ToolRefusal as e:
            os.close(status_r)
            return e.text
        except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as e:
            # SubprocessError: a failed setrlimit; RuntimeError: no thread for the egress proxy
            os.close(status_r)
            if launch is not None:
                launch.abandon()
            return CANNOT_START.format(reason=getattr(e, "strerror", None) or e)
        finally:
            os.close(status_w)
        jobs.add(proc)
        if launch.network is not None:
            try:
                await launch.network.attach()
            except (ToolRefusal, asyncio.CancelledError) as e:
                os.close(status_r)
                await _stop(proc)
                launch.network.close()  # only now: the sandbox held back by it is gone
                for helper in launch.network.helpers:
                    await _stop(helper)
                if isinstance(e, asyncio.CancelledError):
                    raise ToolCancelled(CANCELLED) from None
                return e.text
            finally:
                for helper in launch.network.helpers:
                    jobs.add(helper)
        marker = None
        try:
            status = await asyncio.wait_for(_read_all(status_r), config.bash.timeout)
        except TimeoutError:
            await _stop(proc)
            marker = TIMEOUT.format(duration=go_duration(config.bash.timeout))
        except asyncio.CancelledError:
            await asyncio.shield(_stop(proc))
            raise ToolCancelled(append_marker(truncate(read_back(out), config.maxOutput), CANCELLED)) from None
        else:
            code = await _exit_code(status, proc)
            # Without background jobs the launched process ends at once; reap it now rather than leave it
            # to a loop that may be gone. With jobs it lives on, and the session's reaper owns it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), SETTLE)
            if code:
                marker = EXIT_CODE.format(code=code)
        text = truncate(read_back(out), config.maxOutput)
        text = network_said(text, launch.network, ctx)
        text = append_marker(text, marker) if marker else text
        if guard is not None and guard.tripped not in (None, "over"):
            return append_marker(text, UNWATCHABLE.format(reason=guard.tripped))
        if not walk_needed(ctx.workspace, limit_mb):
            return text
        held = await _workspace_bytes(ctx)
        # The guard counts a sparse file whole, so it may have stopped the command over a limit the walk
        # does not see: the larger figure is the one said.
        stopped = armed is not None and armed.tripped == "over"
        held = max(held, armed.tripped_at) if armed is not None and stopped else held
        over.over = limit_mb is not None and (held > limit_mb * MIB or stopped)
        return append_marker(text, OVER_LIMIT.format(size=-(-held // MIB), limit=limit_mb)) if over.over else text


def walk_needed(workspace: str | os.PathLike[str], limit_mb: int | None) -> bool:
    """Whether the workspace is walked after a command (a second on a large checkout): to check its size
    against `bash.limits.workspaceMB`, or to clear setuid bits (sandbox.measure_workspace) where they matter.

    They matter only in a root-owned workspace on a root worker: there the sandbox's files belong to root on the
    worker, so a setuid bit would make one a root door. Anywhere else a command runs as the workspace's owner (or
    as the worker's own unprivileged user), and a setuid file it makes can grant only that user.
    """
    if limit_mb is not None:
        return True
    if os.geteuid() != 0:
        return False
    try:
        return os.stat(workspace).st_uid == 0
    except OSError:
        return True  # unknown: walk, as before


async def _guard(ctx: ToolContext, limit: int, jobs: BashJobs) -> DiskGuard:
    """The session's disk guard, following the workspace while its commands and background jobs live; once
    the workspace holds more than `limit` it kills all of them at once. Raises Unwatchable."""
    slot: SessionGuard = await ctx.resources.get(GUARD_KEY, SessionGuard)
    return await slot.ready(os.path.realpath(ctx.workspace), limit, jobs.kill_all)


async def _workspace_bytes(ctx: ToolContext) -> int:
    # A walk cut short by its time budget counted less than there is: a workspace too large to walk in time
    # is then taken as under its limit unless what was counted is already over it.
    usage = await asyncio.to_thread(measure_workspace, os.path.realpath(ctx.workspace))
    return usage.bytes


# The most refusal and failure lines the model reads after one command's output; the others are counted.
NETWORK_LINES = 10
NETWORK_MORE = "network: and {count} more refused or failed connections to other hosts"


def network_said(text: str, network: SandboxNetwork | None, ctx: ToolContext) -> str:
    """What the proxy saw of the command's connections: the front end is told every host reached and refused
    (`NetworkUsed`), the model the first NETWORK_LINES refusals and failures in the proxy's words, one line a host,
    after the output (most tools show a refused CONNECT as a bare `403`)."""
    if network is None or network.tap is None:
        return text
    seen = network.tap.snapshot()
    if seen.reached or seen.refused:
        reached = tuple(sorted(seen.reached.items()))
        ctx.emit(NetworkUsed(ctx.call_id, reached, tuple(sorted(seen.refused.items())), ctx.agent))
    said = sorted({**seen.failed, **seen.refused}.items())
    lines = [why for _host, why in said[:NETWORK_LINES]]
    if (more := len(said) - NETWORK_LINES + seen.unkept) > 0:
        lines.append(NETWORK_MORE.format(count=more))
    return append_marker(text, "\n".join(lines)) if lines else text


def _command_text(args: Any) -> str:
    """The command as the person approving it reads it, whatever the model sent."""
    command = args.get("command") if isinstance(args, dict) else None
    if command is None:
        return ""
    return command if isinstance(command, str) else json.dumps(command, ensure_ascii=False)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    _kill_group(proc.pid)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_GRACE)


async def _exit_code(status: bytes, proc: asyncio.subprocess.Process) -> int:
    """The command's exit status as the wrapper reported it, else (the wrapper never ran: bwrap failed) the
    launched process's own."""
    text = status.decode(errors="replace").strip()
    if text.isdigit():
        return int(text)
    try:
        code = await asyncio.wait_for(proc.wait(), KILL_GRACE)
    except TimeoutError:
        return 1
    return code if code >= 0 else 128 - code
