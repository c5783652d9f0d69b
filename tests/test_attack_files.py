"""Hostile trees: whatever a workspace holds, and however it changes while a file tool runs, every call of
read_file, write_file, edit_file, read_skill and fetch_content's `output` returns a text, never raises, never
blocks, and never reads or writes outside the workspace.

A workspace is a cloned repository that the model's own commands fill: symlinks out of it and to the team
next door, loops and chains of symlinks, named pipes, sockets, names at the file system's limit, directories
deeper than PATH_MAX, and names that a background process swaps between a directory, a file and a symlink
while the tool is between its check and its open.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_core.config import AgentConfig
from mm_core.tools.base import Tool, ToolContext
from mm_core.tools.edit import EditFileTool
from mm_core.tools.fetch import FetchContentTool
from mm_core.tools.files import ReadFileTool, WriteFileTool
from mm_core.tools.skills import ReadSkillTool

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

SECRET = "SECRET-MARKER-7d41"  # in every file outside the workspace; no answer may ever hold it
INSIDE = "inside\n"
CALL_TIMEOUT = 20.0  # a call that takes longer is blocked (on a named pipe, say)


# ------------------------------------------------------------------------------------------------ arena


@dataclass
class Arena:
    base: Path
    ws: Path
    outside: Path  # what a symlink out of the workspace leads to
    sibling: Path  # the next team's workspace

    def snapshot(self) -> dict[str, Any]:
        """Everything outside the workspace, as it is now: names, kinds, contents, link targets, times."""
        seen: dict[str, Any] = {}
        for top in (self.outside, self.sibling):
            for dirpath, dirnames, filenames in os.walk(top):
                for name in dirnames + filenames:
                    p = Path(dirpath, name)
                    st_ = p.lstat()
                    if p.is_symlink():
                        seen[str(p)] = ("link", os.readlink(p))
                    elif p.is_file():
                        seen[str(p)] = ("file", p.read_bytes(), st_.st_mtime_ns, st_.st_size)
                    else:
                        seen[str(p)] = ("other", st_.st_mode, st_.st_mtime_ns)
        return seen


@contextlib.contextmanager
def arena() -> Iterator[Arena]:
    # Short, so that a socket's path fits in sun_path; removed with rm -rf, which, unlike shutil.rmtree, does
    # not recurse in Python on a directory deeper than the interpreter's stack.
    base = Path(tempfile.mkdtemp(prefix="atk", dir="/tmp"))
    try:
        a = Arena(base, base / "ws", base / "outside", base / "sibling")
        for d in (a.ws, a.outside, a.sibling, a.outside / "sub"):
            d.mkdir()
        for name in ("marker.txt", "f.txt", "s.md", "SKILL.md", "sub/marker.txt"):
            (a.outside / name).write_text(f"{SECRET} {name}\n")
        (a.sibling / "secret.txt").write_text(f"{SECRET} sibling\n")
        (a.ws / "sub").mkdir()
        (a.ws / "sub" / "f.txt").write_text(INSIDE)
        (a.ws / "sub" / "SKILL.md").write_text("# inside skill\n")
        yield a
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def make_socket(a: Arena, where: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        short = a.base / "s"
        s.bind(str(short))
        os.rename(short, where)
    finally:
        s.close()


def make_deep(parent: Path, depth: int, name: str) -> str:
    """`depth` nested directories named `name` under `parent`, a file at the bottom, made with directory
    descriptors (the whole path is longer than PATH_MAX); the bottom file's path relative to `parent`."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        wfd = os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, INSIDE.encode())
        os.close(wfd)
    finally:
        os.close(fd)
    return "/".join([name] * depth + ["f.txt"])


KINDS = (
    "file",
    "dir",
    "link_out_file",
    "link_out_dir",
    "link_rel_out",
    "link_sibling",
    "link_self",
    "link_pair",
    "link_chain",
    "link_chain_inside",
    "link_inside",
    "fifo",
    "socket",
    "deep",
)
NAMES = ("a", "b.md", "c", "SKILL.md", "n" * 255, "m" * 252 + ".md")


