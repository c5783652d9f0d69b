"""The disk guard against hostile trees: real inotify on a real directory, changed the way a command would.

What it counts must follow every change (writes, truncation, renames of files and of whole trees, deletes,
links), never leave the tree (a directory swapped for a symlink, a symlink to a large file), and a tree beyond
its bounds must stop the commands with a reason rather than go unwatched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_core.tools import disk_guard
from mm_core.tools.disk_guard import DiskGuard, Unwatchable
from tool_helpers import on_disk

MIB = 1024 * 1024


class Watched:
    def __init__(self, root: Path, limit: int = 1 << 40):
        self.root = root
        self.stops = threading.Event()
        self.guard = DiskGuard(str(root), limit, self.stops.set)

    def settled(self, timeout: float = 10) -> int:
        """The guard's count once it agrees with a walk of the tree (it follows events as they come)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            expected = on_disk(self.root)
            if self.guard.total == expected:
                return expected
            time.sleep(0.02)
        raise AssertionError(f"the guard counts {self.guard.total}, the tree holds {on_disk(self.root)}")


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Watched]:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_bytes(b"x" * 10_000)
    (root / "README").write_bytes(b"r" * 3_000)
    w = Watched(root)
    w.guard.start()
    yield w
    w.guard.close()


def test_it_counts_the_tree_as_a_walk_does_and_follows_every_change(watched: Watched) -> None:
    root = watched.root
    assert watched.guard.total == on_disk(root)
    (root / "src" / "pkg" / "mod.py").write_bytes(b"y" * 200_000)  # a file that existed before any event
    (root / "new" / "deep" / "er").mkdir(parents=True)
    (root / "new" / "deep" / "er" / "data").write_bytes(b"z" * 3 * MIB)
    watched.settled()
    os.truncate(root / "new" / "deep" / "er" / "data", 10)
    with open(root / "README", "ab") as f:
        f.write(b"more" * 1000)
    watched.settled()
    # Renames: a file across directories, a whole tree under another, a directory replaced by a file.
    (root / "src" / "pkg" / "mod.py").rename(root / "new" / "mod.py")
    (root / "new" / "deep").rename(root / "src" / "pkg" / "moved")
    (root / "src" / "pkg" / "moved" / "er" / "data").write_bytes(b"w" * MIB)  # written at its new place
    watched.settled()
    shutil.rmtree(root / "src")
    (root / "src").write_bytes(b"s" * 5_000)
    watched.settled()
    # A hard link counts once per name (more than the disk holds: the guard errs on the safe side).
    before = watched.guard.total
    os.link(root / "src", root / "linked")
    st = os.stat(root / "src")
    assert watched.settled() == before + max(st.st_blocks * 512, st.st_size)
    assert not watched.stops.is_set()


def test_a_file_grown_by_ftruncate_counts_at_once(watched: Watched) -> None:
    # Pages written through mmap raise no event: the apparent size is what counts, from the truncate on.
    with open(watched.root / "sparse", "wb") as f:
        f.truncate(64 * MIB)
    watched.settled()
    assert watched.guard.total >= 64 * MIB


def test_it_never_follows_a_symlink_out_of_the_tree(watched: Watched, tmp_path: Path) -> None:
    root, outside = watched.root, tmp_path / "outside"
    (outside / "big").mkdir(parents=True)
    (outside / "big" / "file").write_bytes(b"o" * 2 * MIB)
    before = watched.settled()
    (root / "link-to-dir").symlink_to(outside / "big")
    (root / "link-to-file").symlink_to(outside / "big" / "file")
    # A watched directory swapped for a symlink out, while things are written through both names.
    (root / "src").rename(root / "src-real")
    (root / "src").symlink_to(outside / "big")
    (outside / "big" / "written-outside").write_bytes(b"o" * 4 * MIB)
    (root / "src-real" / "pkg" / "inside").write_bytes(b"i" * MIB)
    after = watched.settled()
    assert after - before < 2 * MIB  # the megabyte inside and the links themselves, nothing of outside's
    (outside / "big" / "more").write_bytes(b"o" * 8 * MIB)
    time.sleep(0.3)
    assert watched.settled() == after


