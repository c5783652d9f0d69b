"""Issue 9's attacks through `mm-bot run -p`, as a hostile model would make them: the scripted model asks for
the call, and what the tool answers (the next request's last message) must hold nothing it should not.

The tool-level tests (test_attack_*.py) cover each defence in depth; these prove the defences are the ones
the real command line runs with. Everything stays on loopback.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from fetch_site import encoding_bomb
from mm_testkit.fixtures_kit import needs_bwrap
from mmbot_helpers import MM_BOT, clean_env
from playground.model_server import ModelServer, Reply, ToolCall

MARKER = "Secret7d1eMarker"
TOKEN = "xoxb-worker-secret-4242"

pytestmark = needs_bwrap


@dataclass
class Run:
    workspace: Path
    outside: Path  # stands for /etc/shadow, and for another thread's workspace
    config: str = ""


def answer(model_server: ModelServer, run: Run, tool: str, args: Mapping[str, object]) -> str:
    """What the tool answered the model, through `mm-bot run -p` in the workspace."""
    model_server.script(Reply(tool_calls=[ToolCall(tool, dict(args))]), Reply(text="done"))
    config = run.workspace.parent / "mm.yaml"
    config.write_text(run.config)
    env = clean_env(MM_CONFIG=str(config), MM_MODEL_URL=model_server.url, MM_MODEL="test-model", SLACK_BOT_TOKEN=TOKEN)
    done = subprocess.run(
        [MM_BOT, "run", "-p", "go"], cwd=run.workspace, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = model_server.messages(1)[-1]
    assert result["role"] == "tool"
    return result["content"]


@pytest.fixture
def run(tmp_path: Path) -> Run:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "shadow").write_text(f"root:{MARKER}:19000:0:99999:7:::\n")
    (outside / "shadow.py").write_text(f'def shadow_fn():\n    """{MARKER}"""\n    return "{MARKER}"\n')
    (workspace / "shadow.py").symlink_to(outside / "shadow.py")
    (workspace / "passwd").symlink_to(outside / "shadow")
    (workspace / "app.py").write_text("from shadow import shadow_fn\n\nshadow_fn()\n")
    return Run(workspace, outside)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on the worker's loopback, standing for its PostgreSQL: the port it listens on."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                conn.sendall(f"{MARKER}\n".encode())
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        yield server.getsockname()[1]
        stop.set()
        thread.join()


def test_file_tools_do_not_follow_a_link_out(model_server, run):
    out = answer(model_server, run, "read_file", {"path": "passwd"})
    assert MARKER not in out and "outside" in out


def test_bash_sees_no_secret_of_the_worker_and_is_not_root(model_server, run):
    out = answer(model_server, run, "bash", {"command": "env; cat /proc/*/environ 2>/dev/null; id -u; cat passwd"})
    assert TOKEN not in out and MARKER not in out
    assert "\n0\n" not in f"\n{out}"


def test_bash_cannot_reach_the_workers_loopback(model_server, run, listener):
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{listener} && cat <&3; exec 3<>/dev/tcp/10.0.2.2/{listener} && cat <&3"
    out = answer(model_server, run, "bash", {"command": f"timeout 5 bash -c '{probe}'; echo probed"})
    assert MARKER not in out and out.rstrip().endswith("probed")


def test_lsp_does_not_read_what_the_workspace_links_to(model_server, run):
    run.config = "lsp: {servers: {pylsp: {command: pylsp, extensions: [.py]}}}\n"
    for args in (
        {"action": "definition", "path": "app.py", "symbol": "shadow_fn"},
        {"action": "hover", "path": "app.py", "symbol": "shadow_fn", "line": 3},
    ):
        model_server.reset()
        assert MARKER not in answer(model_server, run, "lsp", args), args


def test_a_rewrite_of_a_large_file_is_diffed_in_bounded_work(model_server, run):
    (run.workspace / "big.txt").write_text("".join(f"old {i}\n\n" for i in range(2000)))
    out = answer(
        model_server, run, "write_file", {"path": "big.txt", "content": "".join(f"new {i}\n\n" for i in range(2000))}
    )
    assert out.startswith("wrote big.txt: 4000 lines")


def test_an_asked_agents_alias_bomb_is_a_text(model_server, run):
    bomb = run.workspace.parent / "bomb.yaml"
    bomb.write_text(
        "a: &a ["
        + ", ".join(['"x"'] * 9)
        + "]\n"
        + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
    )
    run.config = "mmConfigs: {reviewer: {config: bomb.yaml}}\n"
    out = answer(model_server, run, "ask_agent", {"agent": "reviewer", "prompt": "review"})
    assert out.startswith("[ask_agent: reviewer failed: cannot load ") and "aliases used too often" in out


class BombHandler(http.server.BaseHTTPRequestHandler):
    body = encoding_bomb(("gzip", "gzip", "gzip"), 1024)

    def do_GET(self) -> None:
        if self.path == "/robots.txt":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Encoding", "gzip, gzip, gzip")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serving(handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_compression_bomb_is_refused(model_server, run):
    server = serving(BombHandler)
    try:
        run.config = json.dumps({"fetchContentTool": True, "fetchAllow": ["127.0.0.1"], "network": "open"}) + "\n"
        url = f"http://127.0.0.1:{server.server_address[1]}/page"
        out = answer(model_server, run, "fetch_content", {"url": url})
    finally:
        server.shutdown()
    assert "larger than 5.0 MiB" in out
