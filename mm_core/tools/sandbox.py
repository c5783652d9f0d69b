"""How a bash command is started: scrubbed environment, resource limits, and bubblewrap when available.

The worker holds secrets (Slack tokens, the database and broker URLs, the model's API key) and serves many
workspaces. A command therefore gets:

- in every mode, an environment built from an allow-list plus what the config adds (`bash.env` literal
  values, `bash.passEnv` names copied from the worker), the `bash.limits` applied with setrlimit, and
  no_new_privs (PR_SET_NO_NEW_PRIVS): a setuid or setcap file it runs gains nothing;
- never root: a root worker runs it as the workspace's owner, so that the kernel enforces RLIMIT_NPROC and
  file permissions (both are waived for root). A root-owned workspace runs under bubblewrap as SANDBOX_UID
  with no capability (its files are still root's on the worker, hence `measure_workspace` clearing setuid
  bits); without bubblewrap it is refused (ROOT_WORKSPACE), since the command would be root on the worker;
- with bubblewrap (`sandbox: auto` when `bwrap` is on the PATH, `bwrap` to require it): its own mount, pid,
  ipc, uts, user and network namespaces, where it sees the system read-only (/usr and the merged-usr links, a
  short list of /etc files that hold no secrets), a fresh /proc of its own processes, a minimal read-only /dev,
  a private /tmp, /var/tmp and /dev/shm (tmpfs, each at most `tmpMB` and `memoryMB`), and its workspace
  read-write at the same path (nosuid, as every bwrap mount); no other workspace, and it dies with its parent.

Inside the sandbox the command is never root. Its network is the egress policy's (`network: off | allow |
open`): the worker's egress proxy alone, the internet without the worker's networks, or none; see
mm_core/tools/sandbox_network.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pwd
import resource
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.network.proxy import egress_proxy
from mm_core.tools.base import ToolRefusal
from mm_core.tools.sandbox_network import SandboxNetwork, proxy_env

BWRAP_MISSING = (
    "[error: the configuration requires the bwrap sandbox (sandbox: bwrap) but bubblewrap is not "
    "installed on this worker — the command was not run]"
)
ROOT_WORKSPACE = (
    "[error: bash: this worker runs as root and the workspace {workspace} belongs to root, so without "
    "the bwrap sandbox the command would run as root — the command was not run: give the workspaces "
    "to an unprivileged user (chown -R mm: {workspace}), or install bubblewrap]"
)
ROOT_SERVER = (
    "this worker runs as root and the workspace {workspace} belongs to root, so without the bwrap "
    "sandbox the language server would run as root: give the workspaces to an unprivileged user "
    "(chown -R mm: {workspace}), or install bubblewrap"
)
ROOT_GIT = (
    "this worker runs as root and the workspace {workspace} belongs to root, so without the bwrap sandbox "
    "git would run as root: give the workspaces to an unprivileged user (chown -R mm: {workspace}), or install "
    "bubblewrap"
)

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Copied from the worker when set; everything else is left behind.
ALLOWED_ENV = ("LANG", "LANGUAGE", "TERM", "TZ")
ALLOWED_ENV_PREFIXES = ("LC_",)
# System files a command needs (name service, DNS, certificates, dynamic linker, shells' start-up files),
# never /etc as a whole: /etc/shadow, ssh host keys, /etc/ssl/private and service credentials live there.
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "services",
    "protocols",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "mime.types",
    "os-release",
    "debian_version",
    "lsb-release",
    "bash.bashrc",
    "profile",
    "inputrc",
    "gitconfig",
    "magic",
    "papersize",
    "python3",
    "perl",
)
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The uid a root worker's command has inside the sandbox, when its workspace belongs to root; .ci/run creates
# the user `mm` with it, the owner workspaces should have.
SANDBOX_UID = 10001
PR_SET_NO_NEW_PRIVS = 38
# Where a proxied sandbox finds the roots it trusts plus the egress proxy's CA (sandbox_network.proxy_env).
EGRESS_CA_BUNDLE = "/etc/ssl/mm-egress-ca.pem"

# A command's process inside the sandbox. The user's command runs with the status pipe closed, so that only
# this wrapper reports its exit status; then the wrapper keeps the pid namespace alive while background jobs
# remain (when the namespace's first process exits, the kernel kills every process in it), so that
# `nohup serve &` keeps running as the reference promises, until the session reaps it.
# The wrapper's own stderr goes to /dev/null so that its job reports ("Killed", "File size limit exceeded")
# never mix into the command's output; the command gets the real stderr.
STATUS_WRAPPER = (
    'exec {{err}}>&2 2>/dev/null; "$BASH" -c "$1" 2>&$err {{err}}>&- {fd}>&-; echo $? >&{fd}; '
    "exec {fd}>&- {{err}}>&-{keepalive}"
)
KEEPALIVE = "; while p=(/proc/[0-9]*); [ ${#p[@]} -gt 2 ]; do sleep 1; done"


@dataclass
class Launch:
    """Everything needed to start one command.

    `child_fds` are the ends the started process keeps: the starter closes its copies once it is started.
    With `network`, the command waits inside the sandbox until `network.attach` has connected it.
    """

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...]
    user: int | None = None
    group: int | None = None
    preexec: Callable[[], None] | None = None
    sandboxed: bool = False
    child_fds: tuple[int, ...] = ()
    network: SandboxNetwork | None = None

    def started(self) -> None:
        """The process is started (or could not be): the starter's copies of the child's ends go."""
        for fd in self.child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.child_fds = ()

    def abandon(self) -> None:
        """Nothing more will be done with this launch: every fd it still holds is closed."""
        self.started()
        if self.network is not None:
            self.network.close()


def bwrap_path(config: AgentConfig) -> str | None:
    """The bwrap binary to use, None for no sandbox. Raises ToolRefusal when `sandbox: bwrap` can't be met."""
    if config.sandbox == "none":
        return None
    found = shutil.which("bwrap")
    if found is None and config.sandbox == "bwrap":
        raise ToolRefusal(BWRAP_MISSING)
    return found


