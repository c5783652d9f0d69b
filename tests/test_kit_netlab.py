"""The test kit's network lab (mm_testkit/netlab.py): servers of the test process at a public and a private
address of a network namespace of the test's own, the test's resolver, and a forge emulator under a host name."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import pytest

from mm_core.tools.fetch.errors import BlockedAddress
from mm_core.tools.fetch.guard import AddressGuard
from mm_testkit.fixtures_forge import FORGE_TOKEN, git_env
from mm_testkit.fixtures_kit import REQUIRE_SYSTEM, path_without
from mm_testkit.netlab import FORGE_NAME, GATEWAY, Lab, serve_each

# Every test starts processes: the lab's `ip`, git, or a pytest of its own (mm_testkit/process_guard.py).
pytestmark = pytest.mark.process

LIFT = "fetching internal addresses is not allowed (fetchAllow in the config lifts this)"


def greeter(sock: socket.socket) -> None:
    """Answers each connection on `sock` with the address it came from, from a thread, until `sock` closes."""
    serve_each(sock, lambda conn, peer: conn.sendall(peer[0].encode()))


def greeting(addr: str, port: int) -> str:
    with socket.create_connection((addr, port), timeout=3) as conn:
        return conn.recv(100).decode()


def test_this_namespace_reaches_a_server_of_the_lab_at_each_of_its_addresses(lab: Lab):
    for addr in (lab.public, lab.public2, lab.private):
        sock = lab.listen(addr)
        try:
            greeter(sock)
            assert sock.getsockname()[0] == addr
            # Through the veth: the server sees this namespace's end of it.
            assert greeting(addr, sock.getsockname()[1]) == GATEWAY
        finally:
            sock.close()


def test_a_lab_socket_listens_in_the_lab_not_here(lab: Lab):
    # A port of this namespace's loopback, bound and not listening: connections to it are refused, whatever
    # else runs on the machine.
    here = socket.socket()
    here.bind(("127.0.0.1", 0))
    port = here.getsockname()[1]
    sock = lab.listen("0.0.0.0", port)  # every address of the lab, the same port: it is another namespace's
    try:
        greeter(sock)
        assert greeting(lab.public, port) == greeting(lab.private, port) == GATEWAY
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=3)
        # And the addresses are the lab's: this namespace has none of them.
        with pytest.raises(OSError, match="Cannot assign requested address"):
            socket.create_server((lab.public, 0))
    finally:
        sock.close()
        here.close()


def test_the_lookup_answers_the_names_given_and_no_other(lab: Lab):
    lookup = lab.lookup({"Git.Forge.Test.": lab.public, "two.test": [lab.public, lab.public2]})

    async def answers(*hosts: str) -> list[list[str]]:
        return [await lookup(host, 443) for host in hosts]

    assert asyncio.run(answers("git.forge.test", "GIT.FORGE.TEST.", "two.test")) == [
        [lab.public],
        [lab.public],
        [lab.public, lab.public2],
    ]
    with pytest.raises(socket.gaierror) as refused:
        asyncio.run(answers("forge.test"))
    assert refused.value.errno == socket.EAI_NONAME and refused.value.strerror == "Name or service not known"


def test_the_guard_resolves_through_the_lookup_and_refuses_a_name_of_the_private_address(lab: Lab):
    lookup = lab.lookup(
        {"git.forge.test": lab.public, "intranet.test": lab.private, "both.test": [lab.public, lab.private]}
    )
    guard = AddressGuard(lookup=lookup)
    sock = lab.listen(lab.public)
    try:
        greeter(sock)
        port = sock.getsockname()[1]
        [addr] = asyncio.run(guard.resolve("git.forge.test", port))
        assert greeting(addr, port) == GATEWAY
    finally:
        sock.close()
    for host in ("intranet.test", "both.test"):
        with pytest.raises(BlockedAddress) as refused:
            asyncio.run(guard.resolve(host, 443))
        assert str(refused.value) == f"{host} resolves to {lab.private}, which is a private address — {LIFT}"


def ls_remote(forge_port: int, url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """git ls-remote `url`, git.forge.test resolved to the lab's public address (git uses the system's resolver,
    not the test's lookup: curl is told the address instead)."""
    resolve = f"http.curloptResolve={FORGE_NAME}:{forge_port}:{Lab.public}"
    return subprocess.run(["git", "-c", resolve, "ls-remote", url], capture_output=True, text=True, env=env, timeout=60)


def test_a_forge_in_the_lab_serves_git_under_its_name_to_its_token_only(lab_forge, tmp_path: Path):
    forge = lab_forge("github")
    url = forge.add_repo("acme/app")
    assert (forge.host, url) == (f"{FORGE_NAME}:{forge.port}", f"https://{FORGE_NAME}:{forge.port}/acme/app.git")
    env = git_env(forge, tmp_path / "home")
    with_token = url.replace("https://", f"https://x-access-token:{FORGE_TOKEN}@")
    listed = ls_remote(forge.port, with_token, env)
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[1] for line in listed.stdout.splitlines()] == ["HEAD", "refs/heads/main"], listed.stdout

    forge.requests.clear()
    without = ls_remote(forge.port, url, env | {"GIT_CURL_VERBOSE": "1"})
    assert without.returncode != 0 and "Recv header: HTTP/1.1 401 Unauthorized" in without.stderr, without.stderr
    assert "terminal prompts disabled" in without.stderr, without.stderr  # it asked for a name, and had none
    wrong = ls_remote(forge.port, url.replace("https://", "https://x-access-token:not-the-token@"), env)
    assert wrong.returncode != 0 and "Authentication failed" in wrong.stderr, wrong.stderr
    assert {token for _, _, token in forge.requests} == {None, "not-the-token"}


LAB_TEST = """
def test_in_the_lab(lab):
    pass
"""
PLUGINS = ("-p", "mm_testkit.fixtures_kit", "-p", "mm_testkit.fixtures_forge", "-p", "mm_testkit.netlab")


def test_without_ip_a_lab_test_is_skipped_with_the_fix(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.delenv(REQUIRE_SYSTEM, raising=False)
    monkeypatch.setenv("PATH", path_without("ip", tmp_path))  # not under pytester's directory: pytest walks it
    pytester.makepyfile(LAB_TEST)
    result = pytester.runpytest_subprocess(*PLUGINS, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * iproute2 is not installed (no ip on the PATH): apt-get install iproute2"])
    monkeypatch.setenv(REQUIRE_SYSTEM, "1")
    pytester.runpytest_subprocess(*PLUGINS).assert_outcomes(errors=1)


def test_a_lab_test_starts_processes(pytester: pytest.Pytester):
    pytester.makepyfile(LAB_TEST)
    result = pytester.runpytest_subprocess(*PLUGINS, "-p", "mm_testkit.process_guard", "--no-process")
    result.assert_outcomes(deselected=1)
