"""The bot's listeners: small named functions that record what arrived, ack, and hand the work off.

Each is registered by kind in bot.app.register and can be imported and called on its own. The app runs them
before it answers Slack (`process_before_response`), because the ack is a promise: Slack never redelivers an
acked event, slash command or click, so what it asks is in the database before its ack leaves. A message goes
to the inbox (chatops.inbox); a slash command, a thread command or a click is a request (chatops.requests),
carried out after the ack from its record (bot.requests), and again by a bot's replay if this one dies first.
Everything after the record (the enqueue, the "queued" line, the request's work) runs after the ack, in a
task of its own: nothing here waits on a broker, a model, a tool or the Web API, because Slack wants its ack
within 3 seconds and a Web API that fails must not fail the ack.

A message is recorded on the event loop itself (bot.inbox_writer: an async engine, the messages that wait
together kept in one transaction). The rest of the database work is synchronous (SQLAlchemy), so its calls run
in threads, off the event loop that serves every other request: those before the ack on threads of their own.
Both are bounded in time (bot.before_ack), so that a slow or silent database gets an answer to Slack within its
3 seconds either way — a slash command then says in one sentence that nothing was done, an event or a click is
not acked.

Duplicates need no bookkeeping of their own: the inbox keeps one row per message of a thread,
so a retried HTTP delivery, a Socket Mode envelope sent twice and the `message` twin of an `app_mention` all
find the row there (`Recorded.new` is False) and start nothing; a request's key does the same for requests.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import re
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncBoltContext
from slack_bolt.context.assistant.thread_context import AssistantThreadContext
from slack_bolt.context.assistant.thread_context_store.async_store import AsyncAssistantThreadContextStore
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Engine

from bot.approvals import Click
from bot.before_ack import Unsure, bounded, silent
from bot.commands import SLASH_COMMAND, Where, parse
from bot.hand_off import HandOff
from bot.inbox_writer import InboxWriter
from bot.oauth import workspace_of
from bot.requests import Requests, in_background
from bot.shapes import MAX_TEXT, kept, shared_files
from chatops.buttons import BadButton
from chatops.inbox import Recorded, assistant_context, keep_assistant_context, message_values
from chatops.requests import request_key
from chatops.schema import RequestKind
from chatops.store import record_slack_event
from chatops.teams import Team
from slackio.mrkdwn import Mrkdwn
from slackio.slack_out import SlackOut, outgoing
from workers.tasks import enqueue_job_run, enqueue_pull_request_status, enqueue_push

log = logging.getLogger("mm.bot")
# Where register() puts the process's engine, App Home and requests in bolt's context, for the listeners.
ENGINE = "engine"
INBOX = "inbox"
HOME = "home"
REQUESTS = "requests"
SECRETS = "secrets"
HAND_OFF = "hand_off"
# The process's `async (Team) -> Uninstalled`: a workspace's tokens forgotten, its turns stopped, its jobs paused.
UNINSTALL = "uninstall"
# Set in a request's context once what it asks is recorded: an error after that is answered 200 (bot.app),
# since the record is carried out all the same, and a retry would only find it recorded.
RECORDED = "recorded"

QUEUED = "⏳ Queued: I'll take this after the current turn."
HELLO = "Hi! Ask me about the repository, or to change it: I work in a checkout of it and answer here."
SUGGESTED_PROMPTS = [
    {"title": "Explain the layout", "message": "Give me a tour of the repository: its parts and how they fit."},
    {"title": "Run the tests", "message": "Run the test suite and tell me what fails, and why."},
    {"title": "Find a bug", "message": "Read the code that changed most recently and look for bugs."},
]
# A slash command answered in the ack itself, when it was not taken (nothing was recorded, nothing will be done).
NOT_TAKEN = Mrkdwn("I could not take `{what}`: my database {why}; nothing was done, try again.")
TOO_LONG = Mrkdwn(
    "I could not take `{what}…`: it is {length:,} characters long and I take at most {most:,}; nothing was done."
)
# Message subtypes that are a person writing: everything else (edits, deletions, joins, bots) starts nothing.
PERSON_SUBTYPES = (None, "file_share", "thread_broadcast")


class _InContext(ThreadPoolExecutor):
    """Runs each call in a copy of its caller's context (run_in_executor does not carry it): the hand-off is then
    in the trace of the Slack request it answers (slackio.traces), as an asyncio task would be."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


