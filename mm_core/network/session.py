"""One connection of a sandboxed command to the egress proxy: its requests decided, then tunnelled, forwarded
with a credential added, or refused with the reason.

Every decision is the policy's (`EgressPolicy.refusal`, then a missing secret) and the SSRF guard's (the
addresses the name resolves to): a CONNECT to a host without credentials becomes a tunnel to the address the
guard vetted, the name resolved once; a CONNECT to a credentialed host ends the command's TLS here (a
certificate of the proxy's authority, ca.py) and each request inside is sent on to the host with httpx over
TLS verified against the operator's trust, its Authorization header replaced by the credential's; a plain
http:// request is forwarded as it is, never with a credential. httpx opens its connections through the same
guard (GuardedBackend), which resolves and vets again: no socket reaches an address the guard did not vet.

Nothing the client sends is trusted: a request head is bounded in size and time (h1.py, `Limits`), bodies
stream through (never held whole), and the credential goes nowhere but to its host over verified TLS, is never
logged and never written back in a text of the proxy's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import urllib.parse
from dataclasses import dataclass

import h11
import httpx

from mm_core.errors import CoreError
from mm_core.network.ca import Authority, CertificateAuthority
from mm_core.network.h1 import Client, ClientGone, end_to_end, has_body
from mm_core.network.policy import EgressPolicy, normal_host
from mm_core.network.splice import Stream, splice
from mm_core.network.tap import Tap
from mm_core.tools.fetch.errors import BlockedAddress
from mm_core.tools.fetch.guard import AddressGuard, guarded_transport

log = logging.getLogger(__name__)

UNRESOLVED = "network: host {host} could not be resolved"
UNREACHABLE = "network: host {host} could not be reached ({reason})"
HANDSHAKE = "network: the command's TLS for {host} with the proxy failed ({reason})"
UNREADABLE = "network: the proxy could not read this request as HTTP/1.1"
NOT_PROXIED = "network: the proxy takes CONNECT host:port and plain http:// requests, nothing else"
EARLY_DATA = "network: bytes came before the tunnel to {host} was established"
NOT_A_PATH = "network: a request inside the tunnel to {host} names a path (/…), not a URL"
TOO_MANY = "network: more than {limit} connections to the proxy at once"
NO_TRACE = "network: {method} is not sent to {host}, whose requests carry a credential (the answer would echo it)"
MAX_NAME = 253
BAD_CREDENTIAL = "network: the credentials for {host} on this worker are no valid HTTP header value"


@dataclass(frozen=True)
class Limits:
    """The bounds a hostile command meets: connections of one listener at once (more are answered 503), the
    time to send a request head (and the TLS handshake, and the next request of a kept-alive connection), the
    time a tunnel or a transfer may pass no byte, the time to connect to a host, and the connections of the whole
    process."""

    max_connections: int = 64
    # Connections of every listener of the process at once: past it a new one is closed unanswered, so that
    # commands (and their background jobs, each with a listener) cannot take the worker's file descriptors.
    max_process_connections: int = 512
    head_timeout: float = 30.0
    idle_timeout: float = 600.0
    connect_timeout: float = 15.0


class Refusal(CoreError):
    """A request the proxy answers itself, with `status` and `text`; `host`, when the refusal is about one, is
    recorded on the tap (as refused, or as failed when the host could not be resolved or reached)."""

    def __init__(self, status: int, text: str, host: str | None = None, *, refused: bool = False) -> None:
        super().__init__(text)
        self.status, self.text, self.host, self.refused = status, text, host, refused


@dataclass(frozen=True)
class Gate:
    """What the sessions of one listener decide with and go through."""

    policy: EgressPolicy
    guard: AddressGuard
    http: httpx.AsyncClient
    ca: CertificateAuthority
    authority: Authority  # the one current when the command started: the one its bundle holds
    limits: Limits
    tap: Tap


def upstream_client(guard: AddressGuard, ssl_context: ssl.SSLContext, limits: Limits) -> httpx.AsyncClient:
    """The client that forwards requests: as fetch_content's (mm_core/tools/fetch/http.py make_client), every
    connection opens through the guard; redirections go back to the command (which asks the proxy again), no
    proxy is taken from the environment, and servers' certificates are verified against `ssl_context`."""
    transport = guarded_transport(
        guard, ssl_context, max_connections=limits.max_connections, keepalive_expiry=limits.head_timeout
    )
    return httpx.AsyncClient(
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        timeout=httpx.Timeout(limits.idle_timeout, connect=limits.connect_timeout),
    )


