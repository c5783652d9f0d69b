"""Which language servers run, for whom, and for how long.

A worker process serves many sessions, each in its own workspace. A server belongs to one session and one
workspace (its root is that workspace: servers index their root, and two sessions must not see each other's
edits). It starts on the first call for one of its extensions, is started again when it died, stops after
`lsp.idleTimeout` without a call and when the session ends. Across the sessions of one process at most
`lsp.maxServers` run: starting one more stops the least recently used idle one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from mm_core.config import LspConfig, LspServer
from mm_core.tools.lsp.client import LspClient, RequestFailed, kill_group
from mm_core.tools.sandbox import Launch


def server_command(command: str) -> str | None:
    """The executable of a server's command: on the PATH, else beside the interpreter running us. A virtualenv's
    servers (pip install python-lsp-server puts pylsp in .venv/bin) are then found without activating it."""
    return shutil.which(command) or shutil.which(command, path=str(Path(sys.executable).parent))


def normalize_extension(ext: str) -> str:
    ext = ext.strip().lower()
    return ext if ext.startswith(".") else "." + ext


def extension_map(servers: dict[str, LspServer]) -> dict[str, str]:
    """extension → server name; two servers on one extension are refused (the config check says so first)."""
    owners: dict[str, str] = {}
    for name, server in servers.items():
        for ext in map(normalize_extension, server.extensions):
            if ext in owners and owners[ext] != name:
                raise ValueError(f"lsp.servers: {owners[ext]} and {name} both serve {ext}; keep one")
            owners[ext] = name
    return owners


@dataclass(eq=False)
class Running:
    client: LspClient
    manager: LspManager
    key: tuple[Path, str]
    loop: asyncio.AbstractEventLoop
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    idle_timer: asyncio.TimerHandle | None = None


# Every server of this process, least recently used first: the cap is per worker process, not per session.
_RUNNING: collections.OrderedDict[int, Running] = collections.OrderedDict()


def running_pids() -> list[int]:
    """The pids of the servers this process runs (for diagnostics and tests)."""
    return [r.client.pid for r in _RUNNING.values() if r.client.pid is not None]


class LspManager:
    """The language servers of one session; held in the session's resources under "lsp"."""

    def __init__(
        self,
        config: LspConfig,
        servers: dict[str, LspServer],
        launcher: Callable[[Path, list[str]], Launch] | None = None,
    ):
        self.config = config
        self.servers = servers
        # How a server's process is started for a workspace (the sandbox: mm_core.tools.sandbox.server_launch).
        self.launcher = launcher
        self.extensions = extension_map(servers)
        self._running: dict[tuple[Path, str], Running] = {}
        self._starting: dict[tuple[Path, str], asyncio.Lock] = {}
        self._background: set[asyncio.Task[None]] = set()

    def pids(self) -> list[int]:
        """The pids of this session's running servers."""
        return [r.client.pid for r in self._running.values() if r.client.pid is not None]

    def server_for(self, path: Path) -> str | None:
        return self.extensions.get(path.suffix.lower())

    @contextlib.asynccontextmanager
    async def use(self, workspace: Path, name: str) -> AsyncIterator[LspClient]:
        """The running server `name` for `workspace`, started (again) if needed, held for one call."""
        running = await self._get(workspace, name)
        running.busy += 1
        if running.idle_timer is not None:
            running.idle_timer.cancel()
        try:
            async with running.lock:  # one call at a time per server: the file sync and its request belong together
                yield running.client
        finally:
            running.busy -= 1
            running.last_used = time.monotonic()
            if id(running) in _RUNNING:
                _RUNNING.move_to_end(id(running))
                running.idle_timer = running.loop.call_later(self.config.idleTimeout, self._idle, running)

    async def aclose(self) -> None:
        """Stop every server of this session: shutdown, exit, then the process."""
        for running in list(self._running.values()):
            await self._stop(running)
        for task in list(self._background):
            await task

    # ----------------------------------------------------------------------------------------------------------

    async def _get(self, workspace: Path, name: str) -> Running:
        key = (workspace, name)
        async with self._starting.setdefault(key, asyncio.Lock()):
            running = self._running.get(key)
            loop = asyncio.get_running_loop()
            if running is not None and running.loop is not loop:
                # Left by an event loop that ended (a worker running each task in its own loop): its pipes are
                # gone with that loop, only the process can still be ended.
                kill_group(running.client.pid)
                self._forget(running)
                running = None
            if running is not None and not running.client.alive:
                await self._stop(running)  # died: collect the process, then start a fresh one below
                running = None
            if running is None:
                running = await self._start(workspace, name, loop)
            return running

    async def _start(self, workspace: Path, name: str, loop: asyncio.AbstractEventLoop) -> Running:
        server = self.servers[name]
        command = server_command(server.command)
        if command is None:
            raise RequestFailed(f"{server.command} not found on the PATH")
        await _make_room(self.config.maxServers)
        launch = self.launcher
        launcher = (lambda argv: launch(workspace, argv)) if launch is not None else None
        client = LspClient(name, command, list(server.args), workspace, self.config.requestTimeout, launcher)
        running = Running(client=client, manager=self, key=(workspace, name), loop=loop)
        self._running[running.key] = running
        _RUNNING[id(running)] = running
        try:
            await client.start()
        except BaseException:
            await self._stop(running)
            raise
        return running

    def _idle(self, running: Running) -> None:
        if running.busy or time.monotonic() - running.last_used < self.config.idleTimeout * 0.99:
            return
        task = running.loop.create_task(self._stop(running))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forget(self, running: Running) -> None:
        if self._running.get(running.key) is running:
            del self._running[running.key]
        _RUNNING.pop(id(running), None)
        if running.idle_timer is not None:
            running.idle_timer.cancel()

    async def _stop(self, running: Running) -> None:
        self._forget(running)
        await running.client.close()


async def _make_room(cap: int) -> None:
    """Stop least recently used idle servers until one more fits under the process-wide cap."""
    loop = asyncio.get_running_loop()
    for running in list(_RUNNING.values()):
        if running.loop.is_closed():
            kill_group(running.client.pid)
            running.manager._forget(running)
    while len(_RUNNING) >= cap:
        idle = [r for r in _RUNNING.values() if r.busy == 0 and r.loop is loop]
        if not idle:
            raise RequestFailed(
                f"{len(_RUNNING)} language servers are already running in this worker (lsp.maxServers), "
                "all busy — try again in a moment"
            )
        await idle[0].manager._stop(idle[0])
