"""The model client: OpenAI-compatible chat completions, streamed.

It works with llama.cpp, Ollama, vLLM, Docker Model Runner and hosted APIs alike because it speaks only the
chat-completions wire format: a POST, and the answer as Server-Sent Events (`data: {chunk}` lines, tool-call
arguments in fragments gathered by their index, an optional usage-only chunk, `data: [DONE]`). Two guards sit
on the stream because small models derail: the watchdog (silence longer than `watchdogTimeout` ends the call)
and the runaway guard (a tool call whose arguments loop or balloon is stopped at once, not after minutes of
garbage).

Why aiohttp and not the openai SDK (issue 23). Measured by bench/bench_model_client.py: the scripted model
server over loopback, the CPU of the thread that reads, the same work per chunk on both sides (median of 5
rounds of 100 answers, on the project's 2-core machine):

    client                  per request   per chunk   answer of 403 events   client made per turn
    openai SDK (+ httpx)      1.27 ms      36.6 µs        16.0 ms                  2.2 ms
    aiohttp, SSE by hand      0.19 ms      12.0 µs         5.0 ms                  0.6 ms

(per turn: a client made, used for one short answer and closed, as a worker did each turn, the TLS context
made once per process). The SDK costs 6-7x per request and 3x per chunk, and an agent step's answer is
hundreds of chunks. So the client streams with aiohttp, one session per event loop (ModelHttp: shared by the
turns of a process that share a loop), and parses SSE itself: a few dozen lines against a format that has
not changed. This
client, guards and events included, went from 1.29 ms a request and 53 µs a chunk (the SDK's, with an
asyncio.timeout per chunk) to 0.21 ms and 12.9 µs; bench/bench_loop.py's agent step (model call included,
10 messages of history) from 2.65 ms of CPU to 0.85 ms. tests/test_model_streams.py holds it to the SDK's
events on recorded streams of llama.cpp, Ollama and vLLM (tests/fixtures/model_streams/). The user-visible
error texts are the SDK client's, word for word.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
from yarl import URL

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
    # time.monotonic() when the request left (the history's JSON is before it, on our side of the call) and when
    # the answer's last event arrived.
    started: float = 0.0
    finished: float = 0.0


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
    """httpx's default TLS context (certifi's CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), as the SDK client
    trusted: made once per process, on the first https call (loading the CA bundle costs ~100 ms of CPU; an
    SSLContext is safe to share between threads and event loops)."""
    return httpx.create_ssl_context()


@functools.lru_cache(maxsize=64)
def _proxy(url: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for this endpoint, read as the SDK's httpx client (and curl) read it:
    HTTP_PROXY / HTTPS_PROXY, else ALL_PROXY, in either case; a value without a scheme is an http:// proxy;
    NO_PROXY exempts a host. Looked up once per endpoint (a process's environment does not change under it).
    Not aiohttp's trust_env: it ignores ALL_PROXY and a scheme-less value, costs two thread-pool hops a request,
    and a ~/.netrc entry for the model's host would make it refuse the request."""
    target = URL(url)
    host = target.host or ""
    proxies = urllib.request.getproxies_environment()
    value = proxies.get(target.scheme) or proxies.get("all")
    if not value or (host and urllib.request.proxy_bypass(host)):
        return None, None
    proxy = URL(value if "://" in value else f"http://{value}")
    auth = aiohttp.BasicAuth(proxy.user, proxy.password or "") if proxy.user else None
    return str(proxy.with_user(None)), auth


