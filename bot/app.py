"""The Slack front end: a slack-bolt app built from the service config.

We use bolt's asyncio flavour (AsyncApp) served by aiohttp rather than the sync App behind a WSGI server:
aiohttp is already a dependency, one event loop serves both the HTTP endpoint and Socket Mode, and the
handlers must ack within Slack's 3 seconds while the work itself goes to Celery, so nothing here blocks.

The listeners only ack and log for now; the real handlers (dedupe, authorization, enqueue) come with the
Slack issue and replace the bodies registered in `_register_listeners`.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

if TYPE_CHECKING:
    from chatops.config import Config

log = logging.getLogger("mm.bot")
bolt_log = logging.getLogger("mm.bot.bolt")
# Bolt reads SLACK_BOT_TOKEN from the environment by itself and then warns that our client (which holds the
# same token, and the base_url bolt has no parameter for) takes precedence: true, expected, and only noise.
bolt_log.addFilter(lambda record: "`token` will be unused" not in record.getMessage())

# The Block Kit buttons the bot posts (approval prompts and the Stop button).
ACTION_IDS = ("approve", "reject", "approve_all", "stop")
SLASH_COMMAND = "/mm"


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
    _register_listeners(app)
    return app


def _register_listeners(app: AsyncApp) -> None:
    @app.event("app_mention")
    async def on_mention(ack: AsyncAck, event: dict[str, Any]) -> None:
        await ack()
        log.info("app_mention in %s from %s (not handled yet)", event.get("channel"), event.get("user"))

    @app.event("message")
    async def on_message(ack: AsyncAck, event: dict[str, Any]) -> None:
        await ack()
        log.info("message in %s from %s (not handled yet)", event.get("channel"), event.get("user"))

    @app.action(re.compile(rf"^({'|'.join(ACTION_IDS)})$"))
    async def on_button(ack: AsyncAck, action: dict[str, Any], body: dict[str, Any]) -> None:
        await ack()
        log.info("button %s from %s (not handled yet)", action.get("action_id"), body.get("user", {}).get("id"))

    @app.command(SLASH_COMMAND)
    async def on_command(ack: AsyncAck, command: dict[str, Any]) -> None:
        await ack()
        log.info("%s %r from %s (not handled yet)", SLASH_COMMAND, command.get("text"), command.get("user_id"))
