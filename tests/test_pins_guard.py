"""Pins for fetch_content's address guard (mutation pass, issue 8): public addresses go through, a name with
one internal answer is refused, the allow list lifts the refusal, and the backend connects only to vetted
addresses. Nothing here leaves the machine: literal addresses are never resolved, host names are answered by
a stand-in for the event loop's getaddrinfo, and the connecting backend is a stand-in too."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpcore
import pytest

from mm_core.tools.fetch import guard
from mm_core.tools.fetch.errors import BlockedAddress
from mm_core.tools.fetch.guard import AddressGuard, GuardedBackend, blocked_kind

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
