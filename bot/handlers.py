"""The bot's listeners: small named functions that ack first and then hand the work off.

Each is registered by kind in bot.app.register and can be imported and called on its own. They only record
and enqueue (the Slack issue gives them their bodies); nothing here waits on a model or a tool, because Slack
wants its ack within 3 seconds.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncAck

from chatops.buttons import Action, BadButton, ButtonValue

log = logging.getLogger("mm.bot")
SLASH_COMMAND = "/mm"


async def on_mention(ack: AsyncAck, event: dict[str, Any]) -> None:
    await ack()
    log.info("app_mention in %s from %s (not handled yet)", event.get("channel"), event.get("user"))


async def on_message(ack: AsyncAck, event: dict[str, Any]) -> None:
    await ack()
    log.info("message in %s from %s (not handled yet)", event.get("channel"), event.get("user"))


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