def scrubbed_env(config: AgentConfig, workspace: Path, user: str) -> dict[str, str]:
    env = {"PATH": SAFE_PATH, "HOME": str(workspace), "USER": user, "LOGNAME": user, "SHELL": "/bin/bash"}
    for name, value in os.environ.items():
        if name in ALLOWED_ENV or name.startswith(ALLOWED_ENV_PREFIXES):
            env[name] = value
    env.setdefault("LANG", "C.UTF-8")
    env.update(config.bash.env)
    for name in config.bash.passEnv:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _limits(config: AgentConfig, server: bool = False) -> Callable[[], None]:
    """The child's limits. A language server lives as long as its session, so CPU time would end it, and
    Node's V8 reserves far more address space than it uses: a server's memory is bounded by RLIMIT_DATA (the
    memory it writes) instead of RLIMIT_AS, and it has no CPU limit."""
    mib = 1024 * 1024
    lim = config.bash.limits
    memory = lim.memoryMB * mib if lim.memoryMB else None
    wanted = [
        (resource.RLIMIT_CPU, None if server else lim.cpuSeconds),
        (resource.RLIMIT_DATA if server else resource.RLIMIT_AS, memory),
        (resource.RLIMIT_NPROC, lim.processes),
        (resource.RLIMIT_FSIZE, lim.fileSizeMB * mib if lim.fileSizeMB else None),
    ]
    settings = [(which, value) for which, value in wanted if value is not None]
    # Looked up before the fork: the child only calls it.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def apply() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        for which, value in settings:
            _soft, hard = resource.getrlimit(which)
            # CPU: the soft limit sends SIGXCPU (a clear "CPU time limit exceeded"), SIGKILL a second later.
            wanted_hard = value + 1 if which == resource.RLIMIT_CPU else value
            if hard != resource.RLIM_INFINITY:
                wanted_hard = min(wanted_hard, hard)
            resource.setrlimit(which, (min(value, wanted_hard), wanted_hard))
        # Setuid and file capabilities have no effect for the command and everything it starts.
        if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")

    return apply


