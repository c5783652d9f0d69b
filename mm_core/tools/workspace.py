"""Confinement of every file tool to the session's workspace.

Paths come from a model, and workspaces hold cloned repositories that may contain symlinks pointing anywhere
(`docs -> /etc`, `shared -> ../other-team`). So a path is resolved with every symlink followed, and refused
unless the result stays inside the workspace. Writes then walk the *resolved* path from the workspace's own
directory descriptor with O_NOFOLLOW at every step: a symlink swapped in between the check and the write is
refused by the kernel instead of being followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from mm_core.errors import CoreError
from mm_core.tools.base import ToolRefusal

OUTSIDE = "[error: {path} is outside the workspace]"
EMPTY_PATH = "[error: {tool} needs a path, relative to the working directory]"
SPECIAL = "[error: {path} is not a regular file ({kind}) — the file tools read and write only regular files]"
LOOP = "[error: {path} goes through more than {limit} symlinks (a symlink loop?) — the file tools do not follow it]"
# How a path that goes through a symlink is named to a person approving a write to it: the file written is the
# link's target, and that is what they must see (`docs/notes.md → .github/workflows/release.yml (symlink)`).
LINKED = "{path} → {target} (symlink)"
# The kernel's own limit on symlinks followed in one lookup (Linux's MAXSYMLINKS).
MAX_SYMLINKS = 40


class SymlinkLoop(CoreError, OSError):
    """More than MAX_SYMLINKS symlinks on the way to a path."""

    def __init__(self, path: str):
        super().__init__(errno.ELOOP, os.strerror(errno.ELOOP), path)


class WorkspaceError(ToolRefusal):
    """A path the tools refuse (outside the workspace, not a regular file); some callers tell it apart."""


def resolve(workspace: Path, path: str) -> Path:
    """The real absolute path of `path` (relative to `workspace`, or absolute inside it), symlinks followed.

    Raises WorkspaceError when the result, or any symlink on the way, leads outside the workspace.
    """
    if "\x00" in path:
        raise WorkspaceError(f"[error: {path!r} is not a valid path]")
    root = Path(real_path(workspace))
    # bash runs with HOME set to the workspace, so `~/x` means the same file to both.
    local = "." + path[1:] if path == "~" or path.startswith("~/") else path
    try:
        real = Path(real_path(root / local))
    except SymlinkLoop:
        raise WorkspaceError(LOOP.format(path=path, limit=MAX_SYMLINKS)) from None
    if real != root and root not in real.parents:
        raise WorkspaceError(OUTSIDE.format(path=path))
    return real


def real_path(path: str | os.PathLike[str]) -> str:
    """os.path.realpath (non-strict: a missing part is kept as it is), safe on a tree that changes under it.

    The standard one recurses once per symlink in a chain (a chain of a thousand links raises RecursionError)
    and reads each link after checking it (a link replaced by a directory in between raises OSError). This one
    loops, follows at most MAX_SYMLINKS links (SymlinkLoop beyond, as the kernel gives ELOOP), and takes an
    entry that stops being a readable symlink for what it became: whatever it resolves to is only a guess,
    which the O_NOFOLLOW walk of open_inside() then holds to.
    """
    pending = os.path.abspath(os.fspath(path)).split(os.sep)[::-1]
    resolved = os.sep
    links = 0
    while pending:
        name = pending.pop()
        if not name or name == os.curdir:
            continue
        if name == os.pardir:
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, name)
        target = ""
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
            target = os.readlink(candidate) if is_link else ""
        except (OSError, ValueError):
            is_link = False
        if not is_link:
            resolved = candidate
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise SymlinkLoop(candidate)
        if os.path.isabs(target):
            resolved = os.sep
        pending.extend(target.split(os.sep)[::-1])
    return resolved


def relative(workspace: Path, real: Path) -> Path:
    """`real` (from resolve) relative to the workspace's real path."""
    return real.relative_to(real_path(workspace))


