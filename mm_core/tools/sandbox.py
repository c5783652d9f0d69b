"""How a bash command is started: scrubbed environment, resource limits, and bubblewrap when available.

The worker holds secrets (Slack tokens, the database and broker URLs, the model's API key) and serves many
workspaces. A command therefore gets:

- in every mode, an environment built from an allow-list plus what the config adds (`bash.env` literal
  values, `bash.passEnv` names copied from the worker), and the `bash.limits` applied with setrlimit;
- when the worker runs as root and the workspace belongs to another user, that user's identity: the kernel
  then enforces RLIMIT_NPROC and file permissions (both are waived for root). A root-owned workspace runs as
  root outside the sandbox's user namespace, and RLIMIT_NPROC cannot hold a fork bomb there: give the
  workspaces to an unprivileged user;
- with bubblewrap (`sandbox: auto` when `bwrap` is on the PATH, `bwrap` to require it): its own mount, pid,
  ipc, uts and user namespaces, where it sees the system read-only (/usr and the merged-usr links, a short
  list of /etc files that hold no secrets), a fresh /proc of its own processes, a minimal /dev, a private
  /tmp, and its workspace read-write at the same path; no other workspace, no network unless
  `bash.network`, and it dies with its parent.

Inside the sandbox the command is never root.
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mm_core.config import AgentConfig
from mm_core.tools.base import ToolRefusal

BWRAP_MISSING = ('[error: the configuration requires the bwrap sandbox (sandbox: bwrap) but bubblewrap is not '
                 'installed on this worker — the command was not run]')

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Copied from the worker when set; everything else is left behind.
ALLOWED_ENV = ("LANG", "LANGUAGE", "TERM", "TZ")
ALLOWED_ENV_PREFIXES = ("LC_",)
# System files a command needs (name service, DNS, certificates, dynamic linker, shells' start-up files),
# never /etc as a whole: /etc/shadow, ssh host keys, /etc/ssl/private and service credentials live there.
ETC_FILES = (
    "passwd", "group", "hosts", "hostname", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
    "services", "protocols", "localtime", "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "pki/tls/certs",
    "mime.types", "os-release", "debian_version", "lsb-release", "bash.bashrc", "profile", "inputrc",
    "gitconfig", "magic", "papersize", "python3", "perl",
)
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The uid a root worker's command has inside the sandbox, when its workspace belongs to root.
SANDBOX_UID = 1000

# A command's process inside the sandbox. The user's command runs with the status pipe closed, so that only
# this wrapper reports its exit status; then the wrapper keeps the pid namespace alive while background jobs
# remain (when the namespace's first process exits, the kernel kills every process in it), so that
# `nohup serve &` keeps running as the reference promises, until the session reaps it.
# The wrapper's own stderr goes to /dev/null so that its job reports ("Killed", "File size limit exceeded")
# never mix into the command's output; the command gets the real stderr.
STATUS_WRAPPER = ('exec {{err}}>&2 2>/dev/null; "$BASH" -c "$1" 2>&$err {{err}}>&- {fd}>&-; echo $? >&{fd}; '
                  'exec {fd}>&- {{err}}>&-{keepalive}')
KEEPALIVE = '; while p=(/proc/[0-9]*); [ ${#p[@]} -gt 2 ]; do sleep 1; done'


@dataclass
class Launch:
    """Everything needed to start one command."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...]
    user: int | None = None
    group: int | None = None
    preexec: Callable[[], None] | None = None
    sandboxed: bool = False


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


def _limits(config: AgentConfig) -> Callable[[], None]:
    mib = 1024 * 1024
    lim = config.bash.limits
    wanted = [
        (resource.RLIMIT_CPU, lim.cpuSeconds),
        (resource.RLIMIT_AS, lim.memoryMB * mib if lim.memoryMB else None),
        (resource.RLIMIT_NPROC, lim.processes),
        (resource.RLIMIT_FSIZE, lim.fileSizeMB * mib if lim.fileSizeMB else None),
    ]
    settings = [(which, value) for which, value in wanted if value is not None]

    def apply() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        for which, value in settings:
            _soft, hard = resource.getrlimit(which)
            # CPU: the soft limit sends SIGXCPU (a clear "CPU time limit exceeded"), SIGKILL a second later.
            wanted_hard = value + 1 if which == resource.RLIMIT_CPU else value
            if hard != resource.RLIM_INFINITY:
                wanted_hard = min(wanted_hard, hard)
            resource.setrlimit(which, (min(value, wanted_hard), wanted_hard))

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


def _bwrap_args(bwrap: str, config: AgentConfig, workspace: str, inner_uid: int | None) -> list[str]:
    args = [bwrap, "--die-with-parent", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--cap-drop", "ALL"]
    if not config.bash.network:
        args.append("--unshare-net")
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
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp",
             "--bind", workspace, workspace, "--remount-ro", "/", "--chdir", workspace, "--"]
    return args


def prepare(config: AgentConfig, workspace: Path, command: str, status_fd: int) -> Launch:
    """The launch of `command` in `workspace`; its exit status is written to `status_fd` as a decimal line.

    Raises ToolRefusal when the configuration requires a sandbox that is not installed.
    """
    ws = os.path.realpath(workspace)
    bwrap = bwrap_path(config)
    uid, gid, user = _identity(Path(ws))
    inner_uid = SANDBOX_UID if (bwrap and uid is None and os.geteuid() == 0) else None
    if inner_uid is not None:
        user = _user_name(inner_uid)
    env = scrubbed_env(config, Path(ws), user)
    keepalive = KEEPALIVE if bwrap else ""
    shell = ["bash", "-c", STATUS_WRAPPER.format(fd=status_fd, keepalive=keepalive), "mm-bash", command]
    argv = _bwrap_args(bwrap, config, ws, inner_uid) + shell if bwrap else shell
    return Launch(argv=argv, env=env, cwd=ws, pass_fds=(status_fd,), user=uid, group=gid,
                  preexec=_limits(config), sandboxed=bool(bwrap))
