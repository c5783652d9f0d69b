"""The turn loop's budget (Agent's `budget`) against the scripted model server over real HTTP, with the real file
tools: asked before each model call with what the turn spent, its asked agents included, and a turn it stops ends
as cleanly as one that reached maxTurns."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_support import agent_config, make_agent
from mm_core import Decision, Usage, display
from mm_core.events import Error, PermissionRequested, TurnFinished
from mm_core.log import (
    AssistantMessage,
    ErrorRecord,
    MemoryStore,
    Nested,
    Outcome,
    ToolCallRequest,
    ToolResult,
    TurnEnded,
    UserMessage,
    to_dict,
)
from mm_core.state import SessionState
from playground.model_server import Reply, ToolCall

LINE = "⛔ This turn's budget of 300 tokens is used ({spent})."


class Budget:
    """A budget of `limit` tokens a turn, recording what it was asked with."""

    def __init__(self, limit: int) -> None:
        self.limit, self.asked = limit, list[Usage]()

    def __call__(self, spent: Usage) -> str | None:
        self.asked.append(spent)
        return LINE.format(spent=spent.total_tokens) if spent.total_tokens >= self.limit else None


def write(path: str, content: str = "x\n") -> ToolCall:
    return ToolCall("write_file", {"path": path, "content": content})


def test_a_budget_ends_the_turn_before_its_next_model_call_with_every_call_answered(model_server, tmp_path: Path):
    model_server.script(Reply(tool_calls=[write("a.txt"), ToolCall("read_file", {"path": "a.txt"})], usage=(300, 40)))
    store, events, budget = MemoryStore(), [], Budget(300)
    agent = make_agent(agent_config(model_server.url, yolo=True), store, tmp_path, events=events, budget=budget)
    result = asyncio.run(agent.send("write it"))

    assert result.outcome == Outcome.BUDGET and result.outcome == "budget"
    assert len(model_server.requests) == 1  # the second call was never made
    assert budget.asked == [Usage(), Usage(300, 40)]
    log = asyncio.run(store.load("s1"))
    # The calls of the last answer ran and were answered; then the error, then the end: the log is whole.
    assert [(e.tool, e.status) for e in log if isinstance(e, ToolResult)] == [("write_file", "ok"), ("read_file", "ok")]
    assert (tmp_path / "a.txt").read_text() == "x\n"
    assert log[-2:] == [ErrorRecord(LINE.format(spent=340), "budget"), TurnEnded(Outcome.BUDGET)]
    assert Error(LINE.format(spent=340), "budget") in events
    [finished] = [e for e in events if isinstance(e, TurnFinished)]
    assert display.recap(finished) == "📝 2 file op(s) · 340 tokens"  # the recap as any ended turn's
    assert agent.spent() == Usage(300, 40)

    # The next message is a new turn, counted from nothing.
    model_server.script(Reply(text="fine", usage=(10, 2)))
    assert asyncio.run(agent.send("and now?")).outcome == Outcome.ANSWERED
    assert budget.asked[2:] == [Usage()]
    assert agent.spent() == Usage(10, 2)


def test_a_resumed_turn_counts_what_it_spent_before_it_waited(model_server, tmp_path: Path):
    model_server.script(Reply(tool_calls=[write("b.txt")], usage=(250, 50)), Reply(text="never asked for"))
    store, events = MemoryStore(), []
    config = agent_config(model_server.url, yolo=False)
    first = Budget(300)
    assert asyncio.run(make_agent(config, store, tmp_path, events=events, budget=first).send("write")).outcome == (
        Outcome.SUSPENDED
    )
    assert first.asked == [Usage()]
    [call] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls

    # Another process resumes it after the approval: the approved call runs, then the budget stops the turn.
    again = Budget(300)
    resumed = make_agent(config, store, tmp_path, budget=again)
    result = asyncio.run(resumed.resume([Decision(call.call_id, True, "U0BOB", shown=call.shown)]))
    assert result.outcome == Outcome.BUDGET
    assert again.asked == [Usage(250, 50)]
    assert (tmp_path / "b.txt").read_text() == "x\n"
    assert len(model_server.requests) == 1


def test_an_asked_agent_spends_its_caller_s_budget_and_is_stopped_by_it(model_server, tmp_path: Path):
    (tmp_path / "reviewer.yaml").write_text(f"model: {{url: {model_server.url}, name: test-model}}\n")
    refs = {"reviewer": {"config": str(tmp_path / "reviewer.yaml"), "yolo": True}}
    config = agent_config(model_server.url, yolo=True, mmConfigs=refs)
    model_server.script(
        Reply(tool_calls=[ToolCall("ask_agent", {"agent": "reviewer", "prompt": "look"})], usage=(100, 10)),
        Reply(tool_calls=[ToolCall("read_file", {"path": "missing.txt"})], usage=(150, 50)),  # the reviewer's
        Reply(text="never asked for"),
    )
    store, events, budget = MemoryStore(), [], Budget(300)
    agent = make_agent(config, store, tmp_path, events=events, budget=budget)
    result = asyncio.run(agent.send("get a review"))

    assert result.outcome == Outcome.BUDGET
    assert len(model_server.requests) == 2
    # The caller's first call, the reviewer's two (its second refused), the caller's next (refused).
    assert budget.asked == [Usage(), Usage(100, 10), Usage(250, 60), Usage(250, 60)]
    errors = [e for e in events if isinstance(e, Error)]
    assert [(e.agent, e.where) for e in errors] == [("reviewer", "budget"), (None, "budget")]
    [asked] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult) and e.tool == "ask_agent"]
    assert asked.output.endswith(f"[ask_agent: reviewer stopped before finishing: {LINE.format(spent=310)}]")
    assert agent.spent() == Usage(250, 60)


def test_a_turn_s_spending_counts_its_asked_agents_at_any_depth() -> None:
    log = [
        AssistantMessage("before the turn", (), 7, 7),
        UserMessage("go"),
        AssistantMessage("", (ToolCallRequest("c1", "ask_agent", "{}"),), 10, 1),
        Nested("c1", to_dict(UserMessage("review"))),
        Nested("c1", to_dict(AssistantMessage("", (), 5, 1, agent="reviewer"))),
        Nested("c1", to_dict(Nested("c2", to_dict(AssistantMessage("", (), 2, 1, agent="linter"))))),
    ]
    state = SessionState(log)
    assert state.usage() == Usage(10, 1)  # the recap's: the turn's own answers, as before
    assert state.spent() == Usage(17, 3)


def test_a_budget_used_up_holds_for_compact_too(model_server, tmp_path: Path):
    """`compact` sends the whole history to the model: once a budget is used up, it is refused with the line,
    and no model call is made."""
    store = MemoryStore()
    for entry in (UserMessage("one"), AssistantMessage("a"), TurnEnded(Outcome.ANSWERED), UserMessage("two")):
        asyncio.run(store.append("s1", entry))
    asyncio.run(store.append("s1", AssistantMessage("b")))
    asyncio.run(store.append("s1", TurnEnded(Outcome.ANSWERED)))
    agent = make_agent(agent_config(model_server.url), store, tmp_path, budget=lambda spent: "⛔ used up")
    assert asyncio.run(agent.compact()) == "⛔ used up"
    assert model_server.requests == [] and not any(e.kind == "compaction" for e in store.entries("s1"))
