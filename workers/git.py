"""Every git command the worker runs goes through here, in one of two ways.

**On a thread's workspace** (`in_workspace`), git has exactly the model's power. A workspace is model-writable:
its commands can edit anything under it, `.git` included, and leave a symlink wherever git will later open,
create or append to a file (`logs/HEAD`, `logs/refs`, `refs/heads/<x>`, `objects/<xx>`, `objects/info`,
`packed-refs`, `worktrees`, `index`, `COMMIT_EDITMSG`, `FETCH_HEAD`, and whatever a later git adds). So the worker
never runs git there with its own rights: git runs as the model's commands do (mm_core/tools/sandbox.git_launch),
under bubblewrap when the session's sandbox is on (the system read-only, only that workspace read-write at its own
path, a private /tmp, no network, no credentials), else as the workspace's owner, never root. Every link in
`.git` then resolves inside the model's own view: git writes through it only where the model's own commands
could write anyway, and reads only what they could read. That covers git's files today and any it adds
later, with no list of them to keep up to date. Credentials and the network never reach a workspace's git: a
push copies the commit's objects out (`copy_objects`) into a repository of the worker's own and pushes from there.

What remains, as defence in depth and because the worker trusts git's output (it counts, shows and pushes what
git says), are three layers on every command in a workspace:

1. **The repository's config is cut down to an allow-list** (`sanitize`): git always reads `.git/config`, and
   `-c` only wins for the keys it names, not for pattern keys (`url.<x>.insteadOf`, `filter.<driver>.clean`,
   `diff.<driver>.textconv`, `credential.<url>.helper`, `remote.<n>.uploadpack`) nor for `include.path` /
   `includeIf`. Only the keys in ALLOWED survive (layout, line ends, remotes' URLs and refspecs, branches'
   upstreams, the author); the file is rewritten, atomically, only when something had to go. Files that
   redirect git elsewhere (`commondir`, `config.worktree`, `objects/info/alternates`) are removed; a `.git`,
   `objects` or `refs` that is a symlink or a `gitdir:` file is refused. `sanitize` itself runs as the worker,
   so it never follows a link: every open, unlink and rename goes through directory descriptors opened with
   O_NOFOLLOW, and a directory on its way that is a link is removed, never entered.
2. **The command line overrides what remains dangerous** (OVERRIDES): hooks, fsmonitor, pager, editor,
   askpass, ssh command, credential helpers (an empty `credential.helper` empties the list), signing; `diff`,
   `log` and `show` get `--no-ext-diff --no-textconv`; the transports are limited by GIT_ALLOW_PROTOCOL.
3. **A scrubbed environment**: no system or global config (`GIT_CONFIG_NOSYSTEM=1`,
   `GIT_CONFIG_GLOBAL=/dev/null`, HOME a directory that does not exist), no prompt (`GIT_TERMINAL_PROMPT=0`),
   explicit `GIT_DIR` / `GIT_WORK_TREE` (so `core.worktree` and a `.git` file lead nowhere), no replace refs, no
   optional locks, a timeout that kills the whole process group.

**On the worker's own repositories** (`run_git`): the mirrors, a clone being built in `.staging`, the private
repository a push goes through. No sandbox reaches them and nothing the model wrote is in them but objects,
which reach a private repository only through `git index-pack --strict` (a malformed object or a broken link is
refused). Only here are there credentials: per command in the environment, read by an askpass helper that lives
outside every workspace (`GIT_ASKPASS`), and every text that leaves this module has them masked
(chatops.secrets). The worker fetches from and pushes to URLs it passes itself, never to a remote named in a
workspace's config.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

from chatops.secrets import MASK, mask_url, scrub
from mm_core.config import AgentConfig
from mm_core.tools.base import ToolRefusal
from mm_core.tools.sandbox import Launch, git_launch
from workers.errors import WorkerError

DEFAULT_TIMEOUT = 120.0
# What the worker keeps of one git command's stdout, and of its stderr: far more than a status, a branch's
# changes or an error ever needs, far less than a worker's memory.
OUTPUT_MOST = 16 << 20
PIPE_CHUNK = 1 << 16
# The address space of the worker's index-pack of a pushed pack (_receiver): room for objects up to several
# hundred MB (git streams larger blobs), far from a worker's memory.
RECEIVER_MEMORY = 2 << 30
# The words of a failed command kept in its error (they reach the thread and the errors table).
WORDS_MOST = 4000
# The transports the worker's git may use: a local mirror and HTTPS. ext::, ssh (core.sshCommand) and the rest
# are refused by git itself.
PROTOCOLS = ("file", "https")

# Keys of the repository's config that survive (lower-cased section and key; `*` is a subsection).
ALLOWED = frozenset(
    {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "core.autocrlf",
        "core.eol",
        "core.safecrlf",
        "core.quotepath",
        "core.checkstat",
        "core.trustctime",
        "extensions.objectformat",
        "remote.*.url",
        "remote.*.fetch",
        "remote.*.push",
        "remote.*.tagopt",
        "remote.*.prune",
        "branch.*.remote",
        "branch.*.merge",
        "branch.*.rebase",
        "user.name",
        "user.email",
    }
)
# What a workspace may have put in `.git` to send git somewhere else; removed before a command.
REDIRECTS = ("commondir", "config.worktree", "objects/info/alternates", "objects/info/http-alternates")

OVERRIDES = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "core.editor=true",
    "core.askPass=",
    "core.sshCommand=false",
    "core.bare=false",
    "credential.helper=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "push.gpgSign=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "protocol.allow=never",
    *(f"protocol.{p}.allow=always" for p in PROTOCOLS),
    "gc.auto=0",
    "maintenance.auto=false",
    # The worker's ref updates make no new reflog, and one whose file is not there (a link that leads nowhere in
    # the model's view) is skipped instead of failing the push; an existing one is still appended to.
    "core.logAllRefUpdates=false",
)
NO_DIFF_PROGRAMS = ("--no-ext-diff", "--no-textconv")
DIFFING = frozenset({"diff", "log", "show"})

UNSAFE_LAYOUT = "[git: {path} is {what} — refused: the worker's git uses only a workspace's own .git directory]"
TIMED_OUT = "[git: {command} took more than {timeout:g}s — stopped]"
FAILED = "[git: {command} failed (exit {code}): {words}]"
CANNOT_RUN = "[git: cannot run {command}: {reason}]"
NOT_A_COMMIT = "[git: {command} gave no commit: {words}]"
CANNOT_CLEAN = "[git: cannot clean the workspace's .git: {reason}]"

ASKPASS = """#!/bin/sh
# The worker's askpass: answers git's prompts from the command's environment, so a secret is never on disk,
# and only a prompt for the host the credentials are for (git names it: "Password for 'https://u@host': ").
if [ -n "$MM_GIT_HOST" ]; then
  prompt=$(printf '%s' "$1" | tr 'A-Z' 'a-z')
  case "$prompt" in
    *"//$MM_GIT_HOST': "|*"@$MM_GIT_HOST': "|*"//$MM_GIT_HOST:"[0-9]*"': "|*"@$MM_GIT_HOST:"[0-9]*"': ") ;;
    *) exit 1 ;;
  esac
