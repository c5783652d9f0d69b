"""Each thread's workspace: a directory under MM_WORKSPACES holding a complete checkout of its repository.

The root is shared by every worker (docs/workspaces.md says why), and laid out so that a command, which sees
only its own workspace, can reach nothing the worker keeps for itself:

    <root>/<session id>/            the workspace: bound read-write into the thread's sandbox
    <root>/.mirrors/<name>.git      a bare mirror per repository, fetched from its URL, cloned from locally
    <root>/.mirrors/<name>.lock     its fcntl lock (one fetch or clone at a time); its mtime: last used
    <root>/.meta/<session id>.json  what the workspace was prepared from; its mtime: last used
    <root>/.staging/                where a workspace or mirror is built (and one removed) out of sight, and
                                    a push's private repository lives (private_repository)

A workspace is a full clone of the mirror: no alternates (the sandbox cannot see the mirror) and no hard links
(a command could write through a shared inode into the mirror, and so into every later thread's checkout).
On a root worker it is handed to the sandbox's user (uid and gid SANDBOX_UID, `mm`), so that commands run as
that user; the mirrors, the metadata and the root stay root's. Once in place, a workspace is the model's: the
worker's git on it runs with the model's power (workers/git.py, `in_workspace`), and what the worker does to
its files here (removing it, measuring it) goes by directory descriptor and follows no link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from mm_core.tools.sandbox import SANDBOX_UID, measure_workspace
from workers.errors import WorkerError
from workers.git import Credentials, GitError, clone, masked, run_git

META, MIRRORS, STAGING = ".meta", ".mirrors", ".staging"
# A first fetch of a large repository takes long; a clone from the local mirror does not.
MIRROR_TIMEOUT = 1800.0
CLONE_TIMEOUT = 600.0
# A build left in .staging by a worker that died is removed by the next sweep after this long.
STAGING_MAX_AGE = 24 * 3600.0
DAY = 24 * 3600.0
MIB = 1024 * 1024
# Heads and tags only: a forge's other refs (GitHub's refs/pull/*) would multiply what a mirror holds.
MIRROR_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
# Session ids are the database's UUIDs; no dot, so none can be `..` or one of the worker's own directories.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_HEAD = re.compile(r"^ref: (refs/heads/\S+)\tHEAD$", re.MULTILINE)
_DISK_FULL = ("No space left on device", "Disk quota exceeded")

PREPARE_FAILED = "Could not prepare this thread's workspace from {repo}: {words}"
DISK_FULL = (
    "Could not prepare this thread's workspace: the disk that holds the workspaces is full ({words}); idle "
    "workspaces are removed after workspaces.maxAgeDays days and beyond workspaces.maxTotalMB, and an operator "
    "can free space sooner"
)
NOT_UPDATED = "Could not update {repo} ({words}), so this workspace is a checkout of the copy fetched {when}."
REPLACED = "This thread's workspace was a checkout of {old}; it was replaced by a fresh checkout of {new}."


class WorkspaceError(WorkerError):
    """A workspace that could not be prepared; `text` is one plain sentence for the thread, credentials masked."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class Workspace:
    path: Path
    fresh: bool  # just created: the thread's first turn, or the directory was gone (or its repository changed)
    note: str | None = None  # a sentence the thread should read (a fetch failed, the checkout was replaced)


