"""The egress proxy (mm_core/network/proxy.py): a sandboxed command's only way out with `network: allow` (issue 26).

The proxy's listener here is a socket of the test process on 127.0.0.1 (the worker binds it inside the sandbox's
namespace instead); the servers it reaches are the test's, in a network namespace of their own
(mm_testkit/netlab.py), at an address the SSRF guard calls public and at a private one, under names only the
test's resolver knows. Each test looks at what the server received and what the client was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import http.client
import os
import resource
import socket
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from cryptography import x509

from mm_core.config import NetworkConfig, NetworkCredential
from mm_core.network.ca import CertificateAuthority, system_roots
from mm_core.network.h1 import end_to_end
from mm_core.network.policy import NO_SECRET, NOT_LISTED, PORT_NOT_LISTED, EgressPolicy, expand
from mm_core.network.proxy import EgressProxy, Limits, Tap, egress_proxy
from mm_core.network.session import BAD_CREDENTIAL, NO_TRACE, NOT_PROXIED, TOO_MANY, UNREACHABLE, UNREADABLE, UNRESOLVED
from mm_core.network.tap import MAX_HOSTS
from mm_testkit.fixtures_forge import FORGE_TOKEN, git_env
from mm_testkit.fixtures_kit import needs_system
from mm_testkit.netlab import Lab, serve_each
from playground.forge_server import ForgeServer
from playground.forge_tls import make_certificates, server_context
from playground.server_thread import ThreadedAiohttpServer

SECRET = "s3cret-token-of-the-worker"
TOKEN_ENV, EMPTY_ENV = "MM_TEST_EGRESS_TOKEN", "MM_TEST_EGRESS_EMPTY"
PLAIN, API, TUNNEL, INSIDE, NO_SECRET_HOST, BAD, OTHER = (
    "plain.test",
    "api.test",
    "tunnel.test",
    "inside.test",
    "nosecret.test",
    "bad.test",
    "other.test",
)
LIFT = "fetching internal addresses is not allowed (fetchAllow in the config lifts this)"
MIB = 1024 * 1024
PATTERN = bytes(range(256)) * 4096  # 1 MiB
BIG = 8  # MiB of /big


@dataclass(frozen=True)
class Seen:
    """A request a server got."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    size: int
    sha256: str

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


