"""The bot's listeners, imported and called on their own, and the buttons both sides share."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from slack_bolt.async_app import AsyncAck, AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import handlers
from bot.approvals import Click
from chatops.buttons import ACTION_PATTERN, MAX_VALUE, Action, BadButton, ButtonValue, element


def click(action_id: str, value: object) -> tuple[ButtonValue | None, AsyncAck]:
    """A click whose value is refused: acked, and nothing handed on (the context has no click handler)."""
    ack = AsyncAck()
    body = {"user": {"id": "U1"}, "container": {"type": "message", "channel_id": "C1", "message_ts": "1.2"}}
    clicked = asyncio.run(
        handlers.on_button(ack, {"action_id": action_id, "value": value}, body, AsyncBoltContext(), AsyncWebClient())
    )
    return (clicked.value if clicked else None), ack


def test_a_posted_button_comes_back_as_the_same_value():
    posted = element(Action.APPROVE, ButtonValue("0b5e-session", "call_0123456789abcdef0123"))
    assert posted["action_id"] == "approve" and posted["text"]["text"] == "Approve" and posted["style"] == "primary"
    clicked = Click.of(posted, {"user": {"id": "U1"}, "container": {"type": "message", "channel_id": "C1"}})
    assert clicked.value == ButtonValue("0b5e-session", "call_0123456789abcdef0123") and clicked.user == "U1"


def test_stop_names_the_session_only():
    posted = element(Action.STOP, ButtonValue("s1"))
    assert json.loads(posted["value"]) == {"s": "s1"}
    clicked = Click.of(posted, {"user": {"id": "U1"}, "container": {"type": "view"}})
    assert clicked.value == ButtonValue("s1") and clicked.action == Action.STOP and clicked.channel is None


def test_the_listener_pattern_matches_exactly_our_buttons():
    assert {a.value for a in Action} == {"approve", "reject", "approve_all", "stop", "push", "pull_request"}
    for action in Action:
        assert ACTION_PATTERN.match(action.value)
    for other in ("approve_all_now", "xapprove", "Stop", "", "approve\n"):
        assert not ACTION_PATTERN.match(other), other


@pytest.mark.parametrize(
    "value, reason",
    [
        (None, "carries no value"),
        ("", "carries no value"),
        ("call_1", "not JSON"),
        ("x" * (MAX_VALUE + 1), "longer than Slack allows"),
        ('["s1"]', "unexpected fields"),
        ('{"s": "s1", "admin": true}', "unexpected fields"),
        ('{"c": "call_1"}', "does not name a session"),
        ('{"s": 7}', "does not name a session"),
        ('{"s": "s1\\n<!channel>"}', "does not name a session"),
        ('{"s": "s1", "c": ""}', "does not name a session"),
        ('{"s": "s1\\n"}', "does not name a session"),
        ('{"s": "' + "a" * 201 + '"}', "does not name a session"),
    ],
)
def test_a_value_we_never_posted_is_refused_acked_and_logged_without_itself(value, reason, caplog):
    with pytest.raises(BadButton, match=reason):
        ButtonValue.decode(value)
    with caplog.at_level(logging.INFO, logger="mm.bot"):
        result, ack = click("approve", value)
    assert result is None and ack.response is not None
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and reason in refused[0]
    if value:
        assert value not in caplog.text


@pytest.mark.parametrize(
    "event",
    [
        {"bot_id": "B1", "user": "U2", "text": "beep"},
        {"subtype": "bot_message", "bot_id": "B1", "text": "beep"},
        {"subtype": "message_changed", "message": {"user": "U1", "text": "edited"}},
        {"subtype": "message_deleted", "deleted_ts": "1.000100"},
        {"subtype": "channel_join", "user": "U1", "text": "joined"},
    ],
    ids=["other-bot", "bot-message", "edit", "deletion", "join"],
)
def test_what_no_person_wrote_is_acked_and_never_reaches_the_database(event: dict) -> None:
    # No engine in the context: a listener that looked for the database would fail here.
    event = {"channel": "D1", "channel_type": "im", "ts": "1.000200", "thread_ts": "1.000100"} | event
    for listener in (handlers.on_mention, handlers.on_message, handlers.on_assistant_message):
        ack = AsyncAck()
        asyncio.run(listener(ack, event, AsyncBoltContext(), AsyncWebClient()))
        assert ack.response is not None and ack.response.status == 200, listener.__name__


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("<@U0BOT> fix the tests", "fix the tests"),
        ("  <@U0BOT|mm>: fix the tests", "fix the tests"),
        ("<@U0BOT>, <@U0BOT> twice", "<@U0BOT> twice"),
        ("ask <@U0BOT> later", "ask <@U0BOT> later"),
        ("<@U0OTHER> fix the tests", "<@U0OTHER> fix the tests"),
        ("<@U0BOT>", ""),
    ],
)
def test_only_the_leading_mention_of_the_bot_is_taken_off(text: str, said: str) -> None:
    assert handlers.without_mention(text, "U0BOT") == said
    assert handlers.without_mention(text, None) == text
