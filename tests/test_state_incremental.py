"""The session state kept up to date as entries are appended says exactly what a scan of the whole log says.

mm_core.state answers the loop's questions from indexes it updates on each append (so a step costs the same at
any length of history); `Replayed` below is the definition it replaced, every answer a scan of the entries.
The two are compared on random logs — including the ones the loop never writes (a result before its call, a
call id used twice, compactions and resets anywhere) — at random points, so that the indexes built on first
use (the loop detector, the messages) are also checked after they were updated in place. Then the same is
checked on a real agent, whose state is never derived again between its appends, against its stored log.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_support import agent_config
from mm_core.agent import Agent
from mm_core.events import Counters, Event, ModelCalled, Usage
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Compaction,
    Decision,
    Entry,
    ErrorRecord,
    MemoryStore,
    Nested,
    Outcome,
    Reset,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    ToolSuspended,
    TurnEnded,
    UserMessage,
    YoloSet,
    from_dict,
    to_dict,
)
from mm_core.loopdetect import LOOP_DETECTED, LoopDetector
from mm_core.state import SUMMARY_PREFIX, SessionState
from playground.model_server import ModelServer, Reply, ToolCall

COUNTER_OF: dict[str, str | None] = {"bash": "commands", "read_file": "file_ops", "read_skill": "skills", "fetch": None}


def _requesters(entries: list[Entry]) -> frozenset[str | None]:
    people: set[str | None] = set()
    for e in entries:
        if isinstance(e, UserMessage):
            people |= set(e.author.split(",")) if e.author else {None}
    return frozenset(people)


@dataclass
class Replayed:
    """The state as it was defined before it was kept incrementally: each answer scans the entries."""

    entries: list[Entry]

    @classmethod
    def of(cls, log: list[Entry]) -> Replayed:
        start = max((i + 1 for i, e in enumerate(log) if isinstance(e, Reset)), default=0)
        return cls(log[start:])

    def turn_start(self) -> int | None:
        last_end = max((i for i, e in enumerate(self.entries) if isinstance(e, TurnEnded)), default=-1)
        for i in range(last_end + 1, len(self.entries)):
            if isinstance(self.entries[i], UserMessage):
                return i
        return None

    def turn_entries(self) -> list[Entry]:
        start = self.turn_start()
        return [] if start is None else self.entries[start:]

    def steps(self) -> int:
        return sum(isinstance(e, AssistantMessage) for e in self.turn_entries())

    def results(self) -> dict[str, ToolResult]:
        return {e.call_id: e for e in self.entries if isinstance(e, ToolResult)}

    def started(self) -> set[str]:
        running: set[str] = set()
        for e in self.entries:
            if isinstance(e, ToolStarted):
                running.add(e.call_id)
            elif isinstance(e, (ToolResult, ToolSuspended)):
                running.discard(e.call_id)
        return running

    def decisions(self) -> dict[str, Decision]:
        return {e.call_id: e for e in self.entries if isinstance(e, Decision)}

    def last_assistant(self) -> AssistantMessage | None:
        for e in reversed(self.turn_entries()):
            if isinstance(e, AssistantMessage):
                return e
        return None

    def pending(self) -> list[ToolCallRequest]:
        last = self.last_assistant()
        if last is None:
            return []
        done = self.results()
        return [c for c in last.tool_calls if c.id not in done]

    def open_calls(self) -> set[str]:
        open_ids = {c.id for c in self.pending()}
        nested: dict[str, list[Entry]] = {}
        for e in self.entries:
            if isinstance(e, Nested) and e.scope in open_ids:
                nested.setdefault(e.scope, []).append(from_dict(e.entry))
        for log in nested.values():
            open_ids |= Replayed.of(log).open_calls()
        return open_ids

    def failure(self) -> str | None:
        errors = [e.message for e in self.turn_entries() if isinstance(e, ErrorRecord)]
        return errors[-1] if errors else None

    def cancelled(self) -> bool:
        return any(isinstance(e, ToolResult) and e.status == CallStatus.CANCELLED for e in self.turn_entries())

    def answered(self) -> bool:
        last = self.last_assistant()
        return last is not None and not last.tool_calls and self.entries[-1] is last

    def requesters(self) -> frozenset[str | None]:
        return _requesters(self.turn_entries())

    def grants(self) -> frozenset[str | None]:
        """Whoever asked for the turn each "Approve all" was given in, since the last `yolo off`."""
        granted: set[str | None] = set()
        for i, e in enumerate(self.entries):
            if isinstance(e, YoloSet) and not e.on:
                granted.clear()
            elif isinstance(e, Decision) and e.all and e.approved:
                granted |= Replayed(self.entries[: i + 1]).requesters()
        return frozenset(granted)

    def granted(self) -> bool:
        requesters = self.requesters()
        return bool(requesters) and requesters <= self.grants()

    def yolo(self) -> bool | None:
        switches = [e.on for e in self.entries if isinstance(e, YoloSet)]
        return switches[-1] if switches else None

    def counters(self, counter_of: dict[str, str | None]) -> Counters:
        counts = {"commands": 0, "file_ops": 0, "skills": 0, "lsp": 0}
        for e in self.turn_entries():
            if isinstance(e, ToolResult) and e.status != CallStatus.DROPPED:  # a tool's responses, not the loop's
                key = counter_of.get(e.tool)
                if key:
                    counts[key] += 1
        return Counters(**counts)

    def usage(self) -> Usage:
        total = Usage()
        for e in self.turn_entries():
            if isinstance(e, AssistantMessage):
                total = total + Usage(e.prompt_tokens, e.completion_tokens)
        return total

    def loop_detector(self) -> LoopDetector:
        detector = LoopDetector()
        args = {c.id: c.arguments for e in self.entries if isinstance(e, AssistantMessage) for c in e.tool_calls}
        for e in self.entries:
            if isinstance(e, ToolResult) and e.status == CallStatus.OK:
                detector.record(e.tool, args.get(e.call_id, ""), e.output)
        return detector

    def messages(self, system_prompt: str) -> list[dict[str, Any]]:
        entries, summary = self.entries, None
        for i, e in enumerate(self.entries):
            if isinstance(e, Compaction):
                summary, keep_from = e.summary, e.keep_from
                entries = self.entries[keep_from:i] + self.entries[i + 1 :]
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
        if summary is not None:
            messages.append({"role": "user", "content": SUMMARY_PREFIX + summary})
        results = {e.call_id: e for e in entries if isinstance(e, ToolResult)}
        for e in entries:
            if isinstance(e, UserMessage):
                messages.append({"role": "user", "content": e.text})
            elif isinstance(e, AssistantMessage):
                message: dict[str, Any] = {"role": "assistant", "content": e.text or None}
                if e.tool_calls:
                    message["tool_calls"] = [
                        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in e.tool_calls
                    ]
                messages.append(message)
                for call in e.tool_calls:
                    if call.id in results:
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.id].output})
        return messages


def assert_same(state: SessionState, replayed: Replayed) -> None:
    """Every question the loop, the tools and the front ends ask, answered alike."""
    assert state.entries == replayed.entries
    assert state.turn_start() == replayed.turn_start()
    assert state.turn_entries() == replayed.turn_entries()
    assert state.steps() == replayed.steps()
    assert state.results() == replayed.results()
    assert state.started() == replayed.started()
    assert dict(state.decisions()) == replayed.decisions()
    assert state.last_assistant() == replayed.last_assistant()
    assert state.pending() == replayed.pending()
    assert state.open_calls() == replayed.open_calls()
    assert state.failure() == replayed.failure()
    assert state.cancelled() == replayed.cancelled()
    assert state.answered() == replayed.answered()
    assert state.requesters() == replayed.requesters()
    assert state.grants() == replayed.grants()
    assert state.granted() == replayed.granted()
    assert state.yolo() == replayed.yolo()
    assert state.counters(COUNTER_OF) == replayed.counters(COUNTER_OF)
    assert state.usage() == replayed.usage()
    assert state.loop_detector() == replayed.loop_detector()
    assert state.messages("S") == replayed.messages("S")


# -- random logs ---------------------------------------------------------------------------------------
# Few ids, tools and outputs, so that calls repeat (the loop detector counts), ids collide (a result before
# its call, a call made twice) and results meet their calls.
ids = st.sampled_from(["a", "b", "c", "d"])
tools = st.sampled_from(list(COUNTER_OF))
arguments = st.sampled_from(["{}", '{"path": "x"}'])
# Outputs that end with the detector's warning of their own: the one it appends is stripped, once.
outputs = st.sampled_from(
    ["ok", "", "no such file", "ok\n" + LOOP_DETECTED, "ok\n" + LOOP_DETECTED + "\n" + LOOP_DETECTED]
)
calls = st.builds(ToolCallRequest, ids, tools, arguments)
answers = st.builds(
    AssistantMessage,
    st.sampled_from(["", "done", "let me look"]),
    st.lists(calls, max_size=3).map(tuple),
    st.integers(0, 50),
    st.integers(0, 50),
)
results = st.builds(ToolResult, ids, tools, outputs, st.sampled_from(list(CallStatus)))
authors = st.sampled_from([None, "U1", "U2", "U1,U2"])
plain: st.SearchStrategy[Entry] = st.one_of(
    st.builds(UserMessage, st.sampled_from(["go", "more"]), authors),
    st.builds(YoloSet, st.booleans()),
    answers,
    results,
    st.builds(ToolStarted, ids, tools),
    st.builds(ToolSuspended, ids, tools),
    st.builds(Decision, ids, st.booleans(), st.none(), st.booleans()),
    st.builds(ErrorRecord, st.sampled_from(["boom", ""])),
    st.builds(TurnEnded, st.sampled_from([o for o in Outcome if o not in (Outcome.SUSPENDED, Outcome.IDLE)])),
)
# An asked agent's log inside the caller's, one level deep (open_calls reads it), and asked agents inside it.
nested = st.builds(Nested, ids, st.one_of(plain, st.builds(Nested, ids, plain.map(to_dict))).map(to_dict))
entries: st.SearchStrategy[Entry] = st.one_of(
    plain,
    plain,
    plain,
    nested,
    st.builds(Compaction, st.sampled_from(["summary"]), st.integers(0, 12)),
    st.just(Reset()),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(entries, st.booleans()), max_size=40))
def test_the_state_kept_on_each_append_answers_as_the_scan_of_the_log(log: list[tuple[Entry, bool]]) -> None:
    """Asked at random points (which builds the detector and the messages, then updates them in place) and at
    the end, the incremental state answers as the scans over the same entries."""
    state = SessionState()
    appended: list[Entry] = []
    for entry, ask in log:
        state.append(entry)
        appended.append(entry)
        if ask:
            assert_same(state, Replayed(list(appended)))
    assert_same(state, Replayed(appended))
    assert_same(SessionState(appended), Replayed(appended))  # built from the entries at once, as load() does
    assert_same(SessionState.of(appended), Replayed.of(appended))


@settings(max_examples=200, deadline=None)
@given(st.lists(entries, max_size=40), st.lists(entries, max_size=10))
def test_the_live_loop_detector_equals_the_replayed_one(before: list[Entry], after: list[Entry]) -> None:
    """The detector carried along (built once, then fed each result as it is appended) is the one a replay of
    the whole log gives, whatever came in between: a result before its call, a call id reused, a compaction."""
    state = SessionState(before)
    state.loop_detector()  # built now, so that what follows updates it in place
    for n, entry in enumerate(after, 1):
        state.append(entry)
        assert state.loop_detector() == Replayed([*before, *after[:n]]).loop_detector()
    assert state.loop_detector() == Replayed([*before, *after]).loop_detector()


def test_the_detector_given_to_the_loop_is_a_copy() -> None:
    """The loop records the calls it runs into the detector it gets; the state counts them when their results
    are appended, so the copy must not be the state's own (each would then count every call twice)."""
    state = SessionState([UserMessage("go"), AssistantMessage("", (ToolCallRequest("a", "bash", "{}"),))])
    given = state.loop_detector()
    given.record("bash", "{}", "ok")
    assert state.loop_detector() == LoopDetector()
    state.append(ToolResult("a", "bash", "ok"))
    assert state.loop_detector() == given == LoopDetector(("bash", "{}", "ok"), 1)


