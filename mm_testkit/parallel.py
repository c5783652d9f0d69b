"""What running the suite over several processes (pytest-xdist, as `make test` does) needs of the test kit
(loaded from tests/conftest.py's pytest_plugins).

A worker sends each report to the controller as UTF-8, and a report carries the test's captured output and
log lines: those of a test about hostile text hold lone surrogates (`"\\ud800"`), which no UTF-8 encoder takes,
and the worker would crash on them. They travel as `\\ud800` escapes instead; the text is only shown.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    data = yield
    return _encodable(data)


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_encodable(v) for v in value)
    return value
