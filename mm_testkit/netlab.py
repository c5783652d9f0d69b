"""A network of the test's own: servers at a public and a private address, which this machine reaches and no
other network routes (loaded from tests/conftest.py's pytest_plugins).

A test of what a command may reach (the sandbox's filter, the egress proxy, the SSRF guard) needs a server at
an address the guard calls public, and one at an internal address, without sending a packet to the internet or
to a real company network. The lab is a network namespace made for the test (`ip netns add`) joined to this one
by a veth pair; it holds

- `lab.private` (10.213.97.2): what a company's internal service would have;
- `lab.public`, `lab.public2` (192.0.0.200, .201, in the IETF protocol block, which the guard calls public and no
  network routes): stand-ins for the internet, with host routes to them through the veth.

- `lab` (fixture): a Lab, torn down after the test. `lab.listen(address, port=0)` is a listening TCP socket at that
  address inside the lab, made by this process (from a thread that enters the lab's namespace for a moment): a
  server of the test process (asyncio, aiohttp's SockSite, a thread) serves on it, and this namespace reaches it
  through the veth.
- `lab.lookup(names)`: the test's resolver, `{"git.forge.test": lab.public}` -> an async (host, port) ->
  addresses, as the SSRF guard takes one (`AddressGuard(lookup=...)`); any other name fails as getaddrinfo
  does. The product cannot name one: a test passes it in.
- `lab_forge` (fixture): a factory `lab_forge(kind, name="git.forge.test", tokens=...)` -> a started forge emulator
  listening on lab.public inside the lab, its certificate and URLs under `name`
  (`https://git.forge.test:<port>`); the test maps `name` with `lab.lookup({name: lab.public})`.

A test using the lab needs root and iproute2: without `ip` it is skipped with the fix (a failure with
MM_TEST_REQUIRE_SYSTEM=1, as `needs_system` does), and without root it is skipped. It starts processes (`ip`), so
`make check` leaves it to `make test`. The addresses are fixed, so one lab exists at a time on the machine: a
lock file queues the test processes (pytest-xdist's workers) that want one.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mm_core.tools.fetch.guard import Lookup, blocked_kind
from mm_core.tools.sandbox_network import CLONE_NEWNET
from mm_testkit.fixtures_kit import needs_system
from playground.forge_server import ForgeServer, Kind

PRIVATE = "10.213.97.2"
GATEWAY = "10.213.97.1"  # this namespace's end of the veth
PUBLIC, PUBLIC2 = "192.0.0.200", "192.0.0.201"
FORGE_NAME = "git.forge.test"
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts a namespace by name
PREFIX = "mmlab"
LOCK = Path(tempfile.gettempdir()) / "mm-netlab.lock"
NEEDS_IP = needs_system("ip", "iproute2")
NEEDS_ROOT = "the network lab needs root (it makes a network namespace, a veth pair and routes)"


class Lab:
    """The test's network namespace `netns` and its addresses (see the module's docstring)."""

    public, public2, private = PUBLIC, PUBLIC2, PRIVATE

    def __init__(self, netns: str) -> None:
        self.netns = netns

    def listen(self, address: str, port: int = 0) -> socket.socket:
        """A TCP socket listening at address:port inside the lab (SO_REUSEADDR, backlog 64)."""

        def inside() -> socket.socket:
            # A network namespace is a thread's: only this short-lived thread moves, and the socket keeps the
            # namespace it was made in after the thread ends.
            with (NETNS_DIR / self.netns).open() as ns:
                if ctypes.CDLL(None, use_errno=True).setns(ns.fileno(), CLONE_NEWNET):
                    raise OSError(ctypes.get_errno(), f"cannot enter the network namespace {self.netns}")
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return socket.create_server((address, port), family=family, backlog=64)  # SO_REUSEADDR on POSIX

        with ThreadPoolExecutor(1, thread_name_prefix=f"{self.netns}-listen") as one:
            return one.submit(inside).result()

    @staticmethod
    def lookup(names: Mapping[str, str | Sequence[str]]) -> Lookup:
        """The test's resolver: each name to its address (or addresses), case and a trailing dot ignored."""
        table = {_name(name): [found] if isinstance(found, str) else list(found) for name, found in names.items()}

        async def resolve(host: str, port: int) -> list[str]:
            try:
                return list(table[_name(host)])
            except KeyError:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None

        return resolve