def build(a: Arena, parent: str, name: str, kind: str, chain: int, depth: int) -> list[str]:
    """Make entry `name` of `kind` in ws/`parent`; the paths (relative to ws) worth calling the tools on."""
    where = a.ws / parent / name
    rel = f"{parent}/{name}" if parent else name
    if kind == "file":
        where.write_text(INSIDE)
    elif kind == "dir":
        where.mkdir()
        (where / "f.txt").write_text(INSIDE)
        (where / "SKILL.md").write_text("# a skill\n")
    elif kind == "link_out_file":
        where.symlink_to(a.outside / "marker.txt")
    elif kind == "link_out_dir":
        where.symlink_to(a.outside)
    elif kind == "link_rel_out":
        where.symlink_to(os.path.relpath(a.outside / "marker.txt", where.parent))
    elif kind == "link_sibling":
        where.symlink_to(a.sibling)
    elif kind == "link_self":
        where.symlink_to(name)
    elif kind == "link_pair":
        where.symlink_to(name + ".2")
        (a.ws / parent / (name + ".2")).symlink_to(name)
    elif kind in ("link_chain", "link_chain_inside"):
        # name -> name.1 -> ... -> name.<chain> -> out (or a file inside): longer than the kernel follows.
        end = a.outside / "marker.txt" if kind == "link_chain" else a.ws / "sub" / "f.txt"
        links = [where] + [a.ws / parent / f"{name}.{i}" for i in range(1, chain + 1)]
        for this, nxt in zip(links, [*links[1:], end], strict=True):
            this.symlink_to(nxt.name if nxt.parent == this.parent else nxt)
    elif kind == "link_inside":
        where.symlink_to("sub" if not parent else "../sub")
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        make_socket(a, where)
    elif kind == "deep":
        where.mkdir()
        return [rel, f"{rel}/{make_deep(where, depth, 'd' * 20)}"]
    return [rel, f"{rel}/f.txt", f"{rel}/marker.txt", f"{rel}/new/x.txt", f"{rel}/../../outside/marker.txt"]


# ------------------------------------------------------------------------------------------------ calls


def run_call(make: Callable[[], Tool], args: dict[str, Any], ctx: ToolContext) -> str:
    """Call the tool as the loop does, in a thread of its own: a call still running after CALL_TIMEOUT is
    blocked, and fails the test. Anything the call raised fails it too."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = asyncio.run(make().run(args, ctx))
        except BaseException as e:  # noqa: BLE001 - the point: nothing may come out of run()
            box["raised"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(CALL_TIMEOUT)
    assert not t.is_alive(), f"{args} blocked for {CALL_TIMEOUT}s"
    assert "raised" not in box, f"{args} raised {box['raised']!r}"
    out = box["out"]
    assert isinstance(out, str)
    assert SECRET not in out, f"{args} read outside the workspace: {out[:200]!r}"
    return out


def tool_calls(a: Arena, path: str, fetch: bool = False) -> list[tuple[Callable[[], Tool], dict[str, Any]]]:
    """The calls to make on `path`; with `fetch`, fetch_content's `output` too (slower: it builds a client)."""
    skill = os.path.basename(path.rstrip("/")).removesuffix(".md") or path
    calls: list[tuple[Callable[[], Tool], dict[str, Any]]] = [
        (ReadFileTool, {"path": path}),
        (ReadFileTool, {"path": path, "start": 1, "end": 2, "numbered": True}),
        (WriteFileTool, {"path": path, "content": "PWNED\n"}),
        (EditFileTool, {"path": path, "edits": [{"old": "inside", "new": "PWNED"}]}),
        (EditFileTool, {"path": path, "edits": [{"old": SECRET[6:], "new": "PWNED"}]}),
        (lambda: ReadSkillTool(a.ws, a.ws), {"name": skill}),
        (lambda: ReadSkillTool(a.ws / os.path.dirname(path), a.ws), {"name": skill}),
    ]
    if fetch:
        # Nothing is fetched: no address is allowed (and nothing listens on port 9), so the call ends at the
        # output path's refusal or at the address's.
        fetcher = FetchContentTool(AgentConfig(fetchAllow=[]))
        calls.append((lambda: fetcher, {"url": "http://127.0.0.1:9/", "output": path}))
    return calls


entry = st.tuples(st.sampled_from(("", "sub")), st.sampled_from(NAMES), st.sampled_from(KINDS))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.lists(entry, min_size=1, max_size=5, unique_by=lambda e: (e[0], e[1])),
    chain=st.integers(min_value=41, max_value=1500),
    depth=st.integers(min_value=1, max_value=400),
)
def test_hostile_trees_get_a_text_and_nothing_outside_is_touched(entries, chain, depth):
    with arena() as a:
        paths: list[tuple[str, bool]] = []
        for parent, name, kind in entries:
            # A pair's or chain's second name taken by another entry, or too long for the file system.
            with contextlib.suppress(OSError):
                made = build(a, parent, name, kind, chain, depth)
                paths += [(path, i == 0 or kind == "deep") for i, path in enumerate(made)]
        before = a.snapshot()
        ctx = ToolContext(workspace=a.ws, config=AgentConfig())
        for path, fetch in paths:
            for make, args in tool_calls(a, path, fetch):
                run_call(make, args, ctx)
        assert a.snapshot() == before


