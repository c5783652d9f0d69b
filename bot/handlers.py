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

from slack_bolt.async_app import AsyncAck, AsyncBoltContext, AsyncRespond, AsyncSay, AsyncSetSuggestedPrompts
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Engine

from bot.approvals import Click
from bot.commands import Command, Outcome, Where, parse
from chatops.buttons import BadButton
from chatops.inbox import Recorded, record_message, session_of
from chatops.store import record_slack_event
from workers.tasks import enqueue_job_run, enqueue_push, enqueue_session

log = logging.getLogger("mm.bot")
SLASH_COMMAND = "/mm"
# Where register() puts the process's engine, click handler and App Home in bolt's context, for the listeners.
ENGINE = "engine"
CLICKS = "clicks"
HOME = "home"
COMMANDS = "commands"

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
    await _take(ack, context, client, event, thread_ts=event.get("thread_ts") or event["ts"], addressed=True)


async def on_message(ack: AsyncAck, event: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient) -> None:
    """A direct message starts or continues its thread's session; a channel message continues the session
    of its thread, and only a thread that has one (a session starts with a mention)."""
    if not _from_person(event):
        await ack()
        return
    if event.get("channel_type") == "im":
        await _take(ack, context, client, event, thread_ts=event.get("thread_ts") or event["ts"], addressed=True)
    elif await _in_followed_thread(context, event):
        # The twin of a mention (`@mm stop` in a thread) is addressed too, whichever of the two comes first.
        addressed = _mentions_first(event.get("text") or "", context.bot_user_id)
        await _take(ack, context, client, event, thread_ts=event["thread_ts"], addressed=addressed)
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
    await _take(ack, context, client, event, thread_ts=event["thread_ts"], assistant_thread=True, addressed=True)


async def on_button(
    ack: AsyncAck, action: dict[str, Any], body: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient
) -> Click | None:
    """A click on one of our buttons: acked, then carried out (bot.approvals); the click as read, or None for
    a value we never posted."""
    await ack()
    try:
        click = Click.of(action, body)
    except BadButton as exc:
        # Only a forger or a bug sends this; the value itself is not logged (it is the sender's text).
        log.warning("button %s from %s refused: %s", action.get("action_id"), (body.get("user") or {}).get("id"), exc)
        return None
    _after(_carry_out(context, client, click))
    return click


async def _carry_out(context: AsyncBoltContext, client: AsyncWebClient, click: Click) -> None:
    try:
        refusal = await context[CLICKS].handle(client, click)
    except Exception:  # after the ack there is nobody to answer but the clicker
        log.exception("the click %s of %s failed", click.action, click.user)
        refusal = "Something went wrong on my side, so nothing was changed; the error is in my log."
    if click.channel is None:  # App Home: the page shows the outcome (or the refusal) once published again
        await context[HOME].publish(client, click.user, notice=refusal)
    if refusal is None:
        return
    log.info("click %s of %s on %s refused: %s", click.action, click.user, click.value.session_id, refusal)
    await tell(client, click.user, click.channel, click.thread_ts, refusal)


async def tell(client: AsyncWebClient, user: str, channel: str | None, thread_ts: str | None, text: str) -> None:
    """An ephemeral sentence for one person, in the thread it is about."""
    if channel is None:
        return
    try:
        await client.chat_postEphemeral(channel=channel, user=user, text=text, thread_ts=thread_ts)
    except Exception as e:  # noqa: BLE001 - a courtesy: nothing was changed either way
        log.warning("could not tell %s in %s: %s", user, channel, e)


async def enqueue(session_id: str) -> None:
    """Hand a session to the workers, on the threads kept for the broker."""
    await asyncio.get_running_loop().run_in_executor(_enqueuer, enqueue_session, session_id)


async def enqueue_thread_push(session_id: str, branch: str | None, user: str) -> None:
    """Hand a thread's push to the workers (its workspace is on a worker's disk)."""
    await asyncio.get_running_loop().run_in_executor(_enqueuer, enqueue_push, session_id, branch, user)


