"""The turn loop's own overhead per step, against a bare loop of raw HTTP calls to the same model server.

Both sides talk to the scripted model server at zero latency and stream the same answer (one read_file call),
and both grow the conversation the same way; the difference is what the loop adds: the openai SDK, the
event log (in memory, and in the fsynced JSON-lines FileStore), events, the loop detector, and the tool call.

    .venv/bin/python bench/bench_loop.py [steps]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from mm_core.agent import Agent
from mm_core.config import AgentConfig
from mm_core.log import FileStore, MemoryStore
from mm_testkit.model_server import ModelServer, Reply, ToolCall


def answer(request: dict) -> Reply:
    step = sum(1 for m in request["messages"] if m["role"] == "assistant")
    return Reply(tool_calls=[ToolCall("read_file", {"path": f"missing-{step}.txt"})], chunk_size=64)


async def bare(url: str, steps: int) -> float:
    """Raw HTTP: post, read the SSE stream to the end, append the answer and a tool result, again."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    async with httpx.AsyncClient(timeout=30) as client:
        began = time.perf_counter()
        for step in range(steps):
            body = {"model": "test-model", "messages": messages, "stream": True}
            arguments = []
            async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            for call in choice["delta"].get("tool_calls") or ():
                                arguments.append(call["function"].get("arguments") or "")
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
        return (time.perf_counter() - began) / steps


async def agent_loop(url: str, steps: int, store, workspace: Path) -> float:
    config = AgentConfig.model_validate(
        {"model": {"url": url, "name": "test-model"}, "maxTurns": steps, "bashTool": False}
    )
    agent = Agent(config, store, "bench", workspace)
    began = time.perf_counter()
    result = await agent.send("go")
    elapsed = time.perf_counter() - began
    assert result.outcome == "max_turns", result
    await agent.model.aclose()
    return elapsed / steps


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    rounds = 3
    with ModelServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.always(answer)
        rows = {"bare HTTP loop": [], "Agent, memory log": [], "Agent, file log (fsync)": []}
        for i in range(rounds):
            rows["bare HTTP loop"].append(asyncio.run(bare(server.url, steps)))
            rows["Agent, memory log"].append(asyncio.run(agent_loop(server.url, steps, MemoryStore(), Path(tmp))))
            store = FileStore(Path(tmp) / f"log{i}")
            rows["Agent, file log (fsync)"].append(asyncio.run(agent_loop(server.url, steps, store, Path(tmp))))
    base = statistics.median(rows["bare HTTP loop"])
    print(f"turn loop overhead: {steps} steps per run, median of {rounds} runs, zero-latency scripted model")
    for name, values in rows.items():
        per_step = statistics.median(values)
        print(f"  {name:26s} {per_step * 1000:7.2f} ms/step   ratio {per_step / base:5.2f}x")
    overhead = statistics.median(rows["Agent, memory log"]) - base
    print(f"  loop overhead per step (memory log): {overhead * 1000:.2f} ms")


if __name__ == "__main__":
    main()