def test_a_chain_of_symlinks_longer_than_the_stack_is_refused_in_words():
    # os.path.realpath recursed once per link of a chain: a thousand links raised RecursionError.
    with arena() as a:
        build(a, "", "chain", "link_chain_inside", 1200, 0)
        ctx = ToolContext(workspace=a.ws, config=AgentConfig())
        out = run_call(ReadFileTool, {"path": "chain"}, ctx)
        assert (
            out == "[error: chain goes through more than 40 symlinks (a symlink loop?) — the file tools do not "
            "follow it]"
        )
        assert run_call(WriteFileTool, {"path": "chain", "content": "x"}, ctx) == out
        assert (a.ws / "sub" / "f.txt").read_text() == INSIDE


def test_a_named_pipe_and_a_socket_are_refused_without_blocking():
    with arena() as a:
        os.mkfifo(a.ws / "pipe")
        make_socket(a, a.ws / "sock")
        ctx = ToolContext(workspace=a.ws, config=AgentConfig())
        special = "[error: {} is not a regular file (a {}) — the file tools read and write only regular files]"
        assert run_call(ReadFileTool, {"path": "pipe"}, ctx) == special.format("pipe", "named pipe")
        assert run_call(WriteFileTool, {"path": "pipe", "content": "x"}, ctx) == special.format("pipe", "named pipe")
        assert run_call(ReadFileTool, {"path": "sock"}, ctx).startswith("[error: cannot read sock: ")
        os.symlink("pipe", a.ws / "p.md")
        assert run_call(lambda: ReadSkillTool(a.ws, a.ws), {"name": "p"}, ctx).startswith('No skill named "p"')


# ------------------------------------------------------------------------------------------------ races

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(x: Path, y: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): each name always exists, as one or the other."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(x), _AT_FDCWD, os.fsencode(y), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _has_exchange() -> bool:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "x").touch()
        (Path(d) / "y").mkdir()
        try:
            exchange(Path(d) / "x", Path(d) / "y")
        except (OSError, AttributeError):
            return False
        return True


@pytest.mark.skipif(not _has_exchange(), reason="renameat2(RENAME_EXCHANGE) is not available here")
@settings(max_examples=4, deadline=None)
@given(seconds=st.floats(min_value=1.0, max_value=2.0))
def test_names_swapped_during_the_call_between_dirs_files_pipes_and_symlinks(seconds):
    """A background thread swaps names as fast as it can: a directory with a symlink out (`sw`), a file with a
    symlink to a file outside (`sf`, `sk.md`), a file with a named pipe (`pf`), a file with a directory (`df`).
    Every call still answers in words, and nothing outside is read or written."""
    with arena() as a:
        ws = a.ws
        (ws / "sw").mkdir()
        (ws / "sw" / "f.txt").write_text(INSIDE)
        (ws / "sw" / "s.md").write_text("# a skill\n")
        (ws / ".sw").symlink_to(a.outside)
        (ws / "sf").write_text(INSIDE)
        (ws / ".sf").symlink_to(a.outside / "f.txt")
        (ws / "sk.md").write_text("# a skill\n")
        (ws / ".sk.md").symlink_to(a.outside / "s.md")
        (ws / "pf").write_text(INSIDE)
        os.mkfifo(ws / ".pf")
        (ws / "df").write_text(INSIDE)
        (ws / ".df").mkdir()
        pairs = [(ws / n, ws / f".{n}") for n in ("sw", "sf", "sk.md", "pf", "df")]
        before = a.snapshot()
        stop = threading.Event()

        def swapper() -> None:
            while not stop.is_set():
                for x, y in pairs:
                    exchange(x, y)

        ctx = ToolContext(workspace=ws, config=AgentConfig())
        thread = threading.Thread(target=swapper, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for path in ("sw/f.txt", "sw/new/x.txt", "sf", "pf", "df", "sk.md"):
                    for make, args in tool_calls(a, path):
                        run_call(make, args, ctx)
                run_call(lambda: ReadSkillTool(ws / "sw", ws), {"name": "s"}, ctx)
        finally:
            stop.set()
            thread.join()
        assert a.snapshot() == before