fi
case "$1" in
  Username*) printf '%s\\n' "$MM_GIT_USERNAME" ;;
  *) printf '%s\\n' "$MM_GIT_PASSWORD" ;;
esac
"""
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# A scheme within 32 characters, so that a long run of letters costs linear time (chatops.logs says why).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"]+")
# A remote's or a branch's name as git writes them for a clone: never a URL or a path.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Credentials:
    """A username and a token for HTTPS; given per command, never stored."""

    username: str
    password: str = field(repr=False)
    host: str | None = None  # the only host whose prompt is answered (None: any, for a URL the worker chose)

    def secrets(self) -> list[str]:
        return [self.password] if self.password else []


@dataclass(frozen=True)
class GitResult:
    args: tuple[str, ...]  # the git arguments as given (subcommand first), credentials masked
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class GitError(WorkerError):
    """A git command that failed, timed out, or was refused; `text` says so in git's own words, masked."""

    def __init__(self, text: str, result: GitResult | None = None):
        super().__init__(text)
        self.text = text
        self.result = result


def masked(text: str, secrets: Sequence[str] = ()) -> str:
    """`text` with the given secrets and every URL's password replaced by ***."""
    text = scrub(text, sorted({s for s in secrets if s}, key=len, reverse=True))
    return _URL.sub(lambda m: mask_url(m.group(0)), text)


