"""The model client reads real servers' streams as the openai SDK read them (issue 23).

Each stream of tests/fixtures/model_streams/ (llama.cpp, Ollama, vLLM: see the README there) is replayed byte
for byte by a small aiohttp server over loopback, whole and cut into blocks that split lines, `\\r\\n`, UTF-8
characters and tool-call arguments, with LF and with CRLF line ends. The product's ModelClient and the openai
SDK's stream (the path the client took before, kept here as the reference) must give the same events, the same
answer and the same error text, and that answer must be the one the fixture holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from mm_core.config import ModelConfig
from mm_core.events import Status, TextDelta, Usage
from mm_core.model import ModelClient, ModelError, ModelHttp
from playground.server_thread import ThreadedAiohttpServer

FIXTURES = Path(__file__).parent / "fixtures" / "model_streams"
MESSAGES = [{"role": "user", "content": "run the failing test"}]


class ReplayServer(ThreadedAiohttpServer):
    """POST /v1/chat/completions answers `blocks`, each in a write of its own (a pause between, so that each
    reaches the client as a read of its own). Records each request's client port: its connection."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[bytes] = []
        self.ports: list[int] = []
        self.hold = 0.0  # seconds the body stays open after the last block
        self.started = 0  # requests so far: a request's number is the count before it
        self.ended: list[int] = []  # the requests whose body has ended

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        mine, self.started = self.started, self.started + 1
        self.ports.append(peer[1] if peer else 0)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for block in self.blocks:
            await response.write(block)
            await asyncio.sleep(0.001)
        if self.hold:
            await self.wait_or_stop(self.hold)
        await response.write_eof()
        self.ended.append(mine)
        return response


@pytest.fixture(scope="module")
def server():
    with ReplayServer() as s:
        yield s


# --- the two readers --------------------------------------------------------------------------------------------

Outcome = tuple[list[Any], Any]  # the events, and (text, tool calls, usage) or the error's text


async def product(url: str) -> Outcome:
    events: list[Any] = []
    client = ModelClient(ModelConfig(url=url, name="m"))
    try:
        answer = await client.complete(MESSAGES, None, events.append)
        calls = [(c.id, c.name, c.arguments) for c in answer.tool_calls]
        return events, (answer.text, calls, answer.usage)
    except ModelError as e:
        return events, str(e)
    finally:
        await client.aclose()


