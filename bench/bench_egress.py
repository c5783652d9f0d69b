"""Figures for the egress proxy (not a test): what `network: allow` costs a command's requests beside `open`.

In the test kit's network lab (mm_testkit/netlab.py: a namespace of this machine's own behind a veth, at an
address the guard calls public), side by side in one run: one bash call making N small HTTP requests with curl
(through the proxy under `allow`, through slirp4netns under `open`), and one call downloading a large body
(a CONNECT tunnel under `allow`). The per-call cost of setting the network up is bench/bench_tools.py's.

Run as root (the lab makes a namespace): .venv/bin/python bench/bench_egress.py [requests, default 50]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from mm_core.config import AgentConfig, BashConfig, NetworkConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.bash import BashTool
from mm_core.tools.sandbox import SANDBOX_UID
from mm_core.tools.sandbox_network import network_tools
from mm_testkit.netlab import made_lab, serve_each

BODY = 64 * 1024 * 1024  # the large download


def answer(conn: socket.socket, _peer: tuple[str, int]) -> None:
    """Answers a request with BODY zero bytes (`/big`) or two, one request a connection."""
    length = BODY if b"/big" in conn.recv(65536) else 2
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % length)
    chunk = memoryview(b"\0" * 65536)
    while length > 0:
        conn.sendall(chunk[: min(len(chunk), length)])
        length -= len(chunk)


def timed(ws: Path, config: AgentConfig, command: str) -> tuple[float, str]:
    async def run() -> tuple[float, str]:
        ctx = ToolContext(workspace=ws, config=config)
        started = time.perf_counter()
        out = await BashTool().run({"command": command}, ctx)
        took = time.perf_counter() - started
        await ctx.resources.aclose()
        return took, out

    return asyncio.run(run())


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if os.geteuid() != 0 or shutil.which("bwrap") is None or not all(network_tools().values()):
        sys.exit("bench_egress needs root, bubblewrap, slirp4netns and nftables")
    root = Path(tempfile.mkdtemp(prefix="mm-bench-egress-"))
    root.chmod(0o711)
    ws = root / "ws"
    ws.mkdir()
    os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    try:
        with made_lab() as lab:
            listener = lab.listen(lab.public)
            port = listener.getsockname()[1]
            serve_each(listener, answer)
            url = f"http://{lab.public}:{port}"
            allowed = NetworkConfig(allow=[f"{lab.public}:{port}"])
            modes = {"open (slirp4netns)": NetworkConfig(policy="open"), "allow (the proxy)": allowed}
            small = f"for i in $(seq {n}); do curl -s -o /dev/null {url}/; done"
            big = f"curl -s -o /dev/null -w '%{{size_download}}' {url}/big"
            figures: dict[str, tuple[float, float]] = {}
            for label, network in modes.items():
                config = AgentConfig(sandbox="bwrap", network=network, bash=BashConfig(timeout=300))
                timed(ws, config, "true")  # warm: the filter's ranges, the proxy's thread
                took_small, _ = timed(ws, config, small)
                took_big, out = timed(ws, config, big)
                assert out.strip() == str(BODY), out
                figures[label] = (took_small, took_big)
                print(
                    f"{label}: {n} requests in one call {took_small * 1000:.0f} ms "
                    f"({took_small * 1000 / n:.2f} ms each, curl's start included); "
                    f"{BODY // 2**20} MiB in {took_big * 1000:.0f} ms ({BODY / 2**20 / took_big:.0f} MiB/s)"
                )
            (open_small, open_big), (proxy_small, proxy_big) = figures.values()
            print(
                f"  allow over open: {(proxy_small - open_small) * 1000 / n:+.2f} ms a request, "
                f"the download x{proxy_big / open_big:.2f} the time"
            )
            listener.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
