"""The Slack emulator driven by slack_sdk, and signed requests checked by slack_sdk's and bolt's verifiers."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from aiohttp import web
from slack_bolt.app.async_app import AsyncApp
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.slack_response import SlackResponse

from playground.server_thread import ThreadedAiohttpServer
from playground.signed import SlackEventSender, stale_timestamp
from playground.slack_api import SlackEmulator

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TS = re.compile(r"^\d{10}\.\d{6}$")


def body(response: SlackResponse) -> dict[str, Any]:
    """The response's JSON body: SlackResponse's `[]` is untyped, so a checker sees `... | None` for every key."""
    assert isinstance(response.data, dict), response.data
    return response.data


def stored(slack: SlackEmulator, channel: str, ts: str) -> dict[str, Any]:
    """A message the emulator must hold."""
    message = slack.message(channel, ts)
    assert message is not None, (channel, ts)
    return message


@pytest.fixture
def client(slack: SlackEmulator) -> WebClient:
    return WebClient(token=slack.bot_token, base_url=slack.url)


def test_auth_test_names_the_bot(client: WebClient, slack: SlackEmulator) -> None:
    answer = client.auth_test()
    assert (answer["user_id"], answer["bot_id"], answer["team_id"]) == ("U0BOT", "B0BOT", "T0TESTTEAM")
    assert slack.calls_to("auth.test")[0].headers["Authorization"] == f"Bearer {slack.bot_token}"


def test_thread_posts_come_back_from_conversations_replies(client: WebClient, slack: SlackEmulator) -> None:
    question = slack.add_message("C0TEST", "<@U0BOT> fix the build", user="U0ALICE")
    first = body(client.chat_postMessage(channel="C0TEST", thread_ts=question["ts"], text="On it."))
    second = body(client.chat_postMessage(channel="C0TEST", thread_ts=question["ts"], text="Done."))
    assert TS.match(first["ts"]) and float(second["ts"]) > float(first["ts"]) > float(question["ts"])
    assert first["message"]["bot_id"] == "B0BOT" and first["message"]["thread_ts"] == question["ts"]
    replies = body(client.conversations_replies(channel="C0TEST", ts=question["ts"]))["messages"]
    assert [m["text"] for m in replies] == ["<@U0BOT> fix the build", "On it.", "Done."]
    assert replies[0]["reply_count"] == 2 and replies[0]["latest_reply"] == second["ts"]
    # A reply's ts finds its whole thread too, as in Slack.
    assert len(body(client.conversations_replies(channel="C0TEST", ts=first["ts"]))["messages"]) == 3
    assert [m["text"] for m in slack.messages("C0TEST")] == ["<@U0BOT> fix the build"]
    client.chat_delete(channel="C0TEST", ts=first["ts"])  # a deleted reply no longer counts
    assert slack.messages("C0TEST")[0]["reply_count"] == 1


def test_a_long_lived_emulator_keeps_its_newest_calls_and_one_home_view_a_person() -> None:
    with SlackEmulator(history=3) as slack:
        slack.add_channel("C0TEST", "mm-test")
        client = WebClient(token=slack.bot_token, base_url=slack.url)
        for i in range(10):
            client.chat_postMessage(channel="C0TEST", text=f"m{i}")
        assert 3 <= len(slack.calls) <= 6 and slack.calls[-1].params["text"] == "m9"
        assert len(slack.messages("C0TEST")) == 10  # the channel itself keeps everything, as Slack does
        slack.add_user("U0ALICE", "alice")
        first = body(
            client.views_publish(
                user_id="U0ALICE",
                view={"type": "home", "blocks": [{"type": "header", "text": {"type": "plain_text", "text": "mm"}}]},
            )
        )["view"]
        second = body(client.views_publish(user_id="U0ALICE", view={"type": "home", "blocks": [{"type": "divider"}]}))
        assert second["view"]["id"] == first["id"] and len(slack.views) == 1
        assert slack.snapshot("C0TEST", "U0ALICE")["home"]["blocks"] == [{"type": "divider"}]


def test_update_and_delete_change_the_stored_message(client: WebClient, slack: SlackEmulator) -> None:
    posted = body(client.chat_postMessage(channel="C0TEST", text="Thinking…"))
    updated = body(
        client.chat_update(
            channel="C0TEST",
            ts=posted["ts"],
            text="Answer",
            blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "*Answer*"}}],
        )
    )
    assert updated["message"]["text"] == "Answer"
    message = stored(slack, "C0TEST", posted["ts"])
    assert message["text"] == "Answer" and message["blocks"][0]["text"]["text"] == "*Answer*"
    client.chat_delete(channel="C0TEST", ts=posted["ts"])
    assert slack.message("C0TEST", posted["ts"]) is None
    with pytest.raises(SlackApiError) as caught:
        client.chat_update(channel="C0TEST", ts=posted["ts"], text="again")
    assert caught.value.response["error"] == "message_not_found"


def test_form_encoded_and_json_bodies_store_the_same_blocks(client: WebClient, slack: SlackEmulator) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]
    slack.add_channel("C1", "one")
    form = {"channel": "C1", "text": "a", "blocks": json.dumps(blocks)}
    by_form = body(client.api_call("chat.postMessage", params=form))
    by_json = body(client.api_call("chat.postMessage", json={"channel": "C1", "text": "b", "blocks": blocks}))
    assert stored(slack, "C1", by_form["ts"])["blocks"] == stored(slack, "C1", by_json["ts"])["blocks"] == blocks
    with pytest.raises(SlackApiError) as caught:
        client.api_call("chat.postMessage", json={"text": "no channel"})
    assert caught.value.response["error"] == "invalid_arguments"
    assert caught.value.response["response_metadata"]["messages"] == ["[ERROR] missing required field: channel"]


def test_injected_error_raises_then_the_method_recovers(client: WebClient, slack: SlackEmulator) -> None:
    slack.fail("chat.postMessage", "channel_not_found", times=2)
    for _ in range(2):
        with pytest.raises(SlackApiError) as caught:
            client.chat_postMessage(channel="C0TEST", text="x")
        assert caught.value.response["error"] == "channel_not_found"
    assert client.chat_postMessage(channel="C0TEST", text="x")["ok"]


def test_rate_limit_then_success_with_the_sdk_retry_handler(slack: SlackEmulator) -> None:
    slack.rate_limit("chat.update", times=1, retry_after=1)
    client = WebClient(
        token=slack.bot_token, base_url=slack.url, retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=2)]
    )
    posted = body(client.chat_postMessage(channel="C0TEST", text="v1"))
    assert client.chat_update(channel="C0TEST", ts=posted["ts"], text="v2")["ok"]
    calls = slack.calls_to("chat.update")
    assert [c.status for c in calls] == [429, 200]
    assert calls[0].response == {"ok": False, "error": "ratelimited"}
    assert calls[1].time - calls[0].time >= 0.9  # the SDK honoured Retry-After


def test_rate_limit_without_retry_handler_surfaces_429(client: WebClient, slack: SlackEmulator) -> None:
    slack.rate_limit("reactions.add", retry_after=7)
    with pytest.raises(SlackApiError) as caught:
        client.reactions_add(channel="C0TEST", timestamp="1.000001", name="eyes")
    assert caught.value.response.status_code == 429
    assert caught.value.response.headers["Retry-After"] == "7"


def test_a_held_method_waits_for_its_release_and_drops_a_caller_that_went_away(
    client: WebClient, slack: SlackEmulator
) -> None:
    slack.hold("chat.postMessage")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.chat_postMessage, channel="C0TEST", text="kept")
        slack.wait_for_held("chat.postMessage")
        assert not waiting.done() and not slack.messages("C0TEST")
        # Another caller, gone before the release: its post never reaches the channel.
        form = b"channel=C0TEST&text=dropped"
        request = (
            f"POST /api/chat.postMessage HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {slack.bot_token}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(form)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", slack.port)) as gone:
            gone.sendall(request.encode() + form)
            slack.wait_for_held("chat.postMessage", 2)
        slack.release("chat.postMessage")
        assert waiting.result(timeout=10)["ok"] is True
    time.sleep(0.3)  # the dropped call's handler has run
    assert [m["text"] for m in slack.messages("C0TEST")] == ["kept"]
    assert len(slack.calls_to("chat.postMessage")) == 1


def test_files_upload_v2_lands_in_the_thread(client: WebClient, slack: SlackEmulator) -> None:
    parent = body(client.chat_postMessage(channel="C0TEST", text="output follows"))
    answer = body(
        client.files_upload_v2(
            channel="C0TEST",
            thread_ts=parent["ts"],
            content="line 1\nline 2\n",
            filename="output.txt",
            title="bash output",
            initial_comment="full output",
        )
    )
    file_id = answer["file"]["id"]
    assert slack.uploads[file_id] == b"line 1\nline 2\n"
    assert answer["file"]["title"] == "bash output" and answer["file"]["size"] == 14
    shared = slack.messages("C0TEST", parent["ts"])[-1]
    assert shared["text"] == "full output" and shared["files"][0]["id"] == file_id


def test_tokens_and_methods_are_checked(slack: SlackEmulator) -> None:
    with pytest.raises(SlackApiError) as caught:
        WebClient(token="xoxb-wrong", base_url=slack.url).auth_test()
    assert caught.value.response["error"] == "invalid_auth"
    with pytest.raises(SlackApiError) as caught:
        WebClient(base_url=slack.url).api_call("auth.test")
    assert caught.value.response["error"] == "not_authed"
    with pytest.raises(SlackApiError) as caught:
        WebClient(token=slack.bot_token, base_url=slack.url).api_call("chat.teleport")
    assert caught.value.response["error"] == "unknown_method"
    assert SlackEmulator.take_unknown_methods() == ["chat.teleport"]  # else the kit fails this test


def test_chat_streaming_builds_one_message(client: WebClient, slack: SlackEmulator) -> None:
    parent = slack.add_message("C0TEST", "explain", user="U0ALICE")
    client.assistant_threads_setStatus(channel_id="C0TEST", thread_ts=parent["ts"], status="is thinking…")
    started = body(
        client.chat_startStream(
            channel="C0TEST",
            thread_ts=parent["ts"],
            markdown_text="Hello",
            recipient_user_id="U0ALICE",
            recipient_team_id=slack.team_id,
        )
    )
    client.chat_appendStream(channel="C0TEST", ts=started["ts"], markdown_text=", world")
    stopped = body(client.chat_stopStream(channel="C0TEST", ts=started["ts"], markdown_text="!"))
    assert stopped["message"]["text"] == "Hello, world!"
    with pytest.raises(SlackApiError) as caught:
        client.chat_appendStream(channel="C0TEST", ts=started["ts"], markdown_text="late")
    assert caught.value.response["error"] == "message_not_in_streaming_state"
    # slack_sdk's buffered helper goes through the same three methods.
    streamer = client.chat_stream(
        channel="C0TEST",
        thread_ts=parent["ts"],
        buffer_size=4,
        recipient_user_id="U0ALICE",
        recipient_team_id=slack.team_id,
    )
    streamer.append(markdown_text="ab")
    streamer.append(markdown_text="cdef")
    streamer.stop()
    assert [m["text"] for m in slack.messages("C0TEST", parent["ts"])] == ["explain", "Hello, world!", "abcdef"]
    assert slack.statuses[("C0TEST", parent["ts"])] == ["is thinking…"]


def test_reactions_users_groups_views_ephemerals_permalinks(client: WebClient, slack: SlackEmulator) -> None:
    slack.add_user("U0ALICE", "alice", is_admin=True)
    slack.add_usergroup("S0PLATFORM", "platform", ["U0ALICE", "U0BOB"])
    slack.add_channel("C0TEST", "mm-test")
    msg = slack.add_message("C0TEST", "hi", user="U0ALICE")
    client.reactions_add(channel="C0TEST", timestamp=msg["ts"], name="eyes")
    with pytest.raises(SlackApiError, match="already_reacted"):
        client.reactions_add(channel="C0TEST", timestamp=msg["ts"], name="eyes")
    assert stored(slack, "C0TEST", msg["ts"])["reactions"] == [{"name": "eyes", "users": ["U0BOT"], "count": 1}]
    client.reactions_remove(channel="C0TEST", timestamp=msg["ts"], name="eyes")
    assert "reactions" not in stored(slack, "C0TEST", msg["ts"])
    with pytest.raises(SlackApiError, match="no_reaction"):
        client.reactions_remove(channel="C0TEST", timestamp=msg["ts"], name="eyes")

    assert body(client.users_info(user="U0ALICE"))["user"]["is_admin"] is True
    with pytest.raises(SlackApiError, match="user_not_found"):
        client.users_info(user="U0NOBODY")
    assert client.usergroups_users_list(usergroup="S0PLATFORM")["users"] == ["U0ALICE", "U0BOB"]
    assert body(client.conversations_info(channel="C0TEST"))["channel"]["name"] == "mm-test"
    with pytest.raises(SlackApiError, match="channel_not_found"):
        client.conversations_info(channel="C0NONE")

    divider = [{"type": "divider"}]
    home = body(client.views_publish(user_id="U0ALICE", view={"type": "home", "blocks": divider}))["view"]
    modal = body(
        client.views_open(
            trigger_id="1.2.abc",
            view={"type": "modal", "title": {"type": "plain_text", "text": "mm"}, "blocks": divider},
        )
    )
    assert home["id"].startswith("V") and home["type"] == "home" and modal["view"]["type"] == "modal"
    assert client.chat_postEphemeral(channel="C0TEST", user="U0ALICE", text="only you")["message_ts"]
    assert slack.ephemerals[0]["to_user"] == "U0ALICE" and slack.messages("C0TEST")[-1]["text"] == "hi"
    link = body(client.chat_getPermalink(channel="C0TEST", message_ts=msg["ts"]))["permalink"]
    assert link.endswith(f"/archives/C0TEST/p{msg['ts'].replace('.', '')}")


# -- signed requests ------------------------------------------------------------------------------------------


class VerifyingEndpoint(ThreadedAiohttpServer):
    """A bot stand-in: checks each request with slack_sdk's SignatureVerifier and records the outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.verifier = SignatureVerifier(SECRET)
        self.received: list[dict[str, Any]] = []

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/slack/events", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        valid = self.verifier.is_valid_request(body, dict(request.headers))
        self.received.append({"valid": valid, "body": body, "headers": dict(request.headers)})
        return web.json_response({"valid": valid}, status=200 if valid else 401)


