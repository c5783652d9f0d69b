"""Language servers' lives on a worker: a missing server, a crash mid-request, a timeout, the process-wide cap,
idle stop, and the session's end. Real pylsp processes throughout."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from mm_core.config import AgentConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.lsp import LspTool, find_servers, running_pids
from mm_core.tools.lsp.manager import LspManager
from mm_testkit.fixtures_kit import needs_bwrap_when_root

# A root worker starts a language server only in the sandbox (its workspace here belongs to root).
pytestmark = needs_bwrap_when_root

BIN = Path(sys.executable).parent
FIXTURE = Path(__file__).parent / "fixtures" / "lsp"
PYLSP = {"command": str(BIN / "pylsp"), "extensions": [".py"]}
DEFINITION = {"action": "definition", "path": "app.py", "symbol": "make_greeting"}
ANSWER = "greetings.py:16:5  def make_greeting(name: str) -> str:"


def config(**lsp) -> AgentConfig:
    return AgentConfig.model_validate({"lsp": {"servers": {"pylsp": PYLSP}, **lsp}})


def workspace(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(FIXTURE, root)
    return root


def lsp_pids(ctx: ToolContext) -> list[int]:
    """The pids of the servers the session's manager runs (it exists once the tool has run)."""
    manager: LspManager | None = ctx.resources.peek("lsp")
    assert manager is not None
    return manager.pids()


def stop_all(pid: int) -> None:
    """SIGSTOP `pid` and every process under it: in the sandbox the pid the session knows is bubblewrap's, and
    the server runs two levels down (a SIGSTOP of bubblewrap alone left the server answering)."""
    todo = [pid]
    while todo:
        current = todo.pop()
        os.kill(current, signal.SIGSTOP)
        for task in os.listdir(f"/proc/{current}/task"):
            with open(f"/proc/{current}/task/{task}/children") as f:
                todo.extend(int(child) for child in f.read().split())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_missing_server_is_a_warning_and_no_server_means_no_tool():
    cfg = AgentConfig.model_validate(
        {"lsp": {"servers": {"pylsp": PYLSP, "gopls": {"command": "gopls-not-installed", "extensions": [".go"]}}}}
    )
    available, warnings = find_servers(cfg)
    assert list(available) == ["pylsp"]
    assert warnings == ["[warning: lsp server gopls (gopls-not-installed) not found on the PATH — skipped]"]
    assert "Servers available: pylsp (.py)." in LspTool(cfg, available).schema()["description"]

    none = AgentConfig.model_validate(
        {"lsp": {"servers": {"gopls": {"command": "gopls-not-installed", "extensions": [".go"]}}}}
    )
    assert find_servers(none) == (
        {},
        ["[warning: lsp server gopls (gopls-not-installed) not found on the PATH — skipped]"],
    )


def test_server_crash_mid_request_then_restart(tmp_path):
    cfg = config()
    tool, ctx = LspTool(cfg, find_servers(cfg)[0]), ToolContext(workspace=workspace(tmp_path, "w"), config=cfg)

    async def scenario():
        assert await tool.run(DEFINITION, ctx) == ANSWER
        [pid] = lsp_pids(ctx)
        stop_all(pid)  # the request below stays pending...
        pending = asyncio.create_task(tool.run(DEFINITION | {"action": "hover"}, ctx))
        await asyncio.sleep(0.3)
        assert not pending.done()
        os.kill(pid, signal.SIGKILL)  # ...until the process dies: it fails at once, not at the 20 s timeout
        failed = await asyncio.wait_for(pending, 5)
        # What the server last said on stderr follows the code when it said anything (once in CI, black's
        # "reformatted -" lines from pylsp's own start): the sentence around it is the contract.
        assert failed.startswith("[lsp: pylsp: hover failed: the server exited (code -9)")
        assert failed.endswith(" — it is started again on the next call]") and "\n" not in failed
        assert await tool.run(DEFINITION, ctx) == ANSWER
        [new_pid] = lsp_pids(ctx)
        assert new_pid != pid
        # Killed between calls: the next call notices and starts it again.
        os.kill(new_pid, signal.SIGKILL)
        await asyncio.sleep(0.3)
        assert await tool.run(DEFINITION, ctx) == ANSWER
        await ctx.resources.aclose()

    asyncio.run(scenario())


def test_request_timeout_then_recovery(tmp_path):
    cfg = config(requestTimeout="1s")
    tool, ctx = LspTool(cfg, find_servers(cfg)[0]), ToolContext(workspace=workspace(tmp_path, "w"), config=cfg)

    async def scenario():
        assert await tool.run(DEFINITION, ctx) == ANSWER
        [pid] = lsp_pids(ctx)
        # The whole group: in the sandbox, the server is a child of bwrap, whose pid this is.
        os.killpg(pid, signal.SIGSTOP)
        try:
            assert await tool.run(DEFINITION, ctx) == "[lsp: pylsp: definition failed: no answer within 1s]"
        finally:
            os.killpg(pid, signal.SIGCONT)
        assert await tool.run(DEFINITION, ctx) == ANSWER
        await ctx.resources.aclose()
        assert gone(pid)

    asyncio.run(scenario())


