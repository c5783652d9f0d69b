"""The turn loop against the scripted model server over real HTTP, with the real tools."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from agent_support import agent_config, call_ids, make_agent
from mm_core.agent import CHANGED, TOO_MANY_CALLS, TurnInProgress
from mm_core.display import call_line, counters_line, dropped_line
from mm_core.events import (
    CallsDropped,
    Error,
    PermissionRequested,
    Status,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Compaction,
    Decision,
    ErrorRecord,
    MemoryStore,
    Outcome,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    TurnEnded,
    UserMessage,
    shown_digest,
)
from mm_core.loopdetect import LOOP_DETECTED
from mm_core.model import ModelClient
from mm_testkit.fixtures_kit import needs_bwrap, needs_bwrap_when_root
from mm_testkit.processes import running
from playground.model_server import Reply, ToolCall, endless

pytestmark = needs_bwrap_when_root


def bash(command: str, id: str | None = None) -> ToolCall:
    return ToolCall("bash", {"command": command}, id=id)


def run(coro):
    return asyncio.run(coro)


def test_plain_answer(model_server, tmp_path):
    model_server.script(Reply(text="Hello from the model.", usage=(12, 5)))
    events: list = []
    agent = make_agent(agent_config(model_server.url), MemoryStore(), tmp_path, events=events)
    result = run(agent.send("hi"))
    assert result.outcome == "answered"
    assert result.answer == "Hello from the model."
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 5)
    sent = model_server.messages(0)
    assert [m["role"] for m in sent] == ["system", "user"]
    assert sent[1]["content"] == "hi"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello from the model."
    assert Status("Thinking") in events
    # The declared tools follow the config: bash and the three file tools by default.
    names = [t["function"]["name"] for t in model_server.requests[0].json["tools"]]
    assert names == ["bash", "read_file", "write_file", "edit_file"]


def test_several_tool_rounds_feed_results_back(model_server, tmp_path):
    model_server.script(
        Reply(tool_calls=[bash("echo one", "c1"), bash("echo two", "c2")]),
        Reply(tool_calls=[ToolCall("write_file", {"path": "notes.txt", "content": "x\n"}, id="c3")]),
        Reply(text="Done."),
    )
    events: list = []
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path, events=events)
    result = run(agent.send("do things"))
    assert result.outcome == "answered"
    assert (tmp_path / "notes.txt").read_text() == "x\n"
    c1, c2, c3 = call_ids(asyncio.run(store.load("s1")))
    assert len({c1, c2, c3}) == 3
    second = model_server.messages(1)
    assert [c["id"] for c in second[-3]["tool_calls"]] == [c1, c2]
    assert second[-2] == {"role": "tool", "tool_call_id": c1, "content": "one\n"}
    assert second[-1] == {"role": "tool", "tool_call_id": c2, "content": "two\n"}
    third = model_server.messages(2)
    assert third[-1]["tool_call_id"] == c3
    assert result.counters.commands == 2 and result.counters.file_ops == 1
    assert counters_line(result.counters) == "⚙ 2 command(s) 📝 1 file op(s)"
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert call_line(started[0]).text == "🛠️ bash: echo one"
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished[0].preview == "one"


def test_max_turns_stops_the_turn(model_server, tmp_path):
    model_server.always(lambda request: Reply(tool_calls=[bash(f"echo {len(request['messages'])}")]))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, maxTurns=3), store, tmp_path)
    result = run(agent.send("loop"))
    assert result.outcome == "max_turns"
    assert len(model_server.requests) == 3
    errors = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ErrorRecord)]
    assert errors and "maxTurns (3)" in errors[0].message
    # The session takes the next message.
    model_server.always(None)
    model_server.script(Reply(text="ok"))
    assert run(agent.send("again")).outcome == "answered"


def test_watchdog_ends_a_silent_model(model_server, tmp_path):
    model_server.script(Reply(text="I am thinking very hard", chunk_size=4, stall_after=2, stall_for=30))
    events: list = []
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, watchdogTimeout="0.5s"), store, tmp_path, events=events)
    result = run(agent.send("hi"))
    assert result.outcome == "failed"
    [error] = [e for e in events if isinstance(e, Error)]
    assert error.message == (
        "[error: the model sent nothing for 0.5s — turn stopped by the watchdog (watchdogTimeout); the model "
        "may still be loading, or the server is stuck]"
    )
    assert isinstance(asyncio.run(store.load("s1"))[-1], TurnEnded)


def test_watchdog_is_fed_by_every_delta(model_server, tmp_path):
    # 20 deltas 0.1 s apart: 2 s in all, four times the watchdog. Only silence counts, not a slow answer.
    model_server.script(Reply(text="x" * 20, chunk_size=1, interval=0.1))
    agent = make_agent(agent_config(model_server.url, watchdogTimeout="0.5s"), MemoryStore(), tmp_path)
    assert run(agent.send("hi")).answer == "x" * 20


def test_runaway_repeating_arguments(model_server, tmp_path):
    model_server.script(Reply(tool_calls=[ToolCall("write_file", endless('"aaaab'))], fragment_size=5))
    events: list = []
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path, events=events)
    result = run(agent.send("write"))
    assert result.outcome == "failed"
    [error] = [e for e in events if isinstance(e, Error)]
    assert error.message.startswith("[error: the model's tool call ran away: its arguments repeat the same pattern (2")
    assert error.message.endswith("— generation stopped; rephrase the request, or try another model]")
    assert ErrorRecord(error.message, "generation") in asyncio.run(store.load("s1"))


def test_runaway_arguments_past_256_kb(model_server, tmp_path):
    import random

    rng = random.Random(7)
    chunks = ("".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(1000)) for _ in range(400))
    model_server.script(Reply(tool_calls=[ToolCall("write_file", chunks)]))
    events: list = []
    agent = make_agent(agent_config(model_server.url), MemoryStore(), tmp_path, events=events)
    assert run(agent.send("write")).outcome == "failed"
    [error] = [e for e in events if isinstance(e, Error)]
    size = int(error.message.split("(")[1].split(" ")[0])
    assert 256 * 1024 < size <= 256 * 1024 + 1000
    assert "— generation stopped" in error.message


def test_loop_detector_warns_at_3_and_stops_at_6(model_server, tmp_path):
    same = lambda request: Reply(tool_calls=[bash("cat missing.txt")])  # noqa: E731
    model_server.always(same)
    store = MemoryStore()
    events: list = []
    agent = make_agent(agent_config(model_server.url), store, tmp_path, events=events)
    result = run(agent.send("read it"))
    assert result.outcome == "failed"
    outputs = [e.output for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert len(outputs) == 6
    assert not any(LOOP_DETECTED in o for o in outputs[:2])
    assert all(o.endswith("\n" + LOOP_DETECTED) for o in outputs[2:5])
    stop = (
        "[error: the model repeated the same bash call 6 times in a row with the same failing result — turn "
        "stopped by the loop detector; rephrase the request, or fix what the tool kept reporting]"
    )
    assert outputs[5] == stop
    assert ErrorRecord(stop, "generation") in asyncio.run(store.load("s1"))
    assert len(model_server.requests) == 6


def test_loop_detector_resets_on_new_not_on_compact(model_server, tmp_path):
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    call = lambda: Reply(tool_calls=[bash("echo same")])  # noqa: E731
    model_server.script(call(), call(), Reply(text="a"), Reply(text="m"))
    run(agent.send("one"))
    run(agent.send("mid"))
    model_server.script(Reply(text="summary"))
    assert run(agent.compact()).startswith("compacted")
    model_server.script(call(), Reply(text="b"))
    run(agent.send("two"))
    outputs = [e.output for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert outputs[-1].endswith(LOOP_DETECTED)  # the third in a row, across a compaction
    run(agent.new())
    model_server.script(call(), Reply(text="c"))
    run(agent.send("three"))
    outputs = [e.output for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert outputs[-1] == "same\n"


def test_a_different_call_restarts_the_count(model_server, tmp_path):
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    model_server.script(
        Reply(tool_calls=[bash("echo a")]),
        Reply(tool_calls=[bash("echo a")]),
        Reply(tool_calls=[bash("echo b")]),
        Reply(tool_calls=[bash("echo a")]),
        Reply(text="done"),
    )
    run(agent.send("go"))
    assert not any(LOOP_DETECTED in e.output for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult))


def test_invalid_arguments_and_unknown_tool_are_text(model_server, tmp_path):
    model_server.script(
        Reply(tool_calls=[ToolCall("bash", "{not json", id="a"), ToolCall("nope", {}, id="b")]),
        Reply(text="sorry"),
    )
    agent = make_agent(agent_config(model_server.url), MemoryStore(), tmp_path)
    assert run(agent.send("go")).outcome == "answered"
    tools = model_server.messages(1)[-2:]
    assert tools[0]["content"].startswith("[error: the arguments of bash are not valid JSON (")
    assert tools[1]["content"] == (
        "[error: there is no tool named 'nope' — available tools: bash, edit_file, read_file, write_file]"
    )


def test_suspend_resume_approved_and_rejected(model_server, tmp_path):
    model_server.script(
        Reply(
            tool_calls=[
                ToolCall("read_file", {"path": "a.txt"}, id="r1"),
                bash("echo approved > out.txt", "b1"),
                bash("rm -rf everything", "b2"),
            ]
        ),
        Reply(text="finished"),
    )
    (tmp_path / "a.txt").write_text("A\n")
    store = MemoryStore()
    events: list = []
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, events=events)
    result = run(agent.send("go"))
    assert result.outcome == "suspended"
    [request] = [e for e in events if isinstance(e, PermissionRequested)]
    _, b1, b2 = call_ids(asyncio.run(store.load("s1")))
    assert [(c.call_id, c.tool, c.preview) for c in request.calls] == [
        (b1, "bash", "echo approved > out.txt"),
        (b2, "bash", "rm -rf everything"),
    ]
    assert not (tmp_path / "out.txt").exists()
    with pytest.raises(TurnInProgress):
        run(agent.send("another message"))
    # A fresh Agent on the same store stands for another worker after a restart.
    again = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    result = run(again.resume([Decision(b1, True, "U1"), Decision(b2, False, "U2")]))
    assert result.outcome == "answered"
    assert (tmp_path / "out.txt").read_text() == "approved\n"
    tool_messages = [m for m in model_server.messages(1) if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["A\n", "", "[command rejected by the user]"]
    decisions = [e for e in asyncio.run(store.load("s1")) if isinstance(e, Decision)]
    assert [(d.call_id, d.approved, d.by) for d in decisions] == [(b1, True, "U1"), (b2, False, "U2")]


def test_two_suspensions_in_one_turn(model_server, tmp_path):
    model_server.script(
        Reply(tool_calls=[ToolCall("write_file", {"path": "f.txt", "content": "one\n"}, id="w1")]),
        Reply(tool_calls=[ToolCall("edit_file", {"path": "f.txt", "edits": [{"old": "one", "new": "two"}]}, id="e1")]),
        Reply(text="edited"),
    )
    store = MemoryStore()
    events: list = []
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, events=events)
    assert run(agent.send("go")).outcome == "suspended"
    first = [e for e in events if isinstance(e, PermissionRequested)][-1].calls[0]
    assert first.tool == "write_file"
    assert first.preview == "would write f.txt: new file, 1 line\n@@ -0,0 +1,1 @@\n+1 │ one"
    assert not (tmp_path / "f.txt").exists()
    assert run(agent.resume([Decision(first.call_id, True, "U1")])).outcome == "suspended"
    second = [e for e in events if isinstance(e, PermissionRequested)][-1].calls[0]
    assert second.tool == "edit_file"
    assert "-1 │ one" in second.preview and "+1 │ two" in second.preview, second.preview
    assert (tmp_path / "f.txt").read_text() == "one\n"  # the preview wrote nothing
    result = run(agent.resume([Decision(second.call_id, True, "U1")]))
    assert result.outcome == "answered"
    assert (tmp_path / "f.txt").read_text() == "two\n"


def test_approve_all_runs_the_rest_of_the_requester_s_calls(model_server, tmp_path):
    model_server.script(
        Reply(tool_calls=[bash("echo 1", "a")]),
        Reply(tool_calls=[bash("echo 2", "b")]),
        Reply(text="first done"),
        Reply(tool_calls=[bash("echo 3", "c")]),
        Reply(text="second done"),
    )
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go")).outcome == "suspended"
    [a] = call_ids(asyncio.run(store.load("s1")))
    assert run(agent.resume([Decision(a, True, "U1", all=True)])).outcome == "answered"
    assert run(agent.send("more")).outcome == "answered"
    results = [(e.call_id, e.output) for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert results == list(zip(call_ids(asyncio.run(store.load("s1"))), ["1\n", "2\n", "3\n"], strict=True))


def test_approve_all_covers_its_requester_and_not_someone_else_who_replies(model_server, tmp_path):
    """Issue 21: an approver's "Approve all" on Ada's call runs the rest of Ada's calls, in this turn and her
    later ones; a turn Linus asked for asks again."""
    model_server.script(
        Reply(tool_calls=[bash("echo ada-1", "a")]),
        Reply(text="first done"),
        Reply(tool_calls=[bash("echo ada-2", "b")]),
        Reply(text="second done"),
        Reply(tool_calls=[bash("touch linus.txt", "c")]),
        Reply(text="never"),
    )
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go", author="U0ADA")).outcome == "suspended"
    [a] = call_ids(asyncio.run(store.load("s1")))
    assert run(agent.resume([Decision(a, True, "U0GRACE", all=True)])).outcome == "answered"
    assert run(agent.send("more", author="U0ADA")).outcome == "answered"
    assert run(agent.send("me too", author="U0LINUS")).outcome == "suspended"
    assert not (tmp_path / "linus.txt").exists()
    outputs = [e.output for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert outputs == ["ada-1\n", "ada-2\n"]


def test_a_rejected_call_stays_rejected_beside_an_approve_all(model_server, tmp_path):
    """A call a person decided follows that decision: Approve all on one call does not run another call of the
    same answer that someone rejected."""
    model_server.script(
        Reply(tool_calls=[bash("touch approved.txt", "a"), bash("touch rejected.txt", "b")]),
        Reply(text="done"),
    )
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go", author="U0ADA")).outcome == "suspended"
    a, b = call_ids(asyncio.run(store.load("s1")))
    decisions = [Decision(b, False, "U0GRACE"), Decision(a, True, "U0GRACE", all=True)]
    assert run(agent.resume(decisions)).outcome == "answered"
    assert (tmp_path / "approved.txt").exists() and not (tmp_path / "rejected.txt").exists()


def test_an_approved_edit_whose_file_changed_before_it_ran_does_not_run_and_is_asked_again(model_server, tmp_path):
    """Bound to the exact call: between the approval and the run the file changed (a background job wrote it),
    so the diff that would be written is not the one approved. Nothing is written, the model is told, and its
    next call asks again, with the diff as it is now."""
    edit = {"path": "f.txt", "edits": [{"old": "one", "new": "two"}]}
    model_server.script(
        Reply(tool_calls=[ToolCall("edit_file", edit, id="e1")]),
        Reply(tool_calls=[ToolCall("edit_file", edit, id="e2")]),
        Reply(text="edited"),
    )
    target = tmp_path / "f.txt"
    target.write_text("one\nkept\n")
    store = MemoryStore()
    events: list = []
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, events=events)
    assert run(agent.send("go")).outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
    assert "kept" in asked.preview and asked.shown
    target.write_text("one\nswapped behind your back\n")
    assert run(agent.resume([Decision(asked.call_id, True, "U1", shown=asked.shown)])).outcome == "suspended"
    assert target.read_text() == "one\nswapped behind your back\n"
    [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert (result.call_id, result.output, result.status) == (asked.call_id, CHANGED, "error")
    assert [m["content"] for m in model_server.messages(1) if m["role"] == "tool"] == [CHANGED]
    [again] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
    assert again.call_id != asked.call_id and "swapped behind your back" in again.preview
    assert again.shown != asked.shown
    assert run(agent.resume([Decision(again.call_id, True, "U1", shown=again.shown)])).outcome == "answered"
    assert target.read_text() == "two\nswapped behind your back\n"


def test_a_decision_for_another_version_of_the_call_runs_nothing(model_server, tmp_path):
    """A decision whose digest of what was shown is not this call's (stale, or forged) approves nothing."""
    model_server.script(Reply(tool_calls=[bash("touch made.txt", "a")]), Reply(text="done"))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go")).outcome == "suspended"
    [a] = call_ids(asyncio.run(store.load("s1")))
    harmless = shown_digest("bash", {"command": "echo harmless"}, "echo harmless")
    assert run(agent.resume([Decision(a, True, "U1", all=True, shown=harmless)])).outcome == "answered"
    assert not (tmp_path / "made.txt").exists()
    assert [(e.output, e.status) for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)] == [
        (CHANGED, "error")
    ]


