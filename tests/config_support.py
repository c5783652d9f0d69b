"""Writing a config file in a test and reading what loading it refuses: the config tests' shared helpers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chatops.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    """`text` (dedented) as the test's mm.yaml."""
    path = tmp_path / "mm.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> list[str]:
    """What loading `text` refuses, each problem without the file's path (the error says them all, a line each)."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ or {})
    assert str(caught.value) == "\n".join(caught.value.problems)
    return [p.removeprefix(f"{path}:") for p in caught.value.problems]
