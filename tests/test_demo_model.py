"""The playground's demo model, played by the real turn loop and tools on its own demo repository."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_support import agent_config, make_agent
from mm_core.agent import Agent
from mm_core.events import PermissionRequested, TextDelta
from mm_core.log import AssistantMessage, Compaction, Decision, MemoryStore, Outcome, ToolResult, UserMessage
from mm_testkit.fixtures_kit import needs_bwrap_when_root
from playground.demo_model import (
    DEMO_CONTENT,
    DEMO_FILE,
    DEMO_MODEL_NAME,
    LABEL,
    answer,
    demo_repository,
    start_demo_model,
)
from playground.model_server import ModelServer

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

FIXED_CONTENT = 'print("hello, world")\n'
RESULT_OF_EDIT = (
    "edited greet.py: 1 edit applied, +1 -1 lines, first change at line 1\n"
    "@@ -1,1 +1,1 @@\n"
    '-1 │ print("hello, wrold")\n'
    '+1 │ print("hello, world")'
)
BASH = ("bash", {"command": "python3 greet.py"})
EDIT = ("edit_file", {"path": "greet.py", "edits": [{"old": "wrold", "new": "world"}]})


@pytest.fixture(scope="module")
def demo() -> Iterator[ModelServer]:
    server = start_demo_model()
    try:
        yield server
    finally:
        server.stop()


def new_agent(server: ModelServer, store: MemoryStore, workspace: Path, events: list, yolo: bool = True) -> Agent:
    config = agent_config(server.url, model={"url": server.url, "name": DEMO_MODEL_NAME}, yolo=yolo)
    return make_agent(config, store, workspace, events=events)


def calls_of(entries: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for e in entries if isinstance(e, AssistantMessage) for c in e.tool_calls]


def turn_entries(log: list[Any], n: int) -> list[Any]:
    """The entries of the n-th turn (from its user message to the next one)."""
    starts = [i for i, e in enumerate(log) if isinstance(e, UserMessage)] + [len(log)]
    return log[starts[n] : starts[n + 1]]


def assistant_texts(entries: list[Any]) -> list[str]:
    return [e.text for e in entries if isinstance(e, AssistantMessage)]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@needs_bwrap_when_root
def test_turns_play_the_script_and_replay_it(demo, tmp_path):
    repo = demo_repository(tmp_path / "repo")
    store, events = MemoryStore(), []
    agent = new_agent(demo, store, repo, events)
    first = asyncio.run(agent.send("show me what you can do"))
    assert first.outcome == Outcome.ANSWERED
    log = asyncio.run(store.load("s1"))
    assert calls_of(log) == [BASH, EDIT]
    assert [e.output for e in log if isinstance(e, ToolResult)] == ["hello, wrold\n", RESULT_OF_EDIT]
    assert (repo / DEMO_FILE).read_text() == FIXED_CONTENT
    assert first.answer == assistant_texts(log)[-1]
    assert first.answer.startswith(LABEL + ": greet.py printed “hello, wrold”; it now says “hello, world”.")
    assert "set MM_MODEL_URL to try your own prompts" in first.answer
    assert assistant_texts(log)[:2] == [
        f"{LABEL}: let me run the script first.",
        f"{LABEL}: it prints “wrold”; fixing the typo.",
    ]
    assert {r.json["model"] for r in demo.requests[-3:]} == {DEMO_MODEL_NAME}
    # Streamed: the final answer arrived in many deltas, not in one piece.
    assert len([e for e in events if isinstance(e, TextDelta)]) > 10

    # With the typo back, the next message plays the whole script again, and says it replays.
    git(repo, "checkout", "--", DEMO_FILE)
    second = asyncio.run(agent.send("again please"))
    assert second.outcome == Outcome.ANSWERED
    turn = turn_entries(asyncio.run(store.load("s1")), 1)
    assert calls_of(turn) == [BASH, EDIT]
    assert assistant_texts(turn)[0] == f"{LABEL}: replaying the demo; let me run the script first."
    assert (repo / DEMO_FILE).read_text() == FIXED_CONTENT

    # Without the typo, the replay finds nothing to fix and says so instead of failing at the edit.
    third = asyncio.run(agent.send("once more"))
    turn = turn_entries(asyncio.run(store.load("s1")), 2)
    assert calls_of(turn) == [BASH]
    assert third.answer.startswith(f"{LABEL}: greet.py already prints “hello, world”")

    # compact keeps the model's answer as the summary; the session goes on after it.
    said = asyncio.run(agent.compact())
    assert said.startswith("compacted ")
    [compaction] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, Compaction)]
    assert compaction.summary.startswith(f"{LABEL}: a scripted model cannot summarise")
    fourth = asyncio.run(agent.send("and after the compaction"))
    assert fourth.outcome == Outcome.ANSWERED
    assert calls_of(turn_entries(asyncio.run(store.load("s1")), 3)) == [BASH]
    assert fourth.answer == third.answer

    texts = [*assistant_texts(asyncio.run(store.load("s1"))), compaction.summary]
    assert len(texts) == 11
    assert all(text.startswith(LABEL) for text in texts), texts


def run_until_asked(agent: Agent, events: list, decisions: list[Decision]) -> PermissionRequested:
    result = asyncio.run(agent.resume(decisions)) if decisions else asyncio.run(agent.send("go"))
    assert result.outcome == Outcome.SUSPENDED
    return [e for e in events if isinstance(e, PermissionRequested)][-1]


@needs_bwrap_when_root
def test_rejecting_the_command_stops_the_demo(demo, tmp_path):
    repo = demo_repository(tmp_path / "repo")
    store, events = MemoryStore(), []
    agent = new_agent(demo, store, repo, events, yolo=False)
    asked = run_until_asked(agent, events, [])
    [call] = asked.calls
    assert (call.tool, call.preview) == ("bash", "python3 greet.py")
    result = asyncio.run(agent.resume([Decision(call.call_id, False, "U1")]))
    assert result.outcome == Outcome.ANSWERED
    assert result.answer == (
        f"{LABEL}: you rejected the command `python3 greet.py`, so I stopped there. Ask again to replay the demo."
    )
    assert calls_of(asyncio.run(store.load("s1"))) == [BASH]
    assert (repo / DEMO_FILE).read_text() == DEMO_CONTENT


@needs_bwrap_when_root
def test_rejecting_the_edit_stops_the_demo(demo, tmp_path):
    repo = demo_repository(tmp_path / "repo")
    store, events = MemoryStore(), []
    agent = new_agent(demo, store, repo, events, yolo=False)
    [command] = run_until_asked(agent, events, []).calls
    [edit] = run_until_asked(agent, events, [Decision(command.call_id, True, "U1")]).calls
    assert edit.tool == "edit_file"
    assert '+1 │ print("hello, world")' in edit.preview, edit.preview
    result = asyncio.run(agent.resume([Decision(edit.call_id, False, "U1")]))
    assert result.answer == (
        f"{LABEL}: you rejected the edit of greet.py, so I stopped there. Ask again to replay the demo."
    )
    assert (repo / DEMO_FILE).read_text() == DEMO_CONTENT


@needs_bwrap_when_root
def test_a_workspace_without_the_demo_file_ends_the_demo(demo, tmp_path):
    store, events = MemoryStore(), []
    agent = new_agent(demo, store, tmp_path, events)
    result = asyncio.run(agent.send("go"))
    assert result.outcome == Outcome.ANSWERED
    assert calls_of(asyncio.run(store.load("s1"))) == [BASH]
    assert result.answer.startswith(f"{LABEL}: `python3 greet.py` did not go as the script expects (“python3: ")
    assert "The demo needs its own repository" in result.answer


def conversation(result: str, tool: tuple[str, dict[str, Any]] = BASH) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": tool[0], "arguments": json.dumps(tool[1])}}
    return {
        "model": DEMO_MODEL_NAME,
        "messages": [
            {"role": "system", "content": "You are mm."},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": f"{LABEL}: let me run the script first.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
        ],
    }


def test_an_error_result_says_the_demo_needs_its_repository():
    error = "python3: can't open file '/w/greet.py': [Errno 2] No such file or directory\n[exit code: exit status 2]"
    reply = answer(conversation(error))
    assert not reply.tool_calls
    assert reply.text == (
        f"{LABEL}: `python3 greet.py` did not go as the script expects (“python3: can't open file '/w/greet.py': "
        "[Errno 2] No such file or directory”). The demo needs its own repository, whose greet.py prints "
        "“hello, wrold”, so I stopped there."
    )
    failed_edit = answer(conversation("[error: edit_file: greet.py: edit 1: old text not found]", EDIT))
    assert not failed_edit.tool_calls
    assert "the edit_file call did not go as the script expects" in failed_edit.text
    # The same result that a good run gives goes on with the edit: only the result decides.
    [edit] = answer(conversation("hello, wrold\n")).tool_calls
    assert (edit.name, edit.arguments) == EDIT


def test_the_server_lists_the_demo_model_and_streams_slowly(demo):
    listed = httpx.get(f"{demo.url}/models", timeout=5).json()
    assert [m["id"] for m in listed["data"]] == [DEMO_MODEL_NAME]
    assert answer({"messages": [{"role": "user", "content": "hi"}]}).interval > 0


def test_demo_repository_is_made_once(tmp_path, monkeypatch):
    # A fresh container: no git identity anywhere.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GIT_AUTHOR_NAME", raising=False)
    monkeypatch.delenv("GIT_COMMITTER_EMAIL", raising=False)
    repo = demo_repository(tmp_path / "repo")
    assert (repo / DEMO_FILE).read_text() == DEMO_CONTENT
    assert git(repo, "log", "--format=%an <%ae>|%s") == "mm playground <playground@localhost>|greet: say hello"
    assert git(repo, "status", "--porcelain") == ""
    head = git(repo, "rev-parse", "HEAD")
    (repo / DEMO_FILE).write_text("changed by a person\n")
    assert demo_repository(repo) == repo
    assert git(repo, "rev-parse", "HEAD") == head
    assert (repo / DEMO_FILE).read_text() == "changed by a person\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".repo.")] == []  # no build left behind
    # A directory holding something else is not taken over.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    with pytest.raises(FileExistsError):
        demo_repository(other)
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
