"""The model client: OpenAI-compatible chat completions, streamed.

It works with llama.cpp, Ollama, vLLM, Docker Model Runner and hosted APIs alike because it speaks only the
chat-completions wire format, through the official openai SDK. Two guards sit on the stream because small
models derail: the watchdog (silence longer than `watchdogTimeout` ends the call) and the runaway guard (a
tool call whose arguments loop or balloon is stopped at once, not after minutes of garbage).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from mm_core.config import ModelConfig
from mm_core.errors import CoreError
from mm_core.events import Status, TextDelta, Usage
from mm_core.log import ToolCallRequest

RUNAWAY_MAX_BYTES = 256 * 1024
_RUNAWAY_WINDOW = 256


class ModelError(CoreError):
    """A failure of the model call, worded for the person reading the thread."""


def runaway_text(arguments: str) -> str:
    tail = arguments[-40:].replace("\n", "\\n")
    return (
        f"[error: the model's tool call ran away: its arguments repeat the same pattern "
        f"({len(arguments)} characters so far: …{tail}) — generation stopped; rephrase the request, "
        f"or try another model]"
    )


def is_repeating(tail: str) -> bool:
    """Whether the last 256 characters are one 4-64-character pattern repeated."""
    if len(tail) < _RUNAWAY_WINDOW:
        return False
    window = tail[-_RUNAWAY_WINDOW:]
    # A string is a pattern of length p repeated exactly when it equals itself shifted by p.
    return any(window[p:] == window[:-p] for p in range(4, 65))


@dataclass
class Completion:
    text: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    # time.monotonic() when the request left (the SDK's building and the history's JSON are before it, on our
    # side of the call) and when the answer's last byte arrived.
    started: float = 0.0
    finished: float = 0.0


# When this task's request left: set by the HTTP client's request hook, which runs in the task that sends.
_sent_at: ContextVar[list[float] | None] = ContextVar("_sent_at", default=None)


async def _note_sent(_request: object) -> None:
    sent = _sent_at.get()
    if sent is not None and not sent:  # a redirect sends again: the first send is when the request left
        sent.append(time.monotonic())


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0  # bytes so far
    tail: str = ""  # the last 256 characters: all the repetition check needs, so a delta costs O(1)

    def add(self, fragment: str) -> str | None:
        """Append a streamed fragment; return the runaway error text when the arguments ran away."""
        self.arguments.append(fragment)
        self.size += len(fragment.encode("utf-8", "surrogatepass"))
        self.tail = (self.tail + fragment)[-_RUNAWAY_WINDOW:]
        if self.size > RUNAWAY_MAX_BYTES or is_repeating(self.tail):
            return runaway_text("".join(self.arguments))
        return None


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's own default TLS context, made once per process: loading the CA bundle costs ~100 ms of CPU, and
    a worker makes a client per turn (SSLContext is safe to share between threads and event loops)."""
    return httpx.create_ssl_context()


