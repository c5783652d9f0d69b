"""Pins for fetch_content's address guard (mutation pass, issue 8): public addresses go through, a name with
one internal answer is refused, the allow list lifts the refusal, and the backend connects only to vetted
addresses. Nothing here leaves the machine: literal addresses are never resolved, host names are answered by
a stand-in for the event loop's getaddrinfo, and the connecting backend is a stand-in too."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpcore
import httpx
import pytest

from mm_core.network.ca import CertificateAuthority
from mm_core.network.policy import NOT_LISTED, EgressPolicy, expand
from mm_core.tools.fetch import guard
from mm_core.tools.fetch.errors import BlockedAddress
from mm_core.tools.fetch.guard import AddressGuard, GuardedBackend, blocked_kind, guarded_transport
from mm_testkit.clocks import HandClock
from mm_testkit.fixtures_kit import needs_system

T = TypeVar("T")
LIFT = "fetching internal addresses is not allowed (fetchAllow in the config lifts this)"


def resolving(answers: dict[str, list[str]], coro: Callable[[], Awaitable[T]]) -> T:
    """Run `coro` with host names answered from `answers` (an unknown name fails as DNS would)."""

    async def getaddrinfo(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in answers[host]
        ]

    async def scenario() -> T:
        asyncio.get_running_loop().getaddrinfo = getaddrinfo  # type: ignore[method-assign]
        return await coro()

    return asyncio.run(scenario())


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700::1"])
def test_a_public_literal_address_is_allowed(address: str) -> None:
    """fetch_content reaches public sites: neither the check nor the resolve step refuses a public address."""
    guard = AddressGuard()
    guard.check(address, ipaddress.ip_address(address))  # no BlockedAddress
    host = f"[{address}]" if ":" in address else address
    assert asyncio.run(guard.resolve(host, 443)) == [address]


def test_a_public_name_resolves_to_all_its_addresses_once_each() -> None:
    """Every public answer is offered to the connection, in order, duplicates and zone ids dropped."""
    answers = {"example.test": ["93.184.215.14", "2606:4700::1", "93.184.215.14"]}
    assert resolving(answers, lambda: AddressGuard().resolve("example.test", 443)) == ["93.184.215.14", "2606:4700::1"]


def test_one_internal_answer_refuses_the_whole_name() -> None:
    """A name mixing public and internal answers cannot be steered to the internal one: it is refused."""
    answers = {"mixed.test": ["93.184.215.14", "10.0.0.5"]}
    with pytest.raises(BlockedAddress) as refused:
        resolving(answers, lambda: AddressGuard().resolve("mixed.test", 443))
    assert refused.value.reason == f"mixed.test resolves to 10.0.0.5, which is a private address — {LIFT}"


def test_a_bracketed_ipv6_literal_is_named_as_the_address() -> None:
    """The model is told `::1 is a loopback address`, not that `[::1]` resolves to something."""
    with pytest.raises(BlockedAddress) as refused:
        asyncio.run(AddressGuard().resolve("[::1]", 80))
    assert refused.value.reason == f"::1 is a loopback address — {LIFT}"


def test_the_allow_list_lifts_the_refusal_by_network_or_by_name() -> None:
    """fetchAllow: a CIDR (an IPv6 one in brackets too) or a host name, in any case, trailing dot or not."""
    guard = AddressGuard([" 10.0.0.0/8 ", "[fd00::/8]", "Intranet.Example."])
    guard.check("10.1.2.3", ipaddress.ip_address("10.1.2.3"))
    guard.check("fd00::5", ipaddress.ip_address("fd00::5"))
    guard.check("intranet.example", ipaddress.ip_address("192.168.1.1"))
    guard.check("INTRANET.example.", ipaddress.ip_address("192.168.1.1"))
    # A network written with its host bits set (`192.168.1.5/24`, as people write them) is that network.
    AddressGuard(["192.168.1.5/24"]).check("192.168.1.77", ipaddress.ip_address("192.168.1.77"))
    # The name lifts the refusal for that name only, not for the address it resolves to.
    with pytest.raises(BlockedAddress):
        guard.check("other.example", ipaddress.ip_address("192.168.1.1"))


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("::ffff:8.8.8.8", None),  # IPv4-mapped, public inside
        ("2002:808:808::1", None),  # 6to4 of a public address
        ("64:ff9b::808:808", None),  # NAT64 of a public address
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", None),  # Teredo, client 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a loopback address (as 127.0.0.1 inside an IPv6 address)"),
        ("2002:a00:1::", "a private address (as 10.0.0.1 inside an IPv6 address)"),
        ("::ffff:100.64.0.1", "a carrier-grade NAT address (as 100.64.0.1 inside an IPv6 address)"),
        ("100.100.100.200", "a cloud metadata address"),
    ],
)
def test_an_ipv6_form_is_judged_by_the_ipv4_address_it_carries(address: str, kind: str | None) -> None:
    """A public address in an IPv6 wrapping is fetched; an internal one is refused and named in the reason."""
    assert blocked_kind(ipaddress.ip_address(address)) == kind


class _Inner:
    """Stands in for httpcore's backend: fails to connect to the addresses in `refuse`, records the attempts."""

    def __init__(self, refuse: set[str], silent: frozenset[str] = frozenset()):
        self.refuse, self.silent, self.attempts = refuse, silent, []

    async def connect_tcp(self, address: str, port: int, *_: Any) -> str:
        self.attempts.append(address)
        if address in self.refuse:
            raise httpcore.ConnectError(f"{address} refused")
        if address in self.silent:
            raise httpcore.ConnectTimeout(f"{address} timed out")
        return f"stream to {address}:{port}"