@pytest.fixture
def endpoint() -> Any:
    with VerifyingEndpoint() as server:
        yield server


def test_signed_requests_verify(endpoint: VerifyingEndpoint, slack_sender: Callable[..., SlackEventSender]) -> None:
    sender = slack_sender(endpoint.base, SECRET)
    mention = sender.app_mention("<@U0BOT> run the tests", channel="C0TEST", user="U0ALICE")
    assert mention.status_code == 200
    sent = json.loads(endpoint.received[-1]["body"])
    assert sent["type"] == "event_callback" and sent["event"]["type"] == "app_mention"
    assert sent["event_id"] == sender.last_payload["event_id"] and sent["authorizations"][0]["user_id"] == "U0BOT"

    retry = sender.message(
        "and lint",
        channel="C0TEST",
        user="U0ALICE",
        thread_ts=sent["event"]["ts"],
        event_id=sent["event_id"],
        retry_num=1,
        retry_reason="http_timeout",
    )
    assert retry.status_code == 200
    headers = endpoint.received[-1]["headers"]
    assert (headers["X-Slack-Retry-Num"], headers["X-Slack-Retry-Reason"]) == ("1", "http_timeout")
    assert json.loads(endpoint.received[-1]["body"])["event"]["thread_ts"] == sent["event"]["ts"]

    assert sender.url_verification("abc").status_code == 200
    click = sender.block_action("approve", "call_1", user="U0ALICE", channel="C0TEST", message_ts="1.000200")
    assert click.status_code == 200
    form = parse_qs(endpoint.received[-1]["body"].decode())
    payload = json.loads(form["payload"][0])
    assert payload["actions"][0]["action_id"] == "approve" and payload["actions"][0]["value"] == "call_1"
    assert payload["response_url"].startswith(f"{sender.new_response_url().rsplit('/', 1)[0]}/")
    assert sender.slash_command("/mm", "status", user="U0ALICE", channel="C0TEST").status_code == 200
    assert parse_qs(endpoint.received[-1]["body"].decode())["command"] == ["/mm"]
    assert all(r["valid"] for r in endpoint.received)