# Publishing to the broker blocks (kombu), and a broker that hangs holds its thread for the connect timeout:
# those threads are kept apart from the default executor that runs the database calls, so a broken broker
# can never delay the record, and so the ack, of the next message.
_enqueuer = _InContext(max_workers=4, thread_name_prefix="mm-enqueue")


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
    ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient
) -> None:
    """Slack's assistant pane opened a thread: a greeting and prompts to start from; the session starts with
    the first message. A redelivered event (same event id) greets once."""
    await _keep_context(context, body, changed=False)
    event_id = body.get("event_id")
    first = await bounded(record_slack_event, _engine(context), event_id) if event_id else True
    await ack()
    thread = (body.get("event") or {}).get("assistant_thread") or {}
    channel, thread_ts = thread.get("channel_id"), thread.get("thread_ts")
    if first and isinstance(channel, str) and isinstance(thread_ts, str):
        in_background(_greet(slack_out(context, client), channel, thread_ts))


async def on_assistant_context_changed(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
    """The person looks at another channel beside an assistant thread: kept (ThreadContexts), nothing asked of
    Slack (bolt's default keeps it in the thread's first reply, through the Web API, before the ack)."""
    await _keep_context(context, body)
    await ack()


async def _keep_context(context: AsyncBoltContext, body: dict[str, Any], changed: bool = True) -> None:
    thread = (body.get("event") or {}).get("assistant_thread")
    if not isinstance(thread, dict):
        return
    channel, thread_ts, seen = thread.get("channel_id"), thread.get("thread_ts"), thread.get("context")
    if isinstance(channel, str) and isinstance(thread_ts, str) and isinstance(seen, dict):
        keep = functools.partial(keep_assistant_context, changed=changed)
        await bounded(keep, _engine(context), channel, thread_ts, seen)


class ThreadContexts(AsyncAssistantThreadContextStore):
    """Bolt's store of assistant threads' contexts, in the database: it never calls the Web API (bolt's default
    reads and edits the thread's first reply, before the ack, and fails with it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def save(self, *, channel_id: str, thread_ts: str, context: dict[str, str]) -> None:
        await bounded(keep_assistant_context, self.engine, channel_id, thread_ts, context)

    async def find(self, *, channel_id: str, thread_ts: str) -> AssistantThreadContext | None:
        found = await bounded(assistant_context, self.engine, channel_id, thread_ts)
        return AssistantThreadContext(found) if found else None


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
    """A click on one of our buttons: recorded, acked, then carried out from the record (bot.approvals); the
    click as read, or None for a value we never posted (acked, and nothing recorded)."""
    try:
        click = Click.of(action, body)
    except BadButton as exc:
        await ack()
        # Only a forger or a bug sends this; the value itself is not logged (it is the sender's text).
        log.warning("button %s from %s refused: %s", action.get("action_id"), (body.get("user") or {}).get("id"), exc)
        return None
    container = body.get("container") or {}
    # What Click.of reads, and nothing else: the record carries it out again after a crash.
    payload = {
        "action": {"action_id": click.action.value, "value": click.value.encode()},
        "body": {
            "user": {"id": click.user},
            "container": {k: container.get(k) for k in ("type", "channel_id", "thread_ts", "message_ts")},
            "channel": {"id": click.channel},
            "message": {"thread_ts": click.thread_ts},
            "team": {"id": click.place.team_id},
            "enterprise": {"id": click.place.enterprise_id},
        },
    }
    # One click is one action_ts; a redelivered envelope carries the same.
    parts = (str(action.get("action_ts") or ""), str(body.get("trigger_id") or ""), click.user, click.action)
    key = request_key(RequestKind.CLICK, *parts, click.value.encode())
    await _record_then_ack(ack, context, client, RequestKind.CLICK, key, payload)
    return click


async def enqueue_thread_push(
    session_id: str, branch: str | None, user: str, pull_request: bool = False, title: str | None = None
) -> None:
    """Hand a thread's push (and pull request) to the workers (its workspace is on a worker's disk)."""
    await asyncio.get_running_loop().run_in_executor(
        _enqueuer, enqueue_push, session_id, branch, user, pull_request, title
    )


async def enqueue_thread_pull_request_status(session_id: str) -> None:
    """Hand `@mm pr`'s look at the forge to the workers (they alone hold the forges' tokens)."""
    await asyncio.get_running_loop().run_in_executor(_enqueuer, enqueue_pull_request_status, session_id)


async def enqueue_run(run_id: int) -> None:
    """Hand a job run asked for in Slack to the workers."""
    await asyncio.get_running_loop().run_in_executor(_enqueuer, enqueue_job_run, run_id)


async def on_command(ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient) -> None:
    """`/mm …`: recorded, acked, then carried out from the record; the answer comes through the command's
    response URL, for the person alone."""
    fields = ("text", "channel_id", "user_id", "team_id", "enterprise_id", "trigger_id", "response_url")
    payload = {name: kept(str(command.get(name) or "")) for name in fields}
    if len(payload["text"]) > MAX_TEXT:  # longer than a message could be: refused before anything is kept
        what = f"{SLASH_COMMAND} {payload['text'][:60]}"
        await ack(text=_said(context, TOO_LONG.format(what=what, length=len(payload["text"]), most=MAX_TEXT)))
        return
    # Each invocation has a trigger id of its own; a redelivered envelope carries the same.
    key = request_key(RequestKind.SLASH, *payload.values())
    await _record_then_ack(ack, context, client, RequestKind.SLASH, key, payload)


async def on_home_opened(
    ack: AsyncAck, event: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient
) -> None:
    await ack()
    if event.get("tab") == "home" and event.get("user"):
        place = workspace_of(context)
        in_background(context[HOME].publish(slack_out(context, client), event["user"], place=place))


async def on_uninstalled(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
    """app_uninstalled, or tokens_revoked of the bot's token: the workspace (an org-wide install: the org) is
    gone. Its tokens are deleted, its turns asked to stop and its jobs paused before the ack (none of it calls
    Slack, which would refuse the dead token anyway), so that a failure is sent again by Slack."""
    event = body.get("event") or {}
    if event.get("type") == "tokens_revoked" and not (event.get("tokens") or {}).get("bot"):
        await ack()  # a person's token: the app keeps none
        return
    team = Team(None if context.is_enterprise_install else context.team_id, context.enterprise_id)
    done = await context[UNINSTALL](team)
    context[RECORDED] = True
    await ack()
    log.warning(
        "the app was removed from Slack workspace %s (%s): its tokens deleted, %d turns asked to stop, jobs paused: %s",
        team,
        event.get("type"),
        done.stopped,
        ", ".join(done.paused) or "none",
    )


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
    return await _inbox(context).session_of(event["channel"], thread_ts) is not None


def _engine(context: AsyncBoltContext) -> Engine:
    return context[ENGINE]


def _inbox(context: AsyncBoltContext) -> InboxWriter:
    return context[INBOX]


def slack_out(context: AsyncBoltContext, client: AsyncWebClient) -> SlackOut:
    """The request's Web API client behind the gateway every write to Slack goes through."""
    return SlackOut(client, context[SECRETS])


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
    message addressed to the bot that is exactly a command is recorded as a request instead, and carried out
    after the ack."""
    channel = event["channel"]
    text = kept(without_mention(event.get("text") or "", context.bot_user_id))
    command = parse(text) if addressed else None
    if command is not None:
        where = Where(
            channel,
            thread_ts,
            event["ts"],
            event.get("user") or "",
            requester_team(event, context),
            assistant_thread,
            shared_files(event),
            workspace_of(context).team_id,
            workspace_of(context).enterprise_id,
        )
        payload = {"name": command.name, "args": list(command.args), "where": asdict(where)}
        # A mention arrives twice (app_mention and its message twin): one message, one key, one command.
        key = request_key(RequestKind.COMMAND, channel, event["ts"])
        await _record_then_ack(ack, context, client, RequestKind.COMMAND, key, payload)
        return
    values = message_values(
        channel_id=channel,
        thread_ts=thread_ts,
        message_ts=event["ts"],
        user_id=event.get("user"),
        text=text,
        team_id=requester_team(event, context),
        slack_team_id=workspace_of(context).team_id,
        enterprise_id=workspace_of(context).enterprise_id,
        assistant_thread=assistant_thread,
        files=shared_files(event),  # downloaded by the worker: the ack cannot wait for them
    )
    # On the event loop, in a transaction shared with the messages that wait with it (bot.inbox_writer).
    recorded = await _inbox(context).write(values)
    context[RECORDED] = True
    await ack()
    if recorded.new:
        in_background(_hand_off(recorded, context[HAND_OFF], slack_out(context, client), channel, thread_ts))
    else:
        log.debug("message %s in %s already recorded (a redelivery, or a mention's twin)", event["ts"], channel)


async def _record_then_ack(
    ack: AsyncAck,
    context: AsyncBoltContext,
    client: AsyncWebClient,
    kind: RequestKind,
    key: str,
    payload: dict[str, Any],
) -> None:
    """A request recorded (claimed by this process), acked, then carried out.

    A record that failed, or that the database did not answer in time (nothing kept, bot.before_ack): a slash
    command is answered in one sentence that says so (safe: nothing will be done); an event or a click is not
    acked (HTTP 500, no ack on the socket), so Slack sends an event again, and a person who clicked sees
    Slack's own failure, which is honest. A record whose commit was under way at the deadline (Unsure) is
    carried out if it was kept, once its thread returns; a slash command or a click is acked (Slack would not
    send it again anyway), an event is not (its retry finds the record, or makes it)."""
    requests: Requests = context[REQUESTS]
    try:
        recorded = await requests.record(kind, key, payload)
    except Unsure as unsure:
        in_background(requests.start_once_kept(slack_out(context, client), unsure.outcome))
        if kind == RequestKind.COMMAND:
            raise
        log.warning("the %s request %s: the database did not answer while keeping it; acked", kind, key)
        context[RECORDED] = True
        await ack()
        return
    except Exception as exc:
        if kind != RequestKind.SLASH:
            raise
        why = "did not answer" if silent(exc) else "failed"
        log.error("could not record %s (%s); the person is told that nothing was done", SLASH_COMMAND, _what(exc))
        said = NOT_TAKEN.format(what=f"{SLASH_COMMAND} {payload['text']}".strip()[:100], why=why)
        await ack(text=_said(context, said))
        return
    context[RECORDED] = True
    await ack()
    if recorded is not None:
        requests.start(slack_out(context, client), recorded)
    else:
        log.debug("the %s request %s was recorded before (a redelivery, or a mention's twin)", kind, key)


def _said(context: AsyncBoltContext, text: str) -> str:
    """A sentence said in the ack itself, made safe as every text leaving for Slack is (slackio.slack_out)."""
    return outgoing({"text": text}, context[SECRETS])["text"]


def _what(exc: BaseException) -> str:
    """An error's type and where it was raised, never its message (which may quote the request)."""
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    return f"{type(exc).__name__} at {frame[0].name}" if frame else type(exc).__name__