def workspace_path(root: Path, session_id: str) -> Path:
    """`<root>/<session_id>`; ValueError for an id that is not one (it could name a path outside the root)."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    return Path(root) / session_id


def prepare(
    root: Path,
    session_id: str,
    repo: str | None,
    branch: str | None,
    *,
    credentials: Credentials | Callable[[], Credentials | None] | None = None,
) -> Workspace:
    """The session's workspace, made when missing: a clone of `repo` at `branch` (its default when None) taken
    from the repository's mirror, or an empty directory without `repo`. A workspace prepared from another
    repository or branch is replaced. Blocking (git runs here): call it from a thread.

    Raises WorkspaceError with a sentence for the thread; ValueError for a session id that is not one.
    `credentials` may be a function, asked only when a clone is made (a GitHub App's token costs a request).
    """
    path = workspace_path(root, session_id)
    root = Path(root)
    wanted = {"repo": public_url(repo) if repo else None, "branch": branch or None}
    try:
        _layout(root)
        meta = _read_meta(root, session_id)
        old = path if _is_dir(path) else None
        if old is not None and (meta is None or _source(meta) == _source(wanted)):
            touch(root, session_id)
            return Workspace(path, fresh=False)
        replaced = REPLACED.format(old=_describe(meta), new=_describe(wanted)) if old is not None else None
        box = Path(tempfile.mkdtemp(prefix=f"{session_id}-", dir=root / STAGING))
        try:
            token = credentials() if callable(credentials) else credentials
            built, stale, start, cloned = _build(root, box / "ws", repo, branch, token)
            _write_meta(root, session_id, {**wanted, "commit": start, "cloned_branch": cloned})
            if old is not None:
                os.rename(old, box / "old")
            elif path.is_symlink() or path.exists():  # not a directory: nothing a workspace can be
                os.unlink(path)
            try:
                os.rename(built, path)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return Workspace(path, fresh=False)  # another prepare of this session won the race
        finally:
            _remove(box)
    except GitError as e:
        raise _failure(repo, branch, _git_words(e)) from None
    except OSError as e:
        raise _failure(repo, branch, f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None
    notes = [n for n in (replaced, stale) if n]
    return Workspace(path, fresh=True, note=" ".join(notes) or None)


def start_commit(root: Path, session_id: str) -> str | None:
    """The commit the session's workspace was cloned at (None without a repository, or not recorded)."""
    commit = (_read_meta(Path(root), session_id) or {}).get("commit")
    return commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def cloned_branch(root: Path, session_id: str) -> str | None:
    """The branch the session's workspace was cloned at (the repository's default when none was asked)."""
    branch = (_read_meta(Path(root), session_id) or {}).get("cloned_branch")
    return branch if isinstance(branch, str) and branch != "HEAD" else None


def touch(root: Path, session_id: str) -> None:
    """Mark the session's workspace as used now (sweep removes the least recently used first)."""
    workspace_path(root, session_id)
    meta = Path(root) / META / f"{session_id}.json"
    try:
        os.utime(meta)
    except FileNotFoundError:
        _write_meta(Path(root), session_id, {})


def sweep(
    root: Path, *, max_age_days: int, max_total_mb: int | None, protected: set[str], now: float | None = None
) -> list[Path]:
    """Remove workspaces (and mirrors) unused for `max_age_days`, then, while everything under the root holds
    more than `max_total_mb`, the least recently used. Never a workspace of a session in `protected`, nor a
    mirror a prepare holds. Returns the directories removed."""
    root = Path(root)
    now = time.time() if now is None else now
    if not _is_dir(root) or not _is_dir(root / META):
        return []
    _clear_staging(root, now)
    entries = sorted(_entries(root, protected, now), key=lambda e: (e.last_used, str(e.path)))
    removed: list[Path] = []
    kept: list[_Entry] = []
    for entry in entries:
        if entry.last_used < now - max_age_days * DAY and _remove_entry(root, entry):
            removed.append(entry.path)
        else:
            kept.append(entry)
    if max_total_mb is None:
        return removed
    sizes = {e.path: measure_workspace(str(e.path), budget=math.inf).bytes for e in kept}
    total = sum(sizes.values())
    for entry in kept:
        if total <= max_total_mb * MIB:
            break
        if _remove_entry(root, entry):
            removed.append(entry.path)
            total -= sizes[entry.path]
    return removed


def workspace_ids(root: Path) -> list[str]:
    """The sessions that have a workspace under the root (the worker's own directories left out)."""
    root = Path(root)
    if not _is_dir(root):
        return []
    return sorted(p.name for p in root.iterdir() if _SESSION_ID.fullmatch(p.name) and _is_dir(p))


def remove_workspace(root: Path, session_id: str) -> bool:
    """Remove the session's workspace and its metadata, as the sweep does (moved out of sight, then emptied by
    descriptor, following no link); False when it had none."""
    root, path = Path(root), workspace_path(root, session_id)
    removed = False
    if _is_dir(path):
        (root / STAGING).mkdir(mode=0o700, exist_ok=True)
        removed = _discard(root, path)
    (root / META / f"{session_id}.json").unlink(missing_ok=True)
    return removed


def hand_over(path: Path) -> None:
    """Give `path` and everything under it to the sandbox's user when the worker is root (a no-op otherwise).

    Walked by file descriptor without following symlinks (os.fwalk), so a directory swapped for a link while
    it runs leads nowhere outside `path`.
    """
    if os.geteuid() != 0:
        return
    os.chown(path, SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)
    for _top, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            os.chown(name, SANDBOX_UID, SANDBOX_UID, dir_fd=dir_fd, follow_symlinks=False)


@contextlib.contextmanager
def private_repository(workspace: Path) -> Iterator[Path]:
    """A bare repository of the worker's own for a push of `workspace` (workers/push.py), removed afterwards.

    It lives in the workspaces root's .staging (mode 0700, never bound into a sandbox, a path the model cannot
    name), and borrows the objects of the workspace's mirror through `objects/info/alternates`, read only, so
    that only what the thread made has to be copied in. The mirror is never written.
    """
    workspace = Path(workspace)
    root, session_id = workspace.parent, workspace.name
    if workspace_path(root, session_id) != workspace or not _is_dir(root / STAGING):
        raise ValueError(f"not a prepared workspace: {workspace}")
    repo = (_read_meta(root, session_id) or {}).get("repo")
    box = Path(tempfile.mkdtemp(prefix=f"push-{session_id}-", dir=root / STAGING))
    try:
        repository = box / "push.git"
        run_git(None, "init", "-q", "--bare", "--template=", str(repository))
        mirror = root / MIRRORS / f"{_mirror_name(repo)}.git" if repo else None
        if mirror is not None and _is_dir(mirror):
            (repository / "objects" / "info" / "alternates").write_text(f"{mirror / 'objects'}\n")
        yield repository
    finally:
        _remove(box)


def public_url(url: str) -> str:
    """The repository's URL without its user part (a password, or a token given as the user name, as GitHub
    takes one): what a workspace's `origin`, the metadata, the mirror's name and the thread's texts show."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return masked(url)
    if "@" not in parts.netloc:
        return url
    return url.replace(parts.netloc, parts.netloc.rsplit("@", 1)[1], 1)


# --- building ---------------------------------------------------------------------------------------------------


def _build(
    root: Path, target: Path, repo: str | None, branch: str | None, credentials: Credentials | None
) -> tuple[Path, str | None, str | None, str | None]:
    """The workspace built at `target` in .staging, where only the worker reaches it (so its own git may run
    there); with the note of a stale mirror, and the commit and branch it was cloned at."""
    stale = start = cloned = None
    if repo:
        with _locked(root / MIRRORS / f"{_mirror_name(repo)}.lock") as held:
            assert held
            mirror, stale = _mirror(root, repo, credentials)
            clone(mirror, target, branch=branch, timeout=CLONE_TIMEOUT)
        # The mirror's path means nothing inside the sandbox; the repository's URL does.
        run_git(target / ".git", "remote", "set-url", "origin", public_url(repo))
        # The commit it starts from, kept out of the sandbox's reach: what the thread changed is measured from
        # it, the model's own commits included (they move HEAD, and the model can rewrite .git).
        start = run_git(target / ".git", "rev-parse", "HEAD").stdout.strip()
        cloned = run_git(target / ".git", "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    else:
        target.mkdir()
    hand_over(target)
    return target, stale, start, cloned


def _mirror(root: Path, repo: str, credentials: Credentials | None) -> tuple[Path, str | None]:
    """The repository's mirror, fetched now; a fetch that fails leaves an existing mirror as it was (with a note
    saying so). Called with the mirror's lock held."""
    mirror = root / MIRRORS / f"{_mirror_name(repo)}.git"
    if _is_dir(mirror):
        try:
            _update(mirror, repo, credentials)
        except GitError as e:
            fetched = _mtime(mirror / "FETCH_HEAD")
            when = time.strftime("at %Y-%m-%d %H:%M UTC", time.gmtime(fetched)) if fetched else "earlier"
            return mirror, NOT_UPDATED.format(repo=public_url(repo), words=_git_words(e), when=when)
        return mirror, None
    # Built out of sight and renamed into place: a mirror that exists is complete.
    box = Path(tempfile.mkdtemp(prefix="mirror-", dir=root / STAGING))
    try:
        run_git(None, "init", "--bare", "--template=", str(box / "m.git"))
        _update(box / "m.git", repo, credentials)
        os.rename(box / "m.git", mirror)
    finally:
        _remove(box)
    return mirror, None


