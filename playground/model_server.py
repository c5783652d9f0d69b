"""A scripted OpenAI-compatible model server for tests and benchmarks.

    with ModelServer() as server:
        server.script(
            Reply(text="Let me look."),
            Reply(tool_calls=[ToolCall("bash", {"command": "ls"})]),
            Fail(503, "overloaded"),
            lambda request: Reply(text=f"you sent {len(request['messages'])} messages"),
        )
        client = openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)

Each POST /v1/chat/completions takes the next item of the script. When the script runs out the server answers
500 `script_exhausted`, so a test that calls the model more often than it meant fails loudly. Streaming
(`"stream": true`) answers in Server-Sent Events shaped like OpenAI's, tool-call arguments in fragments.
Every request is recorded (`server.requests`, `server.messages(n)`).

Mind that the openai client retries 5xx/429 by itself (max_retries=2 by default): pass `max_retries=0` when a
test counts requests or scripts failures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from playground.server_thread import ThreadedAiohttpServer


@dataclass
class ToolCall:
    """A tool call the model makes.

    `arguments`: a mapping (sent as its JSON), a raw string (sent as is, even when it is not valid JSON), or
    an iterable of string chunks, each sent as one delta — an endless generator (e.g.
    `itertools.repeat('"aaaa')`) makes a runaway call that only streaming can carry.
    """

    name: str
    arguments: Mapping[str, Any] | str | Iterable[str] = field(default_factory=dict)
    id: str | None = None  # default: call_<request#>_<index>

    def argument_chunks(self, fragment_size: int) -> Iterable[str]:
        if isinstance(self.arguments, Mapping):
            text = json.dumps(self.arguments, ensure_ascii=False)
        elif isinstance(self.arguments, str):
            text = self.arguments
        else:
            return self.arguments
        return (text[i : i + fragment_size] for i in range(0, len(text), fragment_size))


@dataclass
class Reply:
    """One assistant answer, and how to deliver it.

    delay: seconds before the first byte (headers included).
    stall_after / stall_for: in a stream, after that many SSE events have been sent (or before `[DONE]` when
        the answer has fewer), wait `stall_for` seconds (cut short when the server stops); in a plain answer,
        wait before answering.
    disconnect_after: close the connection after that many SSE events (or before `[DONE]`; 0: before any
        response).
    usage: (prompt_tokens, completion_tokens); by default a rough estimate (characters / 4).
    """

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    reasoning: str = ""  # sent as `reasoning_content`, as llama.cpp / vLLM servers do
    chunk_size: int = 16  # characters of text per content delta
    fragment_size: int = 8  # characters of arguments per tool-call delta
    delay: float = 0.0
    stall_after: int | None = None
    stall_for: float = 3600.0
    disconnect_after: int | None = None
    interval: float = 0.0  # seconds between two SSE events: a slow but steady model
    usage: tuple[int, int] | None = None
    finish_reason: str | None = None  # default: "tool_calls" when there are tool calls, else "stop"


@dataclass
class Fail:
    """An HTTP error with OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    status: int = 500
    message: str = "The server had an error while processing your request."
    type: str = "server_error"
    code: str | None = None
    delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. {"Retry-After": "1"} with 429

    @classmethod
    def model_not_found(cls, model: str) -> Fail:
        return cls(404, f"model '{model}' not found", "invalid_request_error", "model_not_found")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


Answer = Reply | Fail
ScriptItem = Answer | Callable[[dict[str, Any]], Answer]