def test_a_result_before_its_call_makes_the_detector_replay() -> None:
    """A result whose call comes later in the log counted with no arguments when it was appended; the replay
    gives it the call's arguments, and so does the state once the call appears."""
    state = SessionState([ToolResult("a", "bash", "ok")])
    assert state.loop_detector() == LoopDetector(("bash", "", "ok"), 1)
    state.append(AssistantMessage("", (ToolCallRequest("a", "bash", '{"command": "ls"}'),)))
    assert state.loop_detector() == LoopDetector(("bash", '{"command": "ls"}', "ok"), 1)


def test_a_result_rebuilds_only_its_answer_in_the_messages() -> None:
    """Results go right after their call in the order of the calls, even when they arrive in another order,
    and after messages were already built once."""
    state = SessionState([UserMessage("go"), AssistantMessage("", (ToolCallRequest("a", "bash", "{}"),))])
    state.append(AssistantMessage("", (ToolCallRequest("b", "bash", "{}"), ToolCallRequest("c", "bash", "{}"))))
    state.messages("S")
    for entry in (ToolResult("c", "bash", "C"), ToolResult("a", "bash", "A"), ToolResult("b", "bash", "B")):
        state.append(entry)
    assert [m.get("tool_call_id") for m in state.messages("S")] == [None, None, None, "a", None, "b", "c"]
    assert_same(state, Replayed(state.entries))


