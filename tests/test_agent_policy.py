"""The approval policy in the turn loop, against the scripted model server over real HTTP and the real tools: a
deny refuses whatever the yolo, a rule's ask holds over the yolo and the grants, an allow runs a gated call
without asking, and each call's result records its rule and who asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_support import agent_config, make_agent
from mm_core.display import denied_line
from mm_core.events import PermissionRequested, ToolCallFinished
from mm_core.log import CallStatus, Decision, MemoryStore, ToolResult, UserMessage
from mm_core.policy import Rule
from mm_testkit.fixtures_kit import needs_bwrap_when_root
from playground.model_server import Reply, ToolCall

pytestmark = needs_bwrap_when_root

RULES = [
    Rule(name="root wipe", tool="bash", commands=["rm -rf /*"], deny=True),
    Rule(name="two-person push", tool="bash", commands=["git push*"], ask=2, approvers=["S0LEADS"]),
    Rule(name="sources", tool="write_file", paths=["src/**"], allow=True),
]


def bash(command: str) -> Reply:
    return Reply(tool_calls=[ToolCall("bash", {"command": command})])


def results(store: MemoryStore) -> list[ToolResult]:
    return [e for e in store.entries("s1") if isinstance(e, ToolResult)]


def test_a_deny_rule_refuses_in_yolo_with_the_reference_s_words_and_names_itself(model_server, tmp_path: Path) -> None:
    model_server.script(bash("echo hi && rm -rf /tmp/nothing-here"), Reply(text="ok"))
    events: list = []
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=True), store, tmp_path, events=events, policies=RULES)
    assert asyncio.run(agent.send("clean up", author="U0ALICE")).outcome == "answered"
    [result] = results(store)
    assert (result.output, result.status) == ("[command rejected by the user]", CallStatus.REJECTED)
    assert (result.rule, result.requested_by) == ("root wipe", "U0ALICE")
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert denied_line(finished) == (
        "⛔ Refused by the approval policy's rule “root wipe” (it matched `rm -rf /tmp/nothing-here`): it is never "
        "run, whoever asks."
    )
    assert model_server.requests[-1].json["messages"][-1]["content"] == "[command rejected by the user]"


def test_a_rule_s_ask_holds_over_yolo_and_an_approve_all_grant(model_server, tmp_path: Path) -> None:
    model_server.script(bash("echo a && git push origin x"))
    events: list = []
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=True), store, tmp_path, events=events, policies=RULES)
    result = asyncio.run(agent.send("push it", author="U0ALICE"))
    assert result.outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)]
    [call] = asked.calls
    assert (call.rule, call.matched, call.needed, call.approvers) == (
        "two-person push",
        "git push origin x",
        2,
        ("S0LEADS",),
    )
    # A grant of every call of the requester (an "Approve all" given earlier) does not cover it either.
    granted = make_agent(
        agent_config(model_server.url, yolo=False),
        MemoryStore(),
        tmp_path,
        policies=RULES,
        granted=frozenset({"U0ALICE"}),
    )
    model_server.script(bash("git push"), Reply(text="pushed"))
    assert asyncio.run(granted.send("push it", author="U0ALICE")).outcome == "suspended"
    # Decided (the service counted two people), it runs.
    model_server.script(Reply(text="pushed"))
    done = asyncio.run(agent.resume([Decision(call.call_id, True, "U0BOB", shown=call.shown)]))
    assert done.outcome == "answered"
    assert results(store)[0].rule == "two-person push" and results(store)[0].status == CallStatus.OK


def test_an_allow_rule_runs_a_gated_edit_without_asking_and_others_still_ask(model_server, tmp_path: Path) -> None:
    write = ToolCall("write_file", {"path": "src/app.py", "content": "x = 1\n"})
    elsewhere = ToolCall("write_file", {"path": "README.md", "content": "hi\n"})
    model_server.script(Reply(tool_calls=[write, elsewhere]), Reply(text="done"))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, policies=RULES)
    assert asyncio.run(agent.send("write", author="U0ALICE")).outcome == "suspended"
    assert (tmp_path / "src" / "app.py").read_text() == "x = 1\n" and not (tmp_path / "README.md").exists()
    assert [(r.rule, r.status) for r in results(store)] == [("sources", CallStatus.OK)]


def test_without_policies_nothing_changes_and_a_result_says_who_asked(model_server, tmp_path: Path) -> None:
    model_server.script(bash("echo plain"), Reply(text="ok"))
    store = MemoryStore()
    agent = make_agent(agent_config(model_server.url, yolo=True), store, tmp_path)
    assert asyncio.run(agent.send("hi", author="U0ALICE")).outcome == "answered"
    [result] = results(store)
    assert (result.output, result.rule, result.requested_by) == ("plain\n", None, "U0ALICE")
    assert isinstance(store.entries("s1")[0], UserMessage)


def test_a_decision_made_under_another_policy_does_not_carry_over_a_reload(model_server, tmp_path: Path) -> None:
    """The config is read again while calls wait: a rejection stands though an allow rule came since, and an
    approval given under the tools' own gating runs nothing once a two-person rule decides the call (its digest
    binds what was asked of it)."""
    model_server.script(bash("echo RAN > marker"))
    store = MemoryStore()
    events: list = []
    agent = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, events=events)
    assert asyncio.run(agent.send("mark it", author="U0ALICE")).outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)]
    reloaded = make_agent(
        agent_config(model_server.url, yolo=False),
        store,
        tmp_path,
        policies=[Rule(tool="bash", commands=["echo *"], allow=True)],
    )
    model_server.script(Reply(text="ok"))
    asyncio.run(reloaded.resume([Decision(asked.calls[0].call_id, False, "U0BOB", shown=asked.calls[0].shown)]))
    assert not (tmp_path / "marker").exists() and results(store)[-1].status == CallStatus.REJECTED

    model_server.script(bash("git push origin main"))
    events.clear()
    assert asyncio.run(agent.send("push", author="U0ALICE")).outcome == "suspended"
    [asked] = [e for e in events if isinstance(e, PermissionRequested)]
    stricter = make_agent(agent_config(model_server.url, yolo=False), store, tmp_path, policies=RULES)
    model_server.script(Reply(text="ok"))
    asyncio.run(stricter.resume([Decision(asked.calls[0].call_id, True, "U0BOB", shown=asked.calls[0].shown)]))
    assert results(store)[-1].output.startswith("[error: not run — what this call would do changed after it was")


def test_an_entry_from_a_later_version_is_read_without_what_this_one_does_not_know() -> None:
    """A rolling upgrade or a rollback: a worker reads a log a later one wrote. Unknown fields are left out, an
    unknown outcome reads as failed (the turn stays ended), an unknown call status as an error."""
    from mm_core.log import AssistantMessage, Outcome, TurnEnded, YoloSet, from_dict

    result = from_dict(
        {"kind": "tool_result", "call_id": "c1", "tool": "bash", "output": "x", "status": "paused", "later": 1}
    )
    assert result == ToolResult("c1", "bash", "x", CallStatus.ERROR)
    assert from_dict({"kind": "turn_ended", "outcome": "someday", "why": "later"}) == TurnEnded(Outcome.FAILED)
    answer = from_dict(
        {"kind": "assistant", "text": "", "tool_calls": [{"id": "c1", "name": "bash", "arguments": "{}", "x": 2}]}
    )
    assert isinstance(answer, AssistantMessage) and answer.tool_calls[0].name == "bash"
    # A later version's decision or switch may carry what narrows it: without it, it grants nothing.
    later = from_dict({"kind": "approval", "call_id": "c1", "approved": True, "all": True, "only_for": "U0X"})
    assert later == Decision("c1", False, None, all=False)
    assert from_dict({"kind": "yolo", "on": True, "by": "U0BOB", "until": "x"}) == YoloSet(False, "U0BOB")
