"""Pytest fixtures of the test kit (loaded from tests/conftest.py's pytest_plugins).

- `model_server`: a started ModelServer with an empty script (fresh for each test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mm_testkit.model_server import ModelServer


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A scripted OpenAI-compatible server; `model_server.url` is the base URL ending in /v1."""
    # Starting one takes about a millisecond, so each test gets its own: no state leaks between tests.
    with ModelServer() as server:
        yield server
