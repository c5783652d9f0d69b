"""A sandboxed command's network, as the egress policy says (`network: off | allow | open`, docs/network.md).

bwrap always gives a command a network namespace of its own. `off` leaves it with its loopback alone. `allow`
binds a port of the worker's egress proxy on that loopback and routes nothing else: every connection goes through
the proxy, which applies the allow-list outside the sandbox (mm_core/network). `open` connects the namespace to
the internet with slirp4netns (`--disable-host-loopback`, its own sandbox and seccomp), and nftables rules loaded
into it before the command starts refuse what fetch_content's guard refuses (derived from its classification)
and the worker's own addresses; the command has no CAP_NET_ADMIN to change them. Without slirp4netns or nft,
`open` commands get no network, and `network_report` says so once at the worker's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import json
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_core.config import AgentConfig
from mm_core.network.policy import EgressPolicy
from mm_core.network.proxy import Tap, egress_proxy
from mm_core.tools.base import ToolRefusal
from mm_core.tools.fetch.guard import blocked_kind, own_addresses

log = logging.getLogger(__name__)

NETWORK_FAILED = (
    "[error: bash: the sandbox's network could not be set up ({reason}) — the command was not run; "
    "network: off runs commands without any]"
)
NETWORK_MISSING = (
    "network is open, but {missing} not installed on this worker: sandboxed commands run without "
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
# `allow`: where the proxy listens inside each sandbox (its own loopback: every sandbox has its own namespace),
# and how many connections may wait to be accepted there.
PROXY_PORT = 3128
PROXY_BACKLOG = 64
_TRUE = shutil.which("true") or "/bin/true"
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

    With `network: open` the sandboxed commands get the internet only when slirp4netns and nft are both
    installed; without one of them they run with no network at all (never with the worker's), and this says
    which to install. `allow` needs neither: the proxy is the worker's own.
    """
    if config.egress.policy != "open" or config.sandbox == "none" or shutil.which("bwrap") is None:
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
    """The network of one sandboxed command: the worker's egress proxy only (`network: allow`), or the internet
    and nothing of the worker's (`network: open`). `network: off` has none: `open` returns None and bwrap's
    `--unshare-net` stands alone, a namespace holding only its loopback.

    Built from existing parts, each doing one thing:

    - bwrap `--unshare-net` gives the command a network namespace of its own, owned by the sandbox's user
      namespace, in which the command has no capability. `--info-fd` reports the sandbox's pid and
      `--block-fd` holds the command back until the network below is in place, so it never runs unfiltered.
    - `allow`: nothing is routed out of the namespace. A listening socket is made inside it, on its loopback's
      PROXY_PORT (`_listen_inside`, by a short-lived process that joins the namespace as its administrator),
      and handed to the worker's egress proxy (mm_core/network/proxy.py), which runs outside the sandbox and
      decides every request by the policy, resolves names itself and adds credentials. A raw connection to an
      address has nowhere to go. The command reaches the proxy through the usual variables (`proxy_env`).
    - `open`: slirp4netns (`--disable-host-loopback`, `--enable-sandbox`, `--enable-seccomp`) attaches to that
      namespace and carries its connections out through ordinary sockets of the worker: the worker's loopback
      (its PostgreSQL, Redis, RabbitMQ with trust auth) is not reachable through it. It was chosen over pasta,
      which by default forwards the worker's bound ports into the namespace and maps its gateway to the
      worker, each to be turned off; slirp4netns attaches to a pid, and its `--exit-fd` ends it with the
      sandbox. slirp4netns forwards to any address the worker can reach, so nftables rules inside the namespace
      (`ruleset`, loaded by an nft that joins the namespace as its administrator, `_enter_as_admin`) refuse
      every internal destination: the networks fetch_content's guard refuses (`internal_networks`, derived
      from its classification), which include slirp4netns's own 10.0.2.2 (the worker, refused a second time
      by `--disable-host-loopback`), and the worker's own addresses. The command cannot change them: it has
      no CAP_NET_ADMIN there, and cannot make a user namespace where it would (`--disable-userns`).
    - Each command pays for this: see bench/bench_tools.py and bench/bench_egress.py (the ranges themselves are
      derived once per process).

    Without slirp4netns or nft (`network_report` says which), `open` gives the command no network.
    """

    info_r: int
    info_w: int
    block_r: int
    block_w: int
    resolv_r: int
    exit_r: int
    exit_w: int
    # `open`: where slirp4netns and nft are. `allow`: the policy the proxy applies, and the SSRF guard's lifts.
    tools: dict[str, str] = field(default_factory=dict)
    policy: EgressPolicy | None = None
    fetch_allow: tuple[str, ...] = ()
    helpers: list[asyncio.subprocess.Process] = field(default_factory=list)
    # What the proxy saw of this command's connections (`allow`), once attached.
    tap: Tap | None = None

    @classmethod
    def open(cls, config: AgentConfig) -> SandboxNetwork | None:
        mode = config.egress.policy
        if mode == "off":
            return None
        tools: dict[str, str] = {}
        if mode == "open":
            found = network_tools()
            tools = {name: path for name, path in found.items() if path is not None}
            if len(tools) != len(found):
                return None
        made: list[int] = []
        try:
            for _ in range(4):
                made += os.pipe()
        except OSError:
            for fd in made:  # out of descriptors: the launch fails, leaking none
                os.close(fd)
            raise
        info_r, info_w, block_r, block_w, resolv_r, resolv_w, exit_r, exit_w = made
        with os.fdopen(resolv_w, "w") as resolv:  # a few bytes: the pipe holds them until bwrap reads them
            # `open`: slirp4netns's own forwarder. `allow`: no resolver at all, so that a tool which resolves a
            # name itself fails at once rather than waiting on one it cannot reach; the proxy resolves.
            resolv.write(f"nameserver {SLIRP_DNS}\n" if mode == "open" else "# names are resolved by the proxy\n")
        policy = EgressPolicy.of(config.egress, os.environ) if mode == "allow" else None
        return cls(info_r, info_w, block_r, block_w, resolv_r, exit_r, exit_w, tools, policy, tuple(config.fetchAllow))

    @property
    def proxied(self) -> bool:
        return self.policy is not None

    @property
    def intercepts(self) -> bool:
        """Whether the proxy terminates TLS for some host, to add its credential: the sandbox trusts its CA."""
        return self.policy is not None and bool(self.policy.credentialed)

    def child_fds(self) -> tuple[int, ...]:
        # exit_w stays open in every process of the sandbox: when the last one ends, slirp4netns (or the proxy)
        # sees it close.
        return self.info_w, self.block_r, self.resolv_r, self.exit_w

    def close(self) -> None:
        """The worker's ends closed. Closing block_w lets a waiting sandbox go on: on a failure, only once the
        sandbox is killed."""
        for fd in (self.info_r, self.block_w, self.exit_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def discard(self) -> None:
        """Every end closed, the child's too: for a launch that never started."""
        self.close()
        for fd in self.child_fds():
            with contextlib.suppress(OSError):
                os.close(fd)

    async def attach(self) -> None:
        """Connect the started sandbox to its network, then let its command run. Raises ToolRefusal
        (NETWORK_FAILED) when a step fails: the caller kills the sandbox, whose command never ran."""
        try:
            # The first call derives internal_networks (a second or two): off the loop and off the clock.
            rules = None if self.proxied else await asyncio.to_thread(ruleset)
            await asyncio.wait_for(self._attach(rules), SETUP_TIMEOUT)
        except TimeoutError:
            raise ToolRefusal(NETWORK_FAILED.format(reason=f"not ready within {SETUP_TIMEOUT:g}s")) from None
        except ToolRefusal:
            raise
        except Exception as e:
            # Out of descriptors, a helper that could not enter the namespace, the proxy closing: the caller
            # kills the sandbox, whose command never ran, and only then closes the ends that hold it back.
            log.warning("bash: the sandbox's network could not be set up", exc_info=True)
            raise ToolRefusal(NETWORK_FAILED.format(reason=str(e) or type(e).__name__)) from None
        self.close()

    async def _attach(self, rules: str | None) -> None:
        pid = await _child_pid(self.info_r)
        await _loopback_up(pid)
        net, owner = _namespaces(pid)
        try:
            if rules is None:
                await self._proxy(net, owner)
            else:
                await self._slirp(net, owner, rules)
        finally:
            os.close(net)
            os.close(owner)
        try:
            os.write(self.block_w, b"1")
        except BrokenPipeError:
            raise ToolRefusal(NETWORK_FAILED.format(reason="the sandbox ended while starting")) from None

    async def _proxy(self, net: int, owner: int) -> None:
        """`allow`: the proxy's port on the namespace's loopback, served by the worker's egress proxy until the
        sandbox's last process ends (the proxy watches its own copy of the exit pipe)."""
        assert self.policy is not None
        listener = await _listen_inside(net, owner)
        self.tap = egress_proxy().serve(listener, self.policy, self.fetch_allow, until_fd=os.dup(self.exit_r))

    async def _slirp(self, net: int, owner: int, rules: str) -> None:
        ready_r, ready_w = os.pipe()
        held = [ready_w]  # the worker's copy, closed once slirp4netns has its own
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


def proxy_env(network: SandboxNetwork | None, ca_bundle: str) -> dict[str, str]:
    """What a proxied command's environment says of the way out: the proxy for every tool that reads the usual
    variables (curl, pip, git, npm, cargo, Go), and, where the proxy adds credentials (so it terminates TLS for
    those hosts), `ca_bundle` (the sandbox's path of the system's roots plus the proxy's CA) for each tool's own
    trust setting. Empty for a command that is not proxied."""
    if network is None or not network.proxied:
        return {}
    url = f"http://127.0.0.1:{PROXY_PORT}"
    local = "localhost,127.0.0.1,::1"
    env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env |= {"NO_PROXY": local, "no_proxy": local, "npm_config_proxy": url, "npm_config_https_proxy": url}
    if network.intercepts:
        trust = (
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            "GIT_SSL_CAINFO",
            "PIP_CERT",
            "npm_config_cafile",
            "CARGO_HTTP_CAINFO",
        )
        env |= dict.fromkeys(trust, ca_bundle)
    return env


async def _listen_inside(net: int, owner: int) -> socket.socket:
    """A listening socket on the loopback of the sandbox's network namespace, for the worker's proxy to serve.

    A socket belongs to the namespace it was made in, whoever holds it after: a short-lived child joins the
    namespace as its administrator (as nft does, `_enter_as_admin`), makes the socket there, and sends it back
    over a socket pair (SCM_RIGHTS) before it execs `true` and ends. The worker's own threads never change
    namespace."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    enter = _enter_as_admin(net, owner, keep=False)

    def make_and_send() -> None:  # in the child between fork and exec
        enter()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", PROXY_PORT))
        listener.listen(PROXY_BACKLOG)
        socket.send_fds(theirs, [b"L"], [listener.fileno()])

    try:
        child = await asyncio.create_subprocess_exec(
            _TRUE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=make_and_send,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        try:
            await child.wait()
        except BaseException:  # cancelled (attach's timeout): the helper goes too
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            raise
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            _, fds, _, _ = await asyncio.wait_for(_recv_fds(loop, ours), SETUP_TIMEOUT)
        except (OSError, TimeoutError):
            fds = []
        if child.returncode or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            reason = f"the proxy's port could not be opened (status {child.returncode})"
            raise ToolRefusal(NETWORK_FAILED.format(reason=reason))
        listener = socket.socket(fileno=fds[0])
        listener.set_inheritable(False)  # received without MSG_CMSG_CLOEXEC: no child of the worker gets it
        return listener
    finally:
        theirs.close()
        ours.close()


async def _recv_fds(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[bytes, list[int], int, Any]:
    """One message with its file descriptors, waiting on the loop (the child wrote it before it exited)."""
    while True:
        try:
            return socket.recv_fds(sock, 1, 1)
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_reader(sock.fileno(), ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())


def _enter_as_admin(net: int, owner: int, keep: bool = True) -> Callable[[], None]:
    """What the nft process does before it runs: it joins the user namespace that owns the sandbox's network
    and that network, where it has every capability, and keeps only CAP_NET_ADMIN, made ambient so that it
    survives the exec of nft (the worker's uid is not root there: an exec would drop the others). nsenter
    cannot do this: it loses the capabilities at its exec of nft. `keep=False`: the child needs nothing after
    its exec (`_listen_inside`), so no capability is kept."""
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
            or (keep and capset(header, data))
            or (keep and prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN, 0, 0))
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