def test_oneshot_rejects_calls_that_would_ask(model_server, tmp_path):
    model_server.script(Reply(tool_calls=[bash("touch x", "a")]), Reply(text="could not"))
    agent = make_agent(agent_config(model_server.url, yolo=False), MemoryStore(), tmp_path, oneshot=True)
    assert run(agent.send("go")).outcome == "answered"
    assert model_server.messages(1)[-1]["content"] == "[command rejected by the user]"
    assert not (tmp_path / "x").exists()


def cancel_when(agent, ready) -> str:
    """Start a turn, cancel it once `ready()` holds, then ask again: the session must take the message."""

    async def scenario():
        task = asyncio.create_task(agent.send("hi"))
        for _ in range(200):
            if ready():
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return (await agent.send("again")).answer

    return run(scenario())


def test_cancel_during_generation(model_server, tmp_path):
    model_server.script(Reply(text="slow answer", chunk_size=2, stall_after=2, stall_for=30), Reply(text="next"))
    store, events = MemoryStore(), []
    agent = make_agent(agent_config(model_server.url), store, tmp_path, events=events)
    assert cancel_when(agent, lambda: any(isinstance(e, TextDelta) for e in events)) == "next"
    log = asyncio.run(store.load("s1"))
    assert TurnEnded(Outcome.CANCELLED) in log
    assert not any(isinstance(e, AssistantMessage) and e.text.startswith("slow") for e in log)


