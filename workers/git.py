"""Every git command the worker runs on a workspace goes through here.

A workspace is model-writable: the model's sandboxed commands can edit `.git/config`, `.git/hooks`, the
`.gitattributes` of the tree and anything else under it. The worker's own git runs *outside* the sandbox, with
the worker's rights and, for a push, the team's credentials; so nothing the workspace says may make it run a
program, read another file, send the credentials elsewhere or rewrite a URL. Three layers:

1. **The repository's config is cut down to an allow-list before every command** (`sanitize`): git always
   reads `.git/config`, and `-c` only wins for the keys it names, not for pattern keys (`url.<x>.insteadOf`,
   `filter.<driver>.clean`, `diff.<driver>.textconv`, `credential.<url>.helper`, `remote.<n>.uploadpack`) nor
   for `include.path` / `includeIf`. Only the keys in ALLOWED survive (layout, line ends, remotes' URLs and
   refspecs, branches' upstreams, the author); the file is rewritten, atomically, only when something had to
   go. Files that redirect git elsewhere (`commondir`, `config.worktree`, `objects/info/alternates`) are
   removed; a `.git`, `objects` or `refs` that is a symlink or a `gitdir:` file is refused.
2. **The command line overrides what remains dangerous** (OVERRIDES): hooks, fsmonitor, pager, editor,
   askpass, ssh command, credential helpers (an empty `credential.helper` empties the list), signing; `diff`,
   `log` and `show` get `--no-ext-diff --no-textconv`; the transports are limited by GIT_ALLOW_PROTOCOL.
3. **A scrubbed environment**: no system or global config (`GIT_CONFIG_NOSYSTEM=1`,
   `GIT_CONFIG_GLOBAL=/dev/null`, HOME an empty directory), no prompt (`GIT_TERMINAL_PROMPT=0`), explicit
   `GIT_DIR` / `GIT_WORK_TREE` (so `core.worktree` and a `.git` file lead nowhere), no replace refs, no optional
   locks, a timeout that kills the whole process group.

Credentials are never written anywhere near the workspace: they travel per command in the environment, read
by an askpass helper that lives outside the workspace (`GIT_ASKPASS`), and every text that leaves this module
has them masked (chatops.secrets). The worker fetches from and pushes to URLs it passes itself, never to a
remote named in the workspace's config.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chatops.secrets import MASK, mask_url, scrub

DEFAULT_TIMEOUT = 120.0
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
)
NO_DIFF_PROGRAMS = ("--no-ext-diff", "--no-textconv")
DIFFING = frozenset({"diff", "log", "show"})

UNSAFE_LAYOUT = "[git: {path} is {what} — refused: the worker's git uses only a workspace's own .git directory]"
TIMED_OUT = "[git: {command} took more than {timeout:g}s — stopped]"
FAILED = "[git: {command} failed (exit {code}): {words}]"
CANNOT_RUN = "[git: cannot run {command}: {reason}]"

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
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
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


class GitError(Exception):
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


def git_dir(workspace: Path) -> Path:
    """The workspace's `.git`, checked to be a real directory with real `objects` and `refs` directories."""
    gd = Path(workspace) / ".git"
    for path, what in ((gd, ".git"), (gd / "objects", ".git/objects"), (gd / "refs", ".git/refs")):
        try:
            mode = os.lstat(path).st_mode
        except OSError as e:
            raise GitError(UNSAFE_LAYOUT.format(path=what, what=f"missing ({e.strerror})")) from None
        if stat.S_ISLNK(mode):
            raise GitError(UNSAFE_LAYOUT.format(path=what, what="a symlink"))
        if not stat.S_ISDIR(mode):
            raise GitError(UNSAFE_LAYOUT.format(path=what, what="not a directory"))
    return gd


def _allowed(key: str) -> bool:
    section, _, rest = key.partition(".")
    subsection, _, name = rest.rpartition(".")
    if subsection and not _PLAIN_NAME.fullmatch(subsection):
        # git takes a URL given to push or fetch for the name of a remote when one is so named: a section
        # `[remote "https://host/repo"]` would send the worker's push (and its token) to its own url.
        return False
    pattern = f"{section}.*.{name}" if subsection else key
    return pattern.lower() in ALLOWED


def _read_nofollow(directory: Path, name: str) -> bytes | None:
    """The bytes of directory/name, not following a symlink at the last step; None when it is no file."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(1 << 20)


def _config_entries(data: bytes, home: Path, env: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """(key, value) of a config file's text, includes not followed; None when git cannot parse it."""
    copy = home / "config.copy"
    copy.write_bytes(data)
    done = subprocess.run(
        ["git", "config", "--file", str(copy), "--no-includes", "--list", "-z"],
        cwd=home,
        env=dict(env),
        capture_output=True,
        timeout=30,
        check=False,
    )
    copy.unlink()
    if done.returncode != 0:
        return None
    entries = []
    for item in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if item:
            key, _, value = item.partition("\n")
            entries.append((key, value))
    return entries