def _identity(workspace: Path) -> tuple[int | None, int | None, str]:
    """Who the command runs as: the workspace's owner when the worker is root and the owner is not."""
    uid = os.geteuid()
    if uid == 0:
        st = workspace.stat()
        if st.st_uid != 0:
            return st.st_uid, st.st_gid, _user_name(st.st_uid)
    return None, None, _user_name(uid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "mm"


def _tmp_bytes(config: AgentConfig) -> int | None:
    """The size of the sandbox's /tmp (and /var/tmp): the smaller of `tmpMB` and `memoryMB`."""
    lim = config.bash.limits
    sizes = [mb for mb in (lim.tmpMB, lim.memoryMB) if mb is not None]
    return min(sizes) * 1024 * 1024 if sizes else None


def _bwrap_args(
    bwrap: str,
    config: AgentConfig,
    workspace: str,
    inner_uid: int | None,
    network: SandboxNetwork | None,
    read_only: tuple[str, ...] = (),
) -> list[str]:
    args = [
        bwrap,
        "--die-with-parent",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",
        "--disable-userns",
        "--cap-drop",
        "ALL",
    ]
    if network is not None:
        args += ["--info-fd", str(network.info_w), "--block-fd", str(network.block_r)]
    if inner_uid is not None:
        args += ["--uid", str(inner_uid), "--gid", str(inner_uid)]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in MERGED_USR:
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    for name in ETC_FILES:
        path = Path("/etc") / name
        if network is not None and name == "resolv.conf":
            # The host's resolver may be on its loopback, which the sandbox cannot reach: slirp4netns's own
            # forwarder answers on 10.0.2.3.
            args += ["--ro-bind-data", str(network.resolv_r), str(path)]
        elif path.exists():
            args += ["--ro-bind", str(path), str(path)]
    tmp_size = _tmp_bytes(config)
    size = ["--size", str(tmp_size)] if tmp_size else []
    # bwrap's /dev is a tmpfs of its own, as large as the kernel's default (half the memory) and writable by the
    # command, and its /dev/shm a plain directory in it: /dev/shm gets a tmpfs sized like /tmp, and /dev itself is
    # made read-only (not recursively: its device nodes, /dev/pts and /dev/shm are mounts of their own).
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    args += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", "/var/tmp"]
    for path in read_only:
        args += ["--ro-bind", path, path]
    if network is not None and network.intercepts:
        # The roots the sandbox trusts plus the proxy's CA, which signs the hosts it adds credentials for.
        args += ["--ro-bind", str(egress_proxy().bundle_path()), EGRESS_CA_BUNDLE]
    args += ["--bind", workspace, workspace, "--remount-ro", "/", "--chdir", workspace, "--"]
    return args


def prepare(config: AgentConfig, workspace: Path, command: str, status_fd: int) -> Launch:
    """The launch of `command` in `workspace`; its exit status is written to `status_fd` as a decimal line.

    Raises ToolRefusal when the configuration requires a sandbox that is not installed, or when the command
    would run as root.
    """
    ws = os.path.realpath(workspace)
    bwrap, uid, gid, inner_uid, user = _confined(config, ws, ROOT_WORKSPACE)
    env = scrubbed_env(config, Path(ws), user)
    preexec = _limits(config)
    if not bwrap:
        shell = ["bash", "-c", STATUS_WRAPPER.format(fd=status_fd, keepalive=""), "mm-bash", command]
        return Launch(argv=shell, env=env, cwd=ws, pass_fds=(status_fd,), user=uid, group=gid, preexec=preexec)
    network = SandboxNetwork.open(config)
    try:
        env |= proxy_env(network, EGRESS_CA_BUNDLE)
        shell = ["bash", "-c", STATUS_WRAPPER.format(fd=status_fd, keepalive=KEEPALIVE), "mm-bash", command]
        argv = _bwrap_args(bwrap, config, ws, inner_uid, network) + shell
    except BaseException:  # the egress proxy's bundle could not be made: no end of the network is left open
        if network is not None:
            network.discard()
        raise
    child_fds = network.child_fds() if network else ()
    return Launch(
        argv=argv,
        env=env,
        cwd=ws,
        pass_fds=(status_fd, *child_fds),
        user=uid,
        group=gid,
        preexec=preexec,
        sandboxed=True,
        child_fds=child_fds,
        network=network,
    )


def server_launch(config: AgentConfig, workspace: Path, argv: list[str]) -> Launch:
    """The launch of a language server for `workspace`, in the same sandbox as a command: only its workspace
    (it loads code and configuration from there), the system read-only, a scrubbed environment, never root,
    no network; plus its own installation, read-only. Raises ToolRefusal as `prepare` does."""
    ws = os.path.realpath(workspace)
    bwrap, uid, gid, inner_uid, user = _confined(config, ws, ROOT_SERVER)
    env = scrubbed_env(config, Path(ws), user)
    env["PATH"] = f"{Path(argv[0]).parent}:{SAFE_PATH}"
    # Caches go to the sandbox's own /tmp, not into the repository.
    env["HOME"] = "/tmp" if bwrap else tempfile.gettempdir()
    preexec = _limits(config, server=True)
    if not bwrap:
        return Launch(argv=argv, env=env, cwd=ws, pass_fds=(), user=uid, group=gid, preexec=preexec)
    args = _bwrap_args(bwrap, config, ws, inner_uid, None, installation(argv[0]))
    return Launch(argv=args + argv, env=env, cwd=ws, pass_fds=(), user=uid, group=gid, preexec=preexec, sandboxed=True)


def git_launch(config: AgentConfig, workspace: Path, argv: list[str], env: dict[str, str]) -> Launch:
    """The launch of the worker's own git on `workspace` (workers/git.py), with the model's power and no more:
    in the sandbox a command gets when the session's has one (only that workspace read-write, the system
    read-only, a private /tmp, no network), else as the workspace's owner; never root. So a link the model left
    in `.git` leads git only where the model's own commands reach. `env` is git's whole environment. Its limits
    are a language server's: no CPU limit (the worker's timeout stops git), memory bounded by what it writes
    rather than what it maps (git maps its packs). Raises ToolRefusal as `prepare` does."""
    ws = os.path.realpath(workspace)
    bwrap, uid, gid, inner_uid, _user = _confined(config, ws, ROOT_GIT)
    preexec = _limits(config, server=True)
    if not bwrap:
        return Launch(argv=argv, env=env, cwd=ws, pass_fds=(), user=uid, group=gid, preexec=preexec)
    args = _bwrap_args(bwrap, config, ws, inner_uid, None)
    return Launch(argv=args + argv, env=env, cwd=ws, pass_fds=(), user=uid, group=gid, preexec=preexec, sandboxed=True)


def _confined(config: AgentConfig, ws: str, refused: str) -> tuple[str | None, int | None, int | None, int | None, str]:
    """Who a process in workspace `ws` runs as: (bwrap or None, the uid and gid to start it as, the uid inside
    the sandbox, the user's name). Raises ToolRefusal (`refused`, plain words) when it would run as root."""
    bwrap = bwrap_path(config)
    uid, gid, user = _identity(Path(ws))
    root_owned = uid is None and os.geteuid() == 0
    if root_owned and not bwrap:
        raise ToolRefusal(refused.format(workspace=ws))
    inner_uid = SANDBOX_UID if root_owned else None
    return bwrap, uid, gid, inner_uid, _user_name(inner_uid) if inner_uid is not None else user


def installation(executable: str) -> tuple[str, ...]:
    """The directories a program needs besides the system: the prefix it is installed in (`…/bin/prog` →
    `…`), its script interpreter's (`#!…/python`), through symlinks, and a virtualenv's base Python."""
    paths = [Path(executable), Path(os.path.realpath(executable))]
    with contextlib.suppress(OSError), open(executable, "rb") as f:
        first = f.readline(512)
        if first.startswith(b"#!") and first[2:].split():
            interpreter = first[2:].split()[0].decode(errors="replace")
            paths += [Path(interpreter), Path(os.path.realpath(interpreter))]
    prefixes = {p.parent.parent if p.parent.name == "bin" else p.parent for p in paths}
    for prefix in list(prefixes):
        with contextlib.suppress(OSError):
            for line in (prefix / "pyvenv.cfg").read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home":
                    home = Path(value.strip())
                    prefixes |= {home.parent, Path(os.path.realpath(home)).parent}
    system = (Path("/usr"), *(Path("/") / name for name in MERGED_USR))
    kept = sorted(
        str(p) for p in prefixes if p.is_dir() and p != Path("/") and not any(p.is_relative_to(s) for s in system)
    )
    # A prefix inside another is bound with it.
    return tuple(p for p in kept if not any(p != q and Path(p).is_relative_to(q) for q in kept))


# --- the workspace's size ---------------------------------------------------------------------------------------

# How long one measure of the workspace may take: the walk stops there (a workspace of millions of files must
# not stall every command), and what it counted is then a lower bound.
MEASURE_BUDGET = 2.0


@dataclass
class Usage:
    """What one walk of the workspace found."""

    bytes: int
    complete: bool
    setuid_cleared: int = 0


def measure_workspace(root: str, budget: float = MEASURE_BUDGET) -> Usage:
    """The disk space the files under `root` hold (allocated blocks: a sparse file counts what it uses, a
    hard-linked file once), for at most `budget` seconds.

    On the way it clears the setuid and setgid bits of every file: a command could have set them on a file it
    owns, and nothing the model writes may run as its owner on the worker (inside the sandbox, no_new_privs
    and the nosuid mount already void them).

    Walked by directory file descriptor, never by path: each directory is opened relative to its parent's with
    O_NOFOLLOW, so one a command swaps for a symlink between the listing and the descent (a background job can)
    is not entered, and the walk never counts or changes a file outside `root`. It holds one descriptor per
    level of the directory it is in.
    """
    deadline = time.monotonic() + budget
    walk = _Walk()
    try:
        top = os.open(root, _DIRECTORY)
    except OSError:
        return Usage(0, True, 0)
    stack = [(top, walk.list(top))]
    try:
        while stack:
            fd, subdirectories = stack[-1]
            if not subdirectories:
                os.close(stack.pop()[0])
                continue
            if time.monotonic() > deadline:
                return Usage(walk.bytes, False, walk.cleared)
            try:
                child = os.open(subdirectories.pop(), _DIRECTORY, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):  # nested deeper than descriptors last: a lower bound
                    return Usage(walk.bytes, False, walk.cleared)
                continue  # gone, or no longer a directory (a symlink now): not entered
            stack.append((child, walk.list(child)))
    finally:
        for fd, _ in stack:
            os.close(fd)
    return Usage(walk.bytes, True, walk.cleared)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Walk:
    """What measure_workspace counted so far."""

    def __init__(self) -> None:
        self.bytes = 0
        self.cleared = 0
        self.seen: set[tuple[int, int]] = set()

    def list(self, fd: int) -> list[str]:
        """Count the entries of the directory open at `fd`; the names of its subdirectories."""
        subdirectories = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1:
                        if (st.st_dev, st.st_ino) in self.seen:
                            continue
                        self.seen.add((st.st_dev, st.st_ino))
                    self.bytes += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        subdirectories.append(entry.name)
                    elif stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                        self.cleared += _clear_setuid(fd, entry.name)
        except OSError:
            pass
        return subdirectories


def _clear_setuid(dir_fd: int, name: str) -> int:
    # O_NOFOLLOW, relative to the directory the walk holds: a file swapped for a symlink since the walk saw it
    # is left alone.
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return 0
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.fchmod(fd, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))
            return 1
        return 0
    except OSError:
        return 0
    finally:
        os.close(fd)
