"""The Slack front end: a slack-bolt app built from the service config.

We use bolt's asyncio flavour (AsyncApp) served by aiohttp rather than the sync App behind a WSGI server:
aiohttp is already a dependency, one event loop serves both the HTTP endpoint and Socket Mode, and the
handlers must ack within Slack's 3 seconds while the work itself goes to Celery, so nothing here blocks.

The listeners themselves are in bot.handlers, registered by kind in `register`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot import handlers
from chatops.buttons import ACTION_PATTERN

if TYPE_CHECKING:
    from chatops.config import Config

bolt_log = logging.getLogger("mm.bot.bolt")
# Bolt reads SLACK_BOT_TOKEN from the environment by itself and then warns that our client (which holds the
# same token, and the base_url bolt has no parameter for) takes precedence: true, expected, and only noise.
bolt_log.addFilter(lambda record: "`token` will be unused" not in record.getMessage())


def slack_api_base(url: str) -> str:
    """slack_sdk joins method names onto base_url, so it must end with a slash."""
    return url if url.endswith("/") else url + "/"


def create_app(config: Config) -> AsyncApp:
    """A bolt app that verifies signatures with the signing secret and calls the Web API at
    `config.slack_api_url` (Slack itself, GovSlack, or the test emulator).

    Needs SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET; callers check `config.missing_slack_secrets()` first.
    """
    client = AsyncWebClient(token=config.slack_bot_token, base_url=slack_api_base(config.slack_api_url))
    app = AsyncApp(
        client=client,
        signing_secret=config.slack_signing_secret,
        # The async flavour verifies the token (auth.test) on the first request rather than at construction,
        # through `client`, so it goes to `config.slack_api_url` like every other call.
        # Bolt answers url_verification with the challenge (after the signature check).
        url_verification_enabled=True,
        logger=bolt_log,
    )
    register(app)
    return app


def register(app: AsyncApp) -> None:
    """The listeners, by kind: events, button clicks, the slash command."""
    app.event("app_mention")(handlers.on_mention)
    app.event("message")(handlers.on_message)
    app.action(ACTION_PATTERN)(handlers.on_button)
    app.command(handlers.SLASH_COMMAND)(handlers.on_command)