def _reason(exc: BaseException, authorization: str | None = None) -> str:
    """An error's words for the command, never with the credential in them (an error about a request may
    quote its headers, as bytes)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__
    secret = (authorization or "").partition(" ")[2] or authorization
    if secret and (secret in text or repr(secret.encode())[2:-1] in text):
        return f"{type(exc).__name__} about the request with the credential"
    return text


def _header_value(authorization: str) -> bool:
    """Whether h11 takes `authorization` as a header's value (a secret may hold a line break): one it refuses
    would be quoted in its error."""
    try:
        h11.Request(method="GET", target="/", headers=[("Host", "h"), ("Authorization", authorization)])
    except (h11.LocalProtocolError, UnicodeError):
        return False
    return True


def _authority(target: bytes) -> tuple[str, int]:
    """CONNECT's host:port; Refusal 400 for anything else."""
    try:
        parts = urllib.parse.urlsplit("//" + target.decode("ascii"))
        host, port = parts.hostname, parts.port
        plain = not (parts.path or parts.query or parts.fragment or "@" in parts.netloc)
    except (UnicodeError, ValueError):
        host, port, plain = None, None, False
    # A name is at most 253 characters: a longer one would only carry the command's text into every refusal.
    if not host or port is None or not plain or len(host) > MAX_NAME:
        raise Refusal(400, NOT_PROXIED)
    return normal_host(host), port


def _absolute(target: bytes) -> httpx.URL:
    """A plain request's http:// URL, without user information or fragment; Refusal 400 for another form (a
    path alone, https://, which goes through CONNECT)."""
    try:
        url = httpx.URL(target.decode("ascii"))
        if url.scheme == "http" and url.host and len(url.host) <= MAX_NAME:
            return httpx.URL(scheme="http", host=normal_host(url.host), port=url.port, raw_path=url.raw_path)
    except (UnicodeError, httpx.InvalidURL):  # UnicodeError: a name IDNA cannot encode
        pass
    raise Refusal(400, NOT_PROXIED)


def _inside(host: str, port: int, target: bytes) -> httpx.URL:
    """The URL of a request inside the tunnel to host:port, which names a path; Refusal 400 for another form."""
    try:
        if target.startswith(b"/"):
            return httpx.URL(scheme="https", host=host, port=port, raw_path=target)
    except httpx.InvalidURL:
        pass
    raise Refusal(400, NOT_A_PATH.format(host=host))


