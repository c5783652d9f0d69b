"""The bot's listeners: small named functions that record a message, ack, and hand the work off.

Each is registered by kind in bot.app.register and can be imported and called on its own. The app runs them
before it answers Slack (`process_before_response`), because the ack is a promise: Slack never redelivers an
acked event, so a message is in the database (chatops.inbox) before its ack leaves. Everything after the
record (the enqueue, the "queued" line) runs after the ack, in a task of its own: nothing here waits on a
broker, a model or a tool, because Slack wants its ack within 3 seconds.

The database is synchronous (SQLAlchemy), so its calls run in threads, off the event loop that serves every
other request. Duplicates need no bookkeeping of their own: the inbox keeps one row per message of a thread,
so a retried HTTP delivery, a Socket Mode envelope sent twice and the `message` twin of an `app_mention` all
find the row there (`Recorded.new` is False) and start nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncBoltContext, AsyncSay, AsyncSetSuggestedPrompts
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Engine

from chatops.buttons import Action, BadButton, ButtonValue
from chatops.inbox import Recorded, record_message, session_of
from chatops.store import record_slack_event
from workers.tasks import enqueue_session

log = logging.getLogger("mm.bot")
SLASH_COMMAND = "/mm"
# Where register() puts the process's engine in bolt's context, for the listeners.
ENGINE = "engine"

QUEUED = "⏳ Queued: I'll take this after the current turn."
HELLO = "Hi! Ask me about the repository, or to change it: I work in a checkout of it and answer here."
SUGGESTED_PROMPTS = [
    {"title": "Explain the layout", "message": "Give me a tour of the repository: its parts and how they fit."},
    {"title": "Run the tests", "message": "Run the test suite and tell me what fails, and why."},
    {"title": "Find a bug", "message": "Read the code that changed most recently and look for bugs."},
]
# Message subtypes that are a person writing: everything else (edits, deletions, joins, bots) starts nothing.
PERSON_SUBTYPES = (None, "file_share", "thread_broadcast")

# Publishing to the broker blocks (kombu), and a broker that hangs holds its thread for the connect timeout:
# those threads are kept apart from the default executor that runs the database calls, so a broken broker
# can never delay the record, and so the ack, of the next message.
_enqueuer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mm-enqueue")
# The after-ack tasks, referenced until they end (the event loop keeps only weak references).
_after_ack: set[asyncio.Task[None]] = set()


async def on_mention(ack: AsyncAck, event: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient) -> None:
    """`@mm …` in a channel: starts the session of the message's thread (the message itself is the root of a
    new one), or continues it."""
    if not _from_person(event):
        await ack()
        return
    await _take(ack, context, client, event, thread_ts=event.get("thread_ts") or event["ts"])


async def on_message(ack: AsyncAck, event: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient) -> None:
    """A direct message starts or continues its thread's session; a channel message continues the session
    of its thread, and only a thread that has one (a session starts with a mention)."""
    if not _from_person(event):
        await ack()
        return
    if event.get("channel_type") == "im":
        await _take(ack, context, client, event, thread_ts=event.get("thread_ts") or event["ts"])
    elif await _in_followed_thread(context, event):
        await _take(ack, context, client, event, thread_ts=event["thread_ts"])
    else:
        await ack()


async def on_assistant_thread_started(
    ack: AsyncAck,
    body: dict[str, Any],
    context: AsyncBoltContext,
    say: AsyncSay,
    set_suggested_prompts: AsyncSetSuggestedPrompts,
) -> None:
    """Slack's assistant pane opened a thread: a greeting and prompts to start from; the session starts with
    the first message. A redelivered event (same event id) greets once."""
    event_id = body.get("event_id")
    first = await asyncio.to_thread(record_slack_event, _engine(context), event_id) if event_id else True
    await ack()
    if first:
        _after(_greet(say, set_suggested_prompts))


async def on_assistant_message(
    ack: AsyncAck, event: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient
) -> None:
    """A message in an assistant thread (bolt sends every threaded direct message here): the thread's
    session, marked as an assistant thread so that the worker shows its status through the assistant API."""
    if not _from_person(event):
        await ack()
        return
    await _take(ack, context, client, event, thread_ts=event["thread_ts"], assistant_thread=True)


async def on_button(ack: AsyncAck, action: dict[str, Any], body: dict[str, Any]) -> ButtonValue | None:
    """A click on one of our buttons; the decoded value, or None for a value we never posted."""
    await ack()
    user = (body.get("user") or {}).get("id")
    try:
        value = ButtonValue.decode(action.get("value"))
    except BadButton as exc:
        # Only a forger or a bug sends this; the value itself is not logged (it is the sender's text).
        log.warning("button %s from %s refused: %s", action.get("action_id"), user, exc)
        return None
    log.info("button %s from %s on %s (not handled yet)", Action(action["action_id"]), user, value)
    return value


async def on_command(ack: AsyncAck, command: dict[str, Any]) -> None:
    await ack()
    log.info("%s from %s (not handled yet)", SLASH_COMMAND, command.get("user_id"))


# --- the steps ----------------------------------------------------------------------------------------------


def _from_person(event: dict[str, Any]) -> bool:
    """Written by a person (bolt already drops the bot's own events): not another bot, not an edit or a
    deletion, not a join."""
    return (
        bool(event.get("user"))
        and not event.get("bot_id")
        and event.get("subtype") in PERSON_SUBTYPES
        and bool(event.get("ts"))
        and bool(event.get("channel"))
    )


async def _in_followed_thread(context: AsyncBoltContext, event: dict[str, Any]) -> bool:
    thread_ts = event.get("thread_ts")
    if not thread_ts or thread_ts == event["ts"]:
        # Top level: one that mentions the bot is taken by on_mention (its app_mention twin), the rest is talk.
        return False
    return await asyncio.to_thread(session_of, _engine(context), event["channel"], thread_ts) is not None


def _engine(context: AsyncBoltContext) -> Engine:
    return context[ENGINE]


def without_mention(text: str, bot_user_id: str | None) -> str:
    """The text without the leading `<@BOT>` that addressed it (the model needs the request, not the
    address); the same for the app_mention and its message twin, whichever is recorded first."""
    if not bot_user_id:
        return text
    return re.sub(rf"^\s*<@{re.escape(bot_user_id)}(?:\|[^>]*)?>[\s,:]*", "", text, count=1)


async def _take(
    ack: AsyncAck,
    context: AsyncBoltContext,
    client: AsyncWebClient,
    event: dict[str, Any],
    *,
    thread_ts: str,
    assistant_thread: bool = False,
) -> None:
    """Record, ack, and then (after the ack) enqueue and say "queued" when a turn is running. An error while
    recording propagates: bolt answers 500 (or, over the socket, no ack), and Slack delivers it again."""
    channel = event["channel"]
    recorded = await asyncio.to_thread(
        record_message,
        _engine(context),
        channel_id=channel,
        thread_ts=thread_ts,
        message_ts=event["ts"],
        user_id=event.get("user"),
        text=without_mention(event.get("text") or "", context.bot_user_id),
        team_id=context.team_id or event.get("team"),
        assistant_thread=assistant_thread,
    )
    await ack()
    if recorded.new:
        _after(_hand_off(recorded, client, channel, thread_ts))
    else:
        log.debug("message %s in %s already recorded (a redelivery, or a mention's twin)", event["ts"], channel)


def _after(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` once the listener has returned, and so once bolt has answered Slack."""
    task = asyncio.get_running_loop().create_task(work)
    _after_ack.add(task)
    task.add_done_callback(_after_ack.discard)


async def _hand_off(recorded: Recorded, client: AsyncWebClient, channel: str, thread_ts: str) -> None:
    try:
        await asyncio.get_running_loop().run_in_executor(_enqueuer, enqueue_session, recorded.session_id)
    except Exception as exc:  # noqa: BLE001 - the message is recorded: housekeeping enqueues it later
        log.warning("could not enqueue session %s (%s); housekeeping will", recorded.session_id, exc)
    if recorded.busy:
        # The one Web API call of the inbound side: without it a message sent during a long turn would look
        # ignored until the turn ends.
        try:
            await client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=QUEUED)
        except Exception as exc:  # noqa: BLE001 - a courtesy: the message waits in the inbox all the same
            log.warning("could not tell %s/%s that its message is queued: %s", channel, thread_ts, exc)


async def _greet(say: AsyncSay, set_suggested_prompts: AsyncSetSuggestedPrompts) -> None:
    # Two calls, each on its own: prompts Slack refuses must not cost the greeting.
    try:
        await set_suggested_prompts(prompts=SUGGESTED_PROMPTS, title="Try one of these")
    except Exception as exc:  # noqa: BLE001 - a courtesy
        log.warning("could not set the assistant thread's suggested prompts: %s", exc)
    try:
        await say(HELLO)
    except Exception as exc:  # noqa: BLE001 - a courtesy
        log.warning("could not greet the assistant thread: %s", exc)