def test_cancel_during_a_tool_kills_it(model_server, tmp_path):
    model_server.script(
        Reply(tool_calls=[bash("echo started; touch running; sleep 30; echo never > never.txt"), bash("echo b")]),
        Reply(text="next"),
    )
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    assert cancel_when(agent, (tmp_path / "running").exists) == "next"
    a, b = call_ids(asyncio.run(store.load("s1")))
    results = {e.call_id: e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)}
    assert results[a].output == "started\n[error: cancelled]"
    assert results[a].status == "cancelled"
    assert results[b].output == "[error: cancelled]"
    assert not (tmp_path / "never.txt").exists()
    # The conversation the model sees next is consistent: both calls have results.
    tool_messages = [m for m in model_server.messages(1) if m["role"] == "tool"]
    assert len(tool_messages) == 2


def test_stop_while_awaiting_approval(model_server, tmp_path):
    model_server.script(Reply(tool_calls=[bash("echo x", "a")]), Reply(text="fresh"))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go")).outcome == "suspended"
    assert run(agent.stop()).outcome == "cancelled"
    assert run(agent.send("new question")).answer == "fresh"


def test_compaction_summarises_and_keeps_the_tail(model_server, tmp_path):
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    model_server.script(Reply(text="answer one"), Reply(text="answer two"))
    run(agent.send("question one"))
    run(agent.send("question two"))
    model_server.script(Reply(text="We discussed one."))
    run(agent.compact())
    summary_request = model_server.messages(2)
    assert [m["content"] for m in summary_request[1:3]] == ["question one", "answer one"]
    assert summary_request[-1]["content"].startswith("Summarise the conversation so far")
    model_server.script(Reply(text="three"))
    run(agent.send("question three"))
    sent = model_server.messages(3)
    assert [m["content"] for m in sent[1:]] == [
        "Summary of the earlier conversation:\nWe discussed one.",
        "question two",
        "answer two",
        "question three",
    ]
    assert any(isinstance(e, Compaction) for e in asyncio.run(store.load("s1")))


