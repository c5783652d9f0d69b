"""The Slack emulator refuses what Slack refuses, with Slack's error names: so a regression in what the bot sends
cannot pass the tests. Each case is one of Slack's documented limits (or one of its required arguments)."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from playground.slack_api import SlackEmulator

CHANNEL = "C0TEST"  # the `slack` fixture's


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def button(text: str = "Go", value: str = "v", action_id: str = "go") -> dict[str, Any]:
    return {"type": "button", "text": {"type": "plain_text", "text": text}, "value": value, "action_id": action_id}


def header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": text}}


@pytest.fixture
def client(slack: SlackEmulator) -> WebClient:
    slack.add_user("U0ALICE", "alice")
    return WebClient(token=slack.bot_token, base_url=slack.url)


def refusal(call: Any, **params: Any) -> dict[str, Any]:
    with pytest.raises(SlackApiError) as caught:
        call(**params)
    data = caught.value.response.data
    assert isinstance(data, dict)
    return data


# Each: blocks Slack refuses, and a word of the `[ERROR]` line it answers.
REFUSED_BLOCKS = {
    "51 blocks": ([section("x")] * 51, "no more than 50 items"),
    "a section's text over 3,000": ([section("x" * 3001)], "3000"),
    "a header's text over 150": ([header("x" * 151)], "150"),
    "a button's text over 75": ([{"type": "actions", "elements": [button(text="x" * 76)]}], "75"),
    "a button's value over 2,000": ([{"type": "actions", "elements": [button(value="v" * 2001)]}], "2000"),
    "an action_id over 255": ([{"type": "actions", "elements": [button(action_id="a" * 256)]}], "255"),
    "a block_id over 255": ([section("x") | {"block_id": "b" * 256}], "255"),
    "26 elements in an actions block": (
        [{"type": "actions", "elements": [button(action_id=f"a{i}") for i in range(26)]}],
        "25",
    ),
    "11 elements in a context block": ([{"type": "context", "elements": [{"type": "mrkdwn", "text": "x"}] * 11}], "10"),
    "an unknown block type": ([{"type": "hologram", "text": "x"}], "unsupported type"),
    "a section with neither text nor fields": ([{"type": "section"}], "text or fields"),
    "a block that is not an object": (["section"], "must be an object"),
}


@pytest.mark.parametrize("case", REFUSED_BLOCKS)
def test_blocks_slack_refuses_are_invalid_blocks_in_every_method_that_takes_them(
    client: WebClient, slack: SlackEmulator, case: str
) -> None:
    blocks, said = REFUSED_BLOCKS[case]
    posted = str(client.chat_postMessage(channel=CHANNEL, text="ok")["ts"])
    started = client.chat_startStream(
        channel=CHANNEL, thread_ts=posted, recipient_user_id="U0ALICE", recipient_team_id=slack.team_id
    )["ts"]
    calls = {
        "chat.postMessage": (client.chat_postMessage, {"channel": CHANNEL, "text": "x", "blocks": blocks}),
        "chat.update": (client.chat_update, {"channel": CHANNEL, "ts": posted, "text": "x", "blocks": blocks}),
        "chat.postEphemeral": (
            client.chat_postEphemeral,
            {"channel": CHANNEL, "user": "U0ALICE", "text": "x", "blocks": blocks},
        ),
        "chat.stopStream": (client.chat_stopStream, {"channel": CHANNEL, "ts": started, "blocks": blocks}),
    }
    for method, (call, params) in calls.items():
        answer = refusal(call, **params)
        error = "msg_blocks_too_many" if method == "chat.stopStream" and case == "51 blocks" else "invalid_blocks"
        assert answer["error"] == error, (method, answer)
        if error == "invalid_blocks":
            assert any(said in line for line in answer["response_metadata"]["messages"]), (method, answer)
    # Nothing refused was kept.
    assert [m["text"] for m in slack.messages(CHANNEL)] == ["ok"] and not slack.ephemerals


def test_blocks_at_slacks_limits_are_taken(client: WebClient, slack: SlackEmulator) -> None:
    blocks = [
        header("x" * 150),
        section("x" * 3000),
        {"type": "actions", "elements": [button(text="x" * 75, value="v" * 2000, action_id="a" * 255)]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "x"}] * 10},
        {"type": "rich_text", "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": "x"}]}]},
        {"type": "markdown", "text": "**x**"},
    ]
    blocks += [{"type": "divider"}] * (50 - len(blocks))
    assert client.chat_postMessage(channel=CHANNEL, text="x", blocks=blocks)["ok"]


def test_text_over_slacks_limits_is_msg_too_long(client: WebClient) -> None:
    assert refusal(client.chat_postMessage, channel=CHANNEL, text="x" * 40_001)["error"] == "msg_too_long"
    assert client.chat_postMessage(channel=CHANNEL, text="x" * 40_000)["ok"]
    ts = client.chat_postMessage(channel=CHANNEL, text="x")["ts"]
    assert refusal(client.chat_update, channel=CHANNEL, ts=ts, text="x" * 4001)["error"] == "msg_too_long"


def test_posting_where_no_channel_is_is_channel_not_found(client: WebClient, slack: SlackEmulator) -> None:
    assert refusal(client.chat_postMessage, channel="C0NOWHERE", text="x")["error"] == "channel_not_found"
    assert refusal(client.chat_postEphemeral, channel="C0NOWHERE", user="U0ALICE", text="x")["error"] == (
        "channel_not_found"
    )
    assert refusal(client.chat_startStream, channel="D0NOWHERE", thread_ts="1.000001")["error"] == ("channel_not_found")
    assert "C0NOWHERE" not in slack.channels
    # A person's message, or event, comes from a channel that is there.
    slack.add_message("C0SEEDED", "hi", user="U0ALICE")
    assert client.chat_postMessage(channel="C0SEEDED", text="x")["ok"]


def test_a_stream_in_a_channel_names_its_recipient(client: WebClient, slack: SlackEmulator) -> None:
    ts = client.chat_postMessage(channel=CHANNEL, text="x")["ts"]
    answer = refusal(client.chat_startStream, channel=CHANNEL, thread_ts=ts, recipient_team_id=slack.team_id)
    assert answer["error"] == "missing_recipient_user_id"
    answer = refusal(client.chat_startStream, channel=CHANNEL, thread_ts=ts, recipient_user_id="U0ALICE")
    assert answer["error"] == "missing_recipient_team_id"
    slack.add_channel("D0ALICE", "alice")  # a DM streams to its one person: no recipient to name
    dm = str(client.chat_postMessage(channel="D0ALICE", text="x")["ts"])
    assert client.chat_startStream(channel="D0ALICE", thread_ts=dm)["ok"]


HOME_BLOCK = [section("hello")]
REFUSED_VIEWS = {
    "101 blocks in a Home tab": ({"type": "home", "blocks": [{"type": "divider"}] * 101}, "no more than 100"),
    "a header's text over 150": ({"type": "home", "blocks": [header("x" * 151)]}, "150"),
    "an unknown block type": ({"type": "home", "blocks": [{"type": "hologram"}]}, "unsupported type"),
    "a view of no type": ({"blocks": HOME_BLOCK}, "home or modal"),
    "a modal's title over 24": (
        {"type": "modal", "title": {"type": "plain_text", "text": "x" * 25}, "blocks": HOME_BLOCK},
        "24",
    ),
}


@pytest.mark.parametrize("case", REFUSED_VIEWS)
def test_views_slack_refuses_are_invalid_arguments(client: WebClient, slack: SlackEmulator, case: str) -> None:
    view, said = REFUSED_VIEWS[case]
    home = client.views_publish(user_id="U0ALICE", view={"type": "home", "blocks": HOME_BLOCK}).data
    assert isinstance(home, dict)
    calls = [
        (client.views_publish, {"user_id": "U0ALICE", "view": view}),
        (client.views_open, {"trigger_id": "1.2.abc", "view": view}),
        (client.views_update, {"view_id": home["view"]["id"], "view": view}),
    ]
    for call, params in calls:
        answer = refusal(call, **params)
        assert answer["error"] == "invalid_arguments", answer
        assert any(said in line for line in answer["response_metadata"]["messages"]), answer
    assert [v["blocks"] for v in slack.views] == [HOME_BLOCK]


def test_suggested_prompts_are_one_to_four_each_with_a_title_and_a_message(
    client: WebClient, slack: SlackEmulator
) -> None:
    prompt = {"title": "Run the tests", "message": "Run the test suite."}
    where = {"channel_id": "D0ALICE", "thread_ts": "1.000001"}
    assert client.assistant_threads_setSuggestedPrompts(**where, prompts=[prompt] * 4, title="Try")["ok"]
    assert slack.suggested_prompts[("D0ALICE", "1.000001")] == [prompt] * 4
    for prompts in ([], [prompt] * 5, [{"title": "no message"}], [{"message": "no title"}], ["a prompt"]):
        answer = refusal(client.assistant_threads_setSuggestedPrompts, **where, prompts=prompts)
        assert answer["error"] == "invalid_arguments", prompts
    answer = refusal(client.api_call, api_method="assistant.threads.setSuggestedPrompts", json={"prompts": [prompt]})
    assert answer["response_metadata"]["messages"] == [
        "[ERROR] missing required field: channel_id",
        "[ERROR] missing required field: thread_ts",
    ]


def test_an_unknown_method_is_remembered_for_the_kit_to_fail_the_test(client: WebClient) -> None:
    assert (
        refusal(client.api_call, api_method="files.upload")["error"] == "unknown_method"
    )  # retired: slack_sdk's v2 instead
    assert refusal(client.api_call, api_method="chat.teleport")["error"] == "unknown_method"
    assert SlackEmulator.take_unknown_methods() == ["files.upload", "chat.teleport"]
    assert SlackEmulator.take_unknown_methods() == []


def test_a_dm_is_opened_once_for_a_person_it_knows_and_takes_an_upload(client: WebClient, slack: SlackEmulator) -> None:
    opened: Any = client.conversations_open(users="U0ALICE").data
    dm = opened["channel"]["id"]
    assert dm.startswith("D") and "already_open" not in opened
    again: Any = client.conversations_open(users="U0ALICE", return_im=True).data
    assert again["channel"]["id"] == dm and again["already_open"] and again["channel"]["user"] == "U0ALICE"
    resumed: Any = client.conversations_open(channel=dm).data
    assert resumed["channel"]["id"] == dm
    client.files_upload_v2(channel=dm, content="a,b\n1,2\n", filename="audit.csv", title="audit")
    [message] = slack.messages(dm)
    [file] = message["files"]
    assert file["name"] == "audit.csv" and slack.uploads[file["id"]] == b"a,b\n1,2\n"


def test_a_dm_is_refused_as_slack_refuses_it(client: WebClient, slack: SlackEmulator) -> None:
    slack.add_user("U0GONE", "gone")
    slack.users["U0GONE"]["deleted"] = True
    assert refusal(client.conversations_open, users="U0NOBODY")["error"] == "user_not_found"
    assert refusal(client.conversations_open, users="U0GONE")["error"] == "user_disabled"
    assert refusal(client.api_call, api_method="conversations.open")["error"] == "users_list_not_supplied"
    assert refusal(client.conversations_open, users=",".join(["U0ALICE"] * 9))["error"] == "too_many_users"
    assert refusal(client.conversations_open, channel="D0NOWHERE")["error"] == "channel_not_found"
    assert refusal(client.conversations_open, channel=CHANNEL)["error"] == "method_not_supported_for_channel_type"
    assert not [c for c in slack.channels if c.startswith("D")]  # nothing was opened