# -------------------------------------------------------------------------------------------- the layout

# A directory opened by the worker in a workspace: never through a link.
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_directory(name: str | Path, dir_fd: int | None, shown: str) -> int:
    """`name` (relative to `dir_fd`) opened as a directory without following a link; GitError otherwise."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise GitError(UNSAFE_LAYOUT.format(path=shown, what="a symlink"))
        if not stat.S_ISDIR(mode):
            raise GitError(UNSAFE_LAYOUT.format(path=shown, what="not a directory"))
        # O_NOFOLLOW: a directory swapped for a link since the look above is refused, not followed.
        return os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except OSError as e:
        raise GitError(UNSAFE_LAYOUT.format(path=shown, what=f"missing ({e.strerror})")) from None


@contextlib.contextmanager
def _git_directory(workspace: Path) -> Iterator[int]:
    """The workspace's `.git`, open, checked to be a real directory with real `objects` and `refs`."""
    top = _open_directory(workspace, None, "the workspace")
    try:
        gd = _open_directory(".git", top, ".git")
    finally:
        os.close(top)
    try:
        for name in ("objects", "refs"):
            os.close(_open_directory(name, gd, f".git/{name}"))
        yield gd
    finally:
        os.close(gd)


def _allowed(key: str) -> bool:
    section, _, rest = key.partition(".")
    subsection, _, name = rest.rpartition(".")
    if subsection and not _PLAIN_NAME.fullmatch(subsection):
        # git takes a URL given to push or fetch for the name of a remote when one is so named: a section
        # `[remote "https://host/repo"]` would send the worker's push (and its token) to its own url.
        return False
    pattern = f"{section}.*.{name}" if subsection else key
    return pattern.lower() in ALLOWED