class ModelClient:
    def __init__(self, config: ModelConfig, api_key: str | None = None, watchdog: float = 120.0):
        self.config = config
        self.watchdog = watchdog
        self.api_key = api_key
        self._client: openai.AsyncOpenAI | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def client(self) -> openai.AsyncOpenAI:
        # A connection pool belongs to the event loop that opened it; a worker may run each turn in a new one.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = openai.AsyncOpenAI(
                base_url=self.config.url,
                api_key=self.api_key or "not-needed",
                # The watchdog, not the HTTP read timeout, decides when silence is too long.
                timeout=openai.Timeout(self.config.requestTimeout, connect=10.0),
                max_retries=0,
                http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [_note_sent]}, verify=_tls()),
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._client = None

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        emit: Callable[[Any], None] = lambda e: None,
        agent: str | None = None,
    ) -> Completion:
        request: dict[str, Any] = {
            "model": self.config.name,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            request["tools"] = [{"type": "function", "function": t} for t in tools]
        if self.config.temperature is not None:
            request["temperature"] = self.config.temperature
        emit(Status("Thinking", agent))
        asked, sent = time.monotonic(), []
        token = _sent_at.set(sent)
        try:
            # The SDK's low-level post: `chat.completions.create` re-validates the whole history against its
            # typed schema on every call, which cost more than everything else in a step (bench/bench_loop.py).
            # The chunks come back as their JSON (cast_to=object): building the SDK's typed object for each one
            # made reading a stream three to four times as costly in CPU, and an answer is hundreds of chunks.
            stream = await self._alive(
                self.client.post(
                    "/chat/completions",
                    body=request,
                    cast_to=object,
                    stream=True,
                    stream_cls=openai.AsyncStream[Any],
                )
            )
            completion = await self._read(stream, emit, agent)
            completion.started = sent[0] if sent else asked  # asked: an HTTP client without our hook
            return completion
        except openai.NotFoundError as e:
            raise ModelError(
                f"the model endpoint {self.config.url} does not know the model {self.config.name!r} "
                f"({_api_message(e)}) — check model.name or MM_MODEL"
            ) from e
        except openai.AuthenticationError as e:
            raise ModelError(
                f"the model endpoint {self.config.url} refused the API key ({_api_message(e)}) — check the "
                f"variable named by model.apiKeyEnv"
            ) from e
        except openai.APIConnectionError as e:
            raise ModelError(
                f"the model endpoint {self.config.url} is unreachable ({e.__cause__ or e}) — start the model "
                f"server or set MM_MODEL_URL"
            ) from e
        except openai.APIStatusError as e:
            raise ModelError(f"the model endpoint answered HTTP {e.status_code}: {_api_message(e)}") from e
        except (openai.APIError, httpx.HTTPError, ValueError, AttributeError, TypeError) as e:
            # An error sent inside the stream, a connection cut mid-answer, a chunk that is not what the
            # protocol says: the model's failure, told as such, never a crash that leaves the turn open.
            raise ModelError(
                f"the model endpoint {self.config.url} sent a broken answer ({type(e).__name__}: {e})"
            ) from e
        finally:
            _sent_at.reset(token)

    async def _alive(self, awaitable):
        try:
            async with asyncio.timeout(self.watchdog):  # cheaper than wait_for: no task per streamed chunk
                return await awaitable
        except TimeoutError:
            raise ModelError(
                f"[error: the model sent nothing for {self.watchdog:g}s — turn stopped by the watchdog "
                f"(watchdogTimeout); the model may still be loading, or the server is stuck]"
            ) from None

    async def _read(self, stream, emit, agent) -> Completion:
        text: list[str] = []
        calls: dict[int, _PartialCall] = {}
        usage = Usage()
        composing = False
        iterator = stream.__aiter__()
        try:
            while True:
                try:
                    chunk = await self._alive(iterator.__anext__())
                except StopAsyncIteration:
                    finished = time.monotonic()
                    break
                counted = chunk.get("usage")
                if counted is not None:
                    usage = Usage(counted.get("prompt_tokens") or 0, counted.get("completion_tokens") or 0)
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                        emit(TextDelta(delta["content"], agent))
                    for tc in delta.get("tool_calls") or ():
                        call = calls.setdefault(tc.get("index", 0), _PartialCall())
                        if not composing:
                            composing = True
                            emit(Status("Composing a tool call", agent))
                        if tc.get("id"):
                            call.id = tc["id"]
                        function = tc.get("function") or {}
                        if function.get("name"):
                            call.name += function["name"]
                        if function.get("arguments"):
                            runaway = call.add(function["arguments"])
                            if runaway:
                                raise ModelError(runaway)
        finally:
            await stream.close()
        tool_calls = [
            ToolCallRequest(id=c.id or f"call_{i}", name=c.name, arguments="".join(c.arguments) or "{}")
            for i, c in sorted(calls.items())
        ]
        return Completion("".join(text), tool_calls, usage, finished=finished)


def _api_message(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return e.message
