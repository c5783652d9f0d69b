"""The turn loop's own overhead per step, against a bare loop of raw HTTP calls to the same model server.

Both sides talk to the scripted model server at zero latency and stream the same answer (one read_file call),
and both grow the conversation the same way; the difference is what the loop adds: the openai SDK, the
event log (in memory, and in the fsynced JSON-lines FileStore), events, the loop detector, and the tool call.

The second table is the figure the worker watches (slackio/metrics.py): the time a step spends outside the
model, from an answer's last byte to the next request leaving (ModelCalled for the loop, the same two moments
for the bare loop), with 10 and with 200 messages of history before the turn. Only the request's own payload
(its JSON, its bytes on the socket) may grow with the history; the bare loop pays that too.

    .venv/bin/python bench/bench_loop.py [steps]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from mm_core.agent import Agent
from mm_core.config import AgentConfig
from mm_core.events import Event, ModelCalled
from mm_core.log import (
    AssistantMessage,
    Entry,
    FileStore,
    MemoryStore,
    Outcome,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    TurnEnded,
    UserMessage,
)
from mm_core.state import SessionState
from playground.model_server import ModelServer, Reply, ToolCall

HISTORIES = (10, 200)  # messages in the first request of the measured turn
TURN_STEPS = 10  # model calls per measured turn
TURNS = 6  # measured turns per history length and loop


@dataclass
class Run:
    step: float  # wall time per step
    cpu: float  # CPU time per step of the thread that runs the loop (the model server has its own)
    gaps: list[float]  # each answer's last byte → the next request sent


def answer(request: dict) -> Reply:
    step = sum(1 for m in request["messages"] if m["role"] == "assistant")
    return Reply(tool_calls=[ToolCall("read_file", {"path": f"missing-{step}.txt"})], chunk_size=64)


async def bare(url: str, steps: int, messages: list[dict[str, Any]] | None = None) -> Run:
    """Raw HTTP: post, read the SSE stream to the end, append the answer and a tool result, again."""
    messages = list(messages or [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}])
    sent: list[float] = []

    async def note_sent(_request: httpx.Request) -> None:
        sent.append(time.monotonic())

    finished: list[float] = []
    async with httpx.AsyncClient(timeout=30, event_hooks={"request": [note_sent]}) as client:
        cpu, began = time.thread_time(), time.perf_counter()
        for step in range(steps):
            body = {"model": "test-model", "messages": messages, "stream": True}
            arguments = []
            async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            for call in choice["delta"].get("tool_calls") or ():
                                arguments.append(call["function"].get("arguments") or "")
                finished.append(time.monotonic())
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{step}",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": "".join(arguments)},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": "x"})
        elapsed, cpu = time.perf_counter() - began, time.thread_time() - cpu
    return Run(elapsed / steps, cpu / steps, [s - f for f, s in zip(finished, sent[1:], strict=False)])


async def agent_loop(url: str, steps: int, store, workspace: Path) -> Run:
    """One turn of `steps` model calls; the gaps outside the model are the ModelCalled events'."""
    config = AgentConfig.model_validate(
        {"model": {"url": url, "name": "test-model"}, "maxTurns": steps, "bashTool": False}
    )
    calls: list[ModelCalled] = []

    def emit(event: Event) -> None:
        if isinstance(event, ModelCalled):
            calls.append(event)

    agent = Agent(config, store, "bench", workspace, emit=emit)
    agent.model.http.session()  # made before the clock starts, as the bare loop's (see client_cost)
    cpu, began = time.thread_time(), time.perf_counter()
    result = await agent.send("go")
    elapsed, cpu = time.perf_counter() - began, time.thread_time() - cpu
    assert result.outcome == "max_turns", result
    await agent.model.aclose()
    return Run(elapsed / steps, cpu / steps, [b.started - a.finished for a, b in itertools.pairwise(calls)])


