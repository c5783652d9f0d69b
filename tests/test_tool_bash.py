"""bash: markers, truncation, timeout and cancellation killing the group, background jobs and the reaper."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from mm_core.tools.base import ToolCancelled, ToolContext
from mm_core.tools.bash import BashTool, go_duration
from mm_core.tools.sandbox import SANDBOX_UID
from mm_testkit.fixtures_kit import needs_bwrap
from tool_helpers import call, make_ctx

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

BASH = BashTool()
NO_CONTEXT = cast(ToolContext, None)  # bash's preview reads only its arguments


@pytest.fixture
def ws() -> Iterator[Path]:
    """A workspace as a root worker should hold it: owned by an unprivileged user (a root worker refuses to run
    a command as root), under a directory that user can traverse."""
    root = Path(tempfile.mkdtemp(prefix="mm-ws-"))
    os.chmod(root, 0o711)
    (root / "ws").mkdir()
    if os.geteuid() == 0:
        os.chown(root / "ws", SANDBOX_UID, SANDBOX_UID)
    yield root / "ws"
    shutil.rmtree(root)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[-1][0] != "Z"


def wait_dead(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(params=["none", pytest.param("bwrap", marks=needs_bwrap)])
def mode(request) -> str:
    return request.param


def test_output_merged_and_exit_code_marker(ws, mode):
    ctx = make_ctx(ws, sandbox=mode)
    assert call(BASH, {"command": "echo out; echo err >&2; pwd"}, ctx) == f"out\nerr\n{os.path.realpath(ws)}\n"
    assert call(BASH, {"command": "printf partial; exit 3"}, ctx) == "partial\n[exit code: exit status 3]"
    assert call(BASH, {"command": "true"}, ctx) == ""


def test_timeout_marker_follows_the_configured_timeout_and_kills_background_children(ws, mode):
    ctx = make_ctx(ws, sandbox=mode, bash={"timeout": "1s"})
    started = time.monotonic()
    out = call(BASH, {"command": "echo begin; (sleep 2; touch late) & sleep 60"}, ctx)
    assert out == "begin\n[error: 1s timeout exceeded]"
    assert time.monotonic() - started < 10
    # The background child was killed with the group (in the sandbox, with its whole pid namespace).
    time.sleep(2.5)
    assert not (ws / "late").exists()


def test_go_durations():
    assert [go_duration(s) for s in (30, 1.5, 0.5, 90, 120, 3600)] == [
        "30s",
        "1.5s",
        "500ms",
        "1m30s",
        "2m0s",
        "1h0m0s",
    ]


def test_background_job_does_not_block_and_is_reaped_when_the_session_ends(ws, mode):
    ctx = make_ctx(ws, sandbox=mode)

    async def scenario() -> tuple[str, float, list[int]]:
        started = time.monotonic()
        out = await BASH.run({"command": "sleep 30 & echo started"}, ctx)
        took = time.monotonic() - started
        jobs = ctx.resources.peek("bash.jobs")
        assert jobs is not None
        groups = jobs.pgids()
        await ctx.resources.aclose()
        return out, took, groups

    out, took, groups = asyncio.run(scenario())
    assert out == "started\n" and took < 5
    # The job kept running after the call returned, then the session's end killed its group.
    assert groups
    for pgid in groups:
        assert wait_dead(pgid)


def test_cancellation_kills_the_group_and_keeps_the_output(ws, mode):
    ctx = make_ctx(ws, sandbox=mode)

    async def scenario() -> ToolCancelled:
        task = asyncio.create_task(BASH.run({"command": "echo before; echo $$ > pid; sleep 60"}, ctx))
        while not (ws / "pid").exists() or not (ws / "pid").read_text():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(ToolCancelled) as raised:
            await task
        return raised.value

    cancelled = asyncio.run(scenario())
    assert cancelled.output == "before\n[error: cancelled]"
    if mode == "none":
        assert wait_dead(int((ws / "pid").read_text()))


def test_very_large_output_is_read_back_from_both_ends(ws):
    ctx = make_ctx(ws, sandbox="none", maxOutput=10**7)
    out = call(
        BASH,
        {
            "command": "head -c 1048576 /dev/zero | tr '\\0' a; head -c 1048576 /dev/zero | tr '\\0' m;"
            " head -c 1048576 /dev/zero | tr '\\0' z"
        },
        ctx,
    )
    assert out == "a" * 1048576 + "\n[... output too large to read back in full ...]\n" + "z" * 1048576


def test_output_truncated_to_max_output_then_markers(ws):
    ctx = make_ctx(ws, sandbox="none", maxOutput=100)
    out = call(BASH, {"command": "seq 1 1000; exit 2"}, ctx)
    digits = "".join(f"{i}\n" for i in range(1, 1001))
    assert out == (
        digits[:100]
        + "\n[... output truncated: "
        + str(len(digits) - 100)
        + " more characters not shown ...]\n[exit code: exit status 2]"
    )


def test_no_stdin(ws):
    assert call(BASH, {"command": "cat; echo done"}, make_ctx(ws, sandbox="none")) == "done\n"


def test_environment_is_scrubbed_in_every_mode(ws, mode, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-worker-secret")
    monkeypatch.setenv("DATABASE_URL", "postgresql://secret")
    monkeypatch.setenv("TEAM_SETTING", "passed on purpose")
    ctx = make_ctx(ws, sandbox=mode, bash={"env": {"GOFLAGS": "-mod=mod"}, "passEnv": ["TEAM_SETTING", "ABSENT"]})
    out = call(BASH, {"command": "env"}, ctx)
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert "SLACK_BOT_TOKEN" not in env and "DATABASE_URL" not in env and "xoxb" not in out
    assert env["GOFLAGS"] == "-mod=mod" and env["TEAM_SETTING"] == "passed on purpose" and "ABSENT" not in env
    assert env["HOME"] == os.path.realpath(ws)


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"command": "  "}, "[error: bash: the command is empty]"),
        ({"command": ["ls"]}, '[error: bash: "command" must be a string, got ["ls"]]'),
        ({}, '[error: bash: missing "command"]'),
        ({"command": "echo a\x00b"}, "[error: bash: the command holds a NUL byte, which no shell command can]"),
        ({"command": "echo \ud800"}, '[error: bash: "command" is not valid Unicode text (it holds a lone surrogate)]'),
    ],
)
def test_bad_arguments(ws, args, expected):
    assert call(BASH, args, make_ctx(ws)) == expected


def test_declaration_display_and_refusal():
    assert BASH.schema()["parameters"] == {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The shell command to run."}},
        "required": ["command"],
    }
    assert BASH.title({"command": "ls -la"}) == "bash: ls -la"
    assert BASH.refusal({"command": "ls"}) == "[command rejected by the user]"
    assert (BASH.counter, BASH.emoji, BASH.needs_approval({"command": "ls"})) == ("commands", "🛠️", True)
    assert asyncio.run(BASH.preview({"command": "rm -rf build"}, NO_CONTEXT)) == "rm -rf build"


@pytest.mark.parametrize("args", [{"command": ["rm", "-rf", "/"]}, {"command": None}, ["ls"], {}])
def test_preview_and_title_are_text_whatever_the_arguments(args):
    # The approval prompt renders them: a list or a null must not reach it as anything but text.
    assert isinstance(asyncio.run(BASH.preview(args, NO_CONTEXT)), str)
    assert BASH.title(args).startswith("bash: ")
