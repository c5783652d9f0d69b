"""The Slack front end: a slack-bolt app built from the service config.

We use bolt's asyncio flavour (AsyncApp) served by aiohttp rather than the sync App behind a WSGI server:
aiohttp is already a dependency, one event loop serves both the HTTP endpoint and Socket Mode, and the
handlers must ack within Slack's 3 seconds while the work itself goes to Celery, so nothing here blocks.

The listeners themselves are in bot.handlers, registered by kind in `register`. They record what arrived
before the ack (so bolt runs them before it answers: `process_before_response`) and hand the rest off after
it. Nothing before the ack calls the Web API, so that Slack failing (a 429, an outage) never fails an ack or
loses a request: bolt's own checks that would (auth.test before the first request, the assistant's thread
context kept in the thread's first reply) are replaced by `Identity` and bot.handlers.ThreadContexts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slack_bolt.async_app import AsyncApp, AsyncAssistant, AsyncBoltContext
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.request.payload_utils import is_assistant_event, is_other_message_sub_event_in_assistant_thread
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy.exc import DataError

from bot import handlers, shapes
from bot.admin import AdminCommands
from bot.approvals import ClickHandler
from bot.authorize import Approvers
from bot.before_ack import WAIT_S, bounded
from bot.commands import SLASH_COMMAND, Commands
from bot.hand_off import HandOff
from bot.home import Home
from bot.inbox_writer import InboxWriter
from bot.jobs import JobCommands
from bot.logging_setup import BOLT_LOGGER
from bot.oauth import ENVELOPE_TEAM, InstallationAuthorize, install_flow
from bot.requests import Requests
from chatops import db
from chatops.buttons import ACTION_PATTERN
from chatops.inbox_async import async_inbox
from chatops.reload import ConfigFile
from chatops.secrets import LiveSecrets
from chatops.teams import Team
from chatops.uninstall import Uninstalled, uninstalled
from slackio.installations import Installations
from slackio.slack_client import TeamClient, api_base, counted_only

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from chatops.config import Config

bolt_log = logging.getLogger(BOLT_LOGGER)
# Bolt reads SLACK_BOT_TOKEN from the environment by itself and then warns that our client (which holds the
# same token, and the base_url bolt has no parameter for) and our `authorize` take precedence: true, expected,
# and only noise.
bolt_log.addFilter(
    lambda record: not ("`token`" in (said := record.getMessage()) and ("unused" in said or "ignored" in said))
)
# How long the server waits for Slack to say who the bot is before it starts (then it asks again in the
# background, and goes by what the requests say until then).
IDENTITY_TIMEOUT = 5.0
# How long a token's refresh before an ack may wait for Slack (bot.oauth).
REFRESH_S = 2
IDENTITY_RETRY = 10.0


@dataclass(frozen=True)
class SlackApp:
    """The bolt app, and what the server runs beside it."""

    bolt: AsyncApp
    # Who the bot is, for one workspace's SLACK_BOT_TOKEN (None when installed through OAuth: each
    # installation says who the bot is in its workspace).
    identity: Identity | None
    requests: Requests
    # The record of each message before its ack, on the event loop (closed at shutdown: bot.server).
    inbox: InboxWriter
    # The sessions' hand-off to the workers after the ack, a process of its own (started and ended by bot.server).
    hand_off: HandOff
    # The app's Web API client in a workspace: a replayed request's (bot.requests), with that workspace's token.
    client_for: Callable[[Team], AsyncWebClient]


class Identity:
    """Who the bot is in Slack (auth.test), asked once at start-up and kept. Bolt's own check asks on the first
    request, before the ack, and answers a request it could not check with a page of its own instead of
    running the listener: one 429 there would lose a message. Until Slack has answered, a request is
    authorized with the bot token as is, its bot user read from the event's `authorizations`."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.known: AuthorizeResult | None = None

    async def learn(self) -> bool:
        """Ask Slack once; True when it answered."""
        try:
            answer = await self.client.auth_test()
        except Exception as exc:  # noqa: BLE001 - asked again later; requests go on meanwhile
            bolt_log.warning("Slack did not say who the bot is (auth.test: %s); asking again later", exc)
            return False
        self.known = AuthorizeResult.from_auth_test_response(auth_test_response=answer, bot_token=self.client.token)
        return True

    async def keep_learning(self) -> None:
        """Ask again every IDENTITY_RETRY seconds until Slack answers (after a first question that failed)."""
        while self.known is None:
            await asyncio.sleep(IDENTITY_RETRY)
            await self.learn()

    def remember_bot_user(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        """Before bolt's authorization: the bot user an event names, for `authorize` while Slack has not said."""
        authorizations = body.get("authorizations")
        if self.known is None and isinstance(authorizations, list) and authorizations:
            first = authorizations[0]
            if isinstance(first, dict) and first.get("is_bot") and isinstance(first.get("user_id"), str):
                context[_BOT_USER] = first["user_id"]

    def authorize(
        self, context: AsyncBoltContext, enterprise_id: str | None, team_id: str | None, user_id: str | None
    ) -> AuthorizeResult:
        known = self.known
        return AuthorizeResult(
            enterprise_id=known.enterprise_id if known else enterprise_id,
            team_id=known.team_id if known else team_id,
            bot_user_id=known.bot_user_id if known else context.get(_BOT_USER),
            bot_id=known.bot_id if known else None,
            bot_token=self.client.token,
            user_id=user_id,
        )


_BOT_USER = "mm_bot_user_hint"
_SOURCE = str(Path(__file__).resolve().parent.parent)


def create_app(
    config: Config, engine: Engine, inbound: Engine | None = None, inbox: InboxWriter | None = None
) -> SlackApp:
    """A bolt app that verifies signatures with the signing secret, calls the Web API at
    `config.slack_api_url` (Slack itself, GovSlack, or the test emulator) and records what arrives through
    `inbound` before the ack (an engine whose waits are bounded: bot.before_ack), a message through `inbox`
    (on the event loop: bot.inbox_writer; made on `inbound`'s database when not given), and works after it
    through `engine`.

    Needs SLACK_SIGNING_SECRET and SLACK_BOT_TOKEN, or the app's OAuth client (SLACK_CLIENT_ID and
    SLACK_CLIENT_SECRET: installed in many workspaces, bot.oauth); callers check `config.missing_slack_secrets()`.
    """
    # Its failures and 429s are counted (slackio/metrics.py). Under OAuth it holds no token: bolt gives each
    # request's copy its workspace's (bot.oauth.InstallationAuthorize).
    settings: dict[str, Any] = {"base_url": api_base(config.slack_api_url), "retry_handlers": counted_only()}
    client = AsyncWebClient(token=None if config.oauth else config.slack_bot_token, **settings)
    inbound = inbound or engine
    thread_contexts = handlers.ThreadContexts(inbound)
    if inbox is None:
        inbox = inbox_writer(inbound.url.render_as_string(hide_password=False))
    # An edit of the config file reaches the bot's checks and commands within a second (chatops/reload.py).
    config_file = ConfigFile(config)
    identity, installs, authorization = _authorization(config_file, client, inbound)

    def client_for(team: Team) -> AsyncWebClient:
        return client if installs is None else TeamClient(installs, team, **settings)

    app = _CheckedApp(
        client=client,
        signing_secret=config.slack_signing_secret,
        **authorization,
        # Bolt answers url_verification with the challenge (after the signature check).
        url_verification_enabled=True,
        # Bolt's default acks an event before its listener runs; ours record the message first, and bolt
        # answers (over HTTP and over the socket alike) once the listener returns. They return quickly: the
        # enqueue and any Web API call run after the ack (bot.handlers).
        process_before_response=True,
        # What no listener takes (another event type, a modal's submission) goes to `_error`, which acks it.
        raise_error_for_unhandled_request=True,
        assistant_thread_context_store=thread_contexts,
        logger=bolt_log,
    )
    # Before bolt authorizes a request (in async_dispatch: a middleware of bolt's costs its every argument built).
    app.identity = identity
    app.error(_error)
    hand_off = HandOff()
    requests = register(app, engine, config_file, thread_contexts, inbound, inbox, hand_off, installs)
    return SlackApp(app, identity, requests, inbox, hand_off, client_for)


def _authorization(
    config_file: ConfigFile, client: AsyncWebClient, inbound: Engine
) -> tuple[Identity | None, Installations | None, dict[str, Any]]:
    """How a request finds its token: one workspace's SLACK_BOT_TOKEN, who the bot is asked once (Identity); or,
    installed through OAuth, the request's workspace's installation (bot.oauth), with bolt's install flow, for
    the workspaces the config serves."""
    config = config_file.current()
    if not config.oauth:
        identity = Identity(client)

        async def authorize(
            context: AsyncBoltContext, enterprise_id: str | None, team_id: str | None, user_id: str | None
        ) -> AuthorizeResult:
            return identity.authorize(context, enterprise_id, team_id, user_id)

        return identity, None, {"authorize": authorize}
    assert config.slack_client_id and config.slack_client_secret
    # Authorize reads before the ack: on the bot's loop, every wait bounded as the rest of that work's.
    url = inbound.url.render_as_string(hide_password=False)
    installs = Installations(
        config.slack_client_id,
        config.slack_client_secret,
        db.async_engine_for(url, wait_s=WAIT_S),
        # A refresh runs before the ack: a Slack that does not answer in 2 s leaves the living token in use.
        # No retries either: a refresh answered but lost on the way spends the refresh token.
        AsyncWebClient(base_url=api_base(config.slack_api_url), retry_handlers=[], timeout=REFRESH_S),
    )

    def serves(team: Team) -> bool:
        return config_file.current().service.serves(team.team_id, team.enterprise_id)

    flow = install_flow(config, installs, client, serves)
    return None, installs, {"authorize": InstallationAuthorize(installs, serves), "oauth_flow": flow}


def inbox_writer(database_url: str) -> InboxWriter:
    """The process's writer of messages before their ack: its own connections, every wait bounded."""
    return InboxWriter(async_inbox(database_url, WAIT_S))


class _CheckedApp(AsyncApp):
    """Bolt's app, which first checks that a request has the shape its listeners read (bot.shapes), over HTTP
    and the socket alike: one that does not is acked and dropped in one line, before bolt reads any of it
    (bolt builds a middleware's arguments — the click's first action, say — from the body before it runs).

    Then it puts in the request's context what the listeners use (`preset`: the engine, the inbox, ...) and
    the bot's user id the request names (Identity.remember_bot_user, for `authorize`): here rather than in
    middlewares, each of which makes bolt build every argument a listener could ask for, on every request
    (py-spy on bench/bench_inbound.py: a seventh of the bot's time)."""

    identity: Identity | None = None
    preset: dict[str, Any] | None = None

    async def async_dispatch(self, req: AsyncBoltRequest) -> BoltResponse:
        body = req.body if isinstance(req.body, dict) else {}
        if (wrong := shapes.problem(body)) is not None:
            bolt_log.warning("dropped a signed Slack request of a shape no listener reads (%s); acked", wrong)
            return BoltResponse(status=200, body="")
        if self.preset:
            req.context.update(self.preset)
        if isinstance(envelope_team := body.get("team_id"), str):
            req.context[ENVELOPE_TEAM] = envelope_team
        if self.identity is not None:
            self.identity.remember_bot_user(body, req.context)
        return await super().async_dispatch(req)


class _Assistant(AsyncAssistant):
    """Bolt's assistant, which a request that is none of its events passes at once: bolt's own runs each of
    its listeners' matchers first, building every argument a matcher could ask for, on every request (py-spy
    on bench/bench_inbound.py: three in four of the matchers run for a mention). The test is the one those
    matchers and the assistant's own fall-through make (bolt's payload_utils)."""

    async def async_process(
        self, *, req: AsyncBoltRequest, resp: BoltResponse, next: Callable[[], Awaitable[BoltResponse]]
    ) -> BoltResponse | None:
        body = req.body
        if not (is_assistant_event(body) or is_other_message_sub_event_in_assistant_thread(body)):
            return await next()
        return await super().async_process(req=req, resp=resp, next=next)


def register(
    app: _CheckedApp,
    engine: Engine,
    config_file: ConfigFile,
    thread_contexts: handlers.ThreadContexts,
    inbound: Engine,
    inbox: InboxWriter,
    hand_off: HandOff,
    installs: Installations | None = None,
) -> Requests:
    """The listeners, by kind: assistant threads, events, button clicks, the slash command, App Home. The
    process's requests (bot.requests), for its background loop. `inbound`: the engine of the work before the
    ack; `inbox`: the writer of messages before their ack; `hand_off`: the sessions' hand-off to the workers."""
    approvers = Approvers(lambda: config_file.current().service)
    # The secrets of the config as it stands (those a reload brings too), asked at each use.
    secrets = LiveSecrets(config_file.current)
    clicks = ClickHandler(
        engine,
        approvers,
        secrets,
        hand_off.enqueue,
        handlers.enqueue_thread_push,
        handlers.enqueue_thread_pull_request_status,
    )
    jobs = JobCommands(engine, config_file, approvers, handlers.enqueue_run)
    home = Home(engine, approvers, secrets, jobs)
    admin = AdminCommands(engine, approvers, secrets)
    commands = Commands(engine, config_file, approvers, hand_off.enqueue, secrets, jobs, clicks, admin)
    requests = Requests(
        engine,
        commands,
        clicks,
        home,
        hand_off.enqueue,
        lambda: config_file.current().service.bot.claimSeconds,
        inbound,
    )

    # In every request's context before any middleware (the assistant's runs its listeners itself).
    app.preset = {
        handlers.ENGINE: inbound,  # the listeners' own work is before the ack
        handlers.INBOX: inbox,
        handlers.HOME: home,
        handlers.REQUESTS: requests,
        handlers.SECRETS: secrets,
        handlers.HAND_OFF: hand_off,
        handlers.UNINSTALL: functools.partial(_uninstall, installs, inbound, config_file),
    }
    assistant = _Assistant(thread_context_store=thread_contexts, logger=bolt_log)
    assistant.thread_started(handlers.on_assistant_thread_started)
    assistant.thread_context_changed(handlers.on_assistant_context_changed)
    # Every threaded direct message (the assistant pane's threads, and replies in a DM's thread alike).
    assistant.user_message(handlers.on_assistant_message)
    app.assistant(assistant)
    app.event("app_mention")(handlers.on_mention)
    app.event("message")(handlers.on_message)
    app.action(ACTION_PATTERN)(handlers.on_button)
    app.command(SLASH_COMMAND)(handlers.on_command)
    app.event("app_home_opened")(handlers.on_home_opened)
    app.event("app_uninstalled")(handlers.on_uninstalled)
    app.event("tokens_revoked")(handlers.on_uninstalled)
    return requests


async def _uninstall(
    installs: Installations | None, engine: Engine, config_file: ConfigFile, team: Team
) -> Uninstalled:
    """A workspace removed the app: its tokens deleted (under OAuth), its turns asked to stop, its jobs paused."""
    if installs is not None:
        await installs.forget(team)
    return await bounded(uninstalled, engine, config_file.current().service, team)


async def _error(error: Exception, request: AsyncBoltRequest) -> BoltResponse | None:
    """What no listener takes is acked (200, not bolt's 404), so that Slack does not send it again: an event
    the manifest does not subscribe to, a modal's submission, a payload Slack adds one day.

    An exception while bolt dispatched a signed request: one line, where it was raised (never the request:
    a message's text, or an error that quotes it, stays out of the log). Once what the request asks is
    recorded, it is answered 200 (bot.handlers.RECORDED): the record is carried out all the same, and a retry
    would only find it. Before, bolt's 500 stands: Slack sends an event again, and a person who typed a slash
    command or clicked sees Slack's own failure."""
    if isinstance(error, BoltUnhandledRequestError):
        body = request.body if isinstance(request.body, dict) else {}
        event = body.get("event")
        kind = event.get("type") if isinstance(event, dict) else body.get("type") or body.get("command")
        bolt_log.debug("nothing here takes a Slack request of type %.40s; acked", kind)
        return BoltResponse(status=200, body="")
    if isinstance(error, DataError | UnicodeError):
        # What it holds cannot be kept (bot.shapes keeps the known cases out): no retry would change that.
        bolt_log.warning("dropped a signed Slack request the database cannot keep (%s); acked", type(error).__name__)
        return BoltResponse(status=200, body="")
    frames = traceback.extract_tb(error.__traceback__)
    # The innermost frame of our own code says most; a library's (bolt's, the driver's) when none is ours.
    ours = [f for f in frames if f.filename.startswith(_SOURCE) and "site-packages" not in f.filename]
    frame = (ours or frames or [None])[-1]
    where = f"{'/'.join(frame.filename.split('/')[-2:])}:{frame.lineno} in {frame.name}" if frame else "?"
    recorded = bool(request.context.get(handlers.RECORDED))
    bolt_log.error(
        "a Slack request failed (%s at %s); %s",
        type(error).__name__,
        where,
        "it was recorded, so it is acked" if recorded else "not recorded, so not acked",
    )
    return BoltResponse(status=200, body="") if recorded else None
