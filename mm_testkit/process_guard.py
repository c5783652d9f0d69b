"""The `process` marker and `make check`'s guard (loaded from tests/conftest.py's pytest_plugins).

`make check` is the fast inner loop: it runs only the tests that start no process (no worker, bot, language
server, redis-server, git, bwrap, nor any other program), with `pytest --no-process`. Those that do are marked:

- `@pytest.mark.process` on the test, or `pytestmark = pytest.mark.process` on its module;
- automatically, every test that needs a system program (`needs_system`, `needs_bwrap`: it runs it) or uses a
  fixture that starts one: `own_redis` (a redis-server of its own), `forge_server` (git), `lab` (`ip`).

With `--no-process` the marked tests are deselected, and starting a process from any other test fails it,
naming the program and the fix: the spawn functions (`subprocess.Popen`, and through it asyncio's subprocesses;
`os.fork`, `os.posix_spawn`, `os.system`, `os.exec*`, multiprocessing's spawn) refuse to start one. A test left unmarked
that starts a process therefore cannot slip into `make check`: the classification cannot rot. `make test` runs
every test, marked or not, with no guard.
"""

from __future__ import annotations

import ctypes.util
import multiprocessing.util
import platform
import sys
import threading
from collections.abc import Generator
from typing import Any

import pytest

OPTION = "--no-process"
AUDITED = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec"})
MARKER = "process"
# Fixtures whose tests start a process whatever they do themselves.
PROCESS_FIXTURES = frozenset({"own_redis", "forge_server", "lab"})


class ProcessRefused(BaseException):
    """Raised where a process would start under --no-process. A BaseException, like pytest's own outcomes, so
    that the product's `except Exception` cannot hide it (the test fails anyway: the guard keeps a record)."""


MACHINE_DESCRIPTION = frozenset({platform.__file__, ctypes.util.__file__})
_guarded = pytest.StashKey[bool]()
# The runs that have the guard on: a pytester run inside one turns it on and off again as a run does.
_depth = 0
_hooked = False
_started: list[str] = []
_lock = threading.Lock()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help="run only the tests that start no process (`make check`); a test that starts one fails",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: starts a process (worker, bot, language server, git, bwrap…): not in `make check`"
    )
    # Under pytest-xdist the controller starts the workers and runs no test: only a process that runs tests is
    # guarded.
    config.stash[_guarded] = bool(config.getoption(OPTION)) and (
        hasattr(config, "workerinput") or config.getoption("dist", "no") == "no"
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    # From here on: importing the test modules may run a program once to describe the machine (croniter's
    # platform.architecture() runs `file`), which is no test's doing.
    global _depth
    if session.config.stash.get(_guarded, False):
        _install_guard()
        _depth += 1


def pytest_unconfigure(config: pytest.Config) -> None:
    global _depth
    if config.stash.get(_guarded, False) and _depth > 0:
        _depth -= 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("system"):
            item.add_marker(MARKER)
    if not config.getoption(OPTION):
        return
    kept = [item for item in items if item.get_closest_marker(MARKER) is None]
    deselected = [item for item in items if item.get_closest_marker(MARKER) is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if not item.config.getoption(OPTION):
        return report
    with _lock:
        started = _started[:]
        _started.clear()
    if started and report.outcome != "skipped":
        report.outcome = "failed"
        report.longrepr = (
            f"this test started a process ({'; '.join(started[:3])}), and `make check` (pytest {OPTION}) runs only "
            f"the tests that start none: mark it `@pytest.mark.{MARKER}` (or its module: "
            f"`pytestmark = pytest.mark.{MARKER}`) and `make test` runs it"
        )
    return report


def _refuse(what: str) -> None:
    with _lock:
        _started.append(what[:160])
    raise ProcessRefused(f"{OPTION}: a test started a process: {what}")


def _install_guard() -> None:
    global _hooked
    if _hooked:  # an audit hook is there for good: one is enough, on while _depth says so
        return
    _hooked = True

    # An audit hook sees every start (subprocess.Popen, and through it asyncio's subprocesses; os.fork,
    # os.posix_spawn, os.system, os.exec…) wherever the function was imported from, and an exception raised in
    # it stops the start. multiprocessing's spawn and forkserver start theirs without an audit event.
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if _depth and event in AUDITED and not _describes_the_machine():
            _refuse(f"{event}{_shown(args)}")

    sys.addaudithook(hook)

    spawnv = multiprocessing.util.spawnv_passfds

    def spawnv_passfds(path: Any, args: Any, passfds: Any) -> int:
        if _depth:
            _refuse(f"multiprocessing {args[:3]}")
        return spawnv(path, args, passfds)

    multiprocessing.util.spawnv_passfds = spawnv_passfds


def _describes_the_machine() -> bool:
    """Whether the standard library's description of the machine starts it: platform's `uname -p` and `file -b`,
    ctypes.util.find_library's `ldconfig -p`, run lazily by libraries (croniter, inotify_simple) to find out
    what they run on. They are no test's doing, and a library would not start them twice."""
    frame = sys._getframe(2)  # the caller of the audited function
    while frame is not None:
        if frame.f_code.co_filename in MACHINE_DESCRIPTION:
            return True
        frame = frame.f_back
    return False


def _shown(args: tuple[Any, ...]) -> str:
    """The program and its first arguments, as the audit event carries them."""
    if len(args) > 1 and isinstance(args[1], (list, tuple)):
        return ": " + " ".join(map(str, args[1][:4]))
    return f": {args[0]!r}" if args else ""