class Upstream(ThreadedAiohttpServer):
    """A server of the lab that records the requests it gets: `/big` sends BIG MiB, `/endless` sends until the
    client goes (then `ended` is set), `/cut` announces 1 MiB and closes after 64 KiB, any other path answers the
    size and SHA-256 of the body it read."""

    def __init__(self, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(sock=sock, ssl_context=ssl_context)
        self.seen: list[Seen] = []
        self.ended = threading.Event()

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/big", self.big)
        app.router.add_get("/endless", self.endless)
        app.router.add_get("/cut", self.cut)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        return app

    async def record(self, request: web.Request) -> Seen:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.content.iter_any():  # streamed: no size limit
            digest.update(chunk)
            size += len(chunk)
        seen = Seen(request.method, request.path_qs, tuple(request.headers.items()), size, digest.hexdigest())
        self.seen.append(seen)
        return seen

    async def echo(self, request: web.Request) -> web.StreamResponse:
        seen = await self.record(request)
        return web.json_response({"size": seen.size, "sha256": seen.sha256})

    async def big(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        response = web.StreamResponse(headers={"Content-Length": str(BIG * MIB)})
        await response.prepare(request)
        for _ in range(BIG):
            await response.write(PATTERN)
        return response

    async def endless(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            while True:
                await response.write(PATTERN[: 64 * 1024])
                # A write into a lost TLS connection neither fails nor waits: without a pause, the loop would
                # never learn that the connection is gone.
                await asyncio.sleep(0)
        finally:
            self.ended.set()

    async def cut(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        response = web.StreamResponse(headers={"Content-Length": str(MIB)})
        await response.prepare(request)
        await response.write(PATTERN[: 64 * 1024])
        assert request.transport is not None
        request.transport.abort()
        return response


def until_eof_server(sock: socket.socket) -> None:
    """Serves `sock` from a thread: reads each connection to its end of file, then answers how many bytes came."""

    def count(conn: socket.socket, _peer: tuple[str, int]) -> None:
        total = 0
        while data := conn.recv(65536):
            total += len(data)
        conn.sendall(str(total).encode())

    serve_each(sock, count)


@dataclass
class World:
    """The lab's servers, the channel's policy, and a proxy resolving the test's names."""

    lab: Lab
    plain: Upstream  # http, at the public address
    tls: Upstream  # https, certificate of the test's CA for API, TUNNEL and NO_SECRET_HOST
    bad: Upstream  # https, certificate of another CA
    private: Upstream  # http, at the private address
    until_eof: socket.socket
    closed_port: int  # nothing listens there
    test_ca: ssl.SSLContext  # trusts the test's CA only
    policy: EgressPolicy
    proxy: EgressProxy

    def serve(self, fetch_allow: Sequence[str] = (), until_fd: int | None = None) -> tuple[Tap, int]:
        return serve(self.proxy, self.policy, fetch_allow, until_fd)

    def client(self, port: int, verify: ssl.SSLContext | None = None) -> httpx.Client:
        """An httpx client going through the proxy, trusting what the sandbox would (the bundle) by default."""
        verify = verify or ssl.create_default_context(cafile=self.proxy.bundle_path())
        return httpx.Client(proxy=f"http://127.0.0.1:{port}", verify=verify, timeout=30, trust_env=False)


def serve(
    proxy: EgressProxy, policy: EgressPolicy, fetch_allow: Sequence[str] = (), until_fd: int | None = None
) -> tuple[Tap, int]:
    """The proxy serving a new listener of the test process: its tap and port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    return proxy.serve(listener, policy, fetch_allow, until_fd), port


@pytest.fixture
def world(lab: Lab) -> Iterator[World]:
    certs = make_certificates((API, TUNNEL, NO_SECRET_HOST))
    plain = Upstream(lab.listen(lab.public)).start()
    tls = Upstream(lab.listen(lab.public), server_context(certs)).start()
    bad = Upstream(lab.listen(lab.public), server_context(make_certificates((BAD,)))).start()
    private = Upstream(lab.listen(lab.private)).start()
    until_eof = lab.listen(lab.public)
    until_eof_server(until_eof)
    with lab.listen(lab.public) as gone:
        closed_port = gone.getsockname()[1]
    eof_port = until_eof.getsockname()[1]
    allow = [
        f"{PLAIN}:{plain.port}",
        f"{API}:{tls.port}",
        f"{API}:{plain.port}",  # plain http to a credentialed host
        f"{TUNNEL}:{tls.port}",
        f"{TUNNEL}:{eof_port}",
        f"{TUNNEL}:{closed_port}",
        f"{INSIDE}:{private.port}",
        f"{NO_SECRET_HOST}:{tls.port}",
        f"{BAD}:{bad.port}",
        "nowhere.test",
    ]
    credentials = [
        NetworkCredential(hosts=[API, BAD], tokenEnv=TOKEN_ENV),
        NetworkCredential(hosts=[NO_SECRET_HOST], tokenEnv=EMPTY_ENV),
    ]
    policy = EgressPolicy.of(
        NetworkConfig(policy="allow", allow=allow, credentials=credentials), {TOKEN_ENV: SECRET, EMPTY_ENV: ""}
    )
    names = {name: lab.public for name in (PLAIN, API, TUNNEL, NO_SECRET_HOST, BAD, OTHER)} | {INSIDE: lab.private}
    test_ca = ssl.create_default_context(cadata=certs.ca_pem.decode())
    proxy = EgressProxy(lookup=lab.lookup(names), upstream_ssl=test_ca)
    try:
        yield World(lab, plain, tls, bad, private, until_eof, closed_port, test_ca, policy, proxy)
    finally:
        proxy.close()
        for server in (plain, tls, bad, private):
            server.stop()
        until_eof.close()


@dataclass(frozen=True)
class Answer:
    status: int
    text: str


def exchange(port: int, data: bytes, timeout: float = 15.0) -> Answer:
    """Sends `data` to the proxy and reads what it answers until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return Answer(int(head.split(b" ", 2)[1]), body.decode())


def connect_request(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


def refused(answer: Answer, status: int, text: str) -> None:
    """The proxy's own answer: `status`, `text` as its body, and never the secret."""
    assert (answer.status, answer.text) == (status, text + "\n")
    assert SECRET not in answer.text


def open_tunnel(port: int, target: str) -> socket.socket:
    """A connection to the proxy past its `200 Connection established` for `target`."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=15)
    conn.sendall(connect_request(target))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(1)  # byte by byte: nothing of the tunnel is read here
        assert chunk, f"the proxy closed the connection: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200 "), head
    return conn


# --- allowed hosts --------------------------------------------------------------------------------------------


def test_an_allowed_host_answers_a_plain_request(world: World) -> None:
    tap, port = world.serve()
    with world.client(port) as client:
        response = client.get(f"http://{PLAIN}:{world.plain.port}/hello?x=1", headers={"X-Mine": "kept"})
    assert response.status_code == 200
    assert response.json()["size"] == 0
    [seen] = world.plain.seen
    assert (seen.method, seen.path, seen.header("X-Mine")) == ("GET", "/hello?x=1", ["kept"])
    assert seen.header("Host") == [f"{PLAIN}:{world.plain.port}"]
    assert seen.header("Authorization") == []
    assert tap.snapshot().reached == {PLAIN: 1}


def test_an_allowed_host_answers_through_a_tunnel_with_its_own_certificate(world: World) -> None:
    tap, port = world.serve()
    # The client trusts the test's CA only: the server's own certificate came through the tunnel untouched.
    with world.client(port, verify=world.test_ca) as client:
        response = client.get(f"https://{TUNNEL}:{world.tls.port}/through")
    assert response.status_code == 200
    [seen] = world.tls.seen
    assert seen.path == "/through"
    assert seen.header("Authorization") == []  # no credential for a host without one
    assert tap.snapshot().reached == {TUNNEL: 1}


def test_a_tunnel_passes_a_half_close_each_way(world: World) -> None:
    _, port = world.serve()
    with open_tunnel(port, f"{TUNNEL}:{world.until_eof.getsockname()[1]}") as conn:
        conn.sendall(b"x" * 300_000)
        conn.shutdown(socket.SHUT_WR)  # the server answers only once it sees the end of what was sent
        received = b""
        while chunk := conn.recv(100):
            received += chunk
    assert received == b"300000"


def test_fetch_allow_lifts_the_guard_for_the_proxy_too(world: World) -> None:
    tap, port = world.serve(fetch_allow=[world.lab.private])
    with world.client(port) as client:
        response = client.get(f"http://{INSIDE}:{world.private.port}/lifted")
    assert response.status_code == 200
    assert [s.path for s in world.private.seen] == ["/lifted"]
    assert tap.snapshot().reached == {INSIDE: 1}


# --- refusals -------------------------------------------------------------------------------------------------


def test_a_host_not_listed_is_refused_in_the_policys_words_and_never_contacted(world: World) -> None:
    tap, port = world.serve()
    target = f"{OTHER}:{world.plain.port}"
    # A request right behind the CONNECT: had a tunnel opened, the server would have received it.
    answer = exchange(port, connect_request(target) + f"GET /sneaked HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    refused(answer, 403, NOT_LISTED.format(host=OTHER))
    with world.client(port) as client:
        response = client.get(f"http://{target}/plain")
    refused(Answer(response.status_code, response.text), 403, NOT_LISTED.format(host=OTHER))
    assert world.plain.seen == []
    assert tap.snapshot().refused == {OTHER: NOT_LISTED.format(host=OTHER)}
    assert tap.snapshot().reached == {}


def test_a_listed_name_resolving_to_an_internal_address_is_refused_by_the_guard(world: World) -> None:
    tap, port = world.serve()
    text = f"{INSIDE} resolves to {world.lab.private}, which is a private address — {LIFT}"
    refused(exchange(port, connect_request(f"{INSIDE}:{world.private.port}")), 403, text)
    with world.client(port) as client:
        response = client.get(f"http://{INSIDE}:{world.private.port}/")
    refused(Answer(response.status_code, response.text), 403, text)
    assert world.private.seen == []
    assert tap.snapshot().refused == {INSIDE: text}


def test_an_allowed_name_on_a_port_not_listed_is_refused(world: World) -> None:
    tap, port = world.serve()
    text = PORT_NOT_LISTED.format(host=PLAIN, port=world.tls.port)
    refused(exchange(port, connect_request(f"{PLAIN}:{world.tls.port}")), 403, text)
    assert world.tls.seen == []
    assert tap.snapshot().refused == {PLAIN: text}


def test_a_name_that_does_not_resolve_or_a_port_that_does_not_answer_is_a_502(world: World) -> None:
    tap, port = world.serve()
    refused(exchange(port, connect_request("nowhere.test:443")), 502, UNRESOLVED.format(host="nowhere.test"))
    unreachable = UNREACHABLE.format(host=TUNNEL, reason="Connection refused")
    refused(exchange(port, connect_request(f"{TUNNEL}:{world.closed_port}")), 502, unreachable)
    assert tap.snapshot().failed.keys() == {"nowhere.test", TUNNEL}
    assert tap.snapshot().refused == {}


# --- credentials ----------------------------------------------------------------------------------------------


def test_a_credentialed_host_gets_the_credential_in_place_of_the_clients(world: World) -> None:
    tap, port = world.serve()
    with world.client(port) as client:
        # The command's own Authorization, and a Host naming another site behind the same address (a CDN's):
        # the credential goes with the credentialed host's name only.
        own = {"Authorization": "Bearer sandbox-own", "Host": "other-tenant.example"}
        response = client.get(f"https://{API}:{world.tls.port}/api", headers=own)
    assert response.status_code == 200
    [seen] = world.tls.seen
    assert seen.header("Authorization") == [f"Bearer {SECRET}"]
    assert seen.header("Host") == [f"{API}:{world.tls.port}"]
    assert tap.snapshot().reached == {API: 1}


def test_trace_is_never_sent_to_a_credentialed_host_whose_answer_would_echo_the_secret(world: World) -> None:
    _, port = world.serve()
    with world.client(port) as client:
        response = client.request("TRACE", f"https://{API}:{world.tls.port}/")
    assert response.status_code == 405
    assert response.text == NO_TRACE.format(method="TRACE", host=API) + "\n" and SECRET not in response.text
    assert world.tls.seen == []


def test_the_command_sees_the_proxys_certificate_for_a_credentialed_host(world: World) -> None:
    _, port = world.serve()
    bundle = ssl.create_default_context(cafile=world.proxy.bundle_path())
    bundle.set_alpn_protocols(["h2", "http/1.1"])
    with open_tunnel(port, f"{API}:{world.tls.port}") as conn, bundle.wrap_socket(conn, server_hostname=API) as tls:
        der = tls.getpeercert(binary_form=True)
        assert tls.selected_alpn_protocol() == "http/1.1"  # the proxy reads HTTP/1.1 only
    assert der is not None
    certificate = x509.load_der_x509_certificate(der)
    assert certificate.issuer.rfc4514_string() == "CN=mm egress proxy CA"
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [API]
    # The test's CA alone does not vouch for it: the command trusts the proxy through the bundle only.
    with (
        open_tunnel(port, f"{API}:{world.tls.port}") as conn,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        world.test_ca.wrap_socket(conn, server_hostname=API)


def test_a_large_response_streams_back_from_a_credentialed_host(world: World) -> None:
    _, port = world.serve()
    digest, size = hashlib.sha256(), 0
    with world.client(port) as client, client.stream("GET", f"https://{API}:{world.tls.port}/big") as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            digest.update(chunk)
            size += len(chunk)
    assert size == BIG * MIB
    assert digest.hexdigest() == hashlib.sha256(PATTERN * BIG).hexdigest()
    assert world.tls.seen[0].header("Authorization") == [f"Bearer {SECRET}"]


def test_a_chunked_post_streams_to_a_credentialed_host(world: World) -> None:
    _, port = world.serve()
    body = os.urandom(3 * MIB)

    def chunks() -> Iterator[bytes]:  # no length known beforehand: httpx sends it chunked
        for start in range(0, len(body), 100_000):
            yield body[start : start + 100_000]

    with world.client(port) as client:
        response = client.post(f"https://{API}:{world.tls.port}/upload", content=chunks())
    assert response.json() == {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    [seen] = world.tls.seen
    assert (seen.method, seen.header("Transfer-Encoding")) == ("POST", ["chunked"])
    assert seen.header("Authorization") == [f"Bearer {SECRET}"]


def test_three_requests_on_one_kept_alive_intercepted_connection(world: World) -> None:
    tap, port = world.serve()
    context = ssl.create_default_context(cafile=world.proxy.bundle_path())
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
    conn.set_tunnel(API, world.tls.port)
    sockets = []
    try:
        for n in range(3):
            conn.request("POST", f"/kept/{n}", body=b"n" * n, headers={"Content-Length": str(n)})
            response = conn.getresponse()
            assert response.status == 200
            assert response.read()
            sockets.append(conn.sock)
    finally:
        conn.close()
    assert sockets[0] is sockets[1] is sockets[2]  # one connection, three requests
    assert [(s.path, s.size) for s in world.tls.seen] == [("/kept/0", 0), ("/kept/1", 1), ("/kept/2", 2)]
    assert all(s.header("Authorization") == [f"Bearer {SECRET}"] for s in world.tls.seen)
    assert tap.snapshot().reached == {API: 3}


def test_a_credentialed_host_whose_secret_is_missing_is_refused(world: World) -> None:
    tap, port = world.serve()
    text = NO_SECRET.format(host=NO_SECRET_HOST, env=EMPTY_ENV)
    refused(exchange(port, connect_request(f"{NO_SECRET_HOST}:{world.tls.port}")), 403, text)
    assert world.tls.seen == []
    assert tap.snapshot().refused == {NO_SECRET_HOST: text}


def test_an_upstream_whose_certificate_is_not_trusted_gets_no_request_and_no_secret(world: World) -> None:
    tap, port = world.serve()
    with world.client(port) as client:
        response = client.get(f"https://{BAD}:{world.bad.port}/")
    assert response.status_code == 502
    assert response.text.startswith(f"network: host {BAD} could not be reached (")
    assert "CERTIFICATE_VERIFY_FAILED" in response.text
    assert SECRET not in response.text
    assert world.bad.seen == []
    assert SECRET not in str(tap.snapshot())
    assert tap.snapshot().failed == {BAD: response.text.rstrip("\n")}


def test_a_credential_that_is_no_header_value_is_never_shown(world: World) -> None:
    # A secret with a line break (a variable set from a file): h11 would refuse the header, quoting it.
    policy = EgressPolicy("allow", world.policy.rules, {API: f"Bearer {SECRET}\nX-Injected: 1"})
    tap, port = serve(world.proxy, policy)
    refused(exchange(port, connect_request(f"{API}:{world.tls.port}")), 403, BAD_CREDENTIAL.format(host=API))
    assert SECRET not in str(tap.snapshot())
    assert world.tls.seen == []


def test_plain_http_to_a_credentialed_host_carries_no_credential(world: World) -> None:
    _, port = world.serve()
    with world.client(port) as client:
        bare = client.get(f"http://{API}:{world.plain.port}/bare")
        own = client.get(f"http://{API}:{world.plain.port}/own", headers={"Authorization": "Basic b3du"})
    assert (bare.status_code, own.status_code) == (200, 200)
    assert [(s.path, s.header("Authorization")) for s in world.plain.seen] == [
        ("/bare", []),
        ("/own", ["Basic b3du"]),  # the command's own, passed as it came
    ]


# --- streams cut short ----------------------------------------------------------------------------------------


def test_a_client_leaving_mid_stream_ends_the_upstream_response(world: World) -> None:
    _, port = world.serve()
    with world.client(port) as client:
        with client.stream("GET", f"https://{API}:{world.tls.port}/endless") as response:
            assert len(next(response.iter_raw())) > 0
        # The client closed; the proxy let go of the server's response.
        assert world.tls.ended.wait(15)
        assert client.get(f"https://{API}:{world.tls.port}/after").status_code == 200


def test_an_upstream_closing_mid_stream_cuts_the_client_short(world: World) -> None:
    _, port = world.serve()
    with world.client(port) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(f"https://{API}:{world.tls.port}/cut")
        assert client.get(f"https://{API}:{world.tls.port}/after").status_code == 200


# --- the listener's life and bounds ---------------------------------------------------------------------------


def test_the_end_of_the_commands_processes_closes_the_listener_and_an_open_tunnel(world: World) -> None:
    read_end, write_end = os.pipe()
    tap, port = world.serve(until_fd=read_end)
    with open_tunnel(port, f"{TUNNEL}:{world.until_eof.getsockname()[1]}") as conn:
        conn.sendall(b"still open")
        os.close(write_end)  # the command's last process is gone
        assert tap.wait_closed(15)
        assert conn.recv(100) == b""  # the tunnel is closed (the server would have answered at its end)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_tunnel_idle_past_the_limit_is_closed(world: World) -> None:
    proxy = EgressProxy(lookup=world.lab.lookup({TUNNEL: world.lab.public}), limits=Limits(idle_timeout=0.5))
    try:
        _, port = serve(proxy, world.policy)
        with open_tunnel(port, f"{TUNNEL}:{world.until_eof.getsockname()[1]}") as conn:
            conn.settimeout(10)
            assert conn.recv(100) == b""
    finally:
        proxy.close()


@needs_system("curl", "curl")
def test_curl_posts_through_the_proxy_waiting_for_100_continue(world: World, tmp_path: Path) -> None:
    _, port = world.serve()
    body = tmp_path / "body"
    body.write_bytes(os.urandom(2 * MIB))  # large enough for curl to send Expect: 100-continue
    proxy = ["--proxy", f"http://127.0.0.1:{port}", "--cacert", str(world.proxy.bundle_path())]
    # curl would wait for the 100 Continue longer than it may run: the proxy must send it.
    expect = ["--expect100-timeout", "30", "--header", "Expect: 100-continue"]
    command = ["curl", "--silent", "--show-error", "--fail", "--max-time", "20", *proxy, *expect]
    url = f"https://{API}:{world.tls.port}/curl"
    done = subprocess.run(
        [*command, "--data-binary", f"@{body}", url], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )
    assert done.returncode == 0, done.stderr
    assert f'"size": {2 * MIB}' in done.stdout
    [seen] = world.tls.seen
    assert seen.sha256 == hashlib.sha256(body.read_bytes()).hexdigest()
    assert seen.header("Authorization") == [f"Bearer {SECRET}"]
    assert seen.header("Expect") == []


@needs_system("git", "git")
def test_git_clones_and_pushes_through_the_proxy_which_adds_the_token(
    lab: Lab, lab_forge: Callable[..., ForgeServer], tmp_path: Path
) -> None:
    forge = lab_forge("github")
    url = forge.add_repo("team/app", {"README.md": "hello\n"})
    policy = EgressPolicy.of(
        NetworkConfig(
            policy="allow",
            allow=[forge.host],
            credentials=[NetworkCredential(hosts=[forge.names[0]], tokenEnv=TOKEN_ENV, scheme="basic")],
        ),
        {TOKEN_ENV: FORGE_TOKEN},
    )
    assert forge.ca_file is not None
    upstream = ssl.create_default_context(cafile=forge.ca_file)
    proxy = EgressProxy(lookup=lab.lookup({forge.names[0]: lab.public}), upstream_ssl=upstream)
    try:
        tap, port = serve(proxy, policy)
        env = git_env(forge, tmp_path / "home") | {
            "GIT_SSL_CAINFO": str(proxy.bundle_path()),
            "SSL_CERT_FILE": str(proxy.bundle_path()),
            "https_proxy": f"http://127.0.0.1:{port}",
        }

        def git(*args: str, cwd: Path = tmp_path) -> None:
            done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr

        git("clone", url, "app")
        work = tmp_path / "app"
        (work / "data.bin").write_bytes(os.urandom(3 * MIB))  # a pack over git's 1 MiB buffer: a chunked POST
        git("add", "data.bin", cwd=work)
        git("commit", "-m", "data", cwd=work)
        git("push", "origin", "HEAD:main", cwd=work)
    finally:
        proxy.close()
    # git had no credential (no helper, no prompt): the forge saw the proxy's, on the clone and the push.
    pushes = [r for r in forge.requests if r[1].endswith("git-receive-pack") and r[0] == "POST"]
    assert pushes and all(token == FORGE_TOKEN for _, _, token in pushes)
    assert tap.snapshot().reached[forge.names[0]] >= 4


# --- without the lab: the proxy's own answers -----------------------------------------------------------------


@pytest.fixture
def bare_proxy() -> Iterator[EgressProxy]:
    """A proxy whose resolver knows no name: what these tests send is answered before any connection."""

    async def nothing(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    proxy = EgressProxy(lookup=nothing)
    try:
        yield proxy
    finally:
        proxy.close()


OPEN_POLICY = EgressPolicy("allow", expand(["example.test"]))


def test_garbage_is_answered_400(bare_proxy: EgressProxy) -> None:
    _, port = serve(bare_proxy, OPEN_POLICY)
    refused(exchange(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"), 400, UNREADABLE)


def test_a_request_head_over_16_kib_is_refused(bare_proxy: EgressProxy) -> None:
    _, port = serve(bare_proxy, OPEN_POLICY)
    head = b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\nX-Big: " + b"a" * 17_000 + b"\r\n\r\n"
    answer = exchange(port, head)
    assert answer.status == 431
    assert answer.text == UNREADABLE + "\n"


def test_a_request_without_a_host_or_for_https_is_refused(bare_proxy: EgressProxy) -> None:
    _, port = serve(bare_proxy, OPEN_POLICY)
    refused(exchange(port, b"GET /path HTTP/1.1\r\nHost: example.test\r\n\r\n"), 400, NOT_PROXIED)
    refused(exchange(port, b"GET https://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n"), 400, NOT_PROXIED)
    refused(exchange(port, b"CONNECT example.test HTTP/1.1\r\nHost: example.test\r\n\r\n"), 400, NOT_PROXIED)


def test_a_request_head_not_sent_in_time_ends_the_connection() -> None:
    proxy = EgressProxy(limits=Limits(head_timeout=0.3))
    try:
        _, port = serve(proxy, OPEN_POLICY)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET http://example.test/ HTTP/1.1\r\n")  # and no more
            assert conn.recv(100) == b""
    finally:
        proxy.close()


def test_connections_past_the_limit_are_answered_503() -> None:
    calls, release = [], threading.Event()

    async def stalled(host: str, port: int) -> list[str]:
        """A resolver that answers nothing until released: each session waits in it."""
        calls.append(host)
        while not release.is_set():
            await asyncio.sleep(0.01)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    proxy = EgressProxy(lookup=stalled)
    limit = Limits().max_connections
    request = b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n"
    try:
        tap, port = serve(proxy, OPEN_POLICY)
        waiting = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(limit)]
        for conn in waiting:
            conn.sendall(request)
        for _ in range(500):
            if len(calls) == limit:
                break
            threading.Event().wait(0.01)
        assert len(calls) == limit
        refused(exchange(port, request), 503, TOO_MANY.format(limit=limit))
        assert len(calls) == limit  # the one over the limit was not served
        release.set()
        for conn in waiting:
            with conn:
                assert conn.recv(100).startswith(b"HTTP/1.1 502 ")
        # Served again once the proxy has seen those end (their answers may reach the test a moment before).
        answer = exchange(port, request)
        for _ in range(200):
            if answer.status != 503:
                break
            threading.Event().wait(0.025)
            answer = exchange(port, request)
        refused(answer, 502, UNRESOLVED.format(host="example.test"))
        assert tap.snapshot().failed == {"example.test": UNRESOLVED.format(host="example.test")}
    finally:
        release.set()
        proxy.close()


def test_closing_the_tap_closes_the_listener_and_its_connections(bare_proxy: EgressProxy) -> None:
    tap, port = serve(bare_proxy, OPEN_POLICY)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET http://example.test/ HTTP/1.1\r\n")
        tap.close()
        assert tap.wait_closed(10)
        # Closed: by the session, or reset with the listener when the proxy had not accepted it yet.
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(100) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_the_process_has_one_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mm_core.network.proxy._proxy", None)
    made = egress_proxy()
    try:
        assert egress_proxy() is made
        monkeypatch.setattr("mm_core.network.proxy._proxy", (os.getpid() + 1, made))  # as in a forked child
        assert egress_proxy() is not made
    finally:
        made.close()
        egress_proxy().close()


def test_hop_by_hop_headers_are_not_passed_on() -> None:
    headers = [
        (b"Connection", b"keep-alive, X-Private"),
        (b"X-Private", b"1"),
        (b"Proxy-Authorization", b"Basic eA=="),
        (b"Transfer-Encoding", b"chunked"),
        (b"Host", b"a.test"),
        (b"Expect", b"100-continue"),
        (b"Accept", b"*/*"),
        (b"Authorization", b"Bearer mine"),
    ]
    assert end_to_end(headers) == [(b"accept", b"*/*"), (b"authorization", b"Bearer mine")]
    assert end_to_end(headers, drop=(b"authorization",)) == [(b"accept", b"*/*")]


# --- the certificate authority --------------------------------------------------------------------------------


def test_the_bundle_holds_the_systems_roots_then_the_proxys_certificate_and_no_key() -> None:
    ca = CertificateAuthority()
    try:
        path = ca.bundle_path()
        content = path.read_bytes()
        assert content.startswith(system_roots().read_bytes().rstrip(b"\n"))
        assert content.endswith(ca.authority().certificate_pem())
        assert b"PRIVATE KEY" not in content
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
        assert ca.bundle_path() == path
    finally:
        ca.close()
    assert not path.parent.exists()


def test_a_command_started_before_a_renewal_keeps_trusting_its_leaves() -> None:
    # Renewed at every use: a lifetime shorter than the margin.
    ca = CertificateAuthority(lifetime=dt.timedelta(days=1), renew_before=dt.timedelta(days=2))
    try:
        before = ca.authority()  # a listener's, at its command's start
        path = ca.bundle_path()  # read again by a later process of the command, after a renewal
        assert path.read_bytes().endswith(before.certificate_pem())
        trusting = ssl.create_default_context(cafile=path)
        assert ca.authority() != before
        asyncio.run(handshake(ca.context_for(API, before), trusting, API))
    finally:
        ca.close()


def test_a_leaf_names_its_host_and_is_made_once() -> None:
    ca = CertificateAuthority()
    assert ca.context_for(API) is ca.context_for(API)
    trusting = ssl.create_default_context(cadata=ca.authority().certificate_pem().decode())
    for host in (API, "192.0.2.7"):  # an address is named as an address
        asyncio.run(handshake(ca.context_for(host), trusting, host))
        with pytest.raises(ssl.SSLCertVerificationError):
            asyncio.run(handshake(ca.context_for(host), trusting, "elsewhere.test"))


async def handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake over loopback, the client checking the server's certificate against `name`."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    async with listening:
        port = listening.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=name)
        assert await reader.read() == b"ok"
        writer.close()


def test_past_the_processs_bound_a_connection_is_closed_unanswered_whatever_its_listener() -> None:
    """Background jobs each keep a listener: the worker's descriptors are bounded over all of them."""
    proxy = EgressProxy(limits=Limits(max_process_connections=4))
    try:
        ports = [serve(proxy, OPEN_POLICY)[1] for _ in range(3)]
        held = [socket.create_connection(("127.0.0.1", ports[n % 3]), timeout=10) for n in range(5)]
        for conn in held:
            conn.sendall(b"GET http://example.test/ HTTP/1.1\r\n")  # a head never finished: each is held
        # The bound is full once the proxy holds four (on a loaded machine that takes more than a moment).
        deadline = time.monotonic() + 10
        while _held(proxy) < 4 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert _held(proxy) == 4
        with socket.create_connection(("127.0.0.1", ports[2]), timeout=10) as over:
            over.sendall(b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n")
            with contextlib.suppress(ConnectionResetError):
                assert over.recv(100) == b""  # closed, no answer spent on it
        for conn in held:
            conn.close()
    finally:
        proxy.close()


def _held(proxy: EgressProxy) -> int:
    """The connections the proxy holds now, read on its loop."""

    async def count() -> int:
        return proxy.connections()

    return asyncio.run_coroutine_threadsafe(count(), proxy.loop).result(5)


def test_bytes_a_command_writes_into_its_end_pipe_neither_close_nor_busy_the_listener(
    bare_proxy: EgressProxy,
) -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    tap, port = serve(bare_proxy, OPEN_POLICY, until_fd=read_end)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 65536)  # until the pipe is full, as `yes > /proc/self/fd/N` would
    assert not tap.wait_closed(0.5)
    refused(
        exchange(port, b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"),
        403,
        NOT_LISTED.format(host="other.test"),
    )
    os.close(write_end)  # the last process is gone
    assert tap.wait_closed(10)


def test_a_tap_keeps_a_bounded_number_of_hosts_and_counts_the_rest() -> None:
    tap = Tap(stop=lambda: None)
    for n in range(MAX_HOSTS + 30):
        tap.refuse(f"h{n}.example", f"network: host h{n}.example is not in this channel's allow-list")
        tap.reach(f"r{n}.example")
    seen = tap.snapshot()
    assert len(seen.refused) == MAX_HOSTS and len(seen.reached) == MAX_HOSTS
    assert seen.unkept == 30  # the refusals past the bound; hosts reached past it are not counted
    tap.reach("r0.example")  # a host it keeps is still counted
    assert tap.snapshot().reached["r0.example"] == 2


def test_the_processs_bound_fits_its_descriptors() -> None:
    """A container's soft limit of 1024 descriptors is raised to the hard one, and the bound follows what is there."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    proxy = None
    try:
        proxy = EgressProxy(limits=Limits())  # as a worker's first proxied command makes it
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised == (65536 if hard == resource.RLIM_INFINITY else min(hard, 65536))
        assert proxy.limits.max_process_connections == min(512, max(16, (raised - 256) // 3))
    finally:
        if proxy is not None:
            proxy.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
