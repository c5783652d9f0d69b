"""The workspace's disk bound while commands run: an inotify watch of the whole tree that stops the session's
commands as soon as the workspace holds more than `bash.limits.workspaceMB`.

A walk after each command (sandbox.measure_workspace) comes too late: one command left 1,200 MiB in a 100 MB
workspace, and a background job (`nohup … &`) keeps writing after its command returned. Nothing privileged is
available to a worker (no quotas, no loop mounts, no fanotify), so the guard counts what inotify tells it:

- one walk at the start, through directory descriptors (openat with O_NOFOLLOW relative to the parent's,
  never a path: a directory swapped for a symlink is never followed), a watch on each directory added through
  its descriptor before its entries are read, so that nothing written after the walk saw it goes unnoticed;
- each directory's bytes kept from that walk; the first event in a directory reads it once more into a map of
  its files' sizes (so that a modified file's old size is known), and from then on an event costs one stat of
  the file it names; a new directory is watched and then read (what was made in it before the watch counts);
- a file counts at the larger of its blocks and its apparent size, so that a file grown with ftruncate and
  then written through mmap (which inotify does not report) counts at once; a hard link counts once per name;
- events are read in batches and each (directory, name) is looked at once a batch, whatever the number of
  events for it; a queue overflow reads the tree again, twice in a row within REWALK_GAP stops the commands;
- the maps are bounded (MAX_DIRS watched directories, MAX_NAMES files in the maps, MAX_DEPTH levels): a tree
  beyond them stops the commands and says so, rather than going unwatched.

When the total passes the limit the guard calls `on_over` from its thread (bash kills the session's process
groups), and again after every batch of events while it is over (a command started meanwhile is stopped
too), until `rearm`; `disarm` lets a cleanup command run over it. Every decision on what a file counts is
here; the walk after the command stays the measure the model is told (bash.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inotify_simple import INotify, flags

from mm_core.errors import CoreError

MAX_DIRS = 50_000
MAX_NAMES = 500_000
MAX_DEPTH = 256
# Two queue overflows closer than this: the tree changes faster than it can be followed.
REWALK_GAP = 2.0
# Directory descriptors kept open between batches (the directories being written now): an event in one of
# them then costs no walk from the root.
OPEN_DIRS = 64

_WATCH = (
    flags.CREATE | flags.MODIFY | flags.MOVED_FROM | flags.MOVED_TO | flags.DELETE | flags.ONLYDIR | flags.EXCL_UNLINK
)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class Unwatchable(CoreError):
    """The tree is beyond what the guard follows; `reason` completes "the workspace …"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class WorkerLimit(Unwatchable):
    """The worker's own inotify limits are reached (fs.inotify.max_user_instances or max_user_watches: a count
    per uid, shared by every session and every process of that uid on the machine). Not the workspace's doing:
    its commands are not refused nor stopped for it; they run bounded by the walk after each command, as
    without the guard (bash.py)."""


def counted(st: os.stat_result) -> int:
    """What one entry counts: its blocks, or its apparent size when a regular file's is larger."""
    blocks = st.st_blocks * 512
    return max(blocks, st.st_size) if stat.S_ISREG(st.st_mode) else blocks


@dataclass(eq=False)
class _Dir:
    wd: int
    parent: _Dir | None
    name: str
    ino: int
    own: int = 0  # the directory's own blocks
    files: int = 0  # its entries but directories
    names: dict[str, int] | None = None  # its entries but directories, by name; read at its first event
    subdirs: dict[str, _Dir] = field(default_factory=dict)

    def path(self) -> list[str]:
        """Its names from the root. Depth is checked here, where it costs: a tree moved under another is not
        walked again to find its deepest part; the first event from too deep down stops the commands."""
        parts, d = [], self
        while d.parent is not None:
            parts.append(d.name)
            if len(parts) > MAX_DEPTH:
                raise Unwatchable(f"is nested deeper than {MAX_DEPTH} directories")
            d = d.parent
        return parts[::-1]