def history(messages: int) -> list[Entry]:
    """An ended turn of read_file calls such that the next turn's first request holds `messages` messages
    (system, that turn's user message, a call and a result per step, its answer, the new user message)."""
    entries: list[Entry] = [UserMessage("look at the files")]
    for i in range((messages - 4) // 2):
        call = ToolCallRequest(f"call_h{i}", "read_file", json.dumps({"path": f"missing-{i}.txt"}))
        output = f"[error: missing-{i}.txt does not exist]"
        entries += [
            AssistantMessage("", (call,)),
            ToolStarted(call.id, call.name),
            ToolResult(call.id, call.name, output),
        ]
    return [*entries, AssistantMessage("They are all missing."), TurnEnded(Outcome.ANSWERED)]


def stored(entries: list[Entry]) -> MemoryStore:
    store = MemoryStore()
    for entry in entries:
        asyncio.run(store.append("bench", entry))
    return store


def ms(seconds: float) -> str:
    return f"{seconds * 1000:6.2f} ms"


def whole_turns(server: ModelServer, tmp: str, steps: int) -> None:
    rounds = 3
    rows: dict[str, list[float]] = {"bare HTTP loop": [], "Agent, memory log": [], "Agent, file log (fsync)": []}
    for i in range(rounds):
        rows["bare HTTP loop"].append(asyncio.run(bare(server.url, steps)).step)
        rows["Agent, memory log"].append(asyncio.run(agent_loop(server.url, steps, MemoryStore(), Path(tmp))).step)
        store = FileStore(Path(tmp) / f"log{i}")
        rows["Agent, file log (fsync)"].append(asyncio.run(agent_loop(server.url, steps, store, Path(tmp))).step)
        server.requests.clear()  # the server keeps every request: do not let it grow across runs
    base = statistics.median(rows["bare HTTP loop"])
    print(f"turn loop overhead: {steps} steps per run, median of {rounds} runs, zero-latency scripted model")
    for name, values in rows.items():
        per_step = statistics.median(values)
        print(f"  {name:26s} {per_step * 1000:7.2f} ms/step   ratio {per_step / base:5.2f}x")
    overhead = statistics.median(rows["Agent, memory log"]) - base
    print(f"  loop overhead per step (memory log): {overhead * 1000:.2f} ms")


def by_history(server: ModelServer, tmp: str) -> None:
    """The p50 of the gaps outside the model, and the CPU per step, at each history length, for the loop and
    the bare loop, measured in turns taken in alternation."""
    runs: dict[tuple[str, int], list[Run]] = {}
    for size in HISTORIES:
        entries = history(size)
        start = [*SessionState(entries).messages("s"), {"role": "user", "content": "go"}]
        assert len(start) == size, (len(start), size)
        for _ in range(TURNS):
            runs.setdefault(("bare", size), []).append(asyncio.run(bare(server.url, TURN_STEPS, start)))
            run = asyncio.run(agent_loop(server.url, TURN_STEPS, stored(entries), Path(tmp)))
            runs.setdefault(("agent", size), []).append(run)
            server.requests.clear()

    def p50(loop: str, size: int) -> float:
        return statistics.median(gap for run in runs[loop, size] for gap in run.gaps)

    def median(loop: str, size: int, field: str) -> float:
        return statistics.median(getattr(run, field) for run in runs[loop, size])

    small, large = HISTORIES
    print(
        f"a step outside the model (answer's last byte → next request sent): p50 of {TURNS} turns x "
        f"{TURN_STEPS - 1} gaps, with {small} and {large} messages of history before the turn; and the CPU a "
        f"step costs the loop's thread, model call included (median of the turns)"
    )
    print(f"  {'':18s} outside: {small:4d} msgs {large:4d} msgs  growth | CPU/step: {small:4d} msgs {large:4d} msgs")
    for loop, name in (("bare", "bare HTTP loop"), ("agent", "Agent, memory log")):
        a, b = p50(loop, small), p50(loop, large)
        cpu = f"{ms(median(loop, small, 'cpu'))} {ms(median(loop, large, 'cpu'))}"
        print(f"  {name:18s}          {ms(a)} {ms(b)}  {b / a:5.2f}x |           {cpu}")
    for size in HISTORIES:
        loop, base = p50("agent", size), p50("bare", size)
        cpu = median("agent", size, "cpu") - median("bare", size, "cpu")
        print(
            f"  at {size:3d} msgs the loop adds {ms(loop - base)} outside the model (ratio {loop / base:5.2f}x) "
            f"and {ms(cpu)} of CPU per step"
        )
    outside = [p50("agent", size) - p50("bare", size) for size in HISTORIES]
    cpu = [median("agent", size, "cpu") - median("bare", size, "cpu") for size in HISTORIES]
    print(
        f"  from {small} to {large} messages, what the loop adds grows by {ms(outside[1] - outside[0])} outside the "
        f"model and by {ms(cpu[1] - cpu[0])} of CPU per step"
    )


async def client_cost(url: str) -> float:
    """The CPU a model client's connections cost to make (an aiohttp session): once per event loop of a process
    (mm_core.model.ModelHttp), so once per turn only where each turn runs on an event loop of its own."""
    config = AgentConfig.model_validate({"model": {"url": url, "name": "test-model"}})
    agent = Agent(config, MemoryStore(), "bench", Path("."), tools=[])
    cpu = time.thread_time()
    agent.model.http.session()
    cpu = time.thread_time() - cpu
    await agent.model.aclose()
    return cpu


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with ModelServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.always(answer)
        whole_turns(server, tmp, steps)
        by_history(server, tmp)
        made = statistics.median(asyncio.run(client_cost(server.url)) for _ in range(3))
        print(f"making the model client's session (once per event loop): {ms(made)} of CPU")


if __name__ == "__main__":
    main()