def _update(mirror: Path, repo: str, credentials: Credentials | None) -> None:
    listed = run_git(None, "ls-remote", "--symref", "--", repo, "HEAD", credentials=credentials)
    # --update-head-ok: workers/git.py forces core.bare=false, under which git guards the "checked-out" HEAD.
    fetch = ("fetch", "--update-head-ok", "--prune", "--no-recurse-submodules", "--", repo, *MIRROR_REFSPECS)
    run_git(mirror, *fetch, credentials=credentials, timeout=MIRROR_TIMEOUT)
    head = _HEAD.search(listed.stdout)
    if head:  # a clone without a branch checks out what the mirror's HEAD names: the repository's default
        run_git(mirror, "symbolic-ref", "HEAD", head.group(1))


def _mirror_name(repo: str) -> str:
    url = public_url(repo)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")).strip("-")
    return f"{slug[:40] or 'repo'}-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _locked(lock_file: Path, *, blocking: bool = True, mark_used: bool = True) -> Iterator[bool]:
    """An exclusive lock on `lock_file` against other processes (flock) and this one's threads (flock on NFS is
    a POSIX lock, which a process's threads share). Yields False when `blocking` is off and it is taken."""
    with _thread_locks_guard:
        local = _thread_locks.setdefault(str(lock_file), threading.Lock())
    if not local.acquire(blocking=blocking):
        yield False
        return
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            if mark_used:
                os.utime(fd)
            yield True
        finally:
            os.close(fd)
    finally:
        local.release()


