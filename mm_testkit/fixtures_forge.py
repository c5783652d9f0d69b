"""Pytest fixtures of the forge emulator (loaded from tests/conftest.py's pytest_plugins).

- `forge_server`: a factory `forge_server(kind, tokens=...)` -> a started ForgeServer (playground/forge_server.py)
  of that kind ("github", "gitlab", "gitea"), its repositories under the test's tmp_path; stopped after the test.
  `tokens` defaults to {FORGE_TOKEN: None}: one token that may write every repository. `sock` and `names`
  serve it elsewhere than 127.0.0.1, under host names (ForgeServer's); `lab_forge` (mm_testkit/netlab.py) puts
  one in a test's network namespace that way.

A test after which an emulator answered a call it does not emulate (`server.unsupported`: an unknown route or
query) fails, naming the calls: the forge would have answered something the emulator cannot say, so a test must
not pass on it. A test that makes one on purpose takes them itself with `server.take_unsupported()`.

`git_env(server, home)` is the environment a test runs git in against the emulator: its CA trusted, and neither
the machine's nor the user's configuration (no credential helper of theirs answers for the test).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import pytest

from playground.forge_server import ForgeServer, Kind

FORGE_TOKEN = "forge-token-rw"  # the default token of `forge_server`: writes every repository


def git_env(server: ForgeServer, home: Path) -> dict[str, str]:
    """git against `server`: its CA, no system or global config, no prompt, HOME of the test's own."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
        "LC_ALL": "C",
    } | server.ca_env()


@pytest.fixture
def forge_server(tmp_path: Path) -> Iterator[Callable[..., ForgeServer]]:
    made: list[ForgeServer] = []

    def make(
        kind: Kind,
        tokens: Mapping[str, Iterable[str] | None] | None = None,
        *,
        sock: socket.socket | None = None,
        names: Iterable[str] = (),
    ) -> ForgeServer:
        root = tmp_path / f"forge-{len(made)}-{kind}"
        server = ForgeServer(kind, root, tokens or {FORGE_TOKEN: None}, sock=sock, names=names)
        made.append(server.start())
        return server

    yield make
    unsupported: list[str] = []
    for server in made:
        unsupported += [f"{server.kind}: {call}" for call in server.take_unsupported()]
        server.stop()
    if unsupported:
        pytest.fail(f"the forge emulator does not emulate {unsupported}", pytrace=False)