def test_cap_across_sessions_and_aclose_stops_the_processes(tmp_path):
    cfg = config(maxServers=2)
    tool = LspTool(cfg, find_servers(cfg)[0])
    sessions = [ToolContext(workspace=workspace(tmp_path, f"w{i}"), config=cfg) for i in range(3)]

    async def scenario():
        pids = []
        for ctx in sessions:
            assert await tool.run(DEFINITION, ctx) == ANSWER
            pids.append(lsp_pids(ctx)[0])
        # The third start stopped the least recently used server, the first session's.
        assert gone(pids[0])
        assert sorted(running_pids()) == sorted(pids[1:])
        # That session still works: its server starts again, and the next least recently used one makes room.
        assert await tool.run(DEFINITION, sessions[0]) == ANSWER
        assert gone(pids[1])
        assert len(running_pids()) == 2
        alive = running_pids()
        for ctx in sessions:
            await ctx.resources.aclose()
        assert running_pids() == []
        assert all(gone(pid) for pid in alive)

    asyncio.run(scenario())


def test_idle_server_is_stopped(tmp_path):
    cfg = config(idleTimeout="500ms")
    tool, ctx = LspTool(cfg, find_servers(cfg)[0]), ToolContext(workspace=workspace(tmp_path, "w"), config=cfg)

    async def scenario():
        assert await tool.run(DEFINITION, ctx) == ANSWER
        [pid] = lsp_pids(ctx)
        for _ in range(50):
            await asyncio.sleep(0.1)
            if gone(pid):
                break
        assert gone(pid)
        assert lsp_pids(ctx) == []
        assert await tool.run(DEFINITION, ctx) == ANSWER  # and comes back on the next call
        await ctx.resources.aclose()

    asyncio.run(scenario())


def test_server_command_that_cannot_start(tmp_path):
    # On the PATH at start-up, then not startable (here: a command that exits at once, speaking no LSP).
    cfg = AgentConfig.model_validate(
        {"lsp": {"servers": {"broken": {"command": "false", "extensions": [".py"]}}, "requestTimeout": "5s"}}
    )
    tool, ctx = LspTool(cfg, find_servers(cfg)[0]), ToolContext(workspace=workspace(tmp_path, "w"), config=cfg)

    async def scenario():
        text = await tool.run(DEFINITION, ctx)
        await ctx.resources.aclose()
        return text

    assert asyncio.run(scenario()) == (
        "[lsp: broken: definition failed: the server exited (code 1) — it is started again on the next call]"
    )


@pytest.mark.parametrize("action", ["symbols", "diagnostics"])
def test_file_gone_between_calls(tmp_path, action):
    cfg = config()
    root = workspace(tmp_path, "w")
    tool, ctx = LspTool(cfg, find_servers(cfg)[0]), ToolContext(workspace=root, config=cfg)

    async def scenario():
        answer = await tool.run({"action": action, "path": "app.py"}, ctx)
        assert answer.startswith(("class Person  line 3\nfunction make_greeting  line 3\n", "no diagnostics"))
        (root / "app.py").unlink()
        text = await tool.run({"action": action, "path": "app.py"}, ctx)
        await ctx.resources.aclose()
        return text

    assert asyncio.run(scenario()) == "[lsp: app.py does not exist]"


def run_scripted_server(tmp_path: Path, name: str, script: str, request_timeout: str, deadline: float) -> str:
    """A definition call to a 'language server' that is this Python script, then the session's close."""
    ws = workspace(tmp_path, "w")
    # In the workspace, which the server's sandbox shows it; not {name}.py: it would shadow a package of that name.
    source = ws / f"{name}_script.py"
    source.write_text(script)
    cfg = AgentConfig.model_validate(
        {
            "lsp": {
                "requestTimeout": request_timeout,
                "servers": {name: {"command": sys.executable, "args": [str(source)], "extensions": [".py"]}},
            }
        }
    )
    tool, ctx = LspTool(cfg, find_servers(cfg)[0]), ToolContext(workspace=ws, config=cfg)

    async def scenario():
        try:
            return await asyncio.wait_for(tool.run(DEFINITION, ctx), deadline)
        finally:
            await asyncio.wait_for(ctx.resources.aclose(), 10)

    return asyncio.run(scenario())


def test_server_flooding_stderr_without_newlines_keeps_working(tmp_path):
    # A 200 KB stderr line, then a megabyte more without a newline: a line reader gives up on the first and
    # stops draining, the pipe fills, the server blocks on its next write and the call never ends.
    script = (
        "import sys\n"
        "sys.stderr.write('x' * 200_000 + '\\n' + 'y' * 1_000_000)\n"
        "sys.stderr.flush()\n"
        "from pylsp.__main__ import main\n"
        "sys.argv = ['pylsp']\n"
        "main()\n"
    )
    assert run_scripted_server(tmp_path, "pylsp", script, "10s", 30) == ANSWER


def test_server_garbling_its_output_fails_the_call_at_once(tmp_path):
    # A header line past the reader's limit, then a flood: the conversation cannot be resynchronised, so the
    # server is ended and the pending request fails then, not at the request timeout.
    script = (
        "import sys, time\n"
        "sys.stdout.write('X' * 100_000 + '\\r\\n' + 'Y' * 1_000_000)\n"
        "sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    assert run_scripted_server(tmp_path, "garble", script, "30s", 15).startswith(
        "[lsp: garble: definition failed: the server exited (code -9)"
    )
