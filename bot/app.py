"""The Slack front end: a slack-bolt app built from the service config.

We use bolt's asyncio flavour (AsyncApp) served by aiohttp rather than the sync App behind a WSGI server:
aiohttp is already a dependency, one event loop serves both the HTTP endpoint and Socket Mode, and the
handlers must ack within Slack's 3 seconds while the work itself goes to Celery, so nothing here blocks.

The listeners themselves are in bot.handlers, registered by kind in `register`. They record a message before
the ack (so bolt runs them before it answers: `process_before_response`) and hand the rest off after it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from slack_bolt.async_app import AsyncApp, AsyncAssistant, AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import handlers
from bot.approvals import ClickHandler
from bot.authorize import Approvers
from bot.commands import Commands
from bot.home import Home
from bot.jobs import JobCommands
from chatops.buttons import ACTION_PATTERN
from chatops.reload import ConfigFile
from chatops.secrets import secrets_of
from workers.slack_client import api_base, counted_only

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from chatops.config import Config

bolt_log = logging.getLogger("mm.bot.bolt")
# Bolt reads SLACK_BOT_TOKEN from the environment by itself and then warns that our client (which holds the
# same token, and the base_url bolt has no parameter for) takes precedence: true, expected, and only noise.
bolt_log.addFilter(lambda record: "`token` will be unused" not in record.getMessage())


def create_app(config: Config, engine: Engine) -> AsyncApp:
    """A bolt app that verifies signatures with the signing secret, calls the Web API at
    `config.slack_api_url` (Slack itself, GovSlack, or the test emulator) and records messages through
    `engine` (the process's one engine).

    Needs SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET; callers check `config.missing_slack_secrets()` first.
    """
    # Its failures and 429s are counted (workers/metrics.py).
    client = AsyncWebClient(
        token=config.slack_bot_token, base_url=api_base(config.slack_api_url), retry_handlers=counted_only()
    )
    app = AsyncApp(
        client=client,
        signing_secret=config.slack_signing_secret,
        # The async flavour verifies the token (auth.test) on the first request rather than at construction,
        # through `client`, so it goes to `config.slack_api_url` like every other call.
        # Bolt answers url_verification with the challenge (after the signature check).
        url_verification_enabled=True,
        # Bolt's default acks an event before its listener runs; ours record the message first, and bolt
        # answers (over HTTP and over the socket alike) once the listener returns. They return quickly: the
        # enqueue and any Web API call run after the ack (bot.handlers).
        process_before_response=True,
        logger=bolt_log,
    )
    register(app, engine, config)
    return app


def register(app: AsyncApp, engine: Engine, config: Config) -> None:
    """The listeners, by kind: assistant threads, events, button clicks, the slash command, App Home."""
    # An edit of the config file reaches the bot's checks and commands within a second (chatops/reload.py).
    config_file = ConfigFile(config)
    approvers = Approvers(lambda: config_file.current().service)
    secrets = secrets_of(config)
    clicks = ClickHandler(engine, approvers, secrets, handlers.enqueue, handlers.enqueue_thread_push)
    jobs = JobCommands(engine, config_file, approvers, handlers.enqueue_run)
    home = Home(engine, approvers, secrets, jobs)
    commands = Commands(engine, config_file, approvers, handlers.enqueue, secrets, jobs, clicks)

    async def attach_engine(context: AsyncBoltContext, next: Callable[[], Awaitable[None]]) -> None:
        context[handlers.ENGINE] = engine
        context[handlers.CLICKS] = clicks
        context[handlers.HOME] = home
        context[handlers.COMMANDS] = commands
        await next()

    # Before the assistant: its middleware runs the assistant listeners itself, which need the engine too.
    app.middleware(attach_engine)
    assistant = AsyncAssistant(logger=bolt_log)
    assistant.thread_started(handlers.on_assistant_thread_started)
    # Every threaded direct message (the assistant pane's threads, and replies in a DM's thread alike).
    assistant.user_message(handlers.on_assistant_message)
    app.assistant(assistant)
    app.event("app_mention")(handlers.on_mention)
    app.event("message")(handlers.on_message)
    app.action(ACTION_PATTERN)(handlers.on_button)
    app.command(handlers.SLASH_COMMAND)(handlers.on_command)
    app.event("app_home_opened")(handlers.on_home_opened)