class ModelHttp:
    """The HTTP side of the model client: one aiohttp session (its connection pool) per event loop, shared by
    every ModelClient made with it, whatever its endpoint, model or key. A worker process keeps one for all its
    turns; `aclose()` once at the end. A session is closed with its event loop too (a task of the loop holds
    it, and asyncio.run cancels what is left at its end), so a loop per turn leaks nothing."""

    def __init__(self) -> None:
        self._sessions: dict[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, asyncio.Task[None]]] = {}

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        held = self._sessions.get(loop)
        if held is not None and not held[0].closed:
            return held[0]
        session = aiohttp.ClientSession(
            # No cap on connections: the worker's concurrency bounds the turns, each streams on its own one.
            connector=aiohttp.TCPConnector(limit=0),
            # The watchdog, not a total time, decides when an answer takes too long.
            timeout=aiohttp.ClientTimeout(total=None, connect=10.0),
        )
        self._sessions[loop] = (session, loop.create_task(self._hold(loop, session)))
        return session

    async def _hold(self, loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            if self._sessions.get(loop, (None,))[0] is session:
                del self._sessions[loop]
            await session.close()

    async def aclose(self) -> None:
        """Close this event loop's session (others close with their loops)."""
        held = self._sessions.pop(asyncio.get_running_loop(), None)
        if held is not None:
            held[1].cancel()
            await held[0].close()


class _Watchdog:
    """Ends the call when the model sends nothing for `seconds`: one timer for the whole call, which each event
    pushes back at the cost of reading the clock (an asyncio.timeout per chunk made a timer and a context
    manager per chunk). It cancels the call's task, and `expired()` tells that cancellation from a stop's."""

    def __init__(self, seconds: float) -> None:
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self.task, self.seconds, self.fired = task, seconds, False
        self.cancelling = task.cancelling()
        self.deadline = self.loop.time() + seconds
        self.handle = self.loop.call_at(self.deadline, self._check)

    def feed(self) -> None:
        self.deadline = self.loop.time() + self.seconds

    def _check(self) -> None:
        if self.loop.time() < self.deadline:
            self.handle = self.loop.call_at(self.deadline, self._check)
        else:
            self.fired = True
            self.task.cancel()

    def expired(self) -> bool:
        """On CancelledError: whether it was the watchdog's alone (then the call ends with its error)."""
        return self.fired and self.task.uncancel() <= self.cancelling

    def stop(self) -> None:
        self.handle.cancel()


class _Unreachable(CoreError):
    """No answer began: the connection failed, or was closed before the response's headers."""


class _Broken(CoreError):
    """The answer began and went wrong: `kind` and `text` are what the error names."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind, self.text = kind, text


class ModelClient:
    """One agent's model: its endpoint, name, key and watchdog, over a ModelHttp (the process's, or one of its
    own, which `aclose()` closes)."""

    def __init__(
        self,
        config: ModelConfig,
        api_key: str | None = None,
        watchdog: float = 120.0,
        http: ModelHttp | None = None,
    ):
        self.config = config
        self.watchdog = watchdog
        self.api_key = api_key
        self.http = http or ModelHttp()
        self._owns_http = http is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

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
        url = self.config.url.rstrip("/") + "/chat/completions"
        headers = {
            "Authorization": f"Bearer {self.api_key or 'not-needed'}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        watchdog = _Watchdog(self.watchdog)
        try:
            body = _json_body(request)
            session = self.http.session()
            started = time.monotonic()
            try:
                proxy, proxy_auth = _proxy(url)
                response = await session.post(
                    url,
                    data=body,
                    headers=headers,
                    proxy=proxy,
                    proxy_auth=proxy_auth,
                    ssl=_tls() if url.startswith("https:") else True,
                    # Between two reads: the SDK client's read timeout. The watchdog is usually shorter.
                    timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self.config.requestTimeout),
                )
            except aiohttp.ClientConnectorError as e:
                raise _Unreachable(str(e.os_error)) from e
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                # A refused connection, a proxy that answers 407, a URL aiohttp cannot use: no answer began.
                raise _Unreachable(str(e) or type(e).__name__) from e
            async with response:
                watchdog.feed()
                try:
                    if response.status >= 400:
                        raise ModelError(self._refusal(response.status, await _head(response)))
                    completion = await _read(response, watchdog, emit, agent)
                except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError, TypeError) as e:
                    raise _Broken(type(e).__name__, str(e)) from e
            completion.started = started
            return completion
        except asyncio.CancelledError:
            if watchdog.expired():
                raise ModelError(
                    f"[error: the model sent nothing for {self.watchdog:g}s — turn stopped by the watchdog "
                    f"(watchdogTimeout); the model may still be loading, or the server is stuck]"
                ) from None
            raise
        except _Unreachable as e:
            raise ModelError(
                f"the model endpoint {self.config.url} is unreachable ({e}) — start the model server or set "
                f"MM_MODEL_URL"
            ) from e
        except _Broken as e:
            # An error sent inside the stream, a connection cut mid-answer, a chunk that is not what the
            # protocol says: the model's failure, told as such, never a crash that leaves the turn open.
            raise ModelError(f"the model endpoint {self.config.url} sent a broken answer ({e.kind}: {e.text})") from e
        finally:
            watchdog.stop()

    def _refusal(self, status: int, raw: bytes) -> str:
        message = _status_message(status, raw.decode("utf-8", "replace"))
        if status == 404:
            return (
                f"the model endpoint {self.config.url} does not know the model {self.config.name!r} "
                f"({message}) — check model.name or MM_MODEL"
            )
        if status == 401:
            return (
                f"the model endpoint {self.config.url} refused the API key ({message}) — check the variable "
                f"named by model.apiKeyEnv"
            )
        return f"the model endpoint answered HTTP {status}: {message}"


def _json_body(request: dict[str, Any]) -> bytes:
    try:
        return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate (a tool's undecodable output): escaped, it is still JSON
        return json.dumps(request, separators=(",", ":")).encode()


def _status_message(status: int, text: str) -> str:
    """What the person is told of a refused request: the `error.message` of the body when it has one, else the
    SDK client's words ("Error code: 503 - …"), so the texts stay what they were."""
    text = text.strip()
    fallback = f"Error code: {status}"
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    else:
        error = body.get("error", body) if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str) and message:
            fallback += f" - {message}"
    data = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return fallback