async def enqueue_run(run_id: int) -> None:
    """Hand a job run asked for in Slack to the workers."""
    await asyncio.get_running_loop().run_in_executor(_enqueuer, enqueue_job_run, run_id)


async def on_command(
    ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient, respond: AsyncRespond
) -> None:
    """`/mm …`: acked at once; the answer comes through the command's response URL, for the person alone."""
    await ack()
    _after(_slash(context, client, command, respond))


async def on_home_opened(
    ack: AsyncAck, event: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient
) -> None:
    await ack()
    if event.get("tab") == "home" and event.get("user"):
        _after(context[HOME].publish(client, event["user"]))


async def _slash(
    context: AsyncBoltContext, client: AsyncWebClient, command: dict[str, Any], respond: AsyncRespond
) -> None:
    try:
        outcome = await context[COMMANDS].slash(
            client,
            command.get("text") or "",
            command.get("channel_id") or "",
            command.get("user_id") or "",
            command.get("team_id"),
            command.get("trigger_id") or "",
        )
    except Exception:
        log.exception("%s from %s failed", SLASH_COMMAND, command.get("user_id"))
        outcome = Outcome(private="Something went wrong on my side; the error is in my log.")
    await _answer(client, outcome, command.get("channel_id") or "", None, command.get("user_id") or "", respond)


async def _command(context: AsyncBoltContext, client: AsyncWebClient, command: Command, where: Where) -> None:
    try:
        outcome = await context[COMMANDS].run(client, command, where)
    except Exception:
        log.exception("the command %s of %s failed", command.name, where.user)
        outcome = Outcome(private="Something went wrong on my side; the error is in my log.")
    await _answer(client, outcome, where.channel, where.thread_ts, where.user)


async def _answer(
    client: AsyncWebClient,
    outcome: Outcome,
    channel: str,
    thread_ts: str | None,
    user: str,
    respond: AsyncRespond | None = None,
) -> None:
    if outcome.enqueue:
        try:
            await enqueue(outcome.enqueue)
        except Exception as exc:  # noqa: BLE001 - recorded: housekeeping enqueues it later
            log.warning("could not enqueue session %s (%s); housekeeping will", outcome.enqueue, exc)
    if outcome.private:
        if respond is not None:
            try:
                await respond(text=outcome.private, response_type="ephemeral")
            except Exception as exc:  # noqa: BLE001 - a courtesy
                log.warning("could not answer %s: %s", SLASH_COMMAND, exc)
        else:
            await tell(client, user, channel, thread_ts, outcome.private)
    if outcome.public:
        try:
            await client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=outcome.public)
        except Exception as exc:  # noqa: BLE001 - the command took effect; its announcement is a courtesy
            log.warning("could not announce a command in %s/%s: %s", channel, thread_ts, exc)


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


def _mentions_first(text: str, bot_user_id: str | None) -> bool:
    return bool(bot_user_id) and without_mention(text, bot_user_id) != text


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
    addressed: bool = False,
) -> None:
    """Record, ack, and then (after the ack) enqueue and say "queued" when a turn is running. An error while
    recording propagates: bolt answers 500 (or, over the socket, no ack), and Slack delivers it again. A
    message addressed to the bot that is exactly a command is carried out instead, after the ack."""
    channel = event["channel"]
    text = without_mention(event.get("text") or "", context.bot_user_id)
    command = parse(text) if addressed else None
    if command is not None:
        # A mention arrives twice (app_mention and its message twin): the command runs for the first only.
        first = await asyncio.to_thread(record_slack_event, _engine(context), f"command:{channel}:{event['ts']}")
        await ack()
        if not first:
            return
        where = Where(
            channel,
            thread_ts,
            event["ts"],
            event.get("user") or "",
            context.team_id or event.get("team"),
            assistant_thread,
        )
        _after(_command(context, client, command, where))
        return
    recorded = await asyncio.to_thread(
        record_message,
        _engine(context),
        channel_id=channel,
        thread_ts=thread_ts,
        message_ts=event["ts"],
        user_id=event.get("user"),
        text=text,
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
