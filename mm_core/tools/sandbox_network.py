"""A sandboxed command's network: the internet, never the worker's loopback nor its internal networks.

bwrap always gives a command a network namespace of its own. With `bash.network: true`, slirp4netns
(`--disable-host-loopback`, its own sandbox and seccomp) connects that namespace to the outside, and nftables
rules loaded into it before the command starts refuse what fetch_content's guard refuses (derived from its
classification) and the worker's own addresses; the command has no CAP_NET_ADMIN to change them. Without
slirp4netns or nft, commands get no network, and `network_report` says so once at the worker's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.tools.base import ToolRefusal
from mm_core.tools.fetch.guard import blocked_kind, own_addresses

NETWORK_FAILED = (
    "[error: bash: the sandbox's network could not be set up ({reason}) — the command was not run; "
    "bash.network: false runs commands without network]"
)
NETWORK_MISSING = (
    "bash.network is on, but {missing} not installed on this worker: sandboxed commands run without "
    "network (apt-get install {packages})"
)
NS_GET_USERNS = 0xB701  # ioctl on a namespace's fd: a new fd of the user namespace that owns it
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
CAP_NET_ADMIN = 12
LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 47, 2


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


def ruleset(extra: tuple[ipaddress.IPv4Network, ...] = ()) -> str:
    """The nftables rules inside a sandbox's network namespace: its own loopback and slirp4netns's DNS
    forwarder are reachable, every internal network and the worker's own addresses are refused, and there is
    no IPv6 beyond loopback. The command cannot change them: it has no CAP_NET_ADMIN in its namespace."""
    refused = ipaddress.collapse_addresses(
        [*internal_networks(), *extra, *(ipaddress.IPv4Network(a) for a in own_addresses() if a.version == 4)]
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