# --- sweeping ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    path: Path
    last_used: float
    stamp: Path  # the file whose mtime says when it was last used: the metadata, or the mirror's lock
    protected: bool
    session: str | None  # None for a mirror


def _entries(root: Path, protected: set[str], now: float) -> Iterator[_Entry]:
    for path in root.iterdir():
        if not _SESSION_ID.fullmatch(path.name) or not _is_dir(path):
            continue  # the worker's own directories, a volume's lost+found, anything that is no workspace
        stamp = root / META / f"{path.name}.json"
        if not stamp.exists():  # prepared by something else, or its metadata was lost: used from now on
            _write_meta(root, path.name, {})
            os.utime(stamp, (now, now))
        yield _Entry(path, _mtime(stamp), stamp, path.name in protected, path.name)
    for mirror in (root / MIRRORS).glob("*.git"):
        stamp = mirror.with_suffix(".lock")
        yield _Entry(mirror, _mtime(stamp) if stamp.exists() else _mtime(mirror), stamp, False, None)
    for stamp in (root / META).glob("*.json"):  # metadata whose workspace is gone, once it is old
        if not _is_dir(root / stamp.stem) and _mtime(stamp) < now - STAGING_MAX_AGE:
            stamp.unlink(missing_ok=True)


def _remove_entry(root: Path, entry: _Entry) -> bool:
    """Move the entry out of sight, then delete it; False when it is in use (or was used since it was listed)."""
    if entry.protected:
        return False
    if entry.session is None:
        with _locked(entry.stamp, blocking=False, mark_used=False) as held:
            return held and _discard(root, entry.path)
    if _mtime(entry.stamp) > entry.last_used:
        return False
    done = _discard(root, entry.path)
    if done:
        entry.stamp.unlink(missing_ok=True)
    return done


def _discard(root: Path, path: Path) -> bool:
    box = Path(tempfile.mkdtemp(prefix="removed-", dir=root / STAGING))
    try:
        os.rename(path, box / path.name)
    except FileNotFoundError:
        return False
    finally:
        _remove(box)
    return True


def _clear_staging(root: Path, now: float) -> None:
    for path in (root / STAGING).iterdir():
        with contextlib.suppress(OSError):
            if path.lstat().st_mtime < now - STAGING_MAX_AGE:
                _remove(path)


# --- small parts ------------------------------------------------------------------------------------------------


