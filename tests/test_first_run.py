"""A first run on a new machine, as issue 8 lists it: `make test` without bubblewrap, a taken port, `mm-bot init`
then `mm-bot run -p`, what `make run` prints, and the sandbox a worker starts with. Each through the real
`mm-bot` process."""

from __future__ import annotations

import pytest

from mm_testkit.fixtures_kit import REQUIRE_SYSTEM

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
