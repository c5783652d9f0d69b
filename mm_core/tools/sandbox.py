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
  short list of /etc files that hold no secrets), a fresh /proc of its own processes, a minimal /dev, a
  private /tmp and /var/tmp (tmpfs, each at most `tmpMB` and `memoryMB`), and its workspace read-write at the
  same path (nosuid, as every bwrap mount); no other workspace, and it dies with its parent.

Inside the sandbox the command is never root. Its network (`bash.network: true`) is the internet only, see
`SandboxNetwork`; `bash.network: false`, or a worker without the parts, gives it none.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import itertools
import json
import os
import pwd
import resource
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.tools.base import ToolRefusal
from mm_core.tools.fetch.guard import blocked_kind

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
NETWORK_FAILED = (
    "[error: bash: the sandbox's network could not be set up ({reason}) — the command was not run; "
    "bash.network: false runs commands without network]"
)
NETWORK_MISSING = (
    "bash.network is on, but {missing} not installed on this worker: sandboxed commands run without "
    "network (apt-get install {packages})"
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
NS_GET_USERNS = 0xB701  # ioctl on a namespace's fd: a new fd of the user namespace that owns it
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
CAP_NET_ADMIN = 12
LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 47, 2

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
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp", *size, "--tmpfs", "/var/tmp"]
    for path in read_only:
        args += ["--ro-bind", path, path]
    args += ["--bind", workspace, workspace, "--remount-ro", "/", "--chdir", workspace, "--"]
    return args


def prepare(config: AgentConfig, workspace: Path, command: str, status_fd: int) -> Launch:
    """The launch of `command` in `workspace`; its exit status is written to `status_fd` as a decimal line.

    Raises ToolRefusal when the configuration requires a sandbox that is not installed, or when the command
    would run as root.
    """
    ws = os.path.realpath(workspace)
    bwrap = bwrap_path(config)
    uid, gid, user = _identity(Path(ws))
    root_owned = uid is None and os.geteuid() == 0
    if root_owned and not bwrap:
        raise ToolRefusal(ROOT_WORKSPACE.format(workspace=ws))
    inner_uid = SANDBOX_UID if root_owned else None
    if inner_uid is not None:
        user = _user_name(inner_uid)
    env = scrubbed_env(config, Path(ws), user)
    preexec = _limits(config)
    if not bwrap:
        shell = ["bash", "-c", STATUS_WRAPPER.format(fd=status_fd, keepalive=""), "mm-bash", command]
        return Launch(argv=shell, env=env, cwd=ws, pass_fds=(status_fd,), user=uid, group=gid, preexec=preexec)
    network = SandboxNetwork.open(config)
    shell = ["bash", "-c", STATUS_WRAPPER.format(fd=status_fd, keepalive=KEEPALIVE), "mm-bash", command]
    argv = _bwrap_args(bwrap, config, ws, inner_uid, network) + shell
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
    bwrap = bwrap_path(config)
    uid, gid, user = _identity(Path(ws))
    root_owned = uid is None and os.geteuid() == 0
    if root_owned and not bwrap:
        raise ToolRefusal(ROOT_SERVER.format(workspace=ws))
    env = scrubbed_env(config, Path(ws), _user_name(SANDBOX_UID) if root_owned else user)
    env["PATH"] = f"{Path(argv[0]).parent}:{SAFE_PATH}"
    # Caches go to the sandbox's own /tmp, not into the repository.
    env["HOME"] = "/tmp" if bwrap else tempfile.gettempdir()
    preexec = _limits(config, server=True)
    if not bwrap:
        return Launch(argv=argv, env=env, cwd=ws, pass_fds=(), user=uid, group=gid, preexec=preexec)
    inner_uid = SANDBOX_UID if root_owned else None
    args = _bwrap_args(bwrap, config, ws, inner_uid, None, installation(argv[0]))
    return Launch(argv=args + argv, env=env, cwd=ws, pass_fds=(), user=uid, group=gid, preexec=preexec, sandboxed=True)


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
    hard-linked file once), walked with os.scandir without following symlinks, for at most `budget` seconds.

    On the way it clears the setuid and setgid bits of every file: a command could have set them on a file it
    owns, and nothing the model writes may run as its owner on the worker (inside the sandbox, no_new_privs
    and the nosuid mount already void them).
    """
    deadline = time.monotonic() + budget
    total, cleared, seen = 0, 0, set()
    stack = [root]
    while stack:
        if time.monotonic() > deadline:
            return Usage(total, False, cleared)
        top = stack.pop()
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1:
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    elif stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                        cleared += _clear_setuid(entry.path)
        except OSError:
            continue
    return Usage(total, True, cleared)


def _clear_setuid(path: str) -> int:
    # O_NOFOLLOW: a file swapped for a symlink since the walk saw it is left alone.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
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


# --- the network: the internet, not the worker ---------------------------------------------------------------

# Where the parts of the network are looked for: the PATH, then the system directories a non-root worker's PATH
# often lacks (nft lives in /usr/sbin).
NETWORK_TOOLS = {"slirp4netns": "slirp4netns", "nft": "nftables"}
SETUP_TIMEOUT = 10.0
# slirp4netns's virtual network: the sandbox is 10.0.2.100, the host's side 10.0.2.2, its DNS forwarder 10.0.2.3.
SLIRP_DNS = "10.0.2.3"
# The grid at which `internal_networks` probes the classification, see there.
GRID_PREFIX = 16


def network_tools() -> dict[str, str | None]:
    """Each part of the sandbox's network, and where it is (None: missing)."""
    path = os.pathsep.join(p for p in (os.environ.get("PATH", ""), "/usr/sbin", "/sbin") if p)
    return {name: shutil.which(name, path=path) for name in NETWORK_TOOLS}


