"""A sandboxed command under `network: allow` (issue 26): its only way out is the worker's egress proxy, bound on
its own loopback; the proxy applies the allow-list, resolves names itself, refuses internal addresses and adds
credentials the command never sees.

The servers live in the test's network lab (mm_testkit/netlab.py), and the proxy resolves their names with the
lab's resolver: this process's proxy is replaced by one made with it for each test (`use_egress_proxy`).
"""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_core.events import NetworkUsed
from mm_core.network.proxy import EgressProxy, use_egress_proxy
from mm_core.tools.bash import BashTool
from mm_testkit.fixtures_kit import needs_bwrap
from mm_testkit.netlab import Lab
from playground import forge_tls
from playground.forge_server import ForgeServer
from tool_helpers import call, make_ctx

pytestmark = [pytest.mark.process, needs_bwrap]

BASH = BashTool()
SECRET = "ghs_egress-test-secret-5b0c"  # what the proxy adds; no byte of it may reach the sandbox
SECRET_ENV = "MM_TEST_EGRESS_TOKEN"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed: apt-get install git")


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every GET and POST with its path, and records the headers each request came with (names in lower
    case: HTTP's are case-insensitive, and the proxy sends them as h11 reads them)."""

    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

    def _answer(self, body: bytes) -> None:
        type(self).seen.append({name.lower(): value for name, value in self.headers.items()})
        text = f"served {self.path} {len(body)}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server:
    """An HTTP (or, with `tls`, HTTPS) server on a lab address, in a thread of the test."""

    def __init__(self, lab: Lab, address: str, tls: ssl.SSLContext | None = None):
        handler = type("Handler", (Recorder,), {"seen": []})
        self.seen: list[dict[str, str]] = handler.seen
        self.httpd = http.server.ThreadingHTTPServer((address, 0), handler, bind_and_activate=False)
        self.httpd.socket.close()
        sock = lab.listen(address)
        self.port = sock.getsockname()[1]
        self.httpd.socket = tls.wrap_socket(sock, server_side=True) if tls else sock
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers(lab: Lab) -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.close()


def proxied(lab: Lab, names: dict[str, str], upstream: ssl.SSLContext | None = None) -> Any:
    """This process's egress proxy, for the test: one resolving `names` to lab addresses."""
    return use_egress_proxy(EgressProxy(lookup=lab.lookup(names), upstream_ssl=upstream))


def run(ws: Path, command: str, network: Any, **config: Any) -> tuple[str, list[NetworkUsed]]:
    ctx = make_ctx(ws, sandbox="bwrap", network=network, **config)
    seen: list[NetworkUsed] = []
    ctx.emit = lambda event: seen.append(event) if isinstance(event, NetworkUsed) else None
    return call(BASH, {"command": command}, ctx), seen


def test_an_allowed_host_answers_and_another_is_refused_in_the_policys_words(owned_ws, lab, servers) -> None:
    site = Server(lab, lab.public)
    servers.append(site)
    names = {"allowed.test": lab.public, "other.test": lab.public}
    with proxied(lab, names):
        out, events = run(
            owned_ws,
            f"curl -sS http://allowed.test:{site.port}/a; echo; curl -sS -o /dev/null https://other.test/; "
            f"curl -sS http://other.test:{site.port}/b; echo status=$?",
            {"allow": [f"allowed.test:{site.port}", "pypi.org"]},
        )
    assert "served /a 0" in out, out
    assert "network: host other.test is not in this channel's allow-list" in out, out
    assert [h["host"] for h in site.seen] == [f"allowed.test:{site.port}"]  # other.test never reached it
    assert events == [
        NetworkUsed(
            "",
            (("allowed.test", 1),),
            (("other.test", "network: host other.test is not in this channel's allow-list"),),
        )
    ]


def test_an_allowed_name_resolving_to_a_private_address_is_refused_after_resolution(owned_ws, lab, servers) -> None:
    inside = Server(lab, lab.private)
    servers.append(inside)
    with proxied(lab, {"intranet.test": lab.private}):
        out, _ = run(
            owned_ws, f"curl -sS http://intranet.test:{inside.port}/", {"allow": [f"intranet.test:{inside.port}"]}
        )
    assert f"intranet.test resolves to {lab.private}, which is a private address" in out, out
    assert inside.seen == []


def test_a_raw_connection_from_the_sandbox_has_nowhere_to_go(owned_ws, lab, servers) -> None:
    site = Server(lab, lab.public)
    servers.append(site)
    probe = (
        f"exec 3<>/dev/tcp/{lab.public}/{site.port} && echo connected || echo refused; "
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
    )
    with proxied(lab, {}):
        out, _ = run(owned_ws, probe, {"allow": [f"{lab.public}:{site.port}"]})
    assert "refused" in out and "connected" not in out, out
    assert out.split()[-1] == "lo", out  # its own loopback and nothing else
    assert site.seen == []


def test_network_off_has_no_proxy_and_no_route(owned_ws, lab, servers) -> None:
    site = Server(lab, lab.public)
    servers.append(site)
    with proxied(lab, {}):
        out, events = run(
            owned_ws,
            f"env | grep -ci proxy; exec 3<>/dev/tcp/{lab.public}/{site.port} && echo connected || echo refused",
            "off",
        )
    assert out.splitlines()[0] == "0" and "refused" in out and "connected" not in out, out
    assert events == [] and site.seen == []


def test_a_credentialed_host_gets_the_header_and_the_sandbox_never_sees_the_secret(
    owned_ws, lab, servers, monkeypatch
) -> None:
    certs = forge_tls.make_certificates(names=["secure.test"])
    upstream = ssl.create_default_context(cadata=certs.ca_pem.decode())
    secure = Server(lab, lab.public, tls=forge_tls.server_context(certs))
    servers.append(secure)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    network = {
        "allow": [f"secure.test:{secure.port}"],
        "credentials": [{"hosts": ["secure.test"], "tokenEnv": SECRET_ENV}],
    }
    # Everything the sandbox can see: its environment, what it received (curl's verbose dump), every file it
    # can read outside /usr, /proc and /sys (the system's own), packed into the workspace for the test to search.
    command = (
        f"env; cat /proc/self/environ; curl -sv -H 'Authorization: Bearer forged' https://secure.test:{secure.port}/"
        f" -d hello 2>&1; tar cf dump.tar --exclude=./usr --exclude=./proc --exclude=./sys --exclude=./dump.tar "
        "-C / . 2>/dev/null; echo tar=$?"
    )
    with proxied(lab, {"secure.test": lab.public}, upstream):
        out, events = run(owned_ws, command, network, bash={"passEnv": []})
    assert "served / 5" in out, out  # the POST went through, over TLS ended by the proxy's CA
    assert [h.get("authorization") for h in secure.seen] == [f"Bearer {SECRET}"]  # the command's own replaced
    assert SECRET not in out
    dump = owned_ws / "dump.tar"
    assert dump.stat().st_size > 100_000, out  # the sandbox's files were packed
    with tarfile.open(dump) as archive:
        for member in archive:
            if member.isfile():
                data = archive.extractfile(member)
                assert data is not None and SECRET.encode() not in data.read(), member.name
    assert events and events[0].reached == (("secure.test", 1),)


@needs_git
def test_git_clones_a_private_repository_through_the_proxy_without_a_token_in_the_sandbox(
    owned_ws, lab, lab_forge, monkeypatch
) -> None:
    forge: ForgeServer = lab_forge("github", tokens={SECRET: None})
    forge.add_repo("acme/private")
    host = forge.host  # git.forge.test:<port>
    monkeypatch.setenv(SECRET_ENV, SECRET)
    network = {
        "allow": [host],
        "credentials": [{"hosts": ["git.forge.test"], "tokenEnv": SECRET_ENV, "scheme": "basic"}],
    }
    assert forge.ca_file is not None
    upstream = ssl.create_default_context(cafile=str(forge.ca_file))
    with proxied(lab, {"git.forge.test": lab.public}, upstream):
        out, _ = run(
            owned_ws,
            f"git clone -q https://{host}/acme/private.git && git -C private log --oneline | wc -l; "
            "env | grep -c -e TOKEN -e ghs_ ; git -C private config --get remote.origin.url",
            network,
            bash={"timeout": 60},
        )
    lines = out.splitlines()
    assert lines[0].strip() not in ("", "0") and lines[1] == "0", out  # cloned; no token in the environment
    assert lines[2] == f"https://{host}/acme/private.git", out  # nor in the clone's config
    assert SECRET not in out
    assert [token for _, _, token in forge.requests if token] and all(t == SECRET for _, _, t in forge.requests if t)
    files = subprocess.run(["grep", "-rlF", SECRET, str(owned_ws)], capture_output=True, text=True)
    assert files.stdout == "", files.stdout
