"""The SSRF guard: a worker inside a company network must not become a door to its internal services.

The check runs where the socket is opened (`GuardedBackend.connect_tcp`): the host is resolved once, every
address it resolves to is vetted, and the connection goes to a vetted address. DNS rebinding between a check
and the connect cannot slip through, and every redirect hop and robots.txt request passes the same door. TLS
SNI and the Host header keep the name, because httpcore takes both from the URL, not from the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpcore
import httpx

from mm_core.tools.fetch.errors import BlockedAddress

if TYPE_CHECKING:
    from mm_core.network.policy import EgressPolicy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = {
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("fd00:ec2::254"),
    ipaddress.ip_address("100.100.100.200"),
}
_LIFT = "fetching internal addresses is not allowed (fetchAllow in the config lifts this)"


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries (mapped, NAT64, 6to4, Teredo client), if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def blocked_kind(ip: IPAddress) -> str | None:
    """Why an address is internal ("a loopback address", …), or None for a public one."""
    inner = _embedded_v4(ip)
    if inner is not None:
        kind = blocked_kind(inner)
        return f"{kind} (as {inner} inside an IPv6 address)" if kind else None
    if ip in _METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_link_local:
        return "a link-local address"
    # fec0::/10: deprecated (RFC 3879), but still the internal network where it was deployed, and `is_global`
    # counts it as global.
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "a site-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a carrier-grade NAT address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "a reserved address"
    return None


# How a name is resolved: (host, port) to its addresses. The worker's is getaddrinfo; a test passes its own to map
# names to the servers it made (mm_testkit.netlab): the config cannot name one.
Lookup = Callable[[str, int], Awaitable[list[str]]]
# How long the worker's own addresses are taken as known: they change with its interfaces, rarely.
OWN_ADDRESSES_TTL = 30.0


def _own_addresses() -> frozenset[IPAddress]:
    """The worker's own addresses (its services listen on them too, public or not), from the kernel's tables:
    no process started."""
    found: set[IPAddress] = set()
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in itertools.pairwise(lines):
            if line.strip() == "/32 host LOCAL":
                found.add(ipaddress.IPv4Address(previous.split()[-1]))
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            digits = line.split()[0]
            found.add(ipaddress.IPv6Address(int(digits, 16)))
    return frozenset(found)


_NOT_READ: tuple[float, frozenset[IPAddress]] = (float("-inf"), frozenset())
_own_cache = _NOT_READ
# Fetches, the sandbox's network and the egress proxy ask from several threads: one of them reads the tables, and
# the others take what it read rather than a set a slower reader stores over it a moment later.
_own_lock = threading.Lock()


def own_addresses() -> frozenset[IPAddress]:
    """The worker's own addresses, read again at most every OWN_ADDRESSES_TTL seconds."""
    global _own_cache
    with _own_lock:
        read_at, found = _own_cache
        if time.monotonic() - read_at > OWN_ADDRESSES_TTL:
            found = _own_addresses()
            _own_cache = (time.monotonic(), found)
        return found


def forget_own_addresses() -> None:
    """Drops what was read: the next own_addresses() reads the kernel's tables. Only tests call it today (one that
    moves the clock must start from a read of its own); a caller that knows the interfaces changed would too."""
    global _own_cache
    with _own_lock:
        _own_cache = _NOT_READ


def _is_own(ip: IPAddress) -> bool:
    """Whether `ip` is one of the worker's addresses, written as itself or inside an IPv6 form (::ffff:a.b.c.d)."""
    own = own_addresses()
    return ip in own or _embedded_v4(ip) in own


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # sockaddr[0] is the address text for AF_INET / AF_INET6, the only families a host name resolves to here.
    return [str(info[4][0]).split("%")[0] for info in infos]


class AddressGuard:
    """Vets the addresses a host name resolves to; `allow` holds CIDRs, addresses or host names; `policy`, when
    given, is asked first whether the name may be reached at all (mm_core/network)."""

    def __init__(self, allow: Iterable[str] = (), policy: EgressPolicy | None = None, lookup: Lookup | None = None):
        self.policy = policy
        self.lookup = lookup or _getaddrinfo
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self.names: set[str] = set()
        for entry in allow:
            entry = entry.strip()
            try:
                self.networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                self.names.add(entry.lower().rstrip("."))

    def check(self, host: str, ip: IPAddress) -> None:
        """Raise BlockedAddress when `ip` (what `host` resolved to) is internal and not allowed."""
        if host.lower().rstrip(".") in self.names or any(ip in net for net in self.networks):
            return
        kind = blocked_kind(ip) or ("this worker's own address" if _is_own(ip) else None)
        if kind is None:
            return
        try:
            is_literal = ipaddress.ip_address(host.strip("[]")) == ip
        except ValueError:
            is_literal = False
        subject = host.strip("[]") if is_literal else f"{host} resolves to {ip}, which"
        raise BlockedAddress(f"{subject} is {kind} — {_LIFT}")

    async def resolve(self, host: str, port: int) -> list[str]:
        """The host's addresses, every one vetted: one internal address refuses the host altogether, so a
        name that mixes public and internal answers cannot be steered to the internal one."""
        if self.policy is not None and (refusal := self.policy.refusal(host, port)) is not None:
            raise BlockedAddress(refusal)
        literal = host.strip("[]")
        try:
            return self._vet(host, [ipaddress.ip_address(literal)])
        except ValueError:
            pass
        addresses = list(dict.fromkeys(ipaddress.ip_address(a) for a in await self.lookup(literal, port)))
        return self._vet(host, addresses)

    def _vet(self, host: str, addresses: list[IPAddress]) -> list[str]:
        for ip in addresses:
            self.check(host, ip)
        return [str(ip) for ip in addresses]


def guarded_transport(
    guard: AddressGuard, ssl_context: ssl.SSLContext | None = None, **pool: Any
) -> httpx.AsyncHTTPTransport:
    """An httpx transport whose every connection opens through `guard` (fetch_content's client, the egress proxy's
    forwarding one): httpx takes no network backend, so its pool is replaced by one on GuardedBackend. `pool`:
    httpcore's pool settings (its limits)."""
    context = ssl_context if ssl_context is not None else httpx.create_ssl_context()
    transport = httpx.AsyncHTTPTransport(verify=context)
    transport._pool = httpcore.AsyncConnectionPool(ssl_context=context, network_backend=GuardedBackend(guard), **pool)
    return transport


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to addresses the guard vetted."""

    def __init__(self, guard: AddressGuard):
        self.guard = guard
        # cast: httpcore declares a stand-in AnyIOBackend (no methods) for when anyio is missing, and the type
        # checker takes that declaration; anyio is installed with httpx, so this is the real backend.
        self.inner = cast(httpcore.AsyncNetworkBackend, httpcore.AnyIOBackend())

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self.guard.resolve(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror or exc}") from exc
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not fetched")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)
