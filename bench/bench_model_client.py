"""The CPU a streamed model answer costs the worker: the openai SDK's stream against a plain aiohttp SSE reader,
side by side in one run, and the product's client (mm_core.model.ModelClient) beside them.

All three read the same answers from the scripted model server over loopback (it runs in a thread of its own;
only the CPU of the thread that reads is counted, time.thread_time) and do the same work per chunk: parse the
JSON, gather the text and the tool-call arguments. The SDK reader is the path the client took before issue 23
(`AsyncOpenAI.post(..., cast_to=object, stream_cls=AsyncStream)`, one client kept for the whole run, no typed
chunks), so the difference is the SDK's and httpx's own work: per request (building the request, headers,
retries' bookkeeping) and per chunk (httpx's byte stream, the SDK's SSE decoder, its per-event checks).

Each client reads N answers of a short and of a long stream; the per-chunk cost is the slope between the two,
the per-request cost what is left of the short one. Printed: CPU per answer, per request, per chunk, and the
SDK's figures over aiohttp's.

    .venv/bin/python bench/bench_model_client.py [answers]
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import openai

from mm_core.config import ModelConfig
from mm_core.model import ModelClient
from playground.model_server import ModelServer, Reply, ToolCall

SHORT, LONG = 4, 403  # SSE events per answer (see reply)
ROUNDS = 5  # each figure is the median of this many rounds of N answers


def reply(events: int) -> Reply:
    """An answer of `events` SSE events. 4: the role, one text chunk, the finish, the usage. More: half text in
    16-character chunks, half one tool call's arguments in 8-character fragments (the first names the call)."""
    if events == SHORT:
        return Reply(text="t" * 16)
    half = (events - 3) // 2
    counting = "".join(f"{i:x}" for i in range(8 * half))  # never one pattern repeated: the runaway guard passes
    arguments = {"path": counting[: 8 * half - len('{"path": ""}')]}
    return Reply(text="t" * (16 * half), tool_calls=[ToolCall("read_file", arguments)], fragment_size=8)


REQUEST = {
    "model": "test-model",
    "messages": [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "go"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


def gather(chunk: dict[str, Any], text: list[str], arguments: dict[int, list[str]]) -> None:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            text.append(delta["content"])
        for tc in delta.get("tool_calls") or ():
            if (function := tc.get("function") or {}).get("arguments"):
                arguments.setdefault(tc.get("index", 0), []).append(function["arguments"])


@functools.cache
def tls() -> ssl.SSLContext:
    """Made once, as the former client made it once per process (loading the CA bundle costs ~25-100 ms)."""
    return httpx.create_ssl_context()


class SdkReader:
    """The former client's path through the openai SDK, its client made as the former client made it."""

    def __init__(self, url: str) -> None:
        self.client = openai.AsyncOpenAI(
            base_url=url,
            api_key="not-needed",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=tls()),
        )

    async def answer(self) -> int:
        text: list[str] = []
        arguments: dict[int, list[str]] = {}
        stream = await self.client.post(
            "/chat/completions", body=REQUEST, cast_to=object, stream=True, stream_cls=openai.AsyncStream[Any]
        )
        async for chunk in stream:
            gather(chunk, text, arguments)
        return len("".join(text))

    async def aclose(self) -> None:
        await self.client.close()


class AiohttpReader:
    """SSE read by hand from one aiohttp session: `data:` lines, JSON each, `[DONE]` ends."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/chat/completions"
        self.session = aiohttp.ClientSession()

    async def answer(self) -> int:
        text: list[str] = []
        arguments: dict[int, list[str]] = {}
        async with self.session.post(self.url, json=REQUEST, headers={"Authorization": "Bearer x"}) as response:
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                gather(json.loads(data), text, arguments)
        return len("".join(text))

    async def aclose(self) -> None:
        await self.session.close()


class ProductReader:
    """The product's client, with everything it does per chunk (events, the runaway guard, the watchdog)."""

    def __init__(self, url: str) -> None:
        self.client = ModelClient(ModelConfig(url=url, name="test-model"))

    async def answer(self) -> int:
        completion = await self.client.complete(REQUEST["messages"], emit=lambda event: None)
        return len(completion.text)

    async def aclose(self) -> None:
        await self.client.aclose()


async def cpu_per_answer(answer: Callable[[], Awaitable[int]], n: int) -> float:
    await answer()  # the connection is open, the code paths warm
    cpu = time.thread_time()
    for _ in range(n):
        await answer()
    return (time.thread_time() - cpu) / n


async def measure(server: ModelServer, n: int) -> dict[str, dict[int, float]]:
    figures: dict[str, dict[int, list[float]]] = {}
    readers = {"openai SDK": SdkReader, "aiohttp SSE": AiohttpReader, "ModelClient": ProductReader}
    for _ in range(ROUNDS):
        for events in (SHORT, LONG):
            server.always(reply(events))
            for name, make in readers.items():  # interleaved: a busy moment of the machine hits all of them
                reader = make(server.url)
                try:
                    cpu = await cpu_per_answer(reader.answer, n)
                finally:
                    await reader.aclose()
                figures.setdefault(name, {}).setdefault(events, []).append(cpu)
    return {name: {k: statistics.median(v) for k, v in by.items()} for name, by in figures.items()}


async def made_per_turn(url: str, n: int) -> dict[str, float]:
    """A client made, used for one short answer and closed, as a worker did once per turn (the TLS context
    already made: it is made once per process)."""
    tls()
    out = {}
    for name, make in (("openai SDK", SdkReader), ("aiohttp SSE", AiohttpReader)):
        cpu = time.thread_time()
        for _ in range(n):
            reader = make(url)
            await reader.answer()
            await reader.aclose()
        out[name] = (time.thread_time() - cpu) / n
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:7.1f} µs"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with ModelServer() as server:
        figures = asyncio.run(measure(server, n))
        server.always(reply(SHORT))
        fresh = asyncio.run(made_per_turn(server.url, max(10, n // 5)))
    print(f"CPU of the reading thread, median of {ROUNDS} rounds of {n} answers each, over loopback:")
    print(
        f"  {'client':12s} {'answer of ' + str(SHORT):>14s} {'answer of ' + str(LONG):>14s} "
        f"{'per request':>12s} {'per chunk':>10s}"
    )
    derived = {}
    for name, by in figures.items():
        per_chunk = (by[LONG] - by[SHORT]) / (LONG - SHORT)
        per_request = by[SHORT] - SHORT * per_chunk
        derived[name] = (per_request, per_chunk, by[LONG])
        print(f"  {name:12s} {ms(by[SHORT]):>14s} {ms(by[LONG]):>14s} {ms(per_request):>12s} {us(per_chunk):>10s}")
    sdk, raw = derived["openai SDK"], derived["aiohttp SSE"]
    print(
        f"  openai SDK / aiohttp SSE: {sdk[0] / raw[0]:.2f}x per request, {sdk[1] / raw[1]:.2f}x per chunk, "
        f"{sdk[2] / raw[2]:.2f}x per answer of {LONG}"
    )
    print("A client made, used once and closed (as per turn before issue 23), per answer of", SHORT, "events:")
    for name, cpu in fresh.items():
        print(f"  {name:12s} {ms(cpu)}")


if __name__ == "__main__":
    main()
