"""The scripted model server, driven by the official openai client over loopback."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import cast

import httpx
import openai
import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction

from playground.model_server import Fail, ModelServer, Reply, ToolCall, endless

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "list the files"}]


def client(server: ModelServer, timeout: float | openai.Timeout | openai.NotGiven = openai.NOT_GIVEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="test-key", max_retries=0, timeout=timeout)


def function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """The message's tool calls, every one a function call (the server sends no other kind)."""
    calls = []
    for call in message.tool_calls or []:
        assert isinstance(call, ChatCompletionMessageFunctionToolCall), call
        calls.append(call)
    return calls


def delta_function(delta: ChoiceDeltaToolCall) -> ChoiceDeltaToolCallFunction:
    """A streamed tool call delta's function part, which the server always sends."""
    assert delta.function is not None, delta
    return delta.function


def test_plain_text_reply_with_usage_and_recorded_request(model_server: ModelServer) -> None:
    model_server.script(Reply(text="hi there", usage=(12, 3)))
    answer = client(model_server).chat.completions.create(model="small", messages=USER, temperature=0.2)
    assert answer.object == "chat.completion"
    assert answer.model == "small"
    assert answer.choices[0].message.content == "hi there"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (12, 3, 15)
    [recorded] = model_server.requests
    assert recorded.path == "/v1/chat/completions"
    assert recorded.json["temperature"] == 0.2
    assert recorded.headers["Authorization"] == "Bearer test-key"
    assert model_server.messages(0) == USER
    assert model_server.remaining == 0


def test_streamed_tool_calls_arrive_as_openai_shaped_argument_deltas(model_server: ModelServer) -> None:
    calls = [ToolCall("bash", {"command": "ls -la /src"}), ToolCall("read_file", {"path": "a.py", "offset": 3})]
    model_server.script(Reply(text="Looking.", tool_calls=calls, fragment_size=5))
    stream = client(model_server).chat.completions.create(model="m", messages=USER, stream=True)
    text, assembled, finish = "", {}, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            function = delta_function(delta)
            if delta.index not in assembled:
                # The first delta of a call names it; later ones carry argument fragments only.
                assert delta.id and delta.type == "function" and function.name
                assembled[delta.index] = {"id": delta.id, "name": function.name, "args": ""}
            else:
                assert delta.id is None and function.name is None
                assert function.arguments is not None and 0 < len(function.arguments) <= 5
            assembled[delta.index]["args"] += function.arguments or ""
    assert text == "Looking."
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["args"])) for c in assembled.values()] == [
        ("bash", {"command": "ls -la /src"}),
        ("read_file", {"path": "a.py", "offset": 3}),
    ]
    assert len({c["id"] for c in assembled.values()}) == 2


def test_openai_stream_helper_reassembles_and_usage_arrives_last(model_server: ModelServer) -> None:
    model_server.script(Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"}, id="call_x")], usage=(40, 7)))
    with client(model_server).chat.completions.stream(
        model="m", messages=USER, stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_x",
        "bash",
        {"command": "echo hi"},
    )
    assert final.usage is not None and final.usage.total_tokens == 47


def test_async_client_streaming_and_not(model_server: ModelServer) -> None:
    model_server.script(Reply(text="one two three", chunk_size=4), Reply(text="whole"))

    async def talk() -> tuple[str, CompletionUsage | None, str | None]:
        aclient = openai.AsyncOpenAI(base_url=model_server.url, api_key="k", max_retries=0)
        parts: list[str] = []
        usage: CompletionUsage | None = None
        stream = await aclient.chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
            usage = chunk.usage or usage
        whole = await aclient.chat.completions.create(model="m", messages=USER)
        await aclient.close()
        return "".join(parts), usage, whole.choices[0].message.content

    text, usage, whole = asyncio.run(talk())
    assert (text, whole) == ("one two three", "whole")
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0


def test_tool_results_sent_back_are_recorded(model_server: ModelServer) -> None:
    model_server.script(Reply(tool_calls=[ToolCall("bash", {"command": "ls"})]), Reply(text="There is a.py."))
    api = client(model_server)
    first = api.chat.completions.create(model="m", messages=USER)
    call = function_calls(first.choices[0].message)[0]
    # The assistant message goes back as the SDK dumps it, a plain dict.
    answered = cast("ChatCompletionMessageParam", first.choices[0].message.model_dump(exclude_none=True))
    history: list[ChatCompletionMessageParam] = [
        *USER,
        answered,
        {"role": "tool", "tool_call_id": call.id, "content": "a.py\n"},
    ]
    api.chat.completions.create(model="m", messages=history)
    sent = model_server.messages(1)
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "a.py\n"}


def test_unknown_model_is_404_model_not_found() -> None:
    with ModelServer(models=["gemma"], known_models=["gemma"]) as server:
        api = client(server)
        assert [m.id for m in api.models.list()] == ["gemma"]
        with pytest.raises(openai.NotFoundError) as caught:
            api.chat.completions.create(model="llama", messages=USER)
        assert caught.value.code == "model_not_found"
        assert "model 'llama' not found" in caught.value.message


def test_scripted_failures_carry_status_and_openai_error_body(model_server: ModelServer) -> None:
    model_server.script(Fail(503, "overloaded, try later"), Fail(500), Fail.model_not_found("x"))
    api = client(model_server)
    with pytest.raises(openai.InternalServerError) as caught:
        api.chat.completions.create(model="m", messages=USER)
    assert caught.value.status_code == 503 and "overloaded, try later" in caught.value.message
    with pytest.raises(openai.InternalServerError) as caught:
        api.chat.completions.create(model="m", messages=USER)
    assert caught.value.status_code == 500
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="m", messages=USER, stream=True)