def _read_nofollow(dir_fd: int, name: str) -> bytes | None:
    """The bytes of `name` in the directory open at `dir_fd`, not following a link; None when it is no file, or
    one larger than CONFIG_MOST (its first part could parse, and what follows would be left in place unread)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(CONFIG_MOST + 1)
    return data if len(data) <= CONFIG_MOST else None


def _remove_redirect(gd: int, relative: str) -> str | None:
    """Unlink `.git/<relative>` through directory descriptors: a directory on the way that is not one (a link,
    a file) is itself removed, never entered. What was removed, or None."""
    *directories, name = relative.split("/")
    fd = os.dup(gd)
    try:
        for i, directory in enumerate(directories):
            try:
                inner = os.open(directory, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                os.unlink(directory, dir_fd=fd)
                return "/".join(directories[: i + 1])
            os.close(fd)
            fd = inner
        try:
            os.unlink(name, dir_fd=fd)
        except (FileNotFoundError, IsADirectoryError):
            return None  # a directory there redirects nothing: git reads only a file of that name
        return relative
    finally:
        os.close(fd)


def _config_entries(data: bytes) -> tuple[tuple[str, str], ...] | None:
    """(key, value) of a config file's text, includes not followed; None when git cannot parse it. A text seen
    lately is not parsed again: most commands find the config as the previous one left it."""
    return _parsed(data) if len(data) <= CACHED_CONFIG else _parse(data)


CACHED_CONFIG = 64 * 1024  # bytes: a repository's config is a few hundred; bigger ones are parsed every time
CONFIG_MOST = 1 << 20  # bytes: a larger config is taken as unreadable, and replaced


def _parse(data: bytes) -> tuple[tuple[str, str], ...] | None:
    with _private_home() as home:
        copy = home / "config.copy"
        copy.write_bytes(data)
        done = subprocess.run(
            ["git", "config", "--file", str(copy), "--no-includes", "--list", "-z"],
            cwd=home,
            env=_base_env(home),
            capture_output=True,
            timeout=30,
            check=False,
        )
    if done.returncode != 0:
        return None
    entries = []
    for item in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if item:
            key, _, value = item.partition("\n")
            entries.append((key, value))
    return tuple(entries)


_parsed = functools.lru_cache(maxsize=64)(_parse)


def sanitize(workspace: Path) -> list[str]:
    """Cut the workspace's repository config down to ALLOWED and remove what redirects git elsewhere.

    Returns the keys and files that were dropped (empty when the workspace was clean, and then nothing is
    written). Raises GitError when `.git`, its objects or refs are not plain directories. Never follows a link.
    """
    try:
        return _sanitize(workspace)
    except OSError as e:  # a .git the worker may not change (a command made it read-only on the chart's worker)
        reason = f"{e.strerror}: {e.filename}" if e.filename else (e.strerror or str(e))
        raise GitError(CANNOT_CLEAN.format(reason=reason)) from None


def _sanitize(workspace: Path) -> list[str]:
    with _git_directory(workspace) as gd:
        dropped = [name for name in (_remove_redirect(gd, r) for r in REDIRECTS) if name]
        data = _read_nofollow(gd, "config")
        entries = _config_entries(data) if data is not None else None
        if entries is None:
            kept: list[tuple[str, str]] = [("core.repositoryformatversion", "0"), ("core.bare", "false")]
            removed = ["config (unreadable)"]
        else:
            kept = [(k, v) for k, v in entries if _allowed(k)]
            removed = [k for k, v in entries if not _allowed(k)]
            # core.bare=true would make git ignore the work tree.
            if any(k.lower() == "core.bare" and v.strip().lower() not in ("false", "0", "no", "off") for k, v in kept):
                kept = [*((k, v) for k, v in kept if k.lower() != "core.bare"), ("core.bare", "false")]
                removed.append("core.bare")
        if not removed:
            return dropped
        with _private_home() as home:
            env = _base_env(home)
            fresh = home / "config.new"
            fresh.write_bytes(b"")
            for key, value in kept:
                subprocess.run(
                    ["git", "config", "--file", str(fresh), "--add", key, value],
                    cwd=home,
                    env=env,
                    capture_output=True,
                    timeout=30,
                    check=True,
                )
            _replace(gd, "config", fresh.read_bytes())
        return [*dropped, *removed]


def _replace(dir_fd: int, name: str, data: bytes) -> None:
    """Write `name` in the directory open at `dir_fd` anew, by a rename (a link there is replaced, not followed),
    owned as the directory is: a root worker's copy must stay the workspace owner's to read and write."""
    owner = os.fstat(dir_fd)
    temporary = f"{name}.mm-{os.urandom(8).hex()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            if os.geteuid() == 0:
                os.fchown(f.fileno(), owner.st_uid, owner.st_gid)
            f.write(data)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


# ------------------------------------------------------------------------------------------- running git


@contextlib.contextmanager
def _private_home():
    """An empty directory of the worker's own for HOME (and the askpass helper); removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="mm-git-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


# HOME of a workspace's git: no directory, so nothing of the worker's or the model's is read from it.
NO_HOME = Path("/nonexistent")


# What a worker's git inherits besides PATH: an operator's own certificate authority for an internal forge
# (git reads no system setting here: GIT_CONFIG_NOSYSTEM).
INHERITED = ("GIT_SSL_CAINFO",)


def _base_env(home: Path) -> dict[str, str]:
    """The whole environment of a worker's git: nothing inherited but PATH (and INHERITED, when set)."""
    return {
        **{name: os.environ[name] for name in INHERITED if os.environ.get(name)},
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "LC_ALL": "C",
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_EDITOR": "true",
        "GIT_ALLOW_PROTOCOL": ":".join(PROTOCOLS),
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": "/",
    }


def _command(args: Sequence[str]) -> str:
    return "git " + " ".join(args[:2])