def shown_path(workspace: Path, path: str, real: Path) -> str:
    """`path` as a person approving a write is shown it: as given when it names the file written (`real`, from
    resolve), else with the file it lands in (LINKED): it goes through a symlink (itself one, or a directory on
    the way), and the preview, and so the approval's digest, must name what is written. Only for people: the
    model's texts name the path it gave."""
    target = relative(workspace, real).as_posix()
    local = "." + path[1:] if path == "~" or path.startswith("~/") else path
    if os.path.isabs(local):
        for base in (os.path.abspath(workspace), real_path(workspace)):
            if local == base or local.startswith(base + os.sep):
                local = os.path.relpath(local, base)
                break
    return path if os.path.normpath(local) == os.path.normpath(target) else LINKED.format(path=path, target=target)


def _walk_dirs(root_fd: int, parts: tuple[str, ...], create: bool) -> int:
    """Open the directory `parts` under `root_fd` one component at a time, never following a symlink."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_directory(workspace: Path, parts: tuple[str, ...], create: bool = False) -> int:
    """The directory `parts` (plain names) under the workspace, opened one component at a time without following
    a symlink, made on the way when `create`: a descriptor to create files in with `dir_fd` (workers.uploads)."""
    root_fd = os.open(real_path(workspace), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _walk_dirs(root_fd, parts, create)
    finally:
        os.close(root_fd)


def open_inside(workspace: Path, real: Path, flags: int, mode: int = 0o666, create_dirs: bool = False) -> int:
    """Open `real` (a path from resolve) relative to the workspace without following any symlink.

    Returns a file descriptor. Raises WorkspaceError when a component turned into a symlink since resolve()
    (the race this guards against), OSError for ordinary failures.
    """
    rel = relative(workspace, real)
    # The workspace itself (`.`, `~`) has no parts: it is opened as `.` of its own directory.
    parts = rel.parts or (".",)
    root_fd = os.open(real_path(workspace), os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            dir_fd = _walk_dirs(root_fd, parts[:-1], create_dirs)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link_on_the_way(root_fd, parts[:-1]):
                raise WorkspaceError(OUTSIDE.format(path=str(rel))) from e
            raise
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise WorkspaceError(OUTSIDE.format(path=str(rel))) from e
            raise
        finally:
            os.close(dir_fd)
    finally:
        os.close(root_fd)


def _is_link_on_the_way(root_fd: int, parts: tuple[str, ...]) -> bool:
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return False
            if stat.S_ISLNK(st.st_mode):
                return True
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return False
    finally:
        os.close(fd)


class NotRegularFile(CoreError, OSError):
    """A directory, named pipe, device or socket where a file was expected."""

    def __init__(self, mode: int):
        super().__init__(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL, "not a regular file")
        self.is_dir = stat.S_ISDIR(mode)
        self.kind = (
            "a directory"
            if self.is_dir
            else "a named pipe"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
        )


def open_regular(
    workspace: Path, real: Path, flags: int, mode: int = 0o666, create_dirs: bool = False
) -> tuple[int, os.stat_result]:
    """open_inside() for a regular file only, and its status. Raises NotRegularFile for anything else.

    The open never blocks: without O_NONBLOCK a named pipe with no writer (`mkfifo p`, then read_file p)
    would hold the worker for ever. A directory opened for writing fails with EISDIR, like any OSError.
    """
    fd = open_inside(workspace, real, flags | os.O_NONBLOCK, mode, create_dirs)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(st.st_mode)
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_bytes(workspace: Path, real: Path, limit: int = -1) -> bytes:
    """The file's bytes, at most `limit` of them when it is not negative (a file may grow while it is read)."""
    fd, _ = open_regular(workspace, real, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def write_bytes(workspace: Path, real: Path, data: bytes) -> None:
    """Write `data` to `real`, creating parent directories, never through a symlink, only to a regular file.

    Truncated only once it is known to be a regular file: O_TRUNC at open time would act on whatever the name
    had become by then.
    """
    fd, _ = open_regular(workspace, real, os.O_WRONLY | os.O_CREAT, 0o666, create_dirs=True)
    with os.fdopen(fd, "wb") as f:
        os.ftruncate(fd, 0)
        f.write(data)