def test_running_out_of_script_fails_loudly(model_server: ModelServer) -> None:
    model_server.script(Reply(text="only one"))
    api = client(model_server)
    api.chat.completions.create(model="m", messages=USER)
    with pytest.raises(openai.InternalServerError) as caught:
        api.chat.completions.create(model="m", messages=USER)
    assert "script ran out" in caught.value.message and "#2" in caught.value.message
    assert caught.value.code == "script_exhausted"
    assert len(model_server.errors) == 1
    model_server.reset()
    assert (model_server.requests, model_server.errors, model_server.remaining) == ([], [], 0)
    with pytest.raises(openai.InternalServerError, match="the test scripted 0"):
        api.chat.completions.create(model="m", messages=USER)


def test_a_stall_trips_a_short_client_timeout_and_stop_is_not_held_up() -> None:
    server = ModelServer().start()
    server.script(Reply(text="slow answer", chunk_size=2, stall_after=2, stall_for=60))
    api = client(server, timeout=openai.Timeout(5.0, read=0.5))
    received = []
    with pytest.raises(openai.APITimeoutError):
        for chunk in api.chat.completions.create(model="m", messages=USER, stream=True):
            received.append(chunk.choices[0].delta.content)
    assert received == ["", "sl"]  # the role chunk, one text chunk, then silence
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 10


def test_latency_before_first_byte(model_server: ModelServer) -> None:
    model_server.script(Reply(text="late", delay=0.3))
    started = time.monotonic()
    client(model_server).chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - started >= 0.3


def test_connection_closed_mid_stream(model_server: ModelServer) -> None:
    model_server.script(Reply(text="x" * 50, chunk_size=1, disconnect_after=4), Reply(disconnect_after=0))
    api = client(model_server)
    seen = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in api.chat.completions.create(model="m", messages=USER, stream=True):
            seen.append(chunk)
    assert len(seen) == 4
    with pytest.raises(openai.APIConnectionError):
        api.chat.completions.create(model="m", messages=USER)
    model_server.script(Reply(text="short", disconnect_after=99))  # past the end: no [DONE] either
    with pytest.raises(openai.APIConnectionError):
        for _ in api.chat.completions.create(model="m", messages=USER, stream=True):
            pass


def test_endless_arguments_stream_past_256_kb(model_server: ModelServer) -> None:
    # Big chunks keep the client's per-chunk parsing cheap; the guard under test only counts characters.
    model_server.script(Reply(tool_calls=[ToolCall("write_file", endless('{"content": "' + "ab" * 1024))]))
    args = 0
    stream = client(model_server).chat.completions.create(model="m", messages=USER, stream=True)
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            args += len(delta_function(delta).arguments or "")
        if args > 256 * 1024:
            break
    stream.close()
    assert args > 256 * 1024


def test_raw_argument_text_and_chunk_generators_are_sent_verbatim(model_server: ModelServer) -> None:
    model_server.script(
        Reply(tool_calls=[ToolCall("bash", '{"command": "ls"')]),  # cut short: not valid JSON
        Reply(tool_calls=[ToolCall("bash", iter(['{"comm', 'and": ', '"pwd"}']))]),
    )
    api = client(model_server)
    broken = api.chat.completions.create(model="m", messages=USER)
    assert function_calls(broken.choices[0].message)[0].function.arguments == '{"command": "ls"'
    fragments = [
        delta_function(delta).arguments
        for chunk in api.chat.completions.create(model="m", messages=USER, stream=True)
        for delta in chunk.choices[0].delta.tool_calls or []
    ]
    assert fragments == ['{"comm', 'and": ', '"pwd"}']


def test_reply_computed_from_the_request_and_always_mode(model_server: ModelServer) -> None:
    model_server.script(lambda request: Reply(text=f"{len(request['messages'])} message(s) to {request['model']}"))
    api = client(model_server)
    assert api.chat.completions.create(model="m1", messages=USER).choices[0].message.content == "1 message(s) to m1"
    counter = itertools.count(1)
    model_server.always(lambda request: Reply(text=f"answer {next(counter)}"))
    answers = [api.chat.completions.create(model="m", messages=USER).choices[0].message.content for _ in range(5)]
    assert answers == [f"answer {i}" for i in range(1, 6)]
    model_server.always(Reply(text="same"))
    assert api.chat.completions.create(model="m", messages=USER).choices[0].message.content == "same"


def test_malformed_requests_and_wrong_key_get_clear_errors() -> None:
    with ModelServer(api_key="right") as server:
        response = httpx.post(
            server.url + "/chat/completions", content=b"{not json", headers={"Authorization": "Bearer right"}
        )
        assert response.status_code == 400
        assert "'messages' list" in response.json()["error"]["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).chat.completions.create(
                model="m", messages=USER
            )
        assert server.requests[0].json is None  # recorded even when it was not JSON


def test_a_long_lived_server_keeps_its_newest_requests_and_numbers_on() -> None:
    with ModelServer(history=2) as server:
        server.always(Reply(tool_calls=[ToolCall("bash", {"command": "ls"})]))
        ids = []
        for _ in range(7):
            answer = httpx.post(f"{server.url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            ids.append(answer.json()["choices"][0]["message"]["tool_calls"][0]["id"])
        assert 2 <= len(server.requests) <= 4
        assert len(set(ids)) == 7  # call ids stay unique after the record is trimmed