@pytest.mark.parametrize(
    "forgery",
    [
        {"secret": "not-the-secret"},
        {"timestamp": stale_timestamp()},
        {"omit_headers": ("X-Slack-Signature",)},
        {"omit_headers": ("X-Slack-Request-Timestamp",)},
        {"tamper": True},
    ],
    ids=["wrong-secret", "stale", "no-signature", "no-timestamp", "tampered"],
)
def test_forged_requests_do_not_verify(endpoint: VerifyingEndpoint, forgery: dict[str, Any]) -> None:
    with SlackEventSender(endpoint.base, SECRET) as sender:
        response = sender.app_mention("<@U0BOT> hi", channel="C0TEST", user="U0EVE", **forgery)
        form_response = sender.slash_command("/mm", "stop", user="U0EVE", channel="C0TEST", **forgery)
    assert (response.status_code, form_response.status_code) == (401, 401)
    assert [r["valid"] for r in endpoint.received] == [False, False]


def test_bolt_app_accepts_the_payloads_and_talks_to_the_emulator(
    slack: SlackEmulator, slack_sender: Callable[..., SlackEventSender]
) -> None:
    """End to end: a bolt app verifies, parses and dispatches what the sender sends, answering via the emulator."""
    bolt = AsyncApp(signing_secret=SECRET, client=AsyncWebClient(token=slack.bot_token, base_url=slack.url))
    seen: list[str] = []

    @bolt.event("app_mention")
    async def mention(event: dict[str, Any], say: Any) -> None:
        seen.append("mention")
        await say(text="on it", thread_ts=event["ts"])

    @bolt.action("approve")
    async def approve(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        seen.append(f"approve {body['actions'][0]['value']}")
        await respond(text="approved")

    @bolt.command("/mm")
    async def command(ack: Any, command: dict[str, Any]) -> None:
        await ack(text=f"status of {command['channel_id']}")
        seen.append("command")

    class BoltServer(ThreadedAiohttpServer):
        def make_app(self) -> web.Application:
            return bolt.web_app(path="/slack/events")

    with BoltServer() as server:
        sender = slack_sender(server.base, SECRET)
        assert sender.app_mention("<@U0BOT> hi", channel="C0TEST", user="U0ALICE").status_code == 200
        mention_ts = sender.last_payload["event"]["ts"]
        assert (
            sender.block_action(
                "approve", "call_9", user="U0ALICE", channel="C0TEST", message_ts="1.000300"
            ).status_code
            == 200
        )
        answer = sender.slash_command("/mm", "status", user="U0ALICE", channel="C0TEST")
        assert answer.text == "status of C0TEST"  # bolt answers a text-only ack as plain text
        assert sender.app_mention("<@U0BOT> hi", channel="C0TEST", user="U0ALICE", secret="x").status_code == 401
        # bolt runs listeners after acking: wait for their effects on the emulator.
        for _ in range(200):
            if slack.messages("C0TEST", mention_ts) and slack.responses:
                break
            time.sleep(0.02)
    assert sorted(seen) == ["approve call_9", "command", "mention"]
    assert [m["text"] for m in slack.messages("C0TEST", mention_ts)] == ["on it"]
    assert slack.responses[0]["body"]["text"] == "approved"


def test_malformed_bodies_and_unknown_upload_urls_get_clear_answers(slack: SlackEmulator) -> None:
    auth = {"Authorization": f"Bearer {slack.bot_token}", "Content-Type": "application/json"}
    for body in (b"{broken", b"[1, 2]"):
        answer = httpx.post(slack.url + "chat.postMessage", content=body, headers=auth)
        assert (answer.status_code, answer.json()) == (200, {"ok": False, "error": "invalid_json"})
    assert httpx.post(f"{slack.base}/upload/v1/F0NOPE", content=b"x").status_code == 404
    assert len(slack.calls_to("chat.postMessage")) == 2
    slack.reset()
    assert slack.calls == [] and list(slack.users) == ["U0BOT"]


# -- Socket Mode ----------------------------------------------------------------------------------------------


def test_connections_open_takes_only_the_app_level_token(slack: SlackEmulator) -> None:
    client = WebClient(base_url=slack.url)
    url = body(client.apps_connections_open(app_token=slack.app_token))["url"]
    assert re.match(rf"^ws://127\.0\.0\.1:{slack.port}/socket\?ticket=[0-9a-f-]{{36}}&app_id=A0TESTAPP$", url)
    assert slack.calls_to("apps.connections.open")[0].headers["Authorization"] == f"Bearer {slack.app_token}"
    for token, error in ((slack.bot_token, "not_allowed_token_type"), ("xapp-1-A0TESTAPP-1-wrong", "invalid_auth")):
        with pytest.raises(SlackApiError) as caught:
            client.apps_connections_open(app_token=token)
        assert caught.value.response["error"] == error
    # ...and the app-level token calls nothing else.
    with pytest.raises(SlackApiError) as caught:
        WebClient(token=slack.app_token, base_url=slack.url).chat_postMessage(channel="C0TEST", text="hi")
    assert caught.value.response["error"] == "not_allowed_token_type"


def test_the_socket_says_hello_records_acks_and_refuses_tickets_it_did_not_issue(slack: SlackEmulator) -> None:
    import aiohttp

    url = body(WebClient(base_url=slack.url).apps_connections_open(app_token=slack.app_token))["url"]

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], list[int]]:
        refused = []
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url) as ws:
                hello = await ws.receive_json(timeout=10)
                envelope_id = await asyncio.to_thread(
                    slack.push_slash_command, "/mm", "status", user="U0ALICE", channel="C0TEST"
                )
                envelope = await ws.receive_json(timeout=10)
                assert envelope["envelope_id"] == envelope_id
                for junk in ("not json", "[1, 2]", '{"type": "pong"}'):
                    await ws.send_str(junk)
                await ws.send_json({"envelope_id": envelope_id, "payload": {"text": "Running."}})
                await asyncio.to_thread(slack.wait_for_ack, envelope_id)
            # A ticket is good for one connection; a made-up one for none.
            for bad in (url, url.replace("ticket=", "ticket=0")):
                with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                    await session.ws_connect(bad)
                refused.append(caught.value.status)
        return hello, envelope, refused

    hello, envelope, refused = asyncio.run(scenario())
    assert hello == {
        "type": "hello",
        "num_connections": 1,
        "connection_info": {"app_id": "A0TESTAPP"},
        "debug_info": {"host": "applink-emulator", "build_number": 1, "approximate_connection_time": 18060},
    }
    assert envelope["type"] == "slash_commands" and envelope["accepts_response_payload"] is True
    assert envelope["payload"]["command"] == "/mm" and envelope["payload"]["text"] == "status"
    assert envelope["payload"]["response_url"].startswith(slack.base)
    assert slack.acks == [{"envelope_id": envelope["envelope_id"], "payload": {"text": "Running."}}]
    assert refused == [401, 401]