def _layout(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # The sandbox's user must traverse the root to reach its workspace (not list it: 0o711 would do).
        mode = stat.S_IMODE(root.stat().st_mode)
        if not mode & 0o001:
            os.chmod(root, mode | 0o001)
        _reachable(root)
    for name in (META, MIRRORS, STAGING):
        (root / name).mkdir(mode=0o700, exist_ok=True)


UNREACHABLE = (
    "the workspaces' directory {root} cannot be reached by the unprivileged user that runs the commands (uid "
    "{uid}): {blocker} lets only its owner through (mode {mode:o}); give it the others' search bit (chmod o+x) "
    "or set MM_WORKSPACES to a directory under one that has it"
)


def _reachable(root: Path) -> None:
    """Every directory above the root must let the sandbox's user through, or each of its commands fails with
    a bare "Permission denied" on its own files: said once, in words, instead."""
    for parent in Path(root).absolute().parents:
        mode = stat.S_IMODE(parent.stat().st_mode)
        if not mode & 0o001:
            raise WorkspaceError(UNREACHABLE.format(root=root, uid=SANDBOX_UID, blocker=parent, mode=mode))


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _read_meta(root: Path, session_id: str) -> dict[str, str | None] | None:
    try:
        data = json.loads((root / META / f"{session_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data else None


def _write_meta(root: Path, session_id: str, source: dict[str, str | None]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f"{session_id}-", dir=root / META)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(source, f)
        os.replace(tmp, root / META / f"{session_id}.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _source(meta: dict[str, str | None]) -> tuple[str | None, str | None]:
    return meta.get("repo"), meta.get("branch")


def _describe(meta: dict[str, str | None] | None) -> str:
    repo, branch = _source(meta or {})
    if not repo:
        return "no repository (an empty directory)"
    return f"{repo} (branch {branch})" if branch else repo


def _remove(path: Path) -> None:
    """Delete a tree, even when a command left directories without write or search permission in it.

    By directory descriptor, never following a link: a command may still run in a workspace being removed
    (a background job) and swap a directory for a link; what such a link names is never entered, chmodded or
    deleted, only the link itself. Best effort: what cannot be removed stays (the next sweep tries again).
    """
    with contextlib.suppress(OSError):
        if not _is_dir(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _remove_in(parent, path.name)
        finally:
            os.close(parent)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_in(parent: int, name: str) -> None:
    """Remove the directory `name` of the directory open at `parent` and everything under it, depth first,
    holding one descriptor per level."""
    top = _open_removable(parent, name)
    if top is None:
        with contextlib.suppress(OSError):
            _retry(parent, os.unlink, name)
        return
    stack = [(parent, name, top, _unlink_files(top))]
    while stack:
        above, below, fd, subdirectories = stack[-1]
        if subdirectories:
            child_name = subdirectories.pop()
            child = _open_removable(fd, child_name)
            if child is None:  # no longer a directory (a link now): the entry itself goes
                with contextlib.suppress(OSError):
                    _retry(fd, os.unlink, child_name)
            else:
                stack.append((fd, child_name, child, _unlink_files(child)))
            continue
        stack.pop()
        os.close(fd)
        with contextlib.suppress(OSError):
            _retry(above, os.rmdir, below)


def _unlink_files(fd: int) -> list[str]:
    """Unlink every entry but the directories of the directory open at `fd`; the names of those."""
    subdirectories = []
    try:
        with os.scandir(fd) as listing:
            entries = list(listing)
    except OSError:
        return []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            subdirectories.append(entry.name)
        else:
            with contextlib.suppress(OSError):
                _retry(fd, os.unlink, entry.name)
    return subdirectories


def _open_removable(parent: int, name: str) -> int | None:
    """The directory `name` opened (never through a link), given u+rwx first when its owner's bits keep the
    worker out (a root worker is never kept out); None when it is no directory or cannot be opened."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except PermissionError:
        pass
    except OSError:
        return None
    try:  # O_PATH needs no permission on the directory itself; its chmod goes through /proc, never a link
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
            return os.open(f"/proc/self/fd/{path_fd}", _DIRECTORY & ~os.O_NOFOLLOW)
        finally:
            os.close(path_fd)
    except OSError:
        return None


def _retry(directory: int, remove: Callable[..., None], name: str) -> None:
    """`remove` (unlink or rmdir) the entry `name` of the directory open at `directory`; once more after giving
    that directory u+rwx when the first try was refused."""
    try:
        remove(name, dir_fd=directory)
    except PermissionError:
        os.fchmod(directory, stat.S_IMODE(os.fstat(directory).st_mode) | 0o700)
        remove(name, dir_fd=directory)


def _git_words(error: GitError) -> str:
    """What git said (masked by workers/git.py), without its progress lines, on one line."""
    text = error.result.stderr if error.result is not None and error.result.stderr.strip() else error.text
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("Cloning into", "hint:"))]
    words = " ".join(lines) or "no message"
    return words if len(words) <= 600 else words[:597] + "..."


def _failure(repo: str | None, branch: str | None, words: str) -> WorkspaceError:
    if any(marker in words for marker in _DISK_FULL):
        return WorkspaceError(DISK_FULL.format(words=words))
    shown = _describe({"repo": public_url(repo) if repo else None, "branch": branch})
    return WorkspaceError(PREPARE_FAILED.format(repo=shown, words=words))


__all__ = [
    "Workspace",
    "WorkspaceError",
    "cloned_branch",
    "hand_over",
    "prepare",
    "private_repository",
    "public_url",
    "start_commit",
    "sweep",
    "touch",
    "workspace_path",
]