def sanitize(workspace: Path) -> list[str]:
    """Cut the workspace's repository config down to ALLOWED and remove what redirects git elsewhere.

    Returns the keys and files that were dropped (empty when the workspace was clean, and then nothing is
    written). Raises GitError when `.git`, its objects or refs are not plain directories.
    """
    gd = git_dir(workspace)
    dropped: list[str] = []
    for name in REDIRECTS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(gd / name)
            dropped.append(name)
    with _private_home() as home:
        env = _base_env(home)
        data = _read_nofollow(gd, "config")
        entries = _config_entries(data, home, env) if data is not None else None
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
        dropped += removed
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
        # Replaced by a rename: a symlink at .git/config is replaced, not followed.
        fd, tmp = tempfile.mkstemp(prefix="config.mm-", dir=gd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(fresh.read_bytes())
            os.replace(tmp, gd / "config")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return dropped


# ------------------------------------------------------------------------------------------- running git


@contextlib.contextmanager
def _private_home():
    """An empty directory of the worker's own for HOME (and the askpass helper); removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="mm-git-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _base_env(home: Path) -> dict[str, str]:
    """The whole environment of a worker's git: nothing inherited but PATH."""
    return {
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


def run_git(
    workspace: Path | None,
    *args: str,
    credentials: Credentials | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> GitResult:
    """Run `git <args>` on `workspace` (None: no repository, for clone) the safe way; see the module's text.

    Returns the result; with `check`, a non-zero exit raises GitError carrying git's own words, masked.
    """
    secrets = credentials.secrets() if credentials else []
    shown = tuple(masked(a, secrets) for a in args)
    if workspace is not None:
        sanitize(workspace)
    if args and args[0] in DIFFING:
        args = (args[0], *NO_DIFF_PROGRAMS, *args[1:])
    with _private_home() as home:
        env = _base_env(home)
        if workspace is not None:
            env["GIT_DIR"] = str(Path(workspace) / ".git")
            env["GIT_WORK_TREE"] = str(workspace)
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
        overrides = (*OVERRIDES, *(("http.followRedirects=false",) if credentials is not None else ()))
        argv = ["git", "--no-pager", *(x for o in overrides for x in ("-c", o)), *args]
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd or workspace or home,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            raise GitError(CANNOT_RUN.format(command=_command(shown), reason=e.strerror or e)) from None
        try:
            out, err = proc.communicate(stdin.encode() if stdin is not None else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise GitError(TIMED_OUT.format(command=_command(shown), timeout=timeout)) from None
    result = GitResult(
        shown,
        proc.returncode,
        masked(out.decode("utf-8", "replace"), secrets),
        masked(err.decode("utf-8", "replace"), secrets),
    )
    if check and not result.ok:
        words = result.stderr.strip() or result.stdout.strip() or "no message"
        raise GitError(FAILED.format(command=_command(shown), code=result.returncode, words=words), result)
    return result


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


def status(workspace: Path, timeout: float = DEFAULT_TIMEOUT) -> GitResult:
    """`git status --porcelain=v1 -z --untracked-files=all`, without touching the index."""
    return run_git(workspace, "status", "--porcelain=v1", "-z", "--untracked-files=all", timeout=timeout)


def diff(workspace: Path, *revisions: str, timeout: float = DEFAULT_TIMEOUT) -> GitResult:
    """`git diff` of the work tree (against `revisions` when given), with no external diff or textconv."""
    return run_git(workspace, "diff", *revisions, timeout=timeout)


def log(workspace: Path, *args: str, timeout: float = DEFAULT_TIMEOUT) -> GitResult:
    return run_git(workspace, "log", *args, timeout=timeout)


def fetch(
    workspace: Path,
    url: str | Path,
    *refspecs: str,
    credentials: Credentials | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> GitResult:
    """Fetch from `url` as the worker names it, never a remote named in the workspace's config."""
    return run_git(
        workspace,
        "fetch",
        "--no-recurse-submodules",
        "--",
        str(url),
        *refspecs,
        credentials=credentials,
        timeout=timeout,
    )


def push(
    workspace: Path,
    url: str | Path,
    *refspecs: str,
    credentials: Credentials | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> GitResult:
    """Push `refspecs` to `url` as the worker names it; no hooks run, credentials only in the environment."""
    return run_git(
        workspace, "push", "--no-verify", "--", str(url), *refspecs, credentials=credentials, timeout=timeout
    )


__all__ = [
    "ALLOWED",
    "MASK",
    "Credentials",
    "GitError",
    "GitResult",
    "clone",
    "diff",
    "fetch",
    "git_dir",
    "log",
    "masked",
    "push",
    "run_git",
    "sanitize",
    "status",
]
