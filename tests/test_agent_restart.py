"""A turn survives its process: suspend in one process, resume in another; kill -9 mid-tool, then resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_support import call_ids
from mm_core.log import FileStore, ToolResult, ToolStarted
from mm_testkit.model_server import Reply, ToolCall

CHILD = Path(__file__).with_name("agent_child.py")


def child(tmp_path: Path, model_url: str, config: dict, *action: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(CHILD.parent))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path / "store"), str(tmp_path / "ws"), model_url,
         json.dumps({"sandbox": "none", **config}), *action],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def kill_processes_in(directory: Path) -> None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(directory):
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def finish(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_suspend_in_one_process_resume_in_another(model_server, tmp_path):
    (tmp_path / "ws").mkdir()
    model_server.script(
        Reply(tool_calls=[ToolCall("bash", {"command": "echo hi >> log.txt"}, id="b1")]),
        Reply(tool_calls=[ToolCall("bash", {"command": "echo no >> log.txt"}, id="b2")]),
        Reply(text="all done"),
    )
    lines = finish(child(tmp_path, model_server.url, {"yolo": False}, "send", "go"))
    assert lines[-1] == {"outcome": "suspended"}
    asked = [line for line in lines if line.get("event") == "PermissionRequested"]
    b1 = asked[0]["calls"][0]["call_id"]

    lines = finish(child(tmp_path, model_server.url, {"yolo": False}, "resume",
                         json.dumps([{"call_id": b1, "approved": True, "by": "U1"}])))
    assert lines[-1] == {"outcome": "suspended"}
    b2 = [line for line in lines if line.get("event") == "PermissionRequested"][0]["calls"][0]["call_id"]
    lines = finish(child(tmp_path, model_server.url, {"yolo": False}, "resume",
                         json.dumps([{"call_id": b2, "approved": False, "by": "U1"}])))
    assert lines[-1] == {"outcome": "answered"}
    assert (tmp_path / "ws" / "log.txt").read_text() == "hi\n"
    assert model_server.messages(2)[-1]["content"] == "[command rejected by the user]"


def test_kill_9_mid_tool_then_resume_never_reruns_a_completed_call(model_server, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    model_server.script(
        Reply(tool_calls=[
            ToolCall("bash", {"command": "echo ran >> counter.txt"}, id="done1"),
            ToolCall("bash", {"command": "touch sleeping; sleep 60"}, id="slow"),
            ToolCall("bash", {"command": "echo after >> counter.txt"}, id="later"),
        ]),
        Reply(text="recovered"),
    )
    proc = child(tmp_path, model_server.url, {}, "send", "go")
    deadline = time.monotonic() + 30
    while not (ws / "sleeping").exists():
        assert time.monotonic() < deadline, "the child never reached the slow call"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    kill_processes_in(ws)  # the orphaned `sleep 60`: its parent died without a chance to reap it

    lines = finish(child(tmp_path, model_server.url, {}, "resume"))
    assert lines[-1] == {"outcome": "answered"}
    assert (ws / "counter.txt").read_text() == "ran\nafter\n"  # done1 ran once, later ran on resume
    log = FileStore(tmp_path / "store").load("s1")
    done1, slow, later = call_ids(log)
    results = {e.call_id: e for e in log if isinstance(e, ToolResult)}
    assert results[slow].status == "interrupted"
    assert results[slow].output.startswith("[error: interrupted")
    assert sum(isinstance(e, ToolStarted) and e.call_id == done1 for e in log) == 1
    tool_messages = [m for m in model_server.messages(1) if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [done1, slow, later]