def test_user_message_author_is_kept(model_server, tmp_path):
    store = MemoryStore()
    model_server.script(Reply(text="ok"))
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    run(agent.send("hello", author="U123"))
    assert asyncio.run(store.load("s1"))[0] == UserMessage("hello", "U123")
    assert json.dumps(model_server.messages(0))  # what was sent is plain JSON


def test_unknown_model_and_unreachable_endpoint_are_clear_errors(tmp_path):
    from playground.model_server import ModelServer

    with ModelServer(known_models=["ai/gemma3"]) as server:
        events: list = []
        agent = make_agent(agent_config(server.url), MemoryStore(), tmp_path, events=events)
        assert run(agent.send("hi")).outcome == "failed"
        [error] = [e for e in events if isinstance(e, Error)]
        assert error.message == (
            f"the model endpoint {server.url} does not know the model 'test-model' (model 'test-model' not "
            f"found) — check model.name or MM_MODEL"
        )
        url = server.url
    # The server is gone: nothing listens on its port any more.
    events = []
    agent = make_agent(agent_config(url), MemoryStore(), tmp_path, events=events)
    assert run(agent.send("hi")).outcome == "failed"
    [error] = [e for e in events if isinstance(e, Error)]
    assert error.message.startswith(f"the model endpoint {url} is unreachable (")
    assert error.message.endswith(") — start the model server or set MM_MODEL_URL")


