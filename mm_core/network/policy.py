"""The egress policy: which hosts a sandboxed command and fetch_content may reach (docs/network.md).

One decision, `EgressPolicy.refusal(host, port)`, taken by the sandbox's proxy for every CONNECT and plain
request and by fetch_content for every connection it opens (redirects and robots.txt included). It judges the
name the client asked for; the addresses that name resolves to are judged afterwards by the SSRF guard
(mm_core/tools/fetch/guard.py), so an allowed name that resolves inside the network is still refused.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Literal

import yaml

if TYPE_CHECKING:
    from mm_core.config import NetworkConfig, NetworkCredential

Mode = Literal["off", "allow", "open"]
# The ports an allow-list entry without one covers: plain HTTP and HTTPS.
DEFAULT_PORTS = (80, 443)

NOT_LISTED = "network: host {host} is not in this channel's allow-list"
PORT_NOT_LISTED = "network: port {port} of {host} is not in this channel's allow-list"
NETWORK_OFF = "network: this channel's network is off"
NO_SECRET = "network: the credentials for {host} are not set on this worker ({env} is empty)"
ENTRY_EXPECTED = "expected a host name, *.domain, host:port, an address or a preset ({presets})"


@functools.cache
def presets() -> dict[str, tuple[str, ...]]:
    """The named host sets (presets.yaml), by name."""
    text = resources.files("mm_core.network").joinpath("presets.yaml").read_text(encoding="utf-8")
    return {name: tuple(hosts) for name, hosts in yaml.safe_load(text).items()}


def normal_host(host: str) -> str:
    """A host as the policy compares it: lower case, no brackets or trailing dot, IDNA (xn--) for a
    non-ASCII name, an address in its canonical form."""
    host = host.strip().strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host.isascii():
        host = host.encode("idna").decode("ascii")
    return host


def _valid_name(name: str) -> bool:
    labels = name.split(".")
    return (
        0 < len(name) <= 253
        and all(0 < len(label) <= 63 for label in labels)
        and all(c.isalnum() or c in "-_" for label in labels for c in label)
        and not any(label.startswith("-") or label.endswith("-") for label in labels)
    )


@dataclass(frozen=True)
class Rule:
    """One allow-list entry: an exact host, or (`suffix`) every name under `.host`; a port, or 80 and 443."""

    host: str
    suffix: bool = False
    port: int | None = None

    def covers_host(self, host: str) -> bool:
        return host.endswith("." + self.host) if self.suffix else host == self.host

    def covers(self, host: str, port: int) -> bool:
        return self.covers_host(host) and (port in DEFAULT_PORTS if self.port is None else port == self.port)


def parse_rule(entry: str) -> Rule:
    """One allow-list entry other than a preset; ValueError says what is wrong with it."""
    expected = ENTRY_EXPECTED.format(presets=", ".join(presets()))
    if not isinstance(entry, str) or not entry.strip() or any(c.isspace() for c in entry.strip()):
        raise ValueError(f"{expected}, got {entry!r}")
    text = entry.strip()
    if "://" in text or "/" in text or "@" in text:
        raise ValueError(f"{expected} (a host, not a URL), got {entry!r}")
    host, port = text, None
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        host = inside
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{expected}, got {entry!r}")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    number = None
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{expected}: the port must be 1 to 65535, got {entry!r}")
        number = int(port)
    try:
        return Rule(str(ipaddress.ip_address(host)), port=number)
    except ValueError:
        pass
    if host == "*":
        raise ValueError(f"{expected}, got {entry!r} (for every host, `network: open`)")
    suffix = host.startswith("*.")
    name = normal_host(host[2:] if suffix else host)
    if "*" in name or not _valid_name(name) or (suffix and "." not in name):
        detail = " (a wildcard covers a domain's subdomains: *.example.com)" if "*" in host else ""
        raise ValueError(f"{expected}, got {entry!r}{detail}")
    return Rule(name, suffix=suffix, port=number)


def expand(entries: Iterable[str]) -> tuple[Rule, ...]:
    """The rules of an allow-list, presets expanded; ValueError names the first bad entry."""
    rules: list[Rule] = []
    for entry in entries:
        named = presets().get(entry.strip()) if isinstance(entry, str) else None
        if named is not None:
            rules += [parse_rule(host) for host in named]
        elif isinstance(entry, str) and entry.strip().isidentifier():
            name = entry.strip()
            raise ValueError(
                f"unknown preset {name!r} (presets: {', '.join(presets())}; a host of one label takes its port: "
                f"{name}:443)"
            )
        else:
            rules.append(parse_rule(entry))
    return tuple(dict.fromkeys(rules))


def credential_header(credential: NetworkCredential, secret: str) -> str:
    """The Authorization header's value a credential adds, for its secret."""
    if credential.scheme == "basic":
        return "Basic " + base64.b64encode(f"{credential.username}:{secret}".encode()).decode("ascii")
    return f"{'Bearer' if credential.scheme == 'bearer' else 'token'} {secret}"


@dataclass(frozen=True)
class EgressPolicy:
    """A channel's (or a job's) network, as the proxy and fetch_content apply it."""

    mode: Mode
    rules: tuple[Rule, ...] = ()
    # The Authorization header added for each credentialed host (its secret read from the worker's environment),
    # or the refusal saying which variable is missing.
    headers: Mapping[str, str] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, config: NetworkConfig, environ: Mapping[str, str]) -> EgressPolicy:
        headers: dict[str, str] = {}
        missing: dict[str, str] = {}
        for credential in config.credentials:
            # A secret from a file or a Secret often ends in a newline, which no header may hold.
            secret = environ.get(credential.tokenEnv, "").strip()
            for host in credential.hosts:
                name = normal_host(host)
                if secret:
                    headers[name] = credential_header(credential, secret)
                else:
                    missing[name] = NO_SECRET.format(host=name, env=credential.tokenEnv)
        return cls(config.policy, expand(config.allow), headers, missing)

    def refusal(self, host: str, port: int) -> str | None:
        """Why a connection to `host:port` is refused by this policy, None when it may go on (to the SSRF
        guard's check of the addresses)."""
        name = normal_host(host)
        if self.mode == "open":
            return None
        if self.mode == "off":
            return NETWORK_OFF
        if any(rule.covers(name, port) for rule in self.rules):
            return None
        if any(rule.covers_host(name) for rule in self.rules):
            return PORT_NOT_LISTED.format(host=name, port=port)
        return NOT_LISTED.format(host=name)

    def header_for(self, host: str) -> str | None:
        """The Authorization header the proxy adds for `host`, None for a host without credentials."""
        return self.headers.get(normal_host(host))

    @property
    def credentialed(self) -> frozenset[str]:
        """The hosts whose TLS the proxy terminates to add a credential (those whose secret is missing too:
        they are refused with the reason rather than reached without it)."""
        return frozenset(self.headers) | frozenset(self.missing)