class DiskGuard:
    """Watches `root` and calls `on_over()` (from its own thread) once it holds more than `limit` bytes."""

    def __init__(self, root: str, limit: int, on_over: Callable[[], None]):
        self.root, self.limit, self.on_over = root, limit, on_over
        self.total = 0
        # Whether passing the limit stops the commands: not while a cleanup command runs over it.
        self.armed = True
        # None, or why the commands were stopped: "over" (the limit) or an Unwatchable's reason.
        self.tripped: str | None = None
        # Why it stopped following without stopping anything: a WorkerLimit's reason.
        self.lapsed: str | None = None
        self.tripped_at = 0  # the total when it tripped
        self._inotify: INotify | None = None
        self._dirs: dict[int, _Dir] = {}
        self._names = 0
        self._open: OrderedDict[int, int] = OrderedDict()  # wd -> a descriptor of that directory
        self._root_fd = -1
        self._last_rewalk = -REWALK_GAP
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the API ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Walk the tree and watch it from a thread of its own. Blocking; raises Unwatchable."""
        try:
            self._walk_all()
        except OSError as e:
            raise Unwatchable(f"could not be followed ({e.strerror or e})") from None
        self._thread = threading.Thread(target=self._run, name=f"disk guard {self.root}", daemon=True)
        self._thread.start()

    def following(self) -> bool:
        """Whether it still follows the tree (not stopped by an Unwatchable, nor closed)."""
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self.tripped in (None, "over") and self.lapsed is None

    def rearm(self, limit: int) -> None:
        """Watch for the limit again (a command starts, the workspace being under it)."""
        with self._lock:
            self.limit, self.tripped, self.armed = limit, None, True

    def disarm(self) -> None:
        """Let a command run over the limit (a cleanup command: rm, du, ls), counting still."""
        with self._lock:
            self.armed = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            self._reset()
            for fd in (self._stop_r, self._stop_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._stop_r = self._stop_w = -1

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # -- the tree ---------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1
        self._dirs.clear()
        self.total = self._names = 0

    def _walk_all(self) -> None:
        self._reset()
        try:
            self._inotify = INotify()
        except OSError as e:
            raise _not_watched(e) from None
        try:
            self._root_fd = os.open(self.root, _OPEN_DIR)
            fd = os.dup(self._root_fd)
        except OSError as e:
            raise Unwatchable(f"could not be opened ({e.strerror})") from None
        self._walk(None, "", fd, 0)

    def _walk(self, parent: _Dir | None, name: str, fd: int, depth: int) -> None:
        """Watch and count the directory open at `fd` (closed here), `depth` levels under the root, and
        everything under it: depth first, one descriptor a level."""
        stack: list[tuple[_Dir, int, Any]] = []  # (directory, its descriptor, its os.scandir)
        try:
            top = self._watch(parent, name, fd)
            stack.append((top, fd, os.scandir(fd)))
            while stack:
                d, dfd, entries = stack[-1]
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except (FileNotFoundError, NotADirectoryError):
                        continue  # gone since the listing: its event follows
                    except OSError as e:
                        self._unreadable(e, d, "")
                        raise
                    if not stat.S_ISDIR(st.st_mode):
                        d.files += counted(st)
                        self.total += counted(st)
                        continue
                    if depth + len(stack) > MAX_DEPTH:
                        raise Unwatchable(f"is nested deeper than {MAX_DEPTH} directories")
                    try:
                        child_fd = os.open(entry.name, _OPEN_DIR, dir_fd=dfd)
                    except OSError as e:
                        self._unreadable(e, d, entry.name)
                        continue  # swapped for something else since the listing: its event follows
                    child = self._watch(d, entry.name, child_fd)
                    stack.append((child, child_fd, os.scandir(child_fd)))
                    break
                else:
                    stack.pop()
                    entries.close()
                    os.close(dfd)
        except BaseException:
            for _, dfd, entries in stack:
                entries.close()
                with contextlib.suppress(OSError):
                    os.close(dfd)
            raise

    def _watch(self, parent: _Dir | None, name: str, fd: int) -> _Dir:
        assert self._inotify is not None
        if len(self._dirs) >= MAX_DIRS:
            os.close(fd)
            raise Unwatchable(f"has more than {MAX_DIRS:,} directories")
        try:
            # Through the descriptor: the directory opened, whatever its path has become since.
            wd = self._inotify.add_watch(f"/proc/self/fd/{fd}", _WATCH)
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise _not_watched(e) from None
        old = self._dirs.get(wd)
        if old is not None:  # watched already (moved in from a part that was dropped): count it afresh
            self._drop(old)
        # The root's own blocks are not the workspace's files (the walk after a command leaves them out too).
        d = _Dir(wd, parent, name, st.st_ino, own=st.st_blocks * 512 if parent is not None else 0)
        self.total += d.own
        self._dirs[wd] = d
        if parent is not None:
            stale = parent.subdirs.get(name)
            if stale is not None and stale is not d:
                self._drop(stale)
            parent.subdirs[name] = d
        return d

    def _drop(self, d: _Dir) -> None:
        """Forget `d` and everything under it (deleted, or moved where it is not watched)."""
        todo = [d]
        while todo:
            x = todo.pop()
            todo.extend(x.subdirs.values())
            if self._dirs.get(x.wd) is not x:
                continue
            del self._dirs[x.wd]
            self.total -= x.own + x.files
            self._names -= len(x.names or ())
            fd = self._open.pop(x.wd, None)
            if fd is not None:
                os.close(fd)
            if self._inotify is not None:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(x.wd)
        if d.parent is not None and d.parent.subdirs.get(d.name) is d:
            del d.parent.subdirs[d.name]
        d.parent = None

    def _unreadable(self, e: OSError, d: _Dir, name: str) -> None:
        if e.errno in (errno.EACCES, errno.EPERM):
            where = "/".join([*d.path(), *([name] if name else [])]) or "."
            raise Unwatchable(f"holds a directory the worker cannot read ({where})")

    # -- events -----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        dirty: dict[_Dir, set[str]] = {}
        while True:
            inotify = self._inotify
            if inotify is None:
                return
            poller = select.poll()
            poller.register(inotify.fileno(), select.POLLIN)
            poller.register(self._stop_r, select.POLLIN)
            while self._inotify is inotify:  # until an overflow walks the tree afresh, with another instance
                if self._stop_r in {fd for fd, _ in poller.poll()}:
                    return
                with self._lock:
                    try:
                        try:
                            self._batch(inotify.read(timeout=0), dirty)
                        except OSError as e:  # nothing the guard expects: it cannot vouch for the count
                            raise Unwatchable(f"could not be followed ({e.strerror or e})") from None
                    except WorkerLimit as e:
                        # Nothing more is followed, and nothing is stopped: the next command tries again.
                        self.lapsed = e.reason
                        self._reset()
                        return
                    except Unwatchable as e:
                        # Nothing more is followed: the next command walks the tree again, and is refused
                        # while it is still beyond the bounds.
                        self._trip(e.reason)
                        self._reset()
                        return
                    if self.total > self.limit and self.armed:
                        # Again at every batch while over: a command started in between is stopped too.
                        self._trip("over")
            dirty.clear()

    def _trip(self, reason: str) -> None:
        if self.tripped is None or reason != "over":
            self.tripped, self.tripped_at = reason, self.total
        self.on_over()

    def _batch(self, events: list, dirty: dict[_Dir, set[str]]) -> None:
        moved: dict[int, _Dir] = {}  # cookie -> a directory moved out of its parent in this batch
        for ev in events:
            if ev.mask & flags.Q_OVERFLOW:
                now = time.monotonic()
                if now - self._last_rewalk < REWALK_GAP:
                    raise Unwatchable("changed faster than the disk guard could follow")
                self._last_rewalk = now
                dirty.clear()
                self._walk_all()  # with an instance of its own, which the thread reads from then on
                return
            d = self._dirs.get(ev.wd)
            if d is None:
                continue
            if ev.mask & flags.IGNORED:  # the directory is gone
                self._drop(d)
                dirty.pop(d, None)
                continue
            if not ev.name:
                continue
            if ev.mask & flags.ISDIR:
                child = d.subdirs.get(ev.name)
                if ev.mask & flags.MOVED_FROM and child is not None:
                    del d.subdirs[ev.name]
                    child.parent = None
                    moved[ev.cookie] = child
                    continue
                if ev.mask & flags.MOVED_TO and ev.cookie in moved:
                    child = moved.pop(ev.cookie)
                    stale = d.subdirs.get(ev.name)
                    if stale is not None:
                        self._drop(stale)
                    child.parent, child.name = d, ev.name
                    d.subdirs[ev.name] = child
                    continue
                if ev.mask & flags.DELETE:
                    continue  # its own IGNORED follows
            dirty.setdefault(d, set()).add(ev.name)
        for child in moved.values():  # moved out of the tree (a worker without the sandbox shares a disk)
            self._drop(child)
        pending = list(dirty.items())
        dirty.clear()
        for d, names in pending:
            if self._dirs.get(d.wd) is not d:
                continue
            fd = self._dir_fd(d)
            if fd is None:
                # Its path changed in a way this batch does not show yet: the next batch has the move.
                dirty.setdefault(d, set()).update(names)
                continue
            self._look(d, fd, names)

    def _look(self, d: _Dir, fd: int, names: set[str]) -> None:
        """Bring `d`'s count up to date for `names` (entries of it an event named)."""
        if d.names is None:
            self._read_names(d, fd)
        assert d.names is not None
        own = os.fstat(fd).st_blocks * 512 if d.parent is not None else 0
        self.total += own - d.own
        d.own = own
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            except OSError as e:  # its directory closed to the worker (chmod 000), with a file open in it
                self._unreadable(e, d, "")
                raise
            old = d.names.pop(name, None)
            if old is not None:
                self._names -= 1
                d.files -= old
                self.total -= old
            sub = d.subdirs.get(name)
            if st is not None and stat.S_ISDIR(st.st_mode):
                if sub is not None and sub.ino == st.st_ino and self._dirs.get(sub.wd) is sub:
                    continue
                if sub is not None:
                    self._drop(sub)
                self._adopt(d, fd, name)
                continue
            if sub is not None:
                self._drop(sub)
            if st is not None:
                size = counted(st)
                d.names[name] = size
                d.files += size
                self.total += size
                self._count_name()

    def _adopt(self, d: _Dir, fd: int, name: str) -> None:
        """A directory that appeared in `d` (made, or moved in from where it was not watched): watch and walk."""
        depth = len(d.path()) + 1
        if depth > MAX_DEPTH:
            raise Unwatchable(f"is nested deeper than {MAX_DEPTH} directories")
        try:
            child_fd = os.open(name, _OPEN_DIR, dir_fd=fd)
        except OSError as e:
            self._unreadable(e, d, name)
            return  # gone, or swapped for something else, since the event: a later event says
        self._walk(d, name, child_fd, depth)

    def _read_names(self, d: _Dir, fd: int) -> None:
        names: dict[str, int] = {}
        try:
            listing = os.scandir(fd)
        except OSError as e:
            self._unreadable(e, d, "")
            raise
        with listing as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except OSError as e:
                    self._unreadable(e, d, "")
                    raise
                if not stat.S_ISDIR(st.st_mode):
                    names[entry.name] = counted(st)
        d.names = names
        self._names += len(names)
        files = sum(names.values())
        self.total += files - d.files
        d.files = files
        if self._names > MAX_NAMES:
            raise Unwatchable(f"holds more than {MAX_NAMES:,} files in the directories commands changed")

    def _count_name(self) -> None:
        self._names += 1
        if self._names > MAX_NAMES:
            raise Unwatchable(f"holds more than {MAX_NAMES:,} files in the directories commands changed")

    def _dir_fd(self, d: _Dir) -> int | None:
        """A descriptor of `d`, opened component by component from the root without following a symlink, and
        checked to be the directory watched; None when its path is not (yet) where the guard knows it."""
        fd = self._open.get(d.wd)
        if fd is not None:
            self._open.move_to_end(d.wd)
            return fd
        try:
            fd = os.dup(self._root_fd)
            for part in d.path():
                try:
                    fd_next = os.open(part, _OPEN_DIR, dir_fd=fd)
                finally:
                    os.close(fd)
                fd = fd_next
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise Unwatchable(f"holds a directory the worker cannot read ({'/'.join(d.path())})") from None
            return None
        if os.fstat(fd).st_ino != d.ino:
            os.close(fd)
            return None
        self._open[d.wd] = fd
        if len(self._open) > OPEN_DIRS:
            _, oldest = self._open.popitem(last=False)
            os.close(oldest)
        return fd