def test_a_failing_model_answer_leaves_the_session_usable(model_server, tmp_path):
    from playground.model_server import Fail

    model_server.script(Fail(503, "overloaded"), Reply(text="back"))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url), store, tmp_path)
    assert run(agent.send("hi")).outcome == "failed"
    assert ErrorRecord("the model endpoint answered HTTP 503: overloaded", "generation") in asyncio.run(
        store.load("s1")
    )
    assert run(agent.send("again")).answer == "back"


def test_a_decision_for_a_call_that_is_not_pending_is_dropped(model_server, tmp_path):
    # A stale "approve all" button, clicked after its turn was stopped, must not switch the session to yolo.
    model_server.script(Reply(tool_calls=[bash("echo 1", "a")]), Reply(tool_calls=[bash("touch later", "b")]))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go")).outcome == "suspended"
    [a] = call_ids(asyncio.run(store.load("s1")))
    assert run(agent.stop()).outcome == "cancelled"
    assert run(agent.resume([Decision(a, True, "U1", all=True)])).outcome == "idle"
    assert not any(isinstance(e, Decision) for e in asyncio.run(store.load("s1")))
    assert run(agent.send("again")).outcome == "suspended"
    assert not (tmp_path / "later").exists()


def test_the_first_decision_on_a_call_wins(model_server, tmp_path):
    model_server.script(Reply(tool_calls=[bash("touch made", "a")]), Reply(text="ok"))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path)
    assert run(agent.send("go")).outcome == "suspended"
    [a] = call_ids(asyncio.run(store.load("s1")))
    assert run(agent.resume([Decision(a, False, "U1"), Decision(a, True, "U2")])).outcome == "answered"
    assert not (tmp_path / "made").exists()
    assert [(d.approved, d.by) for d in asyncio.run(store.load("s1")) if isinstance(d, Decision)] == [(False, "U1")]


