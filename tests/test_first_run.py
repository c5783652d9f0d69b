"""A first run on a new machine, as issue 8 lists it: `make test` without bubblewrap, a taken port, `mm-bot init`
then `mm-bot run -p`, what `make run` prints, and the sandbox a worker starts with. Each through the real
`mm-bot` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from commands.services import answers_as
from mm_testkit.fixtures_kit import REQUIRE_SYSTEM, needs_bwrap, path_without
from mmbot_helpers import MM_BOT, clean_env, free_port, mm_bot, stop, wait_healthy
from playground.model_server import ModelServer, Reply, ToolCall

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

# --- the test kit's marker of system programs --------------------------------------------------------------

MARKED = """
from mm_testkit.fixtures_kit import needs_system

@needs_system("mm-no-such-command", "mm-no-such-package")
def test_needs_a_missing_program():
    pass

@needs_system("sh", "dash")
def test_needs_a_present_program():
    pass
"""
FIX = "mm-no-such-package is not installed (no mm-no-such-command on the PATH): apt-get install mm-no-such-package"


def test_a_missing_system_program_skips_with_the_fix(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(REQUIRE_SYSTEM, raising=False)
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("-p", "mm_testkit.fixtures_kit", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED * {FIX}"])


def test_with_require_system_a_missing_program_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(REQUIRE_SYSTEM, "1")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("-p", "mm_testkit.fixtures_kit", "-rf")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*{FIX} ({REQUIRE_SYSTEM}=1: this run must not skip it)*"])


# --- a taken port -------------------------------------------------------------------------------------------


@pytest.fixture
def impostor(tmp_path: Path) -> Iterator[str]:
    """Another program on a port, answering GET /healthz with 200 as a bot would: its base URL."""
    root = tmp_path / "impostor"
    root.mkdir()
    (root / "healthz").write_text('{"ok": true, "pid": 1}')
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while not _answers(f"{base}/healthz"):
            assert time.monotonic() < deadline and server.poll() is None, "the impostor did not start"
            time.sleep(0.05)
        yield base
    finally:
        stop(server)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("command", ["serve", "dev"])
def test_a_taken_port_is_one_sentence_naming_it_and_the_fix(tmp_path: Path, impostor: str, command: str) -> None:
    port = impostor.rsplit(":", 1)[1]
    env = clean_env(SLACK_BOT_TOKEN="x", SLACK_SIGNING_SECRET="s", CELERY_BROKER_URL=f"sqla+sqlite:///{tmp_path}/b")
    result = mm_bot(command, "--port", port, env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"mm-bot {command}: 127.0.0.1:{port} is already in use by another process: stop what holds it, "
        "or pass --port with a free port"
    ]
    assert not (tmp_path / "var").exists()  # dev said it before migrating or starting anything


def test_dev_knows_its_own_bot_from_another_process_on_the_port(tmp_path: Path, impostor: str) -> None:
    assert not answers_as(f"{impostor}/healthz", os.getpid())
    port = free_port()
    env = clean_env(SLACK_BOT_TOKEN="xoxb-x", SLACK_SIGNING_SECRET="s", DATABASE_URL=f"sqlite:///{tmp_path}/mm.db")
    bot = subprocess.Popen([MM_BOT, "serve", "--port", str(port)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        health = wait_healthy(f"http://127.0.0.1:{port}", bot)
        assert health["pid"] == bot.pid
        assert answers_as(f"http://127.0.0.1:{port}/healthz", bot.pid)
        assert not answers_as(f"http://127.0.0.1:{port}/healthz", bot.pid + 1)
    finally:
        stop(bot)


# --- mm-bot init, then mm-bot run -p ------------------------------------------------------------------------


def without_the_venv(path: str) -> str:
    """`path` as a shell has it where the virtualenv was never activated."""
    venv_bin = str(Path(sys.executable).parent)
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and d != venv_bin)


RUN_WITHOUT_BWRAP = (
    (
        "mm-bot run: bubblewrap is not installed, and you are root: bash commands and language servers are refused "
        "in directories root owns (they would run as root); install bubblewrap (apt-get install bubblewrap), or run "
        "as an unprivileged user"
    )
    if os.geteuid() == 0
    else (
        "mm-bot run: bubblewrap is not installed: bash commands run unsandboxed, with your access to files and the "
        "network; install bubblewrap (apt-get install bubblewrap) to confine each to its workspace, or set "
        "`sandbox: none` to say you mean it"
    )
)


@pytest.mark.parametrize("bwrap", ["absent", pytest.param("installed", marks=needs_bwrap)])
def test_init_then_run_one_shot_works_with_the_venvs_language_server(
    tmp_path: Path, model_server: ModelServer, bwrap: str
) -> None:
    path = without_the_venv(path_without("bwrap", tmp_path) if bwrap == "absent" else os.environ["PATH"])
    env = clean_env(PATH=path, MM_MODEL_URL=model_server.url, MM_MODEL="test-model")
    assert mm_bot("init", env=env, cwd=tmp_path).returncode == 0
    (tmp_path / "app.py").write_text("def greet(name):\n    return name\n")
    model_server.script(
        Reply(tool_calls=[ToolCall("lsp", {"action": "symbols", "path": "app.py"})]),
        # A gated call that no sandbox decides about: only yolo does.
        Reply(tool_calls=[ToolCall("write_file", {"path": "made", "content": "made\n"})]),
        Reply(text="Done."),
    )
    result = mm_bot("run", "-p", "list the symbols, then write a file", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # pylsp is in .venv/bin, off the PATH: found beside the interpreter, it answered (or, as root without the
    # sandbox, was found and refused to start rather than run as root).
    symbols = model_server.messages(1)[-1]["content"]
    if bwrap == "absent" and os.geteuid() == 0:
        assert symbols.startswith(f"[lsp: pylsp: symbols failed: could not start {Path(sys.executable).parent}/pylsp")
    else:
        assert "greet" in symbols
    # The written config's yolo is the documented default: the one shot made the call.
    assert (tmp_path / "made").read_text() == "made\n"
    assert result.stdout.splitlines()[-2:-1] == ["Done."]
    # No warning about the language server, nor a refusal; without bubblewrap, one warning, and it ran anyway.
    assert result.stderr.splitlines() == ([RUN_WITHOUT_BWRAP] if bwrap == "absent" else [])


# --- the sandbox a worker starts with -----------------------------------------------------------------------

CELERY = str(Path(sys.executable).parent / "celery")


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
@pytest.mark.parametrize(
    "start", [[MM_BOT, "worker"], [CELERY, "-A", "workers.celery_app", "worker"]], ids=["mm-bot", "celery"]
)
def test_a_worker_refuses_to_start_without_the_sandbox_its_config_needs(
    tmp_path: Path, mode: str, start: list[str]
) -> None:
    (tmp_path / "mm.yaml").write_text(f"sandbox: {mode}\n")
    env = clean_env(PATH=path_without("bwrap", tmp_path), CELERY_BROKER_URL=f"sqla+sqlite:///{tmp_path}/broker")
    result = subprocess.run(start, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"mm-bot worker: bubblewrap is not installed, and `sandbox: {mode}` needs it to confine bash commands: "
        "install bubblewrap (apt-get install bubblewrap), or set `sandbox: none` to run them unsandboxed"
    ]


def start_worker(tmp_path: Path, config: str, path: str) -> tuple[list[str], int]:
    """`mm-bot worker` with `config` until it is ready, then stopped: its output's lines, and its exit code."""
    (tmp_path / "mm.yaml").write_text(config)
    env = clean_env(PATH=path, CELERY_BROKER_URL=f"sqla+sqlite:///{tmp_path}/broker")
    worker = subprocess.Popen(
        [MM_BOT, "worker", "--", "--pool", "solo"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            lines.append(line.rstrip("\n"))
            if line.rstrip().endswith(" ready."):
                break
    finally:
        stop(worker)
    return lines, worker.returncode


UNSANDBOXED = (
    "`sandbox: none`: bash commands run unsandboxed, with this worker's access to files and the network (only the "
    "resource limits and the scrubbed environment apply)"
)


def test_a_worker_with_sandbox_none_starts_and_warns_once(tmp_path: Path) -> None:
    lines, code = start_worker(tmp_path, "sandbox: none\n", path_without("bwrap", tmp_path))
    assert lines[-1].endswith(" ready."), lines
    warned = [line for line in lines if UNSANDBOXED in line]
    assert len(warned) == 1 and warned[0].endswith(f" WARNING mm.worker: {UNSANDBOXED}"), lines
    assert not any("SecurityWarning" in line for line in lines)
    assert code == 0


@needs_bwrap
def test_a_worker_with_bubblewrap_starts_quietly(tmp_path: Path) -> None:
    lines, code = start_worker(tmp_path, "sandbox: auto\n", os.environ["PATH"])
    assert lines[-1].endswith(" ready."), lines
    assert not any("sandbox" in line or "Warning" in line for line in lines), lines
    assert code == 0