async def sdk(url: str) -> Outcome:
    """The former client's reading, through the SDK's stream: the same events, the same gathering."""
    events: list[Any] = [Status("Thinking", None)]
    client = openai.AsyncOpenAI(base_url=url, api_key="not-needed", max_retries=0)
    text, calls, usage, composing = [], {}, Usage(), False
    try:
        stream = await client.post(
            "/chat/completions",
            body={"model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
            cast_to=object,
            stream=True,
            stream_cls=openai.AsyncStream[Any],
        )
        async for chunk in stream:
            if (counted := chunk.get("usage")) is not None:
                usage = Usage(counted.get("prompt_tokens") or 0, counted.get("completion_tokens") or 0)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text.append(delta["content"])
                    events.append(TextDelta(delta["content"], None))
                for tc in delta.get("tool_calls") or ():
                    call = calls.setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    if not composing:
                        composing = True
                        events.append(Status("Composing a tool call", None))
                    call["id"] = tc.get("id") or call["id"]
                    function = tc.get("function") or {}
                    call["name"] += function.get("name") or ""
                    call["arguments"] += function.get("arguments") or ""
    except openai.APIError as e:
        return events, f"the model endpoint {url} sent a broken answer ({type(e).__name__}: {e})"
    finally:
        await client.close()
    gathered = [(c["id"] or f"call_{i}", c["name"], c["arguments"] or "{}") for i, c in sorted(calls.items())]
    return events, ("".join(text), gathered, usage)


# --- how the bytes are cut --------------------------------------------------------------------------------------


def whole(data: bytes) -> list[bytes]:
    return [data]


def halved_lines(data: bytes) -> list[bytes]:
    """Every line cut in its middle: a `data:` prefix, a JSON value, a tool call's argument torn in two."""
    blocks = []
    for line in data.splitlines(keepends=True):
        middle = len(line) // 2
        blocks += [line[:middle], line[middle:]] if middle else [line]
    return blocks


def every_7_bytes(data: bytes) -> list[bytes]:
    """Blocks of 7 bytes: cuts `\\r\\n` pairs and UTF-8 characters (—, ï, ✓) too."""
    return [data[i : i + 7] for i in range(0, len(data), 7)]


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


CUTS: dict[str, Callable[[bytes], list[bytes]]] = {
    "whole": whole,
    "halved lines": halved_lines,
    "7 bytes": every_7_bytes,
}


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


LLAMA_CPP = (
    "Let me run the tests — naïve first ✓",
    [("ZbXoUa3Gu7MS0Pq4EbFVlHfAXsWbh2rO", "bash", '{"command": "pytest -q tests/test_x.py -k \'naïve\'"}')],
    Usage(1085, 247),
)
EXPECTED = {
    "llamacpp_tool_call.sse": LLAMA_CPP,
    "ollama_parallel_tool_calls.sse": (
        "",
        [
            ("call_wteop8bt", "run_command", '{"command":"ls"}'),
            ("call_rk2xye1l", "run_command", '{"command":"ls -l"}'),
        ],
        Usage(312, 44),
    ),
    "vllm_tool_calls.sse": (
        "I'll read the file.",
        [
            ("chatcmpl-tool-9c1d2e3f4a5b6c7d", "read_file", '{"path": "src/app.py", "limit": 200}'),
            ("chatcmpl-tool-0a1b2c3d4e5f6a7b", "bash", '{"command": "git status"}'),
        ],
        Usage(1024, 47),
    ),
}


def replay(server: ReplayServer, blocks: list[bytes]) -> tuple[Outcome, Outcome]:
    server.blocks = blocks
    return asyncio.run(product(server.url)), asyncio.run(sdk(server.url))


@pytest.mark.parametrize("ending", ["LF", "CRLF"])
@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_recorded_stream_gives_the_same_answer_and_events_as_the_sdk(server, name, cut, ending):
    data = fixture(name)
    ours, theirs = replay(server, CUTS[cut](crlf(data) if ending == "CRLF" else data))
    assert ours == theirs
    events, answer = ours
    assert answer == EXPECTED[name]
    assert events[0] == Status("Thinking", None)
    assert ("Composing a tool call" in [getattr(e, "text", None) for e in events]) == bool(answer[1])


@pytest.mark.parametrize("cut", list(CUTS))
def test_an_error_object_mid_stream_is_the_sdk_client_s_error_text(server, cut):
    ours, theirs = replay(server, CUTS[cut](fixture("vllm_error_mid_stream.sse")))
    assert ours == theirs
    events, error = ours
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("Working", None), TextDelta(" on it", None)]
    assert error == (
        f"the model endpoint {server.url} sent a broken answer (APIError: The decoder prompt (length 40971) is "
        f"longer than the maximum model length of 32768.)"
    )


def test_a_stream_cut_without_done_keeps_what_came_and_drops_a_torn_event(server):
    data = fixture("llamacpp_tool_call.sse")
    before_done = data[: data.index(b"data: [DONE]")]
    # Cut before [DONE]: the whole answer came; the end of the body ends it.
    ours, theirs = replay(server, halved_lines(before_done))
    assert ours == theirs and ours[1] == LLAMA_CPP
    # Cut inside the last chunk (the one with the usage): that event never finished, so it does not count.
    torn = before_done[: before_done.rindex(b'"usage"')]
    ours, theirs = replay(server, halved_lines(torn))
    assert ours == theirs
    assert ours[1] == (LLAMA_CPP[0], LLAMA_CPP[1], Usage())


def test_a_usage_only_chunk_sets_the_usage_and_nothing_else(server):
    data = fixture("ollama_parallel_tool_calls.sse")
    usage_only = b"".join(line + b"\n\n" for line in data.split(b"\n\n") if b'"choices":[]' in line)
    ours, theirs = replay(server, [usage_only, b"data: [DONE]\n\n"])
    assert ours == theirs == ([Status("Thinking", None)], ("", [], Usage(312, 44)))