@needs_bwrap  # the sandbox's wrapper keeps the job below this process, where the test finds it as its own
def test_new_reaps_the_background_jobs_of_the_session(model_server, tmp_path):
    import time

    model_server.script(Reply(tool_calls=[bash("nohup sleep 987 > /dev/null 2>&1 &")]), Reply(text="started"))
    agent = make_agent(agent_config(model_server.url), MemoryStore(), tmp_path)
    assert run(agent.send("start a job")).answer == "started"
    # Host pids, found below this test's process: inside the sandbox the job's own pid is its namespace's.
    [job] = running(os.getpid(), "sleep", "987")  # the job outlived the call, as the reference promises
    run(agent.new())
    for _ in range(100):  # the kill is sent; give the kernel a moment to take the process away
        if not job.alive():
            break
        time.sleep(0.05)
    assert not job.alive()


# --- at most maxToolCallsPerAnswer calls of one answer -----------------------------------------------------------

MANY = 150


def many_calls(n: int = MANY) -> Reply:
    return Reply(tool_calls=[bash(f"echo {i} > f{i}") for i in range(n)])


def dropped_text(asked: int, cap: int) -> str:
    return TOO_MANY_CALLS.format(asked=asked, cap=cap)


def test_an_answer_s_calls_beyond_the_cap_are_answered_not_run(model_server, tmp_path):
    model_server.script(many_calls(), Reply(text="I made 16 of them."))
    store, events = MemoryStore(), []
    agent = make_agent(agent_config(model_server.url, maxToolCallsPerAnswer=16), store, tmp_path, events=events)
    result = run(agent.send("make 150 files"))
    assert result.outcome == "answered"
    assert sorted(p.name for p in tmp_path.glob("f*")) == sorted(f"f{i}" for i in range(16))
    assert len([e for e in events if isinstance(e, ToolCallStarted)]) == 16
    assert len([e for e in events if isinstance(e, ToolCallFinished)]) == 16
    assert [e for e in events if isinstance(e, CallsDropped)] == [CallsDropped(MANY, 16)]
    assert dropped_line(CallsDropped(MANY, 16)) == (
        "✂️ The model asked for 150 tool calls in one answer; only the first 16 are taken up, the other 134 were "
        "not run."
    )
    # Every call has exactly one result, so the next request is a conversation the API takes.
    results = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert len(results) == MANY and len({r.call_id for r in results}) == MANY
    ids = call_ids(asyncio.run(store.load("s1")))
    # They are answered first, at once: what runs after them was never in doubt.
    assert [r.call_id for r in results[:134]] == ids[16:]
    assert {(r.status, r.output) for r in results[:134]} == {(CallStatus.DROPPED, dropped_text(MANY, 16))}
    assert {r.status for r in results[134:]} == {CallStatus.OK}
    sent = model_server.messages(1)
    tool_messages = [m for m in sent if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ids
    assert tool_messages[16]["content"] == (
        "[error: not run — the answer asked for 150 tool calls and at most 16 of one answer are carried out: the "
        "first 16 were taken up, this one was not — ask for it again in a later answer if it is still needed]"
    )
    # The recap counts what ran.
    assert result.counters.commands == 16


def test_with_approvals_only_the_calls_within_the_cap_are_asked_for(model_server, tmp_path):
    model_server.script(many_calls(), Reply(text="done"))
    store, events = MemoryStore(), []
    config = agent_config(model_server.url, maxToolCallsPerAnswer=16, yolo=False)
    agent = make_agent(config, store, tmp_path, events=events)
    assert run(agent.send("make 150 files")).outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)]
    assert len(asked.calls) == 16
    # The dropped calls' results are in the log before anybody is asked: another process resuming the turn
    # sees 16 open calls, not 150.
    again = make_agent(config, store, tmp_path)
    assert len(run(again.load()).open_calls()) == 16
    decisions = [Decision(c.call_id, True, "U1") for c in asked.calls]
    assert run(again.resume(decisions)).outcome == "answered"
    assert len(list(tmp_path.glob("f*"))) == 16