def _argv(args: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """git's command line: the overrides (then `extra` settings), and no diff programs for a diffing command."""
    if args and args[0] in DIFFING:
        args = (args[0], *NO_DIFF_PROGRAMS, *args[1:])
    return ["git", "--no-pager", *(x for o in (*OVERRIDES, *extra) for x in ("-c", o)), *args]


def _start(
    launch: Launch,
    *,
    stdin: int | IO[bytes] | None = subprocess.PIPE,
    stdout: int | IO[bytes] | None = subprocess.PIPE,
    stderr: int | IO[bytes] | None = subprocess.PIPE,
) -> subprocess.Popen[bytes]:
    """git (or the launch's sandbox around it) started in a process group of its own: a timeout kills all of it."""
    return subprocess.Popen(
        launch.argv,
        cwd=launch.cwd,
        env=launch.env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        user=launch.user,
        group=launch.group,
        extra_groups=[] if launch.user is not None else None,
        preexec_fn=launch.preexec,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _communicate(
    proc: subprocess.Popen[bytes], shown: tuple[str, ...], stdin: str | None, timeout: float
) -> tuple[bytes, bytes]:
    """`stdin` written to proc, and its stdout and stderr: at most OUTPUT_MOST bytes of each kept, the rest read
    and dropped (a repository the model wrote can make git print without end: a diff of a huge file, a log of
    a million commits), all within `timeout`; then proc is reaped, killed if it has not ended."""
    deadline = time.monotonic() + timeout
    pending = memoryview(stdin.encode() if stdin is not None else b"")
    kept: dict[int, bytearray] = {}
    writing = proc.stdin
    with selectors.DefaultSelector() as selector:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                kept[pipe.fileno()] = bytearray()
                selector.register(pipe, selectors.EVENT_READ)
        if writing is not None:
            if pending:
                os.set_blocking(writing.fileno(), False)
                selector.register(writing, selectors.EVENT_WRITE)
            else:
                writing.close()
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                _timed_out(proc, shown, timeout)
            for key, _ in selector.select(left):
                pipe, fd = key.fileobj, key.fd
                if writing is not None and pipe is writing:
                    try:
                        pending = pending[os.write(fd, pending[:PIPE_CHUNK]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # git ended without reading it all: its exit and stderr say why
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(pipe)
                        writing.close()
                    continue
                chunk = os.read(fd, PIPE_CHUNK)
                if not chunk:
                    selector.unregister(pipe)
                    continue
                room = OUTPUT_MOST - len(kept[fd])
                if room > 0:
                    kept[fd] += chunk[:room]
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # its output closed, but it lives on (a child kept nothing open)
        _timed_out(proc, shown, timeout)
    said = [bytes(kept.get(pipe.fileno(), b"")) if pipe is not None else b"" for pipe in (proc.stdout, proc.stderr)]
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return said[0], said[1]


def _timed_out(proc: subprocess.Popen[bytes], shown: tuple[str, ...], timeout: float) -> NoReturn:
    """Kill proc's whole group, reap it, and say so."""
    _stop(proc)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    raise GitError(TIMED_OUT.format(command=_command(shown), timeout=timeout))


def _result(
    shown: tuple[str, ...], code: int, out: bytes, err: bytes, secrets: Sequence[str], check: bool
) -> GitResult:
    result = GitResult(
        shown,
        code,
        masked(out.decode("utf-8", "replace"), secrets),
        masked(err.decode("utf-8", "replace"), secrets),
    )
    if check and not result.ok:
        words = result.stderr.strip() or result.stdout.strip() or "no message"
        if len(words) > WORDS_MOST:
            words = f"{words[: WORDS_MOST // 2]}\n[…]\n{words[-WORDS_MOST // 2 :]}"
        raise GitError(FAILED.format(command=_command(shown), code=result.returncode, words=words), result)
    return result


def run_git(
    repository: Path | None,
    *args: str,
    credentials: Credentials | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> GitResult:
    """Run `git <args>` as the worker, on `repository` (a git directory: a mirror, a clone being built in
    .staging, a private push repository; None: no repository, for clone, init and ls-remote). Never a thread's
    workspace: that is `in_workspace`, with the model's power.

    Returns the result; with `check`, a non-zero exit raises GitError carrying git's own words, masked.
    """
    secrets = credentials.secrets() if credentials else []
    shown = tuple(masked(a, secrets) for a in args)
    with _private_home() as home:
        env = _base_env(home)
        if repository is not None:
            env["GIT_DIR"] = str(repository)
        if credentials is not None:
            helper = home / "askpass"
            helper.write_text(ASKPASS)
            helper.chmod(0o700)
            env |= {
                "GIT_ASKPASS": str(helper),
                "MM_GIT_USERNAME": credentials.username,
                "MM_GIT_PASSWORD": credentials.password,
                "MM_GIT_HOST": credentials.host or "",
            }
        # With a token, a redirect is not followed: it could lead the token's next prompt to another host.
        argv = _argv(args, ("http.followRedirects=false",) if credentials is not None else ())
        try:
            proc = _start(Launch(argv=argv, env=env, cwd=str(cwd or home), pass_fds=()))
        except OSError as e:
            raise GitError(CANNOT_RUN.format(command=_command(shown), reason=e.strerror or e)) from None
        out, err = _communicate(proc, shown, stdin, timeout)
    return _result(shown, proc.returncode, out, err, secrets, check)


def _workspace_launch(workspace: Path, agent: AgentConfig, argv: list[str], shown: Sequence[str]) -> Launch:
    """The launch of `argv` (git, or a script of git commands) in `workspace` with the model's power, after
    `sanitize`; GitError when the session's sandbox cannot be had (`sandbox: bwrap` without bubblewrap, a
    root-owned workspace without it)."""
    sanitize(workspace)
    env = _base_env(NO_HOME) | {"GIT_DIR": str(Path(workspace) / ".git"), "GIT_WORK_TREE": str(workspace)}
    try:
        return git_launch(agent, Path(workspace), argv, env)
    except ToolRefusal as e:
        reason = e.text.removeprefix("[error: ").removesuffix("]")
        raise GitError(CANNOT_RUN.format(command=_command(shown), reason=reason)) from None


def _run_in(
    workspace: Path, agent: AgentConfig, argv: list[str], shown: tuple[str, ...], stdin: str | None, timeout: float
) -> tuple[int, bytes, bytes]:
    launch = _workspace_launch(workspace, agent, argv, shown)
    try:
        proc = _start(launch)
    except OSError as e:
        raise GitError(CANNOT_RUN.format(command=_command(shown), reason=e.strerror or e)) from None
    out, err = _communicate(proc, shown, stdin, timeout)
    return proc.returncode, out, err


def in_workspace(
    workspace: Path,
    agent: AgentConfig,
    *args: str,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    stdin: str | None = None,
) -> GitResult:
    """Run `git <args>` on a thread's workspace with the model's power (see the module's text): in the sandbox
    of `agent` (the session's agent config: its `sandbox` and `bash.limits`) or as the workspace's owner, never
    with credentials or a network.

    Returns the result; with `check`, a non-zero exit raises GitError carrying git's own words, masked.
    """
    code, out, err = _run_in(workspace, agent, _argv(args), tuple(args), stdin, timeout)
    return _result(tuple(args), code, out, err, (), check)


# A push's steps in the workspace, in one start of its sandbox (a start costs more than a small git command):
# `$1` the branch, `$2` the message, `$3` and `$4` the author's name and email, then git's own options. A step
# that fails ends it with `failed <exit> <step>` on stdout, git's words on stderr; else HEAD's commit is printed.
COMMIT_ALL = r"""
branch=$1 message=$2 name=$3 email=$4; shift 4; options=("$@")
step() {
  local shown=$1; shift
  git "${options[@]}" "$@" && return
  printf 'failed %d %s\n' $? "$shown"; exit 0
}
step "checkout -q" checkout -q -B "$branch"
step "add --all" add --all
if ! git "${options[@]}" diff --no-ext-diff --no-textconv --cached --quiet; then
  step "commit -q" -c "user.name=$name" -c "user.email=$email" commit -q --no-verify -m "$message"
fi
step "rev-parse --verify" rev-parse --verify 'HEAD^{commit}'
"""


def commit_all(
    workspace: Path,
    agent: AgentConfig,
    branch: str,
    message: str,
    author: tuple[str, str],
    timeout: float = DEFAULT_TIMEOUT,
) -> str:
    """Put the workspace on `branch` (made or moved to HEAD), and commit everything it holds there, when
    anything is left to commit, as `author` (on the command line: never written into the workspace's config);
    with the model's power, as `in_workspace`. Returns the commit; GitError with the failed step's words."""
    argv = ["bash", "-c", COMMIT_ALL, "mm-commit", branch, message, *author, *_argv(())[1:]]
    code, out, err = _run_in(workspace, agent, argv, ("checkout", "-q"), None, timeout)
    said = out.decode("utf-8", "replace").strip()
    if said.startswith("failed "):
        _, step_code, step = said.split(" ", 2)
        _result(tuple(step.split()), int(step_code), b"", err, (), check=True)
    if code != 0 or not _COMMIT.fullmatch(said):
        _result(("commit", "-q"), code or 1, b"", err or out, (), check=True)
    return said


def copy_objects(
    workspace: Path,
    agent: AgentConfig,
    repository: Path,
    commit: str,
    since: str | None,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Copy `commit` and everything it needs from the workspace into `repository` (the worker's own): `git
    pack-objects` runs in the workspace with the model's power, and its pack goes over a pipe into `git
    index-pack --strict` run by the worker in `repository`, which refuses a malformed object or a link to one it
    has not got. What `since` already has is left out while `repository` has it (through its alternates: the
    mirror); otherwise everything is copied."""
    if not _COMMIT.fullmatch(commit):
        raise GitError(NOT_A_COMMIT.format(command="git rev-parse", words=masked(commit[:200])))
    attempts = [[commit, f"^{since}"], [commit]] if since else [[commit]]
    failure = None
    for revisions in attempts:
        try:
            _copy(workspace, agent, repository, revisions, timeout)
            return
        except GitError as e:
            failure = e
    assert failure is not None
    raise failure


def index_pack(repository: Path, home: Path, receiving: Sequence[str]) -> Launch:
    """The worker's `git <receiving>` (index-pack of a pack the workspace sent) into `repository`, its HOME the
    private `home`, bounded in memory: a pack of a few hundred bytes can hold a delta that claims gigabytes (one
    byte of it copies 64 KiB), and index-pack builds each object whole in memory. One thread (each resolves its
    own objects), and RECEIVER_MEMORY of address space: such an object fails the push with git's "out of
    memory" instead of taking the worker's memory."""

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (RECEIVER_MEMORY, RECEIVER_MEMORY))

    env = _base_env(home) | {"GIT_DIR": str(repository)}
    return Launch(argv=_argv(receiving, ("pack.threads=1",)), env=env, cwd=str(home), pass_fds=(), preexec=bounded)


def _copy(workspace: Path, agent: AgentConfig, repository: Path, revisions: list[str], timeout: float) -> None:
    sending = ("pack-objects", "--revs", "--stdout", "-q")
    receiving = ("index-pack", "--stdin", "--strict")
    if (most := agent.bash.limits.workspaceMB) is not None:  # a pack of the workspace's objects is no larger
        receiving += (f"--max-input-size={most * 1024 * 1024}",)
    launch = _workspace_launch(workspace, agent, _argv(sending), sending)
    deadline = time.monotonic() + timeout
    with _private_home() as home, tempfile.TemporaryFile() as sent_err, tempfile.TemporaryFile() as got_err:
        try:
            sender = _start(launch, stderr=sent_err)
        except OSError as e:
            raise GitError(CANNOT_RUN.format(command=_command(sending), reason=e.strerror or e)) from None
        assert sender.stdin is not None and sender.stdout is not None
        try:
            receiver = _start(
                index_pack(repository, home, receiving), stdin=sender.stdout, stdout=subprocess.DEVNULL, stderr=got_err
            )
        except OSError as e:
            _stop(sender)
            sender.wait()
            raise GitError(CANNOT_RUN.format(command=_command(receiving), reason=e.strerror or e)) from None
        sender.stdout.close()  # the receiver's now: it sees the end when the sender ends
        with contextlib.suppress(BrokenPipeError):  # a sender that died early says why on its stderr
            sender.stdin.write("".join(f"{r}\n" for r in revisions).encode())
        with contextlib.suppress(BrokenPipeError):
            sender.stdin.close()
        for proc, shown in ((sender, sending), (receiver, receiving)):
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for each in (sender, receiver):
                    _stop(each)
                    each.wait()
                raise GitError(TIMED_OUT.format(command=_command(shown), timeout=timeout)) from None
        for proc, shown, err in ((sender, sending, sent_err), (receiver, receiving, got_err)):
            if proc.returncode != 0:
                err.seek(0)
                _result(shown, proc.returncode, b"", err.read(1 << 16), (), check=True)


# ------------------------------------------------------------------------------------------------ helpers


def clone(
    source: str | Path,
    workspace: Path,
    *,
    branch: str | None = None,
    credentials: Credentials | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> GitResult:
    """Clone `source` (a mirror cache's path, or a URL) into `workspace`, which must not exist yet.

    No hardlinks into the mirror (the model could write through them into a cache other workspaces share), no
    alternates, no template hooks; the clone's config holds nothing but what git writes for a clone.
    """
    args = ["clone", "--no-hardlinks", "--template=", "--no-recurse-submodules"]
    if branch:
        args += ["--branch", branch]
    workspace = Path(workspace)
    return run_git(
        None, *args, "--", str(source), str(workspace), credentials=credentials, timeout=timeout, cwd=workspace.parent
    )


def status(workspace: Path, agent: AgentConfig, timeout: float = DEFAULT_TIMEOUT) -> GitResult:
    """`git status --porcelain=v1 -z --untracked-files=all`, without touching the index."""
    return in_workspace(workspace, agent, "status", "--porcelain=v1", "-z", "--untracked-files=all", timeout=timeout)


def diff(workspace: Path, agent: AgentConfig, *revisions: str, timeout: float = DEFAULT_TIMEOUT) -> GitResult:
    """`git diff` of the work tree (against `revisions` when given), with no external diff or textconv."""
    return in_workspace(workspace, agent, "diff", *revisions, timeout=timeout)


def log(workspace: Path, agent: AgentConfig, *args: str, timeout: float = DEFAULT_TIMEOUT) -> GitResult:
    return in_workspace(workspace, agent, "log", *args, timeout=timeout)


def push(
    repository: Path,
    url: str | Path,
    *refspecs: str,
    credentials: Credentials | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    lease: tuple[str, str] | None = None,
) -> GitResult:
    """Push `refspecs` from `repository` (the worker's own) to `url` as the worker names it; no hooks run,
    credentials only in the environment. `lease` (ref, commit; "" for none): the push may replace that ref only
    while the remote still has it at that commit (git's --force-with-lease), so nobody's later push is lost."""
    options = [f"--force-with-lease={lease[0]}:{lease[1]}"] if lease is not None else []
    return run_git(
        repository,
        "push",
        "--no-verify",
        *options,
        "--",
        str(url),
        *refspecs,
        credentials=credentials,
        timeout=timeout,
    )


def remote_head(url: str | Path, branch: str, credentials: Credentials | None = None) -> str:
    """The commit `branch` of `url` is at ("" when it has no such branch), as `ls-remote` tells."""
    listed = run_git(None, "ls-remote", "--", str(url), f"refs/heads/{branch}", credentials=credentials)
    for line in listed.stdout.splitlines():
        commit, _, ref = line.partition("\t")
        if ref == f"refs/heads/{branch}" and _COMMIT.fullmatch(commit):
            return commit
    return ""


__all__ = [
    "ALLOWED",
    "MASK",
    "Credentials",
    "GitError",
    "GitResult",
    "clone",
    "commit_all",
    "copy_objects",
    "diff",
    "in_workspace",
    "log",
    "masked",
    "push",
    "remote_head",
    "run_git",
    "sanitize",
    "status",
]