async def _socket_mode_client(slack: SlackEmulator, seen: list[SocketModeRequest]) -> SocketModeClient:
    """slack_sdk's own client against the emulator, acking every request as bolt does."""

    async def on_request(client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        seen.append(request)
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    client = SocketModeClient(app_token=slack.app_token, web_client=AsyncWebClient(base_url=slack.url))
    client.socket_mode_request_listeners.append(on_request)
    await client.connect()
    return client


def test_slack_sdks_socket_mode_client_gets_each_envelope_and_acks_it(slack: SlackEmulator) -> None:
    seen: list[SocketModeRequest] = []

    async def scenario() -> list[dict[str, Any]]:
        client = await _socket_mode_client(slack, seen)
        try:
            pushed = [
                slack.push_app_mention("<@U0BOT> fix the tests", channel="C0TEST", user="U0ALICE"),
                slack.push_block_action("approve", "call_1", user="U0ALICE", channel="C0TEST"),
                slack.push_slash_command("/mm", "help", user="U0ALICE", channel="C0TEST"),
            ]
            return [await asyncio.to_thread(slack.wait_for_ack, envelope_id) for envelope_id in pushed]
        finally:
            await client.close()

    acks = asyncio.run(scenario())
    assert acks == [{"envelope_id": request.envelope_id} for request in seen]
    assert [request.type for request in seen] == ["events_api", "interactive", "slash_commands"]
    mention, click, command = (request.payload for request in seen)
    assert mention["type"] == "event_callback" and mention["api_app_id"] == "A0TESTAPP"
    assert mention["event"]["type"] == "app_mention" and mention["event"]["text"] == "<@U0BOT> fix the tests"
    assert seen[0].retry_attempt == 0 and seen[0].accepts_response_payload is False
    assert click["type"] == "block_actions" and click["actions"][0]["action_id"] == "approve"
    assert command["command"] == "/mm" and seen[2].accepts_response_payload is True
    assert slack.socket_connections == 1


def test_a_disconnect_makes_slack_sdks_client_open_a_new_connection(slack: SlackEmulator) -> None:
    seen: list[SocketModeRequest] = []

    async def scenario() -> dict[str, Any]:
        client = await _socket_mode_client(slack, seen)
        try:
            await asyncio.to_thread(slack.wait_for_socket_connections, 1)
            slack.disconnect()
            await asyncio.to_thread(slack.wait_for_socket_connections, 2)
            # Envelopes go to the new connection, and are acked there.
            envelope_id = slack.push_message("still there?", channel="C0TEST", user="U0ALICE")
            return await asyncio.to_thread(slack.wait_for_ack, envelope_id)
        finally:
            await client.close()

    ack = asyncio.run(scenario())
    assert ack == {"envelope_id": seen[0].envelope_id}
    assert len(slack.calls_to("apps.connections.open")) == 2
    assert seen[0].payload["event"]["text"] == "still there?"
