"""A turn survives its process: suspend in one process, resume in another; kill -9 mid-tool, then resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_support import call_ids
from mm_core.log import CallStatus, FileStore, Outcome, ToolResult, ToolStarted
from mm_testkit.fixtures_kit import needs_bwrap_when_root
from playground.model_server import Reply, ToolCall

pytestmark = needs_bwrap_when_root

CHILD = Path(__file__).with_name("agent_child.py")


def child(tmp_path: Path, model_url: str, config: dict, *action: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(CHILD.parent))
    return subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            str(tmp_path / "store"),
            str(tmp_path / "ws"),
            model_url,
            json.dumps({"bash": {"network": False}, **config}),
            *action,
        ],
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

    lines = finish(
        child(
            tmp_path,
            model_server.url,
            {"yolo": False},
            "resume",
            json.dumps([{"call_id": b1, "approved": True, "by": "U1"}]),
        )
    )
    assert lines[-1] == {"outcome": "suspended"}
    b2 = next(line for line in lines if line.get("event") == "PermissionRequested")["calls"][0]["call_id"]
    lines = finish(
        child(
            tmp_path,
            model_server.url,
            {"yolo": False},
            "resume",
            json.dumps([{"call_id": b2, "approved": False, "by": "U1"}]),
        )
    )
    assert lines[-1] == {"outcome": "answered"}
    assert (tmp_path / "ws" / "log.txt").read_text() == "hi\n"
    assert model_server.messages(2)[-1]["content"] == "[command rejected by the user]"


def test_kill_9_mid_tool_then_resume_never_reruns_a_completed_call(model_server, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    model_server.script(
        Reply(
            tool_calls=[
                ToolCall("bash", {"command": "echo ran >> counter.txt"}, id="done1"),
                ToolCall("bash", {"command": "touch sleeping; sleep 60"}, id="slow"),
                ToolCall("bash", {"command": "echo after >> counter.txt"}, id="later"),
            ]
        ),
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
    log = asyncio.run(FileStore(tmp_path / "store").load("s1"))
    done1, slow, later = call_ids(log)
    results = {e.call_id: e for e in log if isinstance(e, ToolResult)}
    assert results[slow].status == "interrupted"
    assert results[slow].output.startswith("[error: interrupted")
    assert sum(isinstance(e, ToolStarted) and e.call_id == done1 for e in log) == 1
    tool_messages = [m for m in model_server.messages(1) if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [done1, slow, later]


class Killed(BaseException):
    """The process died here (a BaseException, so no `except Exception` in the loop or a tool can catch it)."""


class DyingStore:
    """A FileStore whose process dies on its n-th append: that entry and every later one never reach the disk,
    which is the log a SIGKILL at that moment leaves. Sweeping n covers a kill between every pair of appends."""

    def __init__(self, store: FileStore, lives: int):
        self.store, self.lives = store, lives

    async def load(self, session_id: str) -> list:
        return await self.store.load(session_id)

    async def append(self, session_id: str, entry) -> None:
        if self.lives <= 0:
            raise Killed
        self.lives -= 1
        await self.store.append(session_id, entry)


def conversation_is_valid(messages: list[dict]) -> bool:
    """Every assistant tool call is answered by a tool message right after it, and no tool message is orphaned."""
    expected: list[str] = []
    for m in messages:
        if m["role"] == "tool":
            if not expected or m["tool_call_id"] != expected.pop(0):
                return False
        elif expected:
            return False
        if m["role"] == "assistant":
            expected = [c["id"] for c in m.get("tool_calls") or ()]
    return not expected


def kill_at_every_append(model_server, tmp_path, config: dict, check) -> int:
    from agent_support import agent_config, make_agent

    n = 0
    while True:
        ws, store = tmp_path / f"ws{n}", FileStore(tmp_path / f"store{n}")
        ws.mkdir()
        first = len(model_server.requests)
        dying = make_agent(agent_config(model_server.url, **config), DyingStore(store, n), ws)
        try:
            asyncio.run(closing(dying, dying.send("go")))
            return n  # no append left to die at
        except Killed:
            pass
        again = make_agent(agent_config(model_server.url, **config), store, ws)
        result = asyncio.run(closing(again, again.resume() if asyncio.run(store.load("s1")) else again.send("go")))
        assert result.outcome == "answered", (n, result)
        for request in model_server.requests[first:]:
            assert conversation_is_valid(request.json["messages"]), (n, request.json["messages"])
        check(n, ws, asyncio.run(store.load("s1")))
        n += 1


async def closing(agent, coro):
    try:
        return await coro
    finally:
        await agent.model.aclose()


def first_user(request: dict) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


def test_a_kill_between_any_two_appends_resumes_without_rerunning_a_call(model_server, tmp_path):
    def reply(request: dict) -> Reply:
        if request["messages"][-1]["role"] == "user":
            return Reply(tool_calls=[ToolCall("bash", {"command": f"echo {x} >> count.txt"}) for x in "ab"])
        return Reply(text="done")

    def check(n: int, ws: Path, log: list) -> None:
        ran = (ws / "count.txt").read_text().split() if (ws / "count.txt").exists() else []
        assert sorted(set(ran)) == sorted(ran), (n, ran)  # nothing ran twice
        for e in log:
            if isinstance(e, ToolResult) and e.status != "interrupted":
                assert e.output == "", (n, e)  # a call reported done did run

    model_server.always(reply)
    assert kill_at_every_append(model_server, tmp_path, {}, check) == 8


def review_reply(request: dict) -> Reply:
    """The caller asks the reviewer, whose one command appends to count.txt; both then answer."""
    last = request["messages"][-1]["role"]
    if first_user(request) == "review it":
        if last == "user":
            return Reply(tool_calls=[ToolCall("bash", {"command": "echo r >> count.txt"})])
        return Reply(text="reviewed")
    if last == "user":
        return Reply(tool_calls=[ToolCall("ask_agent", {"agent": "reviewer", "prompt": "review it"})])
    return Reply(text="done")


def test_a_kill_inside_an_asked_agent_resumes_it_where_it_stopped(model_server, tmp_path):
    (tmp_path / "reviewer.yaml").write_text(f"model: {{url: {model_server.url}, name: test-model}}\n")

    def check(n: int, ws: Path, log: list) -> None:
        ran = (ws / "count.txt").read_text().split() if (ws / "count.txt").exists() else []
        assert ran == ["r"], (n, ran)  # the reviewer's command ran, once
        [answer] = [e for e in log if isinstance(e, ToolResult)]
        assert answer.output == "reviewed", (n, answer)  # its work survived the kill

    model_server.always(review_reply)
    config = {"mmConfigs": {"reviewer": {"config": str(tmp_path / "reviewer.yaml")}}}
    assert kill_at_every_append(model_server, tmp_path, config, check) > 8


def test_a_kill_while_resuming_an_approved_nested_call(model_server, tmp_path):
    from agent_support import agent_config, make_agent
    from mm_core import Decision
    from mm_core.events import PermissionRequested

    (tmp_path / "reviewer.yaml").write_text(f"model: {{url: {model_server.url}, name: test-model}}\n")
    config = agent_config(
        model_server.url, yolo=False, mmConfigs={"reviewer": {"config": str(tmp_path / "reviewer.yaml")}}
    )

    model_server.always(review_reply)
    asked = lambda events: [e for e in events if isinstance(e, PermissionRequested)][-1].calls  # noqa: E731
    n, died = 0, True
    while died:
        ws, store, events = tmp_path / f"ws{n}", FileStore(tmp_path / f"store{n}"), []
        ws.mkdir()
        agent = make_agent(config, store, ws, events=events)
        assert asyncio.run(closing(agent, agent.send("go"))).outcome == "suspended"
        [ask] = asked(events)
        assert asyncio.run(closing(agent, agent.resume([Decision(ask.call_id, True)]))).outcome == "suspended"
        [bash] = asked(events)
        approval = [Decision(bash.call_id, True, "U1")]
        dying = make_agent(config, DyingStore(store, n), ws)
        try:
            asyncio.run(closing(dying, dying.resume(approval)))
            died = False
        except Killed:
            pass
        again = make_agent(config, store, ws)
        # The front end passes the person's decision again: it may not have reached the log.
        result = asyncio.run(closing(again, again.resume(approval)))
        assert result.outcome == ("answered" if died else "idle"), (n, result)
        assert (ws / "count.txt").read_text() == "r\n", n
        [answer] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
        assert answer.output == "reviewed", (n, answer)
        n += 1
    assert n > 8


def test_a_kill_while_the_loop_detector_stops_the_turn_keeps_it_stopped(model_server, tmp_path):
    from agent_support import agent_config, make_agent
    from mm_core.log import ErrorRecord, TurnEnded
    from mm_core.loopdetect import stop_text

    looping = ToolCall("bash", {"command": "echo x >> ran.txt; cat nope"})
    model_server.always(lambda request: Reply(tool_calls=[looping]))
    n, died = 0, True
    while died:
        ws, store = tmp_path / f"ws{n}", FileStore(tmp_path / f"store{n}")
        ws.mkdir()
        dying = make_agent(agent_config(model_server.url), DyingStore(store, n), ws)
        try:
            asyncio.run(closing(dying, dying.send("go")))
            died = False
        except Killed:
            again = make_agent(agent_config(model_server.url), store, ws)
            result = asyncio.run(closing(again, again.resume() if asyncio.run(store.load("s1")) else again.send("go")))
            assert result.outcome == "failed", (n, result)
        log = asyncio.run(store.load("s1"))
        results = [e for e in log if isinstance(e, ToolResult)]
        interrupted = sum(r.status == "interrupted" for r in results)
        assert (ws / "ran.txt").read_text().count("x") == 6 + interrupted, n
        assert [r.output for r in results].count(stop_text("bash")) == 1, n
        assert [e for e in log if isinstance(e, ErrorRecord)] == [ErrorRecord(stop_text("bash"), "generation")], n
        assert log[-1] == TurnEnded(Outcome.FAILED), n
        n += 1
    assert n == 22  # a kill at each of the 21 appends, then a run without one


@pytest.mark.parametrize("recorded", [1, 2])
def test_a_kill_while_a_cancellation_is_recorded_keeps_the_turn_cancelled(model_server, tmp_path, recorded):
    """The log a cancel leaves when the process dies after `recorded` of its two results, before the end mark:
    the resume finishes the cancellation and neither runs the other call nor asks the model again."""
    from agent_support import agent_config, make_agent
    from mm_core.log import AssistantMessage, MemoryStore, ToolCallRequest, TurnEnded, UserMessage

    calls = (
        ToolCallRequest("call_a", "bash", '{"command": "sleep 30"}'),
        ToolCallRequest("call_b", "bash", '{"command": "touch b-ran"}'),
    )
    store = MemoryStore()
    for entry in [
        UserMessage("go"),
        AssistantMessage("", calls),
        ToolStarted("call_a", "bash"),
        ToolResult("call_a", "bash", "[error: cancelled]", CallStatus.CANCELLED),
        ToolResult("call_b", "bash", "[error: cancelled]", CallStatus.CANCELLED),
    ][: 3 + recorded]:
        asyncio.run(store.append("s1", entry))
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    assert asyncio.run(agent.resume()).outcome == "cancelled"
    assert not (tmp_path / "b-ran").exists()
    assert model_server.requests == []
    log = asyncio.run(store.load("s1"))
    assert [e.status for e in log if isinstance(e, ToolResult)] == ["cancelled", "cancelled"]
    assert log[-1] == TurnEnded(Outcome.CANCELLED)