def test_past_the_limit_every_batch_stops_the_commands_until_disarmed(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    w = Watched(tmp_path / "ws", limit=10 * MIB)
    w.guard.start()
    try:
        (w.root / "a").write_bytes(b"a" * 11 * MIB)
        assert w.stops.wait(5)
        assert w.guard.tripped == "over" and w.guard.tripped_at > 10 * MIB
        first = w.guard.tripped_at
        # Still over: a command started since (which the first kill missed) is stopped at its first write.
        w.stops.clear()
        (w.root / "b").write_bytes(b"b" * MIB)
        assert w.stops.wait(5)
        assert w.guard.tripped_at == first  # the first time it passed is the one said
        # A cleanup command runs over the limit.
        w.guard.disarm()
        w.stops.clear()
        (w.root / "a").unlink()
        w.settled()
        assert not w.stops.is_set()
        w.guard.rearm(10 * MIB)
        assert w.guard.tripped is None
        (w.root / "c").write_bytes(b"c" * 10 * MIB)
        assert w.stops.wait(5)
    finally:
        w.guard.close()


def test_a_tree_too_deep_is_refused_at_the_start_and_stops_commands_when_made(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    (deep / Path(*["d"] * (disk_guard.MAX_DEPTH + 1))).mkdir(parents=True)
    with pytest.raises(Unwatchable, match="nested deeper than 256 directories"):
        DiskGuard(str(deep), 1 << 40, lambda: None).start()
    (tmp_path / "ws").mkdir()
    w = Watched(tmp_path / "ws")
    w.guard.start()
    try:
        (w.root / Path(*["d"] * (disk_guard.MAX_DEPTH + 1))).mkdir(parents=True)
        assert w.stops.wait(10)
        assert w.guard.tripped == "is nested deeper than 256 directories"
        deadline = time.monotonic() + 5
        while w.guard.following() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not w.guard.following()  # it follows nothing more: the next command walks the tree again
    finally:
        w.guard.close()


def test_a_deep_tree_moved_deeper_stops_commands_at_its_first_event(tmp_path: Path) -> None:
    (tmp_path / "ws" / Path(*["a"] * 100)).mkdir(parents=True)
    (tmp_path / "ws" / Path(*["b"] * 200)).mkdir(parents=True)
    w = Watched(tmp_path / "ws")
    w.guard.start()
    try:
        (tmp_path / "ws" / "b").rename(tmp_path / "ws" / Path(*["a"] * 100) / "b")
        assert not w.stops.wait(0.5)  # moved: nothing to read yet
        (tmp_path / "ws" / Path(*["a"] * 100, *["b"] * 200) / "f").write_bytes(b"f")
        assert w.stops.wait(5)
        assert w.guard.tripped == "is nested deeper than 256 directories"
    finally:
        w.guard.close()


def test_too_many_directories_or_files_stop_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_guard, "MAX_DIRS", 50)
    monkeypatch.setattr(disk_guard, "MAX_NAMES", 200)
    (tmp_path / "ws").mkdir()
    w = Watched(tmp_path / "ws")
    w.guard.start()
    try:
        for i in range(60):
            (w.root / f"d{i}").mkdir()
        assert w.stops.wait(5)
        assert w.guard.tripped == "has more than 50 directories"
    finally:
        w.guard.close()
    shutil.rmtree(tmp_path / "ws")
    (tmp_path / "ws").mkdir()
    w = Watched(tmp_path / "ws")
    w.guard.start()
    try:
        for i in range(300):
            (w.root / f"f{i}").write_bytes(b"")
        assert w.stops.wait(5)
        assert w.guard.tripped == "holds more than 200 files in the directories commands changed"
    finally:
        w.guard.close()
    with pytest.raises(Unwatchable, match="has more than 50 directories"):
        for i in range(60):
            (tmp_path / "ws" / f"d{i}").mkdir()
        DiskGuard(str(tmp_path / "ws"), 1 << 40, lambda: None).start()


UNREADABLE = """
import os, sys, threading
from mm_core.tools.disk_guard import DiskGuard
root = sys.argv[1]
stops = threading.Event()
guard = DiskGuard(root, 1 << 40, stops.set)
guard.start()
# A file opened before its directory was closed to everyone, then written: the guard cannot look at it.
with open(os.path.join(root, "closed", "f"), "wb") as f:
    os.chmod(os.path.join(root, "closed"), 0)
    f.write(b"f" * 1048576)
print(stops.wait(5), guard.tripped)
guard.close()
os.chmod(os.path.join(root, "closed"), 0o700)
"""


@pytest.mark.process
def test_a_directory_the_worker_cannot_read_stops_commands() -> None:
    # As an unprivileged worker (the chart's uid 10001): root would read the directory anyway.
    top = Path(tempfile.mkdtemp(prefix="mm-guard-"))
    try:
        os.chmod(top, 0o711)
        (top / "ws" / "closed").mkdir(parents=True)
        user = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups"] if os.geteuid() == 0 else []
        if user:
            for path in (top / "ws", top / "ws" / "closed"):
                os.chown(path, 10001, 10001)
        done = subprocess.run(
            [*user, sys.executable, "-c", UNREADABLE, str(top / "ws")], capture_output=True, text=True, timeout=30
        )
        assert done.stdout.strip() == "True holds a directory the worker cannot read (closed)", done.stderr
    finally:
        shutil.rmtree(top)


USED_UP = """
import asyncio, errno, sys
from pathlib import Path
from inotify_simple import INotify
from mm_core.tools.bash import BashTool
from tool_helpers import make_ctx

held = []
try:  # every inotify instance this uid may have, as other sessions and processes of the worker's uid would
    while len(held) < 10_000:
        held.append(INotify())
except OSError as e:
    assert e.errno == errno.EMFILE, e
ctx = make_ctx(Path(sys.argv[1]), sandbox="none", bash={"limits": {"workspaceMB": 1}})

async def main():
    try:
        for command in ("echo done", "head -c 3000000 /dev/zero > big; echo done", "rm big", "echo done"):
            print(repr(await BashTool().run({"command": command}, ctx)))
    finally:
        await ctx.resources.aclose()

asyncio.run(main())
"""


@pytest.mark.process
def test_the_worker_s_used_up_inotify_instances_leave_commands_run_and_bounded_by_the_walk() -> None:
    # The instances are counted per uid, across every process of it (other sessions, other workers on the node):
    # reaching that limit is not the workspace's doing, so its commands run, bounded as without the guard by the
    # walk after each command. Refusing them (as before) left a whole test run's later bash commands unrun.
    # As uid 10001 (the chart's worker) when root, so that the rest of the machine's root processes keep theirs.
    top = Path(tempfile.mkdtemp(prefix="mm-guard-"))
    try:
        os.chmod(top, 0o711)
        (top / "ws").mkdir()
        user = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups"] if os.geteuid() == 0 else []
        if user:
            os.chown(top / "ws", 10001, 10001)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
        done = subprocess.run(
            [*user, sys.executable, "-c", USED_UP, str(top / "ws")], capture_output=True, text=True, timeout=60, env=env
        )
        said = done.stdout.splitlines()
        over = "[error: the workspace holds 3 MB, over its limit of 1 MB (bash.limits.workspaceMB) — delete files"
        assert said == [  # the walk after each command still bounds the workspace
            repr("done\n"),
            repr(f"done\n{over} before going on]"),
            repr(""),  # over it, a cleanup command runs
            repr("done\n"),  # and back under, any command
        ], done.stderr
        # Said to the operator, whose worker's limit it is (docs/operations.md), once a command.
        off = "bash: the disk guard is off for this command: the workspace could not be watched: the worker's inotify"
        assert done.stderr.count(off) == 4
    finally:
        shutil.rmtree(top)