# -- a real agent ----------------------------------------------------------------------------------------
def test_an_agents_state_through_turns_equals_its_log_replayed(tmp_path: Path) -> None:
    """Through turns with repeated calls (the loop detector's warning), a suspension and its resume, approve
    all, a compaction and a reset, the agent's state — appended to, never derived again but on load() — answers
    at every event it emits as the replay of what its store holds. Each model call emits ModelCalled right after
    its answer is in the log."""
    store = MemoryStore()
    checked: list[Event] = []
    holder: list[Agent] = []

    def emit(event: Event) -> None:
        log = store.entries("s1")
        assert_same(holder[0].state(), Replayed.of(log))
        if isinstance(event, ModelCalled):
            last = log[-1]
            assert isinstance(last, AssistantMessage)
            assert (event.prompt_tokens, event.completion_tokens) == (last.prompt_tokens, last.completion_tokens)
            assert 0 < event.started <= event.finished and event.agent is None
        checked.append(event)

    read = ToolCall("read_file", {"path": "missing.txt"})
    write = ToolCall("write_file", {"path": "notes.txt", "content": "x\n"})
    with ModelServer() as server:
        config = agent_config(server.url, yolo=False, bashTool=False)
        agent = Agent(config, store, "s1", tmp_path, emit=emit)
        holder.append(agent)

        async def session() -> None:
            server.script(*(Reply(tool_calls=[read], usage=(10, 2)) for _ in range(4)), Reply(text="gone"))
            assert (await agent.send("read it")).outcome == Outcome.ANSWERED
            server.script(Reply(tool_calls=[write, read]), Reply(text="written"))
            assert (await agent.send("write it")).outcome == Outcome.SUSPENDED
            (gated,) = [c.id for c in agent.state().pending() if c.name == "write_file"]
            assert (await agent.resume([Decision(gated, True, "U1", all=True)])).outcome == Outcome.ANSWERED
            server.script(Reply(text="the summary"))
            assert (await agent.compact()).startswith("compacted")
            server.script(Reply(tool_calls=[read]), Reply(tool_calls=[read]), Reply(text="still gone"))
            assert (await agent.send("again")).outcome == Outcome.ANSWERED
            await agent.new()
            assert_same(agent.state(), Replayed.of(await store.load("s1")))  # before anything reads the log again
            server.script(Reply(tool_calls=[read]), Reply(text="fresh"))
            assert (await agent.send("after new")).outcome == Outcome.ANSWERED
            await agent.aclose()

        asyncio.run(session())
    log = asyncio.run(store.load("s1"))
    assert_same(agent.state(), Replayed.of(log))
    assert_same(asyncio.run(agent.load()), Replayed.of(log))
    outputs = [e.output for e in log if isinstance(e, ToolResult)]
    warned = [o.endswith(LOOP_DETECTED) for o in outputs]
    # The third read in a row is warned, across a suspension and a compaction, and not after a reset.
    assert warned == [False, False, True, True, False, False, False, True, False]
    assert sum(isinstance(e, ModelCalled) for e in checked) == 12