async def _head(response: aiohttp.ClientResponse) -> bytes:
    """An error's body, its first BODY_MOST bytes at most: what a refusal says is in its head."""
    parts: list[bytes] = []
    size = 0
    while size < BODY_MOST and (part := await response.content.read(BODY_MOST - size)):
        parts.append(part)
        size += len(part)
    return b"".join(parts)


class _Lines:
    """Server-Sent Events' lines out of the body's blocks, as they come: a line (and a `\r\n`) may be split
    across blocks anywhere. The unfinished line is kept as parts and only the new block is searched for line
    ends, so a long line costs linear time; a line or an event longer than LINE_MOST is a broken answer (a
    server or proxy gone wrong would otherwise grow it, and the CPU spent on it, until the watchdog)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def feed(self, block: bytes) -> list[bytes]:
        done: list[bytes] = []
        if self.parts and self.parts[-1][-1:] == b"\r":
            # The unfinished line ended in `\r`: a `\n` now makes it `\r\n`; anything else means `\r` ended it.
            if block[:1] == b"\n":
                self.parts.append(b"\n")
                block = block[1:]
            done.append(self._take())
        if b"\n" not in block and b"\r" not in block:
            if block:
                self._keep(block)
            return done
        lines = block.splitlines(keepends=True)
        if self.parts:
            self._keep(lines[0])
            lines[0] = self._take()
        # An unfinished last line waits for the rest; so does one ending in `\r`, which may be half a `\r\n`.
        if lines[-1][-1:] == b"\r" or lines[-1][-1:] != b"\n":
            self._keep(lines.pop())
        return done + lines

    def _keep(self, part: bytes) -> None:
        self.size += len(part)
        if self.size > LINE_MOST:
            raise _Broken("LineTooLong", f"a line of the stream passed {LINE_MOST} bytes")
        self.parts.append(part)

    def _take(self) -> bytes:
        line, self.parts, self.size = b"".join(self.parts), [], 0
        return line

    def finish(self) -> list[bytes]:
        rest = self._take()
        return [rest] if rest else []


async def _read(
    response: aiohttp.ClientResponse, watchdog: _Watchdog, emit: Callable[[Any], None], agent: str | None
) -> Completion:
    """The answer's events, gathered: text, tool calls by index, usage; `[DONE]` (or the end of the body)
    ends it. SSE as the spec (and the SDK) reads it: `data:` lines joined until a blank line, comments and the
    other fields skipped, an unfinished event at the end dropped."""
    text: list[str] = []
    calls: dict[int, _PartialCall] = {}
    usage = Usage()
    composing = False
    data: list[bytes] = []
    lines = _Lines()

    def chunk_of(payload: bytes) -> None:
        nonlocal usage, composing
        chunk = json.loads(payload)
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise _Broken("APIError", message if message and isinstance(message, str) else STREAM_ERROR)
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

    def event_ends(batch: list[bytes]) -> bool:
        """Take a batch of lines; True at `[DONE]`."""
        for line in batch:
            line = line.rstrip(b"\r\n")
            if line:
                if line[:5] == b"data:":
                    data.append(line[6:] if line[5:6] == b" " else line[5:])
                    if len(data) > 1 and sum(map(len, data)) > LINE_MOST:
                        raise _Broken("EventTooLong", f"an event of the stream passed {LINE_MOST} bytes")
                elif line == b"data":
                    data.append(b"")
                continue
            if not data:
                continue
            payload = data[0] if len(data) == 1 else b"\n".join(data)
            data.clear()
            watchdog.feed()
            if payload[:6] == b"[DONE]":
                return True
            chunk_of(payload)
        return False

    done = False
    async for block in response.content.iter_any():
        if event_ends(lines.feed(block)):
            done = True
            break
    if not done:
        event_ends(lines.finish())
    finished = time.monotonic()
    if done:
        # What follows `[DONE]` (the body's end, at once): read, the connection serves the next call. A server that
        # keeps the body open after it loses the connection, not the answer.
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                while await response.content.read(BODY_MOST):
                    pass
        except TimeoutError:
            response.close()
    tool_calls = [
        ToolCallRequest(id=c.id or f"call_{i}", name=c.name, arguments="".join(c.arguments) or "{}")
        for i, c in sorted(calls.items())
    ]
    return Completion("".join(text), tool_calls, usage, finished=finished)


DRAIN_SECONDS = 1.0
# The longest line or event of a stream taken: a chunk carries a few tokens, and a tool call's arguments are
# capped by the runaway guard long before this.
LINE_MOST = 2 * RUNAWAY_MAX_BYTES
# What is read of an error's body, and of what follows `[DONE]`.
BODY_MOST = 64 * 1024

# The SDK client's words for an error object without a message.
STREAM_ERROR = "An error occurred during streaming"