@dataclass
class RecordedRequest:
    """A request the server received: `json` is the parsed body (None when it was not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any
    time: float


class ModelServer(ThreadedAiohttpServer):
    """OpenAI-compatible chat-completions server replaying a script. `url` ends in `/v1`.

    models: the names GET /v1/models lists. known_models: when given, other model names get a 404
    `model_not_found` (default: any name is accepted). api_key: when given, other bearer tokens get a 401.
    """

    def __init__(
        self,
        models: Sequence[str] = ("test-model",),
        known_models: Sequence[str] | None = None,
        api_key: str | None = None,
        history: int | None = None,
    ) -> None:
        super().__init__()
        # Requests recorded, at most (the newest): the demo model serves for as long as the playground runs.
        self.history = history
        self.models = list(models)
        self.known_models = list(known_models) if known_models is not None else None
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        self._numbers = itertools.count(1)  # the chat requests served, kept apart from the (trimmed) record
        self.errors: list[str] = []  # the script-ran-out messages, for a test to assert on
        self._script: deque[ScriptItem] = deque()
        self._always: ScriptItem | None = None
        self._scripted = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    # -- the script ---------------------------------------------------------------------------------------

    def script(self, *items: ScriptItem) -> ModelServer:
        """Append answers: Reply, Fail, or a callable taking the request JSON and returning one."""
        with self._lock:
            self._script.extend(items)
            self._scripted += len(items)
        return self

    def always(self, item: ScriptItem | None) -> ModelServer:
        """Answer `item` to every request once the script is empty (None: back to failing). For benchmarks.

        A Reply whose arguments are a generator is consumed by its first use: use a callable instead.
        """
        with self._lock:
            self._always = item
        return self

    @property
    def remaining(self) -> int:
        """How many scripted answers have not been used yet."""
        return len(self._script)

    def reset(self) -> None:
        """Forget the script, the recorded requests and the errors; keep the models and the key."""
        with self._lock:
            self._script.clear()
            self._always = None
            self._scripted = 0
            self.requests.clear()
            self._numbers = itertools.count(1)
            self.errors.clear()

    def messages(self, n: int = -1) -> list[dict[str, Any]]:
        """The `messages` of the n-th chat request (default: the last)."""
        return self.requests[n].json["messages"]

    def _next(self, body: dict[str, Any], number: int) -> Answer:
        with self._lock:
            item = self._script.popleft() if self._script else self._always
        if item is None:
            message = (
                f"ModelServer: the script ran out: chat request #{number} has no scripted answer "
                f"(the test scripted {self._scripted})"
            )
            self.errors.append(message)
            return Fail(500, message, "server_error", "script_exhausted")
        return item(body) if callable(item) else item

    # -- HTTP ---------------------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        fail = Fail(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        return web.json_response(fail.body(), status=401)

    async def _list_models(self, request: web.Request) -> web.Response:
        if (denied := self._auth_failure(request)) is not None:
            return denied
        names = self.known_models if self.known_models is not None else self.models
        data = [{"id": name, "object": "model", "created": 1700000000, "owned_by": "mm-playground"} for name in names]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(RecordedRequest(request.method, request.path, dict(request.headers), body, time.time()))
        if self.history is not None and len(self.requests) > 2 * self.history:
            del self.requests[: -self.history]  # trimmed in halves: appending stays cheap
        number = next(self._numbers)
        if (denied := self._auth_failure(request)) is not None:
            return denied
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            fail = Fail(400, "the body must be a JSON object with a 'messages' list", "invalid_request_error")
            return web.json_response(fail.body(), status=400)
        model = str(body.get("model", ""))
        if self.known_models is not None and model not in self.known_models:
            fail = Fail.model_not_found(model)
            return web.json_response(fail.body(), status=fail.status)

        answer = self._next(body, number)
        if answer.delay:
            await self.wait_or_stop(answer.delay)
        if isinstance(answer, Fail):
            return web.json_response(answer.body(), status=answer.status, headers=dict(answer.headers))
        if answer.disconnect_after == 0:
            _hang_up(request)
            return web.Response()
        completion = _Completion(answer, body, number)
        if body.get("stream"):
            return await self._stream(request, answer, completion, body)
        if answer.stall_after is not None:
            await self.wait_or_stop(answer.stall_for)
        return web.json_response(completion.whole())

    async def _stream(
        self, request: web.Request, answer: Reply, completion: _Completion, body: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        sent = 0
        for chunk in completion.chunks(include_usage):
            if answer.disconnect_after is not None and sent >= answer.disconnect_after:
                _hang_up(request)
                return response
            if answer.stall_after is not None and sent == answer.stall_after:
                await self.wait_or_stop(answer.stall_for)
            await response.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
            sent += 1
            # Let other requests and the stop signal through between chunks of an endless stream.
            await (self.wait_or_stop(answer.interval) if answer.interval else asyncio.sleep(0))
        # A count past the end of the answer still stalls / hangs up, just before [DONE].
        if answer.disconnect_after is not None:
            _hang_up(request)
            return response
        if answer.stall_after is not None and sent <= answer.stall_after:
            await self.wait_or_stop(answer.stall_for)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _hang_up(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


class _Completion:
    """Builds the OpenAI JSON of one answer: whole (`chat.completion`) or as chunks (`chat.completion.chunk`)."""

    def __init__(self, reply: Reply, body: dict[str, Any], number: int) -> None:
        self.reply = reply
        self.id = f"chatcmpl-mm{number:06d}"
        self.created = int(time.time())
        self.model = str(body.get("model", ""))
        self.prompt_chars = len(json.dumps(body.get("messages", []), ensure_ascii=False))
        self.completion_chars = 0
        self.call_ids = [call.id or f"call_{number}_{i}" for i, call in enumerate(reply.tool_calls)]

    def finish_reason(self) -> str:
        return self.reply.finish_reason or ("tool_calls" if self.reply.tool_calls else "stop")

    def usage(self) -> dict[str, int]:
        if self.reply.usage is not None:
            prompt, completion = self.reply.usage
        else:
            prompt, completion = max(1, self.prompt_chars // 4), max(1, self.completion_chars // 4)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "system_fingerprint": None}

    def whole(self) -> dict[str, Any]:
        reply = self.reply
        calls = []
        for call_id, call in zip(self.call_ids, reply.tool_calls, strict=True):
            arguments = "".join(call.argument_chunks(reply.fragment_size))
            calls.append({"id": call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
        self.completion_chars = len(reply.text) + sum(len(c["function"]["arguments"]) for c in calls)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason()}
        return self._envelope("chat.completion") | {"choices": [choice], "usage": self.usage()}

    def chunks(self, include_usage: bool) -> Iterable[dict[str, Any]]:
        """The stream's chunks, lazily (arguments may be endless)."""
        reply = self.reply
        extra = {"usage": None} if include_usage else {}

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk") | {"choices": [choice]} | extra

        yield chunk({"role": "assistant", "content": "", "refusal": None})
        step = max(1, reply.chunk_size)
        for i in range(0, len(reply.reasoning), step):
            yield chunk({"reasoning_content": reply.reasoning[i : i + step]})
        for i in range(0, len(reply.text), step):
            self.completion_chars += len(reply.text[i : i + step])
            yield chunk({"content": reply.text[i : i + step]})
        for index, (call_id, call) in enumerate(zip(self.call_ids, reply.tool_calls, strict=True)):
            fragments = iter(call.argument_chunks(max(1, reply.fragment_size)))
            first = next(fragments, "")
            self.completion_chars += len(first)
            # As OpenAI does: the first delta names the call, the later ones carry argument text only.
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": first},
                        }
                    ]
                }
            )
            for fragment in fragments:
                self.completion_chars += len(fragment)
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        yield chunk({}, self.finish_reason())
        if include_usage:
            yield self._envelope("chat.completion.chunk") | {"choices": [], "usage": self.usage()}


def endless(pattern: str) -> Iterable[str]:
    """Argument chunks repeating `pattern` forever, for runaway-guard tests."""
    return itertools.repeat(pattern)