def _not_watched(e: OSError) -> Unwatchable:
    """What a failed inotify_init or add_watch means: the worker's limits (WorkerLimit), or this tree's."""
    if e.errno == errno.ENOSPC:
        return WorkerLimit(
            "could not be watched: the worker's inotify watches are used up (fs.inotify.max_user_watches)"
        )
    if e.errno == errno.EMFILE:
        return WorkerLimit(
            "could not be watched: the worker's inotify instances are used up (fs.inotify.max_user_instances)"
        )
    return Unwatchable(f"could not be watched: {e.strerror or e}")


class SessionGuard:
    """A session's guard (a session resource): started by the first command under `workspaceMB`, walked
    afresh once it has stopped following the tree, closed with the session's other resources."""

    def __init__(self) -> None:
        self.guard: DiskGuard | None = None

    async def ready(self, root: str, limit: int, on_over: Callable[[], None]) -> DiskGuard:
        """The running guard of `root`; raises Unwatchable when the tree is beyond its bounds."""
        guard = self.guard
        if guard is not None and guard.following():
            return guard
        if guard is not None:
            await asyncio.to_thread(guard.close)
        self.guard = None
        guard = DiskGuard(root, limit, on_over)
        try:
            await asyncio.to_thread(guard.start)
        except BaseException:
            await asyncio.to_thread(guard.close)
            raise
        self.guard = guard
        return guard

    async def aclose(self) -> None:
        guard, self.guard = self.guard, None
        if guard is not None:
            await guard.aclose()
