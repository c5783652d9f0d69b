from collections.abc import Iterator

import pytest

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


@pytest.fixture(autouse=True)
def _sessions_closed() -> Iterator[None]:
    """The tool contexts a test made end as a worker's sessions do (tool_helpers.close_made)."""
    yield
    close_made()