def _backend(refuse: set[str], silent: frozenset[str] = frozenset()) -> tuple[GuardedBackend, _Inner]:
    backend = GuardedBackend(AddressGuard())
    inner = _Inner(refuse, silent)
    backend.inner = inner  # type: ignore[assignment]
    return backend, inner


def test_the_backend_tries_the_vetted_addresses_in_turn() -> None:
    """A site whose first address is down is still fetched through its next one."""
    backend, inner = _backend({"93.184.215.14"})
    answers = {"example.test": ["93.184.215.14", "93.184.215.15"]}
    assert resolving(answers, lambda: backend.connect_tcp("example.test", 443)) == "stream to 93.184.215.15:443"
    assert inner.attempts == ["93.184.215.14", "93.184.215.15"]


def test_an_address_that_times_out_is_skipped_too() -> None:
    """A dead first address that swallows the connection (no refusal, a timeout) does not fail the fetch."""
    backend, inner = _backend(set(), silent=frozenset({"2606:4700::1"}))
    answers = {"example.test": ["2606:4700::1", "93.184.215.14"]}
    assert resolving(answers, lambda: backend.connect_tcp("example.test", 443)) == "stream to 93.184.215.14:443"
    assert inner.attempts == ["2606:4700::1", "93.184.215.14"]


def test_the_backend_reports_the_last_failure_when_no_address_answers() -> None:
    """When every address is down the model is told why the last one failed."""
    backend, _ = _backend({"93.184.215.14", "93.184.215.15"})
    answers = {"example.test": ["93.184.215.14", "93.184.215.15"]}
    with pytest.raises(httpcore.ConnectError, match=r"^93\.184\.215\.15 refused$"):
        resolving(answers, lambda: backend.connect_tcp("example.test", 443))


def test_the_backend_connects_to_nothing_when_a_name_has_an_internal_answer() -> None:
    """The refusal comes before any connection: no byte goes to the internal address, nor to the public one."""
    backend, inner = _backend(set())
    with pytest.raises(BlockedAddress):
        resolving({"mixed.test": ["93.184.215.14", "127.0.0.1"]}, lambda: backend.connect_tcp("mixed.test", 80))
    assert inner.attempts == []


def test_an_unresolvable_name_is_a_connect_error_naming_the_host() -> None:
    """A typo in a URL reads `cannot resolve <host>: …`, a connection failure rather than a crash."""
    backend, _ = _backend(set())
    with pytest.raises(httpcore.ConnectError, match=r"^cannot resolve nowhere\.test: Name or service not known$"):
        resolving({}, lambda: backend.connect_tcp("nowhere.test", 80))