def network_report(config: AgentConfig) -> str | None:
    """What a worker should say once at start about its commands' network, None when there is nothing to say.

    The sandboxed commands get the internet only when slirp4netns and nft are both installed; without one of
    them they run with no network at all (never with the worker's), and this says which to install.
    """
    if not config.bash.network or config.sandbox == "none" or shutil.which("bwrap") is None:
        return None
    missing = [name for name, found in network_tools().items() if found is None]
    if not missing:
        return None
    names = " and ".join(missing) + (" is" if len(missing) == 1 else " are")
    packages = " ".join(dict.fromkeys(NETWORK_TOOLS[name] for name in missing))
    return NETWORK_MISSING.format(missing=names, packages=packages)


def _blocked(address: int) -> bool:
    return blocked_kind(ipaddress.IPv4Address(address)) is not None


@functools.cache
def internal_networks() -> tuple[ipaddress.IPv4Network, ...]:
    """The IPv4 networks fetch_content's guard refuses, as CIDRs for the sandbox's packet filter.

    Derived from `guard.blocked_kind` itself, never a second list that could drift from it: every /16 is
    probed at its first and last address, and a /16 (or smaller block) whose two ends disagree is split until
    they agree. The internal ranges are CIDR blocks, so a block whose ends agree is taken as uniform; the one
    blind spot is a range smaller than a /16 lying strictly inside a /16 whose both ends are public (today:
    the documentation ranges 198.51.100.0/24 and 203.0.113.0/24, which no network routes). About 130,000
    probes, a second or two, once per process.
    """
    ranges: list[list[int]] = []

    def add(start: int, end: int) -> None:
        if ranges and ranges[-1][1] + 1 == start:
            ranges[-1][1] = end
        else:
            ranges.append([start, end])

    def visit(start: int, prefix: int) -> None:
        end = start + (1 << (32 - prefix)) - 1
        if prefix >= GRID_PREFIX:
            first, last = _blocked(start), _blocked(end)
            if first == last:
                if first:
                    add(start, end)
                return
        half = 1 << (31 - prefix)
        visit(start, prefix + 1)
        visit(start + half, prefix + 1)

    visit(0, 0)
    nets: list[ipaddress.IPv4Network] = []
    for start, end in ranges:
        nets += ipaddress.summarize_address_range(ipaddress.IPv4Address(start), ipaddress.IPv4Address(end))
    return tuple(nets)