async def _hand_off(recorded: Recorded, hand_off: HandOff, slack: SlackOut, channel: str, thread_ts: str) -> None:
    try:
        await hand_off.enqueue(recorded.session_id)
    except Exception as exc:  # noqa: BLE001 - the message is recorded: housekeeping enqueues it later
        log.warning("could not enqueue session %s (%s); housekeeping will", recorded.session_id, exc)
    if recorded.busy:
        # The one Web API call of the inbound side: without it a message sent during a long turn would look
        # ignored until the turn ends.
        try:
            await slack.post(channel, QUEUED, thread_ts=thread_ts)
        except Exception as exc:  # noqa: BLE001 - a courtesy: the message waits in the inbox all the same
            log.warning("could not tell %s/%s that its message is queued: %s", channel, thread_ts, exc)


def requester_team(event: dict[str, Any], context: AsyncBoltContext) -> str | None:
    """The team of the person who wrote: their own (`user_team`, a Slack Connect person's workspace), not the
    one the app is installed in. A stream in a channel names its recipient with it, and Slack refuses a stream
    to a person named with another team."""
    return event.get("user_team") or event.get("team") or context.team_id


async def _greet(slack: SlackOut, channel: str, thread_ts: str) -> None:
    # Two calls, each on its own: prompts Slack refuses must not cost the greeting.
    try:
        await slack.call(
            "assistant.threads.setSuggestedPrompts",
            channel_id=channel,
            thread_ts=thread_ts,
            prompts=SUGGESTED_PROMPTS,
            title="Try one of these",
        )
    except Exception as exc:  # noqa: BLE001 - a courtesy
        log.warning("could not set the assistant thread's suggested prompts: %s", exc)
    try:
        await slack.post(channel, HELLO, thread_ts=thread_ts)
    except Exception as exc:  # noqa: BLE001 - a courtesy
        log.warning("could not greet the assistant thread: %s", exc)