class Session:
    """One client connection, served to its end (`run`); its owner closes it then."""

    def __init__(self, client: Client, gate: Gate) -> None:
        self.client, self.gate = client, gate

    async def run(self) -> None:
        try:
            await self._serve()
        except Refusal as refusal:
            self._record(refusal)
            await self._answer(refusal.status, refusal.text)
        except h11.RemoteProtocolError as exc:
            log.debug("egress: an unreadable request: %s", exc)
            await self._answer(exc.error_status_hint, UNREADABLE)
        except (OSError, ClientGone, h11.LocalProtocolError, httpx.HTTPError) as exc:
            # The client or the server went away, or a timeout: nothing can be answered any more.
            log.debug("egress: a connection ends: %r", exc)
        except Exception:  # a flaw met by one connection is logged, and ends that one only
            log.exception("egress: a connection failed")

    def _record(self, refusal: Refusal) -> None:
        log.debug("egress: %s (%d)", refusal.text, refusal.status)
        if refusal.host is not None:
            record = self.gate.tap.refuse if refusal.refused else self.gate.tap.fail
            record(refusal.host, refusal.text)

    async def _answer(self, status: int, text: str) -> None:
        if self.client.can_answer():
            with contextlib.suppress(OSError, h11.LocalProtocolError):
                await self.client.answer(status, text)
                await self.client.linger()

    async def _next_request(self) -> h11.Request | None:
        async with asyncio.timeout(self.gate.limits.head_timeout):
            return await self.client.request()

    async def _serve(self) -> None:
        while (request := await self._next_request()) is not None:
            if request.method == b"CONNECT":
                await self._connect(request)
                return
            await self._plain(request)
            if not self.client.next_cycle():
                return

    async def _decide(self, host: str, port: int, *, credentialed: bool = False) -> list[str]:
        """The vetted addresses of host:port; Refusal when the policy, a missing secret (for a credentialed
        host) or the SSRF guard refuses it, or when it cannot be resolved."""
        policy = self.gate.policy
        refusal = policy.refusal(host, port) or (policy.missing.get(host) if credentialed else None)
        if refusal is not None:
            raise Refusal(403, refusal, host, refused=True)
        try:
            addresses = await self.gate.guard.resolve(host, port)
        except BlockedAddress as exc:
            raise Refusal(403, exc.reason, host, refused=True) from None
        except (OSError, UnicodeError):  # UnicodeError: a name the resolver cannot encode
            addresses = []
        if not addresses:
            raise Refusal(502, UNRESOLVED.format(host=host), host)
        return addresses

    async def _connect(self, request: h11.Request) -> None:
        host, port = _authority(request.target)
        await self.client.end_of_request()
        credentialed = host in self.gate.policy.credentialed
        addresses = await self._decide(host, port, credentialed=credentialed)
        authorization = self.gate.policy.header_for(host)
        if authorization is None:  # a credentialed host whose secret is missing was refused
            await self._tunnel(host, port, addresses)
        elif not _header_value(authorization):
            raise Refusal(403, BAD_CREDENTIAL.format(host=host), host, refused=True)
        else:
            await self._intercept(host, port, authorization)

    async def _open(self, host: str, port: int, addresses: list[str]) -> Stream:
        """A connection to the first of the vetted addresses that answers (never to the name: it is not
        resolved again)."""
        failure: OSError = TimeoutError()
        for address in addresses:
            try:
                async with asyncio.timeout(self.gate.limits.connect_timeout):
                    return await asyncio.open_connection(address, port)
            except OSError as exc:  # TimeoutError included
                failure = exc
        # The system's words for the error ("Connection refused"), not asyncio's, which name the address.
        reason = os.strerror(failure.errno) if failure.errno else _reason(failure)
        raise Refusal(502, UNREACHABLE.format(host=host, reason=reason), host)

    async def _tunnel(self, host: str, port: int, addresses: list[str]) -> None:
        upstream = await self._open(host, port, addresses)
        try:
            await self.client.respond(200, [], b"Connection established")
            self.gate.tap.reach(host)
            log.debug("egress: CONNECT %s:%d tunnelled to %s", host, port, upstream[1].get_extra_info("peername"))
            if early := self.client.trailing():
                upstream[1].write(early)
            await splice((self.client.reader, self.client.writer), upstream, self.gate.limits.idle_timeout)
        finally:
            upstream[1].close()

    async def _intercept(self, host: str, port: int, authorization: str) -> None:
        """The command's TLS ended here with a certificate for `host`; each request inside is forwarded with
        the credential."""
        if self.client.trailing():
            # TLS bytes sent before the answer would be read as plain text once TLS starts: a client waits.
            raise Refusal(400, EARLY_DATA.format(host=host))
        context = await asyncio.to_thread(self.gate.ca.context_for, host, self.gate.authority)
        await self.client.respond(200, [], b"Connection established")
        try:
            await self.client.writer.start_tls(context, ssl_handshake_timeout=self.gate.limits.head_timeout)
        except OSError as exc:  # TimeoutError and ssl.SSLError included
            self.gate.tap.fail(host, HANDSHAKE.format(host=host, reason=_reason(exc)))
            raise
        log.debug("egress: CONNECT %s:%d intercepted to add its credential", host, port)
        self.client.restart()
        while (request := await self._next_request()) is not None:
            url = _inside(host, port, request.target)
            await self._forward(request, url, authorization)
            if not self.client.next_cycle():
                return

    async def _plain(self, request: h11.Request) -> None:
        url = _absolute(request.target)
        await self._decide(url.host, url.port or 80)
        # No credential over plain http, ever: the secret would cross the network in clear text. The client's
        # own headers (its own Authorization included) go as they came.
        await self._forward(request, url, None)

    async def _forward(self, request: h11.Request, url: httpx.URL, authorization: str | None) -> None:
        """`request` sent on to `url` and its response streamed back; with `authorization`, the client's own
        Authorization header replaced by it."""
        if authorization is not None and request.method.upper() in (b"TRACE", b"TRACK"):
            raise Refusal(405, NO_TRACE.format(method=request.method.decode("ascii"), host=url.host))
        headers = end_to_end(request.headers, drop=(b"authorization",) if authorization is not None else ())
        if authorization is not None:
            headers.append((b"authorization", authorization.encode()))
        if has_body(request):
            body = self.client.body()
        else:
            body = None
            await self.client.end_of_request()
        outgoing = httpx.Request(request.method.decode("ascii"), url, headers=headers, content=body)
        response = await self._send(outgoing, authorization)
        try:
            self.gate.tap.reach(url.host)
            log.debug("egress: %s %s:%s answered %d", outgoing.method, url.host, url.port, response.status_code)
            reason = response.extensions.get("reason_phrase", b"")
            await self.client.respond(response.status_code, end_to_end(response.headers.raw), reason)
            async for chunk in response.aiter_raw():
                await self.client.send(h11.Data(data=chunk))
            await self.client.send(h11.EndOfMessage())
        finally:
            await response.aclose()

    async def _send(self, outgoing: httpx.Request, authorization: str | None) -> httpx.Response:
        host = outgoing.url.host
        try:
            return await self.gate.http.send(outgoing, stream=True)
        except BlockedAddress as exc:  # the name resolved to an internal address this time
            raise Refusal(403, exc.reason, host, refused=True) from None
        except httpx.TransportError as exc:
            reason = _reason(exc, authorization)
            raise Refusal(502, UNREACHABLE.format(host=host, reason=reason), host) from None
