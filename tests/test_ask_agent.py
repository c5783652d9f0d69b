"""ask_agent: the asked agent runs in the same turn and workspace, and its gated calls suspend and resume
through the caller's approvals."""

from __future__ import annotations

import asyncio

from agent_support import agent_config, call_ids, make_agent
from mm_core import Decision
from mm_core.display import call_line
from mm_core.events import PermissionRequested, TextDelta, ToolCallFinished, ToolCallStarted
from mm_core.log import MemoryStore, ToolResult
from mm_testkit.fixtures_kit import needs_bwrap_when_root
from playground.model_server import Reply, ToolCall

pytestmark = needs_bwrap_when_root


def setup(tmp_path, model_server, **agent_keys):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "reviewer.yaml").write_text(
        f"model: {{url: {model_server.url}, name: test-model}}\n"
        "bash: {network: false}\nacp: {title: Code reviewer}\n"
    )
    refs = {"reviewer": {"config": str(tmp_path / "agents" / "reviewer.yaml"), **agent_keys}}
    return agent_config(model_server.url, yolo=False, mmConfigs=refs)


def ask(prompt="Review the change in app.py", **extra):
    return Reply(tool_calls=[ToolCall("ask_agent", {"agent": "reviewer", "prompt": prompt, **extra})])


def test_description_lists_agents_with_their_purpose(tmp_path, model_server):
    config = setup(tmp_path, model_server)
    agent = make_agent(config, MemoryStore(), tmp_path)
    description = agent.tools["ask_agent"].schema()["description"]
    assert description.endswith("\nAgents:\n  reviewer — Code reviewer")
    (tmp_path / "x").mkdir()
    config = setup(tmp_path / "x", model_server, description="reviews a diff")
    agent = make_agent(config, MemoryStore(), tmp_path / "x")
    assert agent.tools["ask_agent"].schema()["description"].endswith("\nAgents:\n  reviewer — reviews a diff")


def test_nested_gated_call_suspends_and_resumes(tmp_path, model_server):
    config = setup(tmp_path, model_server)
    model_server.script(
        ask(),
        Reply(text="Let me look. ", tool_calls=[ToolCall("bash", {"command": "echo reviewed > review.txt"})]),
        Reply(text="Looks good to me."),
        Reply(text="The reviewer approves."),
    )
    store, events = MemoryStore(), []
    agent = make_agent(config, store, tmp_path, events=events)
    assert asyncio.run(agent.send("get a review")).outcome == "suspended"
    [ask_call] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
    assert ask_call.tool == "ask_agent" and ask_call.icon == "🗣"
    assert ask_call.title.startswith("ask_agent: reviewer (127.0.0.1:")
    assert ask_call.title.endswith("/test-model) — Review the change in app.py")

    # Approving ask_agent runs the reviewer, whose bash call asks in turn: the caller's turn suspends again.
    assert asyncio.run(agent.resume([Decision(ask_call.call_id, True, "U1")])).outcome == "suspended"
    [nested] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
    assert (nested.tool, nested.agent, nested.preview) == ("bash", "reviewer", "echo reviewed > review.txt")
    assert not (tmp_path / "review.txt").exists()
    assert any(isinstance(e, TextDelta) and e.agent == "reviewer" for e in events)

    # A new Agent on the same store stands for another worker: the reviewer resumes where it stopped.
    events2: list = []
    again = make_agent(config, store, tmp_path, events=events2)
    result = asyncio.run(again.resume([Decision(nested.call_id, True, "U2")]))
    assert result.outcome == "answered" and result.answer == "The reviewer approves."
    assert (tmp_path / "review.txt").read_text() == "reviewed\n"
    assert [call_line(e).text for e in events2 if isinstance(e, ToolCallStarted)] == [
        call_line(ask_call).text,
        "🛠️ bash: echo reviewed > review.txt",
    ]
    results = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert [(r.tool, r.output) for r in results] == [("ask_agent", "Looks good to me.")]
    finished = [e for e in events2 if isinstance(e, ToolCallFinished)]
    assert [(e.agent, e.preview) for e in finished] == [
        ("reviewer", "(no output)"),
        (None, "reviewer answered (17 characters)"),
    ]
    # The reviewer saw only its task, not the caller's conversation.
    assert model_server.messages(1)[1:] == [{"role": "user", "content": "Review the change in app.py"}]


def test_rejected_nested_call_and_entry_yolo(tmp_path, model_server):
    config = setup(tmp_path, model_server, yolo=True)  # the entry's yolo decides for the asked agent
    model_server.script(
        ask(),
        Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]),
        Reply(text="ran it"),
        Reply(text="done"),
    )
    store, events = MemoryStore(), []
    agent = make_agent(config, store, tmp_path, events=events)
    assert asyncio.run(agent.send("go")).outcome == "suspended"
    [ask_call] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
    assert asyncio.run(agent.resume([Decision(ask_call.call_id, True, "U1")])).outcome == "answered"
    assert [m["content"] for m in model_server.messages(2) if m["role"] == "tool"] == ["hi\n"]


