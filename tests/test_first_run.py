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

from commands.dev import answers_as
from mm_testkit.fixtures_kit import REQUIRE_SYSTEM
from mm_testkit.model_server import ModelServer, Reply, ToolCall
from mmbot_helpers import MM_BOT, clean_env, free_port, mm_bot, stop, wait_healthy

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


def path_without_the_venv() -> str:
    """The PATH of a shell where the virtualenv was never activated."""
    venv_bin = str(Path(sys.executable).parent)
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d and d != venv_bin)


def test_init_then_run_one_shot_works_with_the_venvs_language_server(tmp_path: Path, model_server: ModelServer):
    env = clean_env(PATH=path_without_the_venv(), MM_MODEL_URL=model_server.url, MM_MODEL="test-model")
    assert mm_bot("init", env=env, cwd=tmp_path).returncode == 0
    (tmp_path / "app.py").write_text("def greet(name):\n    return name\n")
    model_server.script(
        Reply(tool_calls=[ToolCall("lsp", {"action": "symbols", "path": "app.py"})]),
        Reply(tool_calls=[ToolCall("bash", {"command": "touch made"})]),
        Reply(text="Done."),
    )
    result = mm_bot("run", "-p", "list the symbols, then make a file", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # pylsp is in .venv/bin, off the PATH: found beside the interpreter, it answered.
    assert "not found on the PATH" not in result.stderr
    assert "greet" in model_server.messages(1)[-1]["content"]
    # The written config's yolo is the documented default: the one shot ran the command.
    assert (tmp_path / "made").exists()
    assert "was not run" not in result.stderr
    assert result.stdout.splitlines()[-2:-1] == ["Done."]
