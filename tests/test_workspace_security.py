"""Confinement: no file tool reads or writes outside its workspace, whatever path or symlink it is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mm_core.tools.edit import EditFileTool
from mm_core.tools.files import ReadFileTool, WriteFileTool
from mm_core.tools.workspace import WorkspaceError, resolve, write_bytes
from tool_helpers import call, make_ctx
from tool_helpers import spaces as spaces_fixture  # noqa: F401 - the fixture "spaces"

READ, WRITE, EDIT = ReadFileTool(), WriteFileTool(), EditFileTool()


@pytest.mark.parametrize("path", ["../team-b/secret.txt", "../../x", "/etc/passwd", "sub/../../team-b/secret.txt"])
def test_escapes_by_dotdot_and_absolute_paths_are_refused(spaces, path):
    ws, _ = spaces
    ctx = make_ctx(ws)
    expected = f"[error: {path} is outside the workspace]"
    assert call(READ, {"path": path}, ctx) == expected
    assert call(WRITE, {"path": path, "content": "x"}, ctx) == expected
    assert call(EDIT, {"path": path, "edits": [{"old": "team", "new": "x"}]}, ctx) == expected
    assert (spaces[1] / "secret.txt").read_text() == "team b's secret\n"


def test_absolute_path_inside_the_workspace_is_fine(spaces):
    ws, _ = spaces
    assert call(READ, {"path": str(ws / "mine.txt")}, make_ctx(ws)) == "mine\n"


def test_symlink_to_etc_is_refused(spaces):
    ws, _ = spaces
    (ws / "docs").symlink_to("/etc")
    ctx = make_ctx(ws)
    assert call(READ, {"path": "docs/passwd"}, ctx) == "[error: docs/passwd is outside the workspace]"
    assert call(WRITE, {"path": "docs/evil.conf", "content": "x"}, ctx) == (
        "[error: docs/evil.conf is outside the workspace]"
    )
    assert not Path("/etc/evil.conf").exists()


def test_symlink_to_a_sibling_workspace_is_refused(spaces):
    ws, sibling = spaces
    (ws / "shared").symlink_to(sibling)
    (ws / "link.txt").symlink_to(sibling / "secret.txt")
    ctx = make_ctx(ws)
    assert call(READ, {"path": "shared/secret.txt"}, ctx) == "[error: shared/secret.txt is outside the workspace]"
    assert call(READ, {"path": "link.txt"}, ctx) == "[error: link.txt is outside the workspace]"
    assert call(WRITE, {"path": "link.txt", "content": "pwned"}, ctx) == "[error: link.txt is outside the workspace]"
    assert call(WRITE, {"path": "shared/new/deep.txt", "content": "x"}, ctx) == (
        "[error: shared/new/deep.txt is outside the workspace]"
    )
    assert call(EDIT, {"path": "link.txt", "edits": [{"old": "secret", "new": "x"}]}, ctx) == (
        "[error: link.txt is outside the workspace]"
    )
    assert (sibling / "secret.txt").read_text() == "team b's secret\n"
    assert sorted(os.listdir(sibling)) == ["secret.txt"]


def test_symlinks_that_stay_inside_are_followed(spaces):
    ws, _ = spaces
    (ws / "real").mkdir()
    (ws / "current").symlink_to("real")
    ctx = make_ctx(ws)
    call(WRITE, {"path": "current/a.txt", "content": "a\n"}, ctx)
    assert (ws / "real" / "a.txt").read_text() == "a\n"
    assert call(READ, {"path": "current/a.txt"}, ctx) == "a\n"


def test_a_symlink_swapped_in_after_the_check_is_not_followed(spaces):
    # The race resolve() cannot see: the directory was real when checked and is a symlink when written.
    ws, sibling = spaces
    (ws / "build").mkdir()
    real = resolve(ws, "build/out.txt")
    (ws / "build").rmdir()
    (ws / "build").symlink_to(sibling)
    with pytest.raises(WorkspaceError):
        write_bytes(ws, real, b"pwned")
    assert sorted(os.listdir(sibling)) == ["secret.txt"]
    # Same for the final component.
    real = resolve(ws, "victim.txt")
    (ws / "victim.txt").symlink_to(sibling / "secret.txt")
    with pytest.raises(WorkspaceError):
        write_bytes(ws, real, b"pwned")
    assert (sibling / "secret.txt").read_text() == "team b's secret\n"


def test_home_shorthand_means_the_workspace(spaces):
    ws, _ = spaces
    assert resolve(ws, "~/mine.txt") == Path(os.path.realpath(ws / "mine.txt"))
    assert call(READ, {"path": "~/../team-b/secret.txt"}, make_ctx(ws)) == (
        "[error: ~/../team-b/secret.txt is outside the workspace]"
    )


def test_nul_byte_in_a_path_is_refused(spaces):
    ws, _ = spaces
    assert call(READ, {"path": "a\x00b"}, make_ctx(ws)) == "[error: 'a\\x00b' is not a valid path]"


def test_a_named_pipe_is_refused_without_blocking(spaces):
    # Opening a FIFO with no writer blocks for ever: a `mkfifo p` in the workspace must not hang the worker.
    ws, _ = spaces
    os.mkfifo(ws / "p")
    ctx = make_ctx(ws)
    refused = "[error: p is not a regular file (a named pipe) — the file tools read and write only regular files]"
    assert call(READ, {"path": "p"}, ctx) == refused
    assert call(WRITE, {"path": "p", "content": "x"}, ctx) == refused
    assert call(EDIT, {"path": "p", "edits": [{"old": "a", "new": "b"}]}, ctx) == refused


def test_a_pipe_swapped_in_after_the_check_is_not_written(spaces):
    ws, _ = spaces
    real = resolve(ws, "out.txt")
    os.mkfifo(ws / "out.txt")
    with pytest.raises(OSError):
        write_bytes(ws, real, b"x")


@pytest.mark.parametrize("path", ["x" * 300, "y" * 300 + "/z.txt"])
def test_a_name_too_long_is_an_answer_not_an_exception(spaces, path):
    ws, _ = spaces
    ctx = make_ctx(ws)
    assert call(READ, {"path": path}, ctx) == f"[error: cannot read {path}: File name too long]"
    assert call(WRITE, {"path": path, "content": "x"}, ctx) == f"[error: cannot write {path}: File name too long]"
    assert call(EDIT, {"path": path, "edits": [{"old": "a", "new": "b"}]}, ctx) == (
        f"[error: cannot read {path}: File name too long]"
    )


def test_a_lone_surrogate_in_a_path_is_refused(spaces):
    ws, _ = spaces
    assert call(READ, {"path": "a\ud800"}, make_ctx(ws)) == (
        '[error: read_file: "path" is not valid Unicode text (it holds a lone surrogate)]'
    )


@pytest.mark.parametrize("path", [".", "~", "./", "~/"])
def test_the_workspace_itself_is_a_directory_not_a_file(spaces, path):
    ws, _ = spaces
    ctx = make_ctx(ws)
    refused = f"[error: {path} is a directory — list it with bash (ls {path})]"
    assert call(READ, {"path": path}, ctx) == refused
    assert call(WRITE, {"path": path, "content": "x"}, ctx) == refused
    assert call(EDIT, {"path": path, "edits": [{"old": "a", "new": "b"}]}, ctx) == refused
    assert call(READ, {"path": str(ws)}, ctx) == f"[error: {ws} is a directory — list it with bash (ls {ws})]"