def test_the_turns_of_a_process_share_one_connection(server):
    """Two agents' clients over one ModelHttp, one after the other, in one event loop: one TCP connection."""
    server.blocks = [fixture("vllm_tool_calls.sse")]
    server.ports.clear()

    async def two_turns() -> None:
        http = ModelHttp()
        try:
            for key in ("key-a", "key-b"):
                client = ModelClient(ModelConfig(url=server.url, name="m"), key, 30.0, http)
                assert (await client.complete(MESSAGES)).tool_calls
                await client.aclose()  # not its connections: the process's
        finally:
            await http.aclose()

    asyncio.run(two_turns())
    assert len(server.ports) == 2 and server.ports[0] == server.ports[1]


def test_a_body_kept_open_after_done_does_not_hold_the_answer(server):
    """The answer is whole at `[DONE]`: a server that keeps the body open after it costs the connection, not the
    turn (no wait for the watchdog, nor for the body's end)."""
    server.blocks, server.hold = [fixture("vllm_tool_calls.sse")], 60.0
    try:
        mine = server.started  # an earlier test's body may end meanwhile: only this request's is looked at
        answer = asyncio.run(product(server.url))[1]
        assert answer == EXPECTED["vllm_tool_calls.sse"]
        assert server.started == mine + 1
        assert mine not in server.ended  # the answer came back while the body was still open
    finally:
        server.hold = 0.0


def test_bare_cr_line_ends_cut_anywhere_give_the_same_answer(server):
    """SSE lets a line end in a lone `\\r`: one cut at every byte position (so at every `\\r`, which may or may not
    be followed by a `\\n` in the next block) gives the answer of the whole stream."""
    data = fixture("llamacpp_tool_call.sse").replace(b"\n", b"\r")
    whole_answer = replay(server, [data])[0][1]
    assert whole_answer == LLAMA_CPP
    for at in range(1, len(data), max(1, len(data) // 60)):
        server.blocks = [data[:at], data[at:]]
        assert asyncio.run(product(server.url))[1] == LLAMA_CPP, f"cut at byte {at}"


def test_a_line_without_end_is_a_broken_answer_not_a_growing_buffer(server):
    """A server (or a proxy) that sends megabytes without a line end: the call ends with the model's error once
    the line passes the bound, instead of holding memory and CPU until the watchdog."""
    from mm_core.model import LINE_MOST

    server.blocks = [b"data: " + b"x" * 65536 for _ in range(LINE_MOST // 65536 + 2)]
    _events, error = asyncio.run(product(server.url))
    assert isinstance(error, str) and "sent a broken answer (LineTooLong" in error


def test_the_proxy_is_read_as_httpx_read_it_all_proxy_and_no_scheme(server, monkeypatch):
    """ALL_PROXY, a value without a scheme (an http:// proxy, as httpx and curl read it), and NO_PROXY exempting a
    host. The replay server stands in for the proxy: the request for a host that does not exist reaches it."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", server.base.removeprefix("http://"))
    data = fixture("llamacpp_tool_call.sse")
    server.blocks = [data]
    assert asyncio.run(product("http://model-behind-the-proxy.invalid/v1"))[1] == LLAMA_CPP
    monkeypatch.setenv("NO_PROXY", "exempt.invalid")
    _events, error = asyncio.run(product("http://exempt.invalid/v1"))
    assert isinstance(error, str) and "is unreachable" in error  # went direct, to a host that does not exist


def test_a_proxy_or_url_aiohttp_cannot_use_is_the_model_s_error_not_a_crash(server, monkeypatch):
    """Before the answer begins, whatever the HTTP client refuses (here a proxy URL that does not parse) ends the
    call with the model's 'unreachable' sentence: the turn fails as a model failure, it does not crash the worker."""
    for name in ("http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://[::1")
    _events, error = asyncio.run(product("http://proxied-badly.invalid/v1"))
    assert isinstance(error, str) and "is unreachable" in error