def test_a_turn_resumed_after_a_crash_drops_the_same_calls(model_server, tmp_path):
    # The process died right after logging the answer, before any call had a result.
    store = MemoryStore()
    calls = tuple(ToolCallRequest(f"call_{i}", "bash", json.dumps({"command": f"echo {i} > f{i}"})) for i in range(40))
    asyncio.run(store.append("s1", UserMessage("make 40 files")))
    asyncio.run(store.append("s1", AssistantMessage("", calls)))
    model_server.script(Reply(text="done"))
    events: list = []
    config = agent_config(model_server.url, maxToolCallsPerAnswer=4, yolo=False)
    result = run(make_agent(config, store, tmp_path, events=events).resume())
    assert result.outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)]
    assert [c.call_id for c in asked.calls] == ["call_0", "call_1", "call_2", "call_3"]
    assert [e for e in events if isinstance(e, CallsDropped)] == [CallsDropped(40, 4)]


def test_without_a_cap_every_call_of_an_answer_runs(model_server, tmp_path):
    model_server.script(many_calls(20), Reply(text="done"))
    agent = make_agent(agent_config(model_server.url), MemoryStore(), tmp_path)
    assert agent.config.maxToolCallsPerAnswer is None  # the reference's behaviour unless configured
    assert run(agent.send("make 20 files")).counters.commands == 20
    assert len(list(tmp_path.glob("f*"))) == 20


