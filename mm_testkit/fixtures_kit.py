"""Pytest fixtures of the test kit (loaded from tests/conftest.py's pytest_plugins).

- `model_server`: a started ModelServer with an empty script.
- `slack`: a started SlackEmulator (`slack.url`, `slack.bot_token`, bot user `slack.bot_user_id` seeded, and
  the tests' channel `C0TEST`: the emulator, as Slack, posts only in channels it knows).
- `slack_sender`: a factory `slack_sender(url, signing_secret, **kwargs) -> SlackEventSender` whose envelopes
  and response_urls match the `slack` emulator.

Starting a server takes about a millisecond, so each test gets fresh ones: no state leaks between tests.

Every test is checked for calls of Web API methods the emulator does not know (`unknown_method`, from any
SlackEmulator of the test process, the fixture's or its own): a test that made one fails, naming the methods.
Slack has no such methods, or the emulator lacks one the bot now calls; either way a test must not pass on it.
A test that calls one on purpose takes them itself with `SlackEmulator.take_unknown_methods()`.

And the marker of tests that need a program of the system rather than of the virtualenv:

- `needs_system(command, package)`: the test is skipped, with the fix in the reason ("bubblewrap is not
  installed (no bwrap on the PATH): apt-get install bubblewrap"), when `command` is not on the PATH. A
  laptop's `make test` then passes on what it can run, and says what it could not. With
  MM_TEST_REQUIRE_SYSTEM=1 (CI sets it: it installs the packages and must prove what they guard) the skip is
  a failure instead.
- `needs_bwrap`: that marker for bubblewrap, which the sandbox tests need; `needs_bwrap_when_root`: the same,
  only when the tests run as root (a root worker never runs a command unsandboxed in a root-owned workspace).
- `path_without(command, where)`: a PATH on which `command` is not found, for tests of a machine without it
  (they then run whether or not this one has it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from playground.model_server import ModelServer
from playground.signed import SlackEventSender
from playground.slack_api import SlackEmulator

REQUIRE_SYSTEM = "MM_TEST_REQUIRE_SYSTEM"
TEST_CHANNEL = "C0TEST"  # the channel the `slack` fixture knows


def needs_system(command: str, package: str) -> pytest.MarkDecorator:
    """Marks a test that needs `command`, which the Debian package `package` installs."""
    return pytest.mark.system(command, package)


needs_bwrap = needs_system("bwrap", "bubblewrap")
# A root worker runs a command in a workspace root owns only inside the sandbox (never as root), so tests that
# run commands through an agent in their own temporary directories need bubblewrap when they run as root. Either
# way they start processes (mm_testkit/process_guard.py): `make check` leaves them to `make test`.
needs_bwrap_when_root = needs_bwrap if os.geteuid() == 0 else pytest.mark.process


def path_without(command: str, where: Path) -> str:
    """This process's PATH with `command` taken off: each directory that holds it is replaced by one, under
    `where`, of symlinks to everything else it holds."""
    dirs = []
    for i, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        if entry and (Path(entry) / command).exists():
            copy = where / f"path-{i}"
            copy.mkdir(parents=True, exist_ok=True)
            for item in Path(entry).iterdir():
                if item.name != command and not (copy / item.name).exists():
                    (copy / item.name).symlink_to(item)
            entry = str(copy)
        dirs.append(entry)
    return os.pathsep.join(dirs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"system(command, package): needs a system program; skipped without it unless {REQUIRE_SYSTEM}=1"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A skip marker rather than pytest.skip() in a hook: the report then names the test, not this file.
    if os.environ.get(REQUIRE_SYSTEM) == "1":
        return
    for item in items:
        if (missing := _missing_program(item)) is not None:
            item.add_marker(pytest.mark.skip(reason=missing))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if os.environ.get(REQUIRE_SYSTEM) == "1" and (missing := _missing_program(item)) is not None:
        pytest.fail(f"{missing} ({REQUIRE_SYSTEM}=1: this run must not skip it)", pytrace=False)


def _missing_program(item: pytest.Item) -> str | None:
    """What is missing for `item`, with the fix; None when it has every program it needs."""
    for mark in item.iter_markers("system"):
        command, package = mark.args
        if shutil.which(command) is None:
            return f"{package} is not installed (no {command} on the PATH): apt-get install {package}"
    return None


@pytest.fixture(autouse=True)
def no_unknown_slack_methods() -> Iterator[None]:
    """Fails the test after which an emulator answered `unknown_method`."""
    SlackEmulator.take_unknown_methods()  # a previous test's, already reported
    yield
    unknown = SlackEmulator.take_unknown_methods()
    if unknown:
        pytest.fail(f"the Slack emulator answered unknown_method to {sorted(set(unknown))}", pytrace=False)


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A scripted OpenAI-compatible server; `model_server.url` is the base URL ending in /v1."""
    with ModelServer() as server:
        yield server


@pytest.fixture
def slack() -> Iterator[SlackEmulator]:
    """A Slack Web API emulator; use `slack_sdk.WebClient(token=slack.bot_token, base_url=slack.url)`."""
    with SlackEmulator() as emulator:
        emulator.add_channel(TEST_CHANNEL, "mm-test")
        yield emulator


@pytest.fixture
def slack_sender(slack: SlackEmulator) -> Iterator[Callable[..., SlackEventSender]]:
    """Factory of signed-request senders to a bot: `slack_sender(bot_url, signing_secret, path=...)`."""
    made: list[SlackEventSender] = []

    def make(url: str, signing_secret: str, **kwargs: Any) -> SlackEventSender:
        defaults = {
            "team_id": slack.team_id,
            "api_app_id": slack.app_id,
            "bot_user_id": slack.bot_user_id,
            "response_url": slack.response_url,
        }
        sender = SlackEventSender(url, signing_secret, **(defaults | kwargs))
        made.append(sender)
        return sender

    yield make
    for sender in made:
        sender.close()