def test_a_host_the_policy_refuses_is_refused_with_its_reason_and_never_looked_up() -> None:
    """A channel's allow-list is asked before DNS: a host outside it is refused in the policy's words, and no
    lookup says to the resolver which name the model tried."""
    looked_up: list[str] = []

    async def lookup(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["192.0.2.7"]

    allowed = AddressGuard(["192.0.2.0/24"], policy=EgressPolicy("allow", expand(["api.example.test"])), lookup=lookup)
    with pytest.raises(BlockedAddress) as refused:
        asyncio.run(allowed.resolve("other.example.test", 443))
    assert refused.value.reason == NOT_LISTED.format(host="other.example.test")
    assert looked_up == []
    assert asyncio.run(allowed.resolve("api.example.test", 443)) == ["192.0.2.7"]
    assert looked_up == ["api.example.test"]


def test_a_literal_address_is_vetted_as_itself_and_never_looked_up() -> None:
    """http://192.0.2.7/ or http://[2001:db8::7]/ names its address: it is checked as written, with no DNS asked
    (a resolver could answer something else for the text)."""

    async def lookup(host: str, port: int) -> list[str]:
        raise AssertionError(f"{host} was looked up")

    allowed = AddressGuard(["192.0.2.0/24", "2001:db8::/32"], lookup=lookup)
    assert asyncio.run(allowed.resolve("192.0.2.7", 80)) == ["192.0.2.7"]
    assert asyncio.run(allowed.resolve("[2001:db8::7]", 80)) == ["2001:db8::7"]
    with pytest.raises(BlockedAddress, match=r"^10\.0\.0\.1 is a private address"):
        asyncio.run(AddressGuard(lookup=lookup).resolve("10.0.0.1", 80))


def test_unix_sockets_are_never_fetched() -> None:
    """A unix socket would reach a local service without any address to vet."""
    with pytest.raises(httpcore.ConnectError, match="unix sockets are not fetched"):
        asyncio.run(GuardedBackend(AddressGuard()).connect_unix_socket("/var/run/docker.sock"))


def test_the_workers_own_address_is_refused_inside_an_ipv6_form_too(monkeypatch) -> None:
    """An address of the worker's that the classification calls public, written as ::ffff:a.b.c.d."""
    own = ipaddress.ip_address("8.8.8.8")  # only classified: no packet is sent
    monkeypatch.setattr(guard, "own_addresses", lambda: frozenset({own}))
    for written in ("8.8.8.8", "::ffff:8.8.8.8", "::ffff:808:808"):
        with pytest.raises(BlockedAddress, match="this worker's own address"):
            AddressGuard().check("x.example", ipaddress.ip_address(written))


def _listed_by_ip() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    listed = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    return {ipaddress.ip_address(a["local"]) for link in listed for a in link.get("addr_info", [])}


@pytest.fixture
def own_clock(monkeypatch) -> Iterator[HandClock]:
    """The guard's clock, moved by the test, from a cache with nothing read: what another test (or a thread of
    this process) read before does not count, and what this test reads is dropped after it."""
    clock = HandClock()
    monkeypatch.setattr(guard, "time", clock)
    guard.forget_own_addresses()
    yield clock
    guard.forget_own_addresses()


@needs_system("ip", "iproute2")
def test_the_workers_own_addresses_are_every_address_of_its_interfaces() -> None:
    """Read from the kernel's tables, IPv4 and IPv6: each address `ip` lists is one of them, loopback included.
    (Tests in other processes add and remove addresses here: one `ip` lists before the read and after it counts.)"""
    before = _listed_by_ip()
    guard.forget_own_addresses()
    own = guard.own_addresses()
    steady = before & _listed_by_ip()
    assert ipaddress.ip_address("127.0.0.1") in steady
    assert steady <= own


def test_the_own_addresses_are_read_once_then_again_after_their_ttl(own_clock: HandClock) -> None:
    """Not a read of the kernel's tables per connection, and an address the worker gains is known within the ttl:
    what was read stands for OWN_ADDRESSES_TTL seconds, then the tables are read again (a new set)."""
    first = guard.own_addresses()
    assert ipaddress.ip_address("127.0.0.1") in first
    assert guard.own_addresses() is first
    own_clock.now += guard.OWN_ADDRESSES_TTL
    assert guard.own_addresses() is first  # at its ttl, still what was read
    own_clock.now += 1
    again = guard.own_addresses()
    assert again is not first and again == first


def test_threads_that_ask_at_once_past_the_ttl_share_one_read(own_clock: HandClock) -> None:
    """Fetches, the sandbox's network and the egress proxy ask from several threads: with nothing read yet (or
    past the ttl) they all get the one set read, and a slower reader does not store its own over it."""
    start = threading.Barrier(16)

    def ask(_: int) -> frozenset[object]:
        start.wait()
        return guard.own_addresses()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    kept = guard.own_addresses()
    assert all(answer is kept for answer in answers)


def test_a_transport_given_a_trust_store_verifies_servers_against_it() -> None:
    """The egress proxy forwards with its own trust store (a forge's CA): the connection takes that store, and
    without it the same server is refused as unverified."""
    ca = CertificateAuthority()
    trusting = ssl.create_default_context(cadata=ca.authority().certificate_pem().decode())
    allow = AddressGuard(["127.0.0.1/32"])

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def get(transport: httpx.AsyncHTTPTransport, port: int) -> str:
        async with httpx.AsyncClient(transport=transport) as client:
            return (await client.get(f"https://127.0.0.1:{port}/")).text

    async def scenario() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=ca.context_for("127.0.0.1"))
        async with server:
            port = server.sockets[0].getsockname()[1]
            assert await get(guarded_transport(allow, trusting), port) == "ok"
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await get(guarded_transport(allow), port)

    try:
        asyncio.run(scenario())
    finally:
        ca.close()
