"""The bwrap sandbox and the limits: what a command can neither see, reach, nor exhaust."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_core.tools.bash import BashTool
from mm_testkit.fixtures_kit import needs_bwrap
from tool_helpers import call, make_ctx
from tool_helpers import spaces as spaces_fixture  # noqa: F401 - the fixture "spaces"

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

BASH = BashTool()


@needs_bwrap
def test_worker_environment_is_invisible_even_through_proc(spaces, monkeypatch):
    ws, _ = spaces
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-worker-secret")
    ctx = make_ctx(ws, sandbox="bwrap")
    out = call(
        BASH,
        {"command": "env; cat /proc/1/environ /proc/$PPID/environ; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"},
        ctx,
    )
    assert "xoxb-worker-secret" not in out and "SLACK_BOT_TOKEN" not in out
    # Its own processes only: the worker (and pytest) are not in its pid namespace.
    seen = set(call(BASH, {"command": "ps -e -o comm="}, ctx).split())
    assert seen <= {"bwrap", "bash", "ps"}, seen


@needs_bwrap
def test_other_workspaces_and_the_host_tmp_are_invisible(spaces):
    ws, sibling = spaces
    out = call(
        BASH,
        {"command": f"cat {sibling}/secret.txt; ls {sibling.parent}; ls /tmp | wc -l"},
        make_ctx(ws, sandbox="bwrap"),
    )
    assert out.splitlines() == [f"cat: {sibling}/secret.txt: No such file or directory", "team-a", "1"]


@needs_bwrap
def test_writing_outside_the_workspace_fails(spaces):
    ws, sibling = spaces
    ctx = make_ctx(ws, sandbox="bwrap")
    out = call(
        BASH,
        {
            "command": f"echo x > /etc/mm-evil; echo x > /usr/mm-evil; echo x > /mm-evil; "
            f"mkdir -p {sibling}; echo x > {sibling}/evil; echo ok > inside"
        },
        ctx,
    )
    # The sibling's path does not exist in the sandbox: making it creates it in the sandbox's own /tmp.
    assert out.count("Read-only file system") == 3, out
    assert not Path("/etc/mm-evil").exists() and not Path("/usr/mm-evil").exists() and not Path("/mm-evil").exists()
    assert sorted(os.listdir(sibling)) == ["secret.txt"]
    assert (ws / "inside").read_text() == "ok\n"


@needs_bwrap
def test_secret_files_of_etc_are_not_there(spaces):
    ws, _ = spaces
    out = call(BASH, {"command": "ls /etc; cat /etc/shadow"}, make_ctx(ws, sandbox="bwrap"))
    assert "passwd" in out and "shadow: No such file or directory" in out


@needs_bwrap
def test_network_off_leaves_only_loopback(spaces):
    ws, _ = spaces
    off = call(
        BASH,
        {"command": "tail -n +3 /proc/net/dev | cut -d: -f1"},
        make_ctx(ws, sandbox="bwrap", bash={"network": False}),
    )
    assert off.split() == ["lo"]


@needs_bwrap
def test_the_command_is_not_root_inside(spaces):
    ws, _ = spaces
    assert call(BASH, {"command": "id -u"}, make_ctx(ws, sandbox="bwrap")).strip() != "0"


def test_required_sandbox_missing_is_a_clear_refusal(spaces, monkeypatch, tmp_path):
    ws, _ = spaces
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    out = call(BASH, {"command": "touch ran"}, make_ctx(ws, sandbox="bwrap"))
    assert out == (
        "[error: the configuration requires the bwrap sandbox (sandbox: bwrap) but bubblewrap is not "
        "installed on this worker — the command was not run]"
    )
    assert not (ws / "ran").exists()


@pytest.fixture
def owned_ws() -> Iterator[tuple[Path, int]]:
    """A workspace owned by an unprivileged user of this test's own (a uid nothing else on the machine uses): a
    root worker then runs its commands as that user, so the kernel enforces RLIMIT_NPROC (it never does for
    root). The limit counts a user's processes, so a user shared with another test (`nobody`) would let two tests
    running at once exhaust each other's. Its parent must be traversable by that user."""
    uid = random.randrange(3_000_000, 4_000_000)
    root = Path(tempfile.mkdtemp(prefix="mm-ws-"))
    os.chmod(root, 0o711)
    ws = root / "team-a"
    ws.mkdir()
    os.chown(ws, uid, uid)
    yield ws, uid
    shutil.rmtree(root)


def _processes_of(uid: int) -> int:
    out = subprocess.run(["ps", "-u", str(uid), "-o", "pid="], capture_output=True, text=True).stdout
    return len(out.split())


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "none"])
def test_fork_bomb_is_contained_by_the_process_limit(owned_ws, mode):
    ws, uid = owned_ws
    ctx = make_ctx(ws, sandbox=mode, bash={"timeout": 5, "limits": {"processes": 20}})

    async def session() -> str:
        out = await BASH.run({"command": "bomb() { bomb | bomb & }; bomb; sleep 1; id -u"}, ctx)
        # The bomb's processes are background jobs: they may outlive the call, not the session.
        await ctx.resources.aclose()
        return out

    started = time.monotonic()
    out = asyncio.run(session())
    assert time.monotonic() - started < 20
    assert "Resource temporarily unavailable" in out
    assert f"{uid}\n" in out or out.endswith("[error: 5s timeout exceeded]")
    deadline = time.monotonic() + 10
    while _processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_of(uid) == 0


@needs_bwrap
def test_runaway_write_is_stopped_by_the_file_size_limit(spaces):
    ws, _ = spaces
    out = call(BASH, {"command": "yes > big"}, make_ctx(ws, sandbox="bwrap", bash={"limits": {"fileSizeMB": 1}}))
    assert "File size limit exceeded" in out and out.endswith("\n[exit code: exit status 153]")  # 128 + SIGXFSZ
    assert (ws / "big").stat().st_size == 1024 * 1024


def test_cpu_time_limit(owned_ws):
    ws, _ = owned_ws
    started = time.monotonic()
    out = call(
        BASH, {"command": "while :; do :; done"}, make_ctx(ws, sandbox="none", bash={"limits": {"cpuSeconds": 1}})
    )
    assert out == "[exit code: exit status 152]"  # 128 + SIGXCPU
    assert time.monotonic() - started < 10


@needs_bwrap
def test_memory_limit(spaces):
    ws, _ = spaces
    out = call(
        BASH,
        {"command": "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}"},
        make_ctx(ws, sandbox="bwrap", bash={"limits": {"memoryMB": 100}}),
    )
    assert "200000000" not in out and "[exit code: exit status" in out