def serve_each(sock: socket.socket, handle: Callable[[socket.socket, tuple[str, int]], None]) -> None:
    """Serves `sock` from a thread until it closes: each connection is handed to `handle(conn, peer)`, then
    closed. The test servers of the lab are a few lines each on top of it."""

    def accept() -> None:
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            with conn:
                handle(conn, peer)

    threading.Thread(target=accept, daemon=True).start()


def _name(host: str) -> str:
    return host.lower().rstrip(".")


@contextlib.contextmanager
def made_lab() -> Iterator[Lab]:
    """Makes the lab, and removes it after: the namespace, the veth pair and the host routes."""
    for addr, public in ((PRIVATE, False), (PUBLIC, True), (PUBLIC2, True)):
        assert (blocked_kind(ipaddress.ip_address(addr)) is None) == public, addr
    name, host_if, ns_if = _names(os.getpid())
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _remove_stale_labs()
        try:
            _ip("netns", "add", name)
            _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name)
            _ip("addr", "add", f"{GATEWAY}/30", "dev", host_if)
            _ip("link", "set", host_if, "up")
            _ip("-n", name, "addr", "add", f"{PRIVATE}/30", "dev", ns_if)
            for public in (PUBLIC, PUBLIC2):
                _ip("-n", name, "addr", "add", f"{public}/32", "dev", ns_if)
            _ip("-n", name, "link", "set", ns_if, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "route", "add", "default", "via", GATEWAY)
            for public in (PUBLIC, PUBLIC2):
                _ip("route", "add", f"{public}/32", "via", PRIVATE, "dev", host_if)
            # Every packet of the test goes into the veth, never out of the machine.
            for addr in (PRIVATE, PUBLIC, PUBLIC2):
                route = _ip("route", "get", addr)
                assert f"dev {host_if}" in route, route
            yield Lab(name)
        finally:
            _remove(name, host_if)


def _names(pid: int) -> tuple[str, str, str]:
    """The lab's namespace and the veth's two ends, of the test process `pid` (one lab at a time each)."""
    return f"{PREFIX}{pid}", f"mmlh{pid}", f"mmln{pid}"


def _remove(name: str, host_if: str) -> None:
    # The host routes go with the veth, and the veth with the namespace, unless a socket still holds the
    # namespace (a server the test left running): each is removed by itself.
    for public in (PUBLIC, PUBLIC2):
        subprocess.run(["ip", "route", "del", f"{public}/32", "dev", host_if], capture_output=True)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _remove_stale_labs() -> None:
    """Removes the labs of test processes that died without removing theirs (killed): their addresses and
    routes would stand in the way of this one's."""
    for ns in NETNS_DIR.glob(f"{PREFIX}*") if NETNS_DIR.is_dir() else ():
        pid = ns.name.removeprefix(PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            name, host_if, _ = _names(int(pid))
            _remove(name, host_if)


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the network lab: ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@pytest.hookimpl(tryfirst=True)  # before the kit's hooks that act on the `system` marker added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(NEEDS_IP)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason=NEEDS_ROOT))


@pytest.fixture
def lab() -> Iterator[Lab]:
    with made_lab() as made:
        yield made


@pytest.fixture
def lab_forge(lab: Lab, forge_server: Callable[..., ForgeServer]) -> Callable[..., ForgeServer]:
    # `lab` before `forge_server`: the emulators stop before the lab is removed.
    def make(
        kind: Kind, name: str = FORGE_NAME, tokens: Mapping[str, Iterable[str] | None] | None = None
    ) -> ForgeServer:
        return forge_server(kind, tokens, sock=lab.listen(lab.public), names=(name,))

    return make
