import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_core.tools.sandbox import SANDBOX_UID
from tool_helpers import close_made

# The test kit's fixtures: the scripted model server, the Slack emulator and signed-request client, a PostgreSQL
# database / Redis key prefix of this run's own, and a network namespace of the test's own. pytester runs the kit's
# own plugin on a small test file, to prove what the kit's markers do. The process guard marks the tests that start
# a process, which `make check` leaves to `make test`.
pytest_plugins = [
    "mm_testkit.fixtures_kit",
    "mm_testkit.fixtures_services",
    "mm_testkit.fixtures_forge",
    "mm_testkit.netlab",
    "mm_testkit.process_guard",
    "mm_testkit.parallel",
    "pytester",
]


@pytest.fixture
def owned_ws() -> Iterator[Path]:
    """A workspace owned by the unprivileged SANDBOX_UID, as a root worker's are, under a directory that user can
    traverse (pytest's own temporary directories are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="mm-ws-"))
    os.chmod(root, 0o711)
    ws = root / "team-a"
    ws.mkdir()
    if os.geteuid() == 0:
        os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    yield ws
    shutil.rmtree(root)


@pytest.fixture(autouse=True)
def _sessions_closed() -> Iterator[None]:
    """The tool contexts a test made end as a worker's sessions do (tool_helpers.close_made)."""
    yield
    close_made()
