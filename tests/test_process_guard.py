"""`make check`'s guard (mm_testkit/process_guard.py): under `--no-process` a test that starts a process fails,
naming the fix, however it starts one; a marked test is left out; without the option everything runs."""

from __future__ import annotations

import pytest

STARTS = """
import asyncio, os, subprocess, threading

import pytest

def test_pure():
    assert 1 + 1 == 2

def test_runs_a_program():
    subprocess.run(["true"], check=True)

def test_swallows_the_refusal_in_a_thread():
    def start():
        try:
            subprocess.run(["true"])
        except BaseException:
            pass
    t = threading.Thread(target=start)
    t.start()
    t.join()

def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

def test_asyncio_subprocess():
    async def main():
        p = await asyncio.create_subprocess_exec("true")
        await p.wait()
    asyncio.run(main())

@pytest.mark.process
def test_marked():
    subprocess.run(["true"], check=True)
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_starts=STARTS)
    return pytester.runpytest("-p", "mm_testkit.process_guard", "-p", "no:cacheprovider", *args)


def test_under_no_process_each_way_of_starting_one_fails_and_says_what_to_do(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--no-process")
    result.assert_outcomes(passed=1, failed=4, deselected=1)
    result.stdout.fnmatch_lines(
        ["*this test started a process (subprocess.Popen: true)*mark it `@pytest.mark.process`*"]
    )
    result.stdout.fnmatch_lines(["*this test started a process (os.fork*"])
    for name in (
        "test_runs_a_program",
        "test_swallows_the_refusal_in_a_thread",
        "test_forks",
        "test_asyncio_subprocess",
    ):
        result.stdout.fnmatch_lines([f"FAILED test_starts.py::{name}*"])


@pytest.mark.process  # the inner tests start theirs
def test_without_it_every_test_runs(pytester: pytest.Pytester) -> None:
    run(pytester).assert_outcomes(passed=6)


def test_a_test_that_needs_a_system_program_or_its_own_redis_is_marked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_marked="""
        import pytest
        from mm_testkit.fixtures_kit import needs_system

        @needs_system("sh", "dash")
        def test_needs_sh():
            pass

        def test_own_redis(own_redis):
            pass

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest(
        "-p",
        "mm_testkit.process_guard",
        "-p",
        "mm_testkit.fixtures_kit",
        "-p",
        "mm_testkit.fixtures_services",
        "-p",
        "no:cacheprovider",
        "--no-process",
    )
    result.assert_outcomes(passed=1, deselected=2)