def test_an_asked_agent_obeys_the_asking_agent_s_cap(model_server, tmp_path):
    # The reviewer's own file sets no bound; it is asked under its caller's, which it cannot raise.
    (tmp_path / "reviewer.yaml").write_text(
        f"model: {{url: {model_server.url}, name: test-model}}\nbash: {{network: false}}\nmaxToolCallsPerAnswer: 50\n"
    )
    refs = {"reviewer": {"config": str(tmp_path / "reviewer.yaml")}}
    config = agent_config(model_server.url, maxToolCallsPerAnswer=2, mmConfigs=refs)
    model_server.script(
        Reply(tool_calls=[ToolCall("ask_agent", {"agent": "reviewer", "prompt": "make files"})]),
        many_calls(5),
        Reply(text="made two"),
        Reply(text="the reviewer made two"),
    )
    store, events = MemoryStore(), []
    assert run(make_agent(config, store, tmp_path, events=events).send("ask")).outcome == "answered"
    assert sorted(p.name for p in tmp_path.glob("f*")) == ["f0", "f1"]
    assert [e for e in events if isinstance(e, CallsDropped)] == [CallsDropped(5, 2, "reviewer")]
    reviewer_tools = [m for m in model_server.messages(2) if m["role"] == "tool"]
    assert [m["content"] for m in reviewer_tools[2:]] == [dropped_text(5, 2)] * 3


class RacingStore(MemoryStore):
    """A log whose recording of a call's start takes long enough for another writer to change the call's file:
    what a database commit before the write leaves open."""

    def __init__(self, target: Path, text: str) -> None:
        super().__init__()
        self.target, self.text = target, text

    async def append(self, session_id: str, entry) -> None:
        await super().append(session_id, entry)
        if isinstance(entry, ToolStarted):
            self.target.write_text(self.text)


def test_an_approved_edit_is_checked_after_its_start_is_recorded_right_before_it_writes(model_server, tmp_path):
    """Issue 21, second round: the check of what was approved came before ToolStarted's append (a commit), and the
    tool then worked its change out again: a file changed during the commit got an edit nobody saw. The check is
    now the last step before the write, and the edit written is the one checked."""
    edit = {"path": "f.txt", "edits": [{"old": "one", "new": "two"}]}
    model_server.script(Reply(tool_calls=[ToolCall("edit_file", edit, id="e1")]), Reply(text="could not"))
    target = tmp_path / "f.txt"
    target.write_text("one\nkept\n")
    store = RacingStore(target, "one\nwritten by someone else while the start was recorded\n")
    events: list = []
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, events=events)
    assert run(agent.send("go")).outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
    assert run(agent.resume([Decision(asked.call_id, True, "U1", shown=asked.shown)])).outcome == "answered"
    assert target.read_text() == "one\nwritten by someone else while the start was recorded\n"
    [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert (result.output, result.status) == (CHANGED, "error")


def test_a_front_end_s_standing_grant_covers_the_turns_of_its_requesters_alone(model_server, tmp_path):
    """Issue 21, second round: a job's yolo is given to the loop as a grant to the prompt nobody wrote: a turn a
    person asked for in the run's thread (a reply, an `ask`) asks, whenever it is taken."""
    model_server.script(
        Reply(tool_calls=[bash("touch prompt.txt", "a")]),
        Reply(text="done"),
        Reply(tool_calls=[bash("touch eve.txt", "b")]),
        Reply(text="never"),
    )
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, granted=frozenset({None}))
    assert run(agent.send("the job's prompt")).outcome == "answered"
    assert run(agent.send("me too", author="U0EVE")).outcome == "suspended"
    assert (tmp_path / "prompt.txt").exists() and not (tmp_path / "eve.txt").exists()


def test_start_runs_the_turn_a_front_end_opened_and_the_agent_closes_as_a_context(model_server, tmp_path):
    """A front end appends the turn's message in its own transaction (a store taking a thread's inbox) and starts
    the turn; `async with` closes the model client on the way out."""

    class Closing(ModelClient):
        closed = 0

        async def aclose(self) -> None:
            self.closed += 1
            await super().aclose()

    store = MemoryStore()
    config = agent_config(model_server.url)
    model = Closing(config.model, None, config.watchdogTimeout)
    model_server.script(Reply(text="hello"))

    async def go():
        async with make_agent(config, store, tmp_path, model=model) as agent:
            assert (await agent.start()).outcome == "idle"  # nothing opened yet: nothing to run
            (await store.append("s1", UserMessage("hi", "U1")))
            return await agent.start()

    finished = run(go())
    assert (finished.outcome, finished.answer) == ("answered", "hello")
    assert model.closed == 1