def _local_addresses() -> Iterator[ipaddress.IPv4Address]:
    """The worker's own IPv4 addresses (its services listen on them too, public or not), from the kernel's
    routing table: no process started."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in itertools.pairwise(lines):
            if line.strip() == "/32 host LOCAL":
                yield ipaddress.IPv4Address(previous.split()[-1])


def ruleset(extra: tuple[ipaddress.IPv4Network, ...] = ()) -> str:
    """The nftables rules inside a sandbox's network namespace: its own loopback and slirp4netns's DNS
    forwarder are reachable, every internal network and the worker's own addresses are refused, and there is
    no IPv6 beyond loopback. The command cannot change them: it has no CAP_NET_ADMIN in its namespace."""
    refused = ipaddress.collapse_addresses(
        [*internal_networks(), *extra, *(ipaddress.IPv4Network(a) for a in _local_addresses())]
    )
    elements = ", ".join(str(n) for n in refused)
    return f"""table inet mm_sandbox {{
  set internal {{
    type ipv4_addr
    flags interval
    elements = {{ {elements} }}
  }}
  chain output {{
    type filter hook output priority 0; policy accept;
    oif "lo" accept
    ip daddr {SLIRP_DNS} udp dport 53 accept
    ip daddr {SLIRP_DNS} tcp dport 53 accept
    meta nfproto ipv6 reject
    ip daddr @internal meta l4proto tcp reject with tcp reset
    ip daddr @internal reject
  }}
}}
"""


@dataclass
class SandboxNetwork:
    """The internet for one sandboxed command, and nothing of the worker's.

    Built from existing parts, each doing one thing:

    - bwrap `--unshare-net` gives the command a network namespace of its own, owned by the sandbox's user
      namespace, in which the command has no capability. `--info-fd` reports the sandbox's pid and
      `--block-fd` holds the command back until the network below is in place, so it never runs unfiltered.
    - slirp4netns (`--disable-host-loopback`, `--enable-sandbox`, `--enable-seccomp`) attaches to that
      namespace and carries its connections out through ordinary sockets of the worker: the worker's loopback
      (its PostgreSQL, Redis, RabbitMQ with trust auth) is not reachable through it. It was chosen over pasta,
      which by default forwards the worker's bound ports into the namespace and maps its gateway to the
      worker, each to be turned off; slirp4netns attaches to a pid, and its `--exit-fd` ends it with the
      sandbox.
    - slirp4netns forwards to any address the worker can reach, so nftables rules inside the namespace
      (`ruleset`, loaded by an nft that joins the namespace as its administrator, `_enter_as_admin`) refuse
      every internal destination: the networks fetch_content's guard refuses (`internal_networks`, derived
      from its classification), which include slirp4netns's own 10.0.2.2 (the worker, refused a second time
      by `--disable-host-loopback`), and the worker's own addresses. The command cannot change them: it has
      no CAP_NET_ADMIN there, and cannot make a user namespace where it would (`--disable-userns`).
    - Each command pays for this: see bench/bench_tools.py (the ranges themselves are derived once per
      process).

    Without one of the parts (`network_report` says which), the command gets no network: `open` returns None
    and bwrap's `--unshare-net` stands alone.
    """

    tools: dict[str, str]
    info_r: int
    info_w: int
    block_r: int
    block_w: int
    resolv_r: int
    exit_r: int
    exit_w: int
    helpers: list[asyncio.subprocess.Process] = field(default_factory=list)

    @classmethod
    def open(cls, config: AgentConfig) -> SandboxNetwork | None:
        if not config.bash.network:
            return None
        found = network_tools()
        tools = {name: path for name, path in found.items() if path is not None}
        if len(tools) != len(found):
            return None
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        resolv_r, resolv_w = os.pipe()
        exit_r, exit_w = os.pipe()
        with os.fdopen(resolv_w, "w") as resolv:  # a few bytes: the pipe holds them until bwrap reads them
            resolv.write(f"nameserver {SLIRP_DNS}\n")
        return cls(tools, info_r, info_w, block_r, block_w, resolv_r, exit_r, exit_w)

    def child_fds(self) -> tuple[int, ...]:
        # exit_w stays open in every process of the sandbox: when the last one ends, slirp4netns sees it close.
        return self.info_w, self.block_r, self.resolv_r, self.exit_w

    def close(self) -> None:
        for fd in (self.info_r, self.block_w, self.exit_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    async def attach(self) -> None:
        """Connect the started sandbox to the internet, then let its command run. Raises ToolRefusal
        (NETWORK_FAILED) when a step fails: the caller kills the sandbox, whose command never ran."""
        try:
            # The first call derives internal_networks (a second or two): off the loop and off the clock.
            rules = await asyncio.to_thread(ruleset)
            await asyncio.wait_for(self._attach(rules), SETUP_TIMEOUT)
        except TimeoutError:
            raise ToolRefusal(NETWORK_FAILED.format(reason=f"not ready within {SETUP_TIMEOUT:g}s")) from None
        finally:
            self.close()

    async def _attach(self, rules: str) -> None:
        pid = await _child_pid(self.info_r)
        await _loopback_up(pid)
        net, owner = _namespaces(pid)
        ready_r, ready_w = os.pipe()
        held = [ready_w, net, owner]  # the worker's copies, closed once the helpers have theirs
        try:
            slirp = await asyncio.create_subprocess_exec(
                self.tools["slirp4netns"],
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--enable-sandbox",
                "--enable-seccomp",
                f"--ready-fd={ready_w}",
                f"--exit-fd={self.exit_r}",
                f"--userns-path=/proc/self/fd/{owner}",
                "--netns-type=path",
                f"/proc/self/fd/{net}",
                "tap0",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(ready_w, self.exit_r, net, owner),
                start_new_session=True,
            )
            self.helpers.append(slirp)
            os.close(held.pop(0))  # ready_w: slirp4netns's report, or its exit, must end the read below
            ready = await _read_ready(ready_r)
            if not ready.startswith(b"1"):
                code = await slirp.wait()
                raise ToolRefusal(NETWORK_FAILED.format(reason=f"slirp4netns exited with status {code}"))
            nft = await asyncio.create_subprocess_exec(
                self.tools["nft"],
                "-f",
                "-",
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=_enter_as_admin(net, owner),
            )
            _, err = await nft.communicate(rules.encode())
        finally:
            for fd in held:
                os.close(fd)
        if nft.returncode:
            reason = err.decode(errors="replace").strip().splitlines()
            raise ToolRefusal(NETWORK_FAILED.format(reason=f"nft: {reason[0] if reason else nft.returncode}"))
        try:
            os.write(self.block_w, b"1")
        except BrokenPipeError:
            raise ToolRefusal(NETWORK_FAILED.format(reason="the sandbox ended while starting")) from None


def _enter_as_admin(net: int, owner: int) -> Callable[[], None]:
    """What the nft process does before it runs: it joins the user namespace that owns the sandbox's network
    and that network, where it has every capability, and keeps only CAP_NET_ADMIN, made ambient so that it
    survives the exec of nft (the worker's uid is not root there: an exec would drop the others). nsenter
    cannot do this: it loses the capabilities at its exec of nft."""
    libc = ctypes.CDLL(None, use_errno=True)
    setns, capset, prctl = libc.setns, libc.capset, libc.prctl
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    admin = 1 << CAP_NET_ADMIN
    # Two __user_cap_data_struct {effective, permitted, inheritable}: capabilities 0-31, then 32-63.
    data = (ctypes.c_uint32 * 6)(admin, admin, admin, 0, 0, 0)

    def enter() -> None:  # in the child between fork and exec (single-threaded: setns to a user namespace)
        if (
            setns(owner, CLONE_NEWUSER)
            or setns(net, CLONE_NEWNET)
            or capset(header, data)
            or prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN, 0, 0)
        ):
            raise OSError(ctypes.get_errno(), "cannot enter the sandbox's network as its administrator")

    return enter


async def _loopback_up(pid: int) -> None:
    """Wait until bwrap has set up the sandbox's loopback (it adds 127.0.0.1, then brings `lo` up): it does so
    after reporting the pid, and its netlink requests fail ("Failed RTM_NEWADDR") when slirp4netns configures
    the namespace at the same moment. A device that is up has joined the all-hosts group: `lo` appears in the
    namespace's /proc/net/igmp (a kernel without multicast has no such file: then 127.0.0.1 in its routes)."""
    igmp, fib = Path(f"/proc/{pid}/net/igmp"), Path(f"/proc/{pid}/net/fib_trie")
    while True:
        try:
            if igmp.exists() and any(line.split()[1:2] == ["lo"] for line in igmp.read_text().splitlines()):
                return
            if not igmp.exists() and "127.0.0.1" in fib.read_text():
                return
        except OSError:
            raise ToolRefusal(NETWORK_FAILED.format(reason="the sandbox ended while starting")) from None
        await asyncio.sleep(0.002)


def _namespaces(pid: int) -> tuple[int, int]:
    """File descriptors of the sandbox's network namespace and of the user namespace that owns it (bwrap may
    have moved its process into a nested one since, with `--disable-userns`): slirp4netns and nft need the
    owner's capabilities over that network."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return net, fcntl.ioctl(net, NS_GET_USERNS)
    except OSError:
        os.close(net)
        raise ToolRefusal(NETWORK_FAILED.format(reason="the sandbox's namespaces cannot be opened")) from None


async def _read_ready(fd: int) -> bytes:
    """slirp4netns's ready report: one byte, or nothing when it exits first; fd is closed."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    try:
        return await reader.read(1)
    finally:
        transport.close()


async def _child_pid(fd: int) -> int:
    """The sandbox's pid, from bwrap's --info-fd JSON (it writes it once its namespaces exist)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd), "rb", 0)
    )
    text = b""
    try:
        while b"}" not in text:
            chunk = await reader.read(4096)
            if not chunk:
                break
            text += chunk
    finally:
        transport.close()
    try:
        return int(json.loads(text)["child-pid"])
    except (ValueError, KeyError, TypeError):
        raise ToolRefusal(NETWORK_FAILED.format(reason="bwrap did not start the sandbox")) from None