def test_errors_are_the_reference_texts(tmp_path, model_server):
    config = setup(tmp_path, model_server)
    model_server.script(
        Reply(
            tool_calls=[
                ToolCall("ask_agent", {"agent": "nobody", "prompt": "x"}),
                ToolCall("ask_agent", {"agent": "reviewer", "prompt": "  "}),
            ]
        ),
        Reply(text="ok"),
    )
    agent = make_agent(config.model_copy(update={"yolo": True}), MemoryStore(), tmp_path)
    asyncio.run(agent.send("go"))
    assert [m["content"] for m in model_server.messages(1) if m["role"] == "tool"] == [
        '[ask_agent: unknown agent "nobody" — agents: reviewer]',
        "[ask_agent: the prompt is empty — say what reviewer must do]",
    ]


def test_asked_agent_that_stops_returns_what_it_said(tmp_path, model_server):
    config = setup(tmp_path, model_server).model_copy(update={"yolo": True})
    model_server.script(ask(), Reply(text="partial thoughts", chunk_size=4, stall_after=3, stall_for=30))
    agent_file = tmp_path / "agents" / "reviewer.yaml"
    agent_file.write_text(agent_file.read_text() + "watchdogTimeout: 0.5s\n")
    model_server.script(Reply(text="caller done"))
    store = MemoryStore()
    agent = make_agent(config, store, tmp_path)
    assert asyncio.run(agent.send("go")).outcome == "answered"
    [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert result.output.startswith("[ask_agent: reviewer stopped before finishing: [error: the model sent nothing")


def test_broken_agent_file_fails_clearly(tmp_path, model_server):
    config = setup(tmp_path, model_server).model_copy(update={"yolo": True})
    (tmp_path / "agents" / "reviewer.yaml").write_text("yoloo: true\n")
    model_server.script(ask(), Reply(text="ok"))
    store = MemoryStore()
    asyncio.run(make_agent(config, store, tmp_path).send("go"))
    [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert result.output.startswith(f"[ask_agent: reviewer failed: cannot load {tmp_path}/agents/reviewer.yaml: ")


def test_with_context_sends_history_without_tool_outputs(tmp_path, model_server):
    config = setup(tmp_path, model_server).model_copy(update={"yolo": True})
    model_server.script(
        Reply(tool_calls=[ToolCall("bash", {"command": "echo SECRET-OUTPUT"})]),
        Reply(text="first answer"),
        ask(with_context=True),
        Reply(text="reviewed"),
        Reply(text="done"),
    )
    store = MemoryStore()
    agent = make_agent(config, store, tmp_path)
    asyncio.run(agent.send("first question"))
    asyncio.run(agent.send("second question"))
    sent = model_server.messages(3)[-1]["content"]
    assert sent == (
        "The conversation so far:\n"
        "user: first question\n"
        'tool call: bash {"command": "echo SECRET-OUTPUT"}\n'
        "assistant: first answer\n\n"
        "Your task:\nReview the change in app.py"
    )
    assert len(call_ids(asyncio.run(store.load("s1")))) == 2


def test_depth_limit(tmp_path, model_server):
    config = setup(tmp_path, model_server).model_copy(update={"yolo": True})
    model_server.script(ask(), Reply(text="ok"))
    store = MemoryStore()
    agent = make_agent(config, store, tmp_path, depth=2)
    asyncio.run(agent.send("go"))
    [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert result.output == (
        "[ask_agent: reviewer cannot be asked: agents may only be nested 2 levels deep (MM_ASK_DEPTH)]"
    )


def test_a_gated_call_two_agents_deep_suspends_and_resumes(tmp_path, model_server):
    config = setup(tmp_path, model_server)
    reviewer = tmp_path / "agents" / "reviewer.yaml"
    # Relative to the file that names it: the reviewer's config, not the workspace.
    reviewer.write_text(reviewer.read_text() + "mmConfigs: {helper: {config: helper.yaml}}\n")
    (tmp_path / "agents" / "helper.yaml").write_text(f"model: {{url: {model_server.url}, name: test-model}}\n")
    model_server.script(
        ask(),
        Reply(tool_calls=[ToolCall("ask_agent", {"agent": "helper", "prompt": "help me"})]),
        Reply(tool_calls=[ToolCall("bash", {"command": "echo helped > helped.txt"})]),
        Reply(text="helped"),
        Reply(text="reviewed"),
        Reply(text="done"),
    )
    store, events = MemoryStore(), []
    agent = make_agent(config, store, tmp_path, events=events)
    result = asyncio.run(agent.send("go"))
    asked: list[str | None] = []
    for _ in range(3):  # the caller's ask_agent, the reviewer's ask_agent, the helper's bash
        assert result.outcome == "suspended"
        [call] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
        asked.append(call.agent)
        result = asyncio.run(make_agent(config, store, tmp_path, events=events).resume([Decision(call.call_id, True)]))
    assert asked == [None, "reviewer", "helper"]
    assert result.outcome == "answered" and result.answer == "done"
    assert (tmp_path / "helped.txt").read_text() == "helped\n"


def test_cancel_while_the_asked_agent_runs_a_tool(tmp_path, model_server):
    config = setup(tmp_path, model_server).model_copy(update={"yolo": True})
    model_server.script(
        ask(),
        Reply(text="Checking. ", tool_calls=[ToolCall("bash", {"command": "touch running; sleep 30; touch never"})]),
        Reply(text="next"),
    )
    store = MemoryStore()
    agent = make_agent(config, store, tmp_path)

    async def scenario():
        task = asyncio.create_task(agent.send("go"))
        for _ in range(200):
            if (tmp_path / "running").exists():
                break
            await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the turn was not cancelled")
        return await agent.send("again")

    assert asyncio.run(scenario()).answer == "next"
    assert not (tmp_path / "never").exists()
    [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
    assert (result.status, result.output) == (
        "cancelled",
        "Checking. \n[ask_agent: reviewer stopped before finishing: cancelled]",
    )
    # The next conversation is consistent: the cancelled call has its result.
    assert [m["role"] for m in model_server.messages(2)] == ["system", "user", "assistant", "tool", "user"]


def test_the_preview_says_when_the_conversation_goes_along_and_where(tmp_path, model_server):
    """Issue 21, second round: `with_context: true` sends the whole conversation to the asked agent, maybe to
    another endpoint, and the approver was shown the same as without it. The preview (and so the digest) says it,
    and names the endpoint when it is not this agent's."""
    from mm_core.tools.base import ToolContext

    config = setup(tmp_path, model_server)
    tool = make_agent(config, MemoryStore(), tmp_path).tools["ask_agent"]
    ctx = ToolContext(workspace=tmp_path, config=config)
    args = {"agent": "reviewer", "prompt": "Review the change in app.py"}
    alone = asyncio.run(tool.preview(args, ctx))
    along = asyncio.run(tool.preview({**args, "with_context": True}, ctx))
    assert alone != along and "with_context" not in alone
    assert along.splitlines()[1] == (
        "⚠ with_context: this conversation so far (its questions, answers and tool calls, up to 20,000 characters) "
        "is sent to reviewer too."
    )
    # The asked agent on another endpoint: the preview names it.
    (tmp_path / "agents" / "reviewer.yaml").write_text("model: {url: 'https://models.example:8443/v1', name: big}\n")
    elsewhere = asyncio.run(tool.preview({**args, "with_context": True}, ctx))
    assert elsewhere.splitlines()[1].endswith(
        "is sent to reviewer too, at models.example:8443 (model big), another endpoint than this agent's."
    )
    # What runs reads the flag as the preview does: a string "false" is true to both.
    assert "with_context" in asyncio.run(tool.preview({**args, "with_context": "false"}, ctx))


def test_an_asked_agent_runs_under_its_callers_network_whatever_its_file_says(tmp_path, model_server):
    """A channel's `network: off` (the caller's) holds for an agent it asks, though the agent's file says `open`."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "browser.yaml").write_text(
        f"model: {{url: {model_server.url}, name: test-model}}\n"
        "network: open\nfetchContentTool: true\nfetchAllow: [127.0.0.1]\n"
    )
    refs = {"browser": {"config": str(tmp_path / "agents" / "browser.yaml")}}
    config = agent_config(model_server.url, yolo=True, mmConfigs=refs, network="off")
    model_server.script(
        Reply(tool_calls=[ToolCall("ask_agent", {"agent": "browser", "prompt": "read the page"})]),
        Reply(tool_calls=[ToolCall("fetch_content", {"url": "http://127.0.0.1:9/"})]),
        Reply(text="It would not load."),
        Reply(text="The browser could not read it."),
    )
    events: list = []
    asyncio.run(make_agent(config, MemoryStore(), tmp_path, events=events).send("ask the browser"))
    [fetched] = [e for e in events if isinstance(e, ToolCallFinished) and e.tool == "fetch_content"]
    assert fetched.agent == "browser"
    assert fetched.output == "[fetch_content: error 2 (input) — network: this channel's network is off]"
