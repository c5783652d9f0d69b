"""Sends requests to a bot the way Slack does: signed Events API callbacks, interactivity and slash commands.

    sender = SlackEventSender("http://127.0.0.1:3000", signing_secret="s3cret")
    response = sender.app_mention("<@U0BOT> fix the tests", channel="C0TEST", user="U0ALICE")
    assert response.status_code == 200

Each helper returns the `httpx.Response` (status_code, text, json(), elapsed). `sender.last_payload` holds
the payload just sent (its event_id, ts...). Forgeries for negative tests go through the same helpers'
keyword arguments: `secret=` (sign with another secret), `timestamp=` (e.g. `stale_timestamp()`),
`omit_headers=("X-Slack-Signature",)`, `tamper=True` (sign one body, send another).

A workspace of an Enterprise Grid org (`enterprise_id`, `enterprise_name`), or an app installed org-wide
(`is_enterprise_install=True`), fills the envelopes as Slack does for them: `enterprise_id` beside `team_id`,
`authorizations[0]` naming the org (and no team for an org-wide install), `team`/`enterprise` in clicks and
commands. `for_team(...)` speaks for another workspace with the same ids; `app_uninstalled()` and
`tokens_revoked()` send the lifecycle events, whose bodies `app_uninstalled_body()` and `tokens_revoked_body()`
build alone (the Slack emulator's `uninstall()` makes them); `deliver(body)` sends a body made elsewhere.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

import httpx

FORM = "application/x-www-form-urlencoded"
# The verification token Slack puts in every body (deprecated by the signatures; bolt ignores it).
VERIFICATION_TOKEN = "Jhj5dZrVaK7ZwHHjRyZWjbDl"


def sign(signing_secret: str, timestamp: int | str, body: bytes) -> str:
    """Slack's request signature: `v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{body}`."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


def signed_headers(signing_secret: str, body: bytes, content_type: str, timestamp: int | None = None) -> dict[str, str]:
    """The headers Slack sends with `body` (for callers that bring their own HTTP client)."""
    stamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": str(stamp),
        "X-Slack-Signature": sign(signing_secret, stamp, body),
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
    }


def stale_timestamp() -> int:
    """A timestamp older than the five minutes verifiers accept."""
    return int(time.time()) - 6 * 60


def app_uninstalled_body(
    *, api_app_id: str, team_id: str | None, enterprise_id: str | None = None, event_id: str | None = None
) -> dict[str, Any]:
    """The `app_uninstalled` event_callback Slack sends once the app is gone from a workspace (`team_id`, with
    its org's `enterprise_id`) or from an org (`enterprise_id` alone). No `authorizations`: none is left."""
    return _lifecycle_body({"type": "app_uninstalled"}, api_app_id, team_id, enterprise_id, event_id)


def tokens_revoked_body(
    *,
    api_app_id: str,
    team_id: str | None,
    enterprise_id: str | None = None,
    bot: Iterable[str] = (),
    oauth: Iterable[str] = (),
    event_id: str | None = None,
) -> dict[str, Any]:
    """The `tokens_revoked` event_callback: `event.tokens.bot` names the bot users whose tokens were revoked,
    `event.tokens.oauth` the people whose user tokens were."""
    event = {"type": "tokens_revoked", "tokens": {"oauth": list(oauth), "bot": list(bot)}}
    return _lifecycle_body(event, api_app_id, team_id, enterprise_id, event_id)


def _lifecycle_body(
    event: dict[str, Any], api_app_id: str, team_id: str | None, enterprise_id: str | None, event_id: str | None
) -> dict[str, Any]:
    where: dict[str, Any] = {"team_id": team_id} if team_id else {}
    if enterprise_id:
        where["enterprise_id"] = enterprise_id
    return {
        "token": VERIFICATION_TOKEN,
        **where,
        "api_app_id": api_app_id,
        "event": event,
        "type": "event_callback",
        # Unique across senders and emulators: the bot dedupes events by their id.
        "event_id": event_id or f"Ev{uuid.uuid4().hex[:12].upper()}",
        "event_time": int(time.time()),
    }


class SlackEventSender:
    """Signed requests to a bot's endpoint. `url` is the bot's base URL; `path` is appended.

    team_id / api_app_id / bot_user_id fill the envelopes (match them to the SlackEmulator's: its
    `sender_options(team_id)` gives a workspace's, with its org and the installation that reaches it).
    enterprise_id / enterprise_name: the workspace's Enterprise Grid org; is_enterprise_install: the app is
    installed org-wide (Slack then names no team in `authorizations`).
    response_url_base: where response_url values point (the emulator's `response_url()` is best: pass
    `response_url=emulator.response_url` as a callable).
    """

    def __init__(
        self,
        url: str,
        signing_secret: str,
        *,
        path: str = "/slack/events",
        team_id: str = "T0TESTTEAM",
        team_domain: str = "testteam",
        enterprise_id: str | None = None,
        enterprise_name: str | None = None,
        is_enterprise_install: bool = False,
        api_app_id: str = "A0TESTAPP",
        bot_user_id: str = "U0BOT",
        response_url: str | Callable[[], str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/") + path
        self.signing_secret = signing_secret
        self.team_id, self.team_domain = team_id, team_domain
        self.enterprise_id, self.enterprise_name = enterprise_id, enterprise_name
        self.is_enterprise_install = is_enterprise_install
        self.api_app_id, self.bot_user_id = api_app_id, bot_user_id
        self._response_url = response_url
        self._counter = itertools.count(1)
        self._last_ts_us = 0
        self.last_payload: Any = None
        self.http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> SlackEventSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def for_team(
        self,
        team_id: str,
        *,
        team_domain: str | None = None,
        enterprise_id: str | None = None,
        enterprise_name: str | None = None,
        is_enterprise_install: bool = False,
        bot_user_id: str | None = None,
    ) -> SlackEventSender:
        """This sender speaking for another workspace (the emulator's `sender_options(team_id)` fit): its event
        and trigger ids continue this one's, so a bot that dedupes them sees every event. It shares this one's
        HTTP client: closing either closes both."""
        other = copy.copy(self)
        other.team_id, other.team_domain = team_id, team_domain or team_id.lower()
        other.enterprise_id, other.enterprise_name = enterprise_id, enterprise_name
        other.is_enterprise_install = is_enterprise_install
        other.bot_user_id = bot_user_id or self.bot_user_id
        return other

    # -- ids ------------------------------------------------------------------------------------------------

    def new_ts(self) -> str:
        """A message ts of now, unique and increasing for this sender."""
        self._last_ts_us = max(int(time.time() * 1_000_000), self._last_ts_us + 1)
        return f"{self._last_ts_us // 1_000_000}.{self._last_ts_us % 1_000_000:06d}"

    def new_event_id(self) -> str:
        return f"Ev{next(self._counter):08d}TEST"

    def new_trigger_id(self) -> str:
        return f"{next(self._counter)}.{int(time.time())}.{uuid.uuid4().hex}"

    def new_response_url(self) -> str:
        if callable(self._response_url):
            return self._response_url()
        return self._response_url or f"http://127.0.0.1:9/response-url/{next(self._counter)}"

    # -- the raw send ---------------------------------------------------------------------------------------

    def send(
        self,
        body: bytes | str,
        content_type: str,
        *,
        secret: str | None = None,
        timestamp: int | None = None,
        omit_headers: Iterable[str] = (),
        tamper: bool = False,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """POST `body` signed with `secret` (default: the right one); the forgery knobs are documented above."""
        raw = body.encode() if isinstance(body, str) else body
        sent = signed_headers(secret or self.signing_secret, raw, content_type, timestamp)
        if retry_num is not None:
            sent["X-Slack-Retry-Num"] = str(retry_num)
            sent["X-Slack-Retry-Reason"] = retry_reason
        sent.update(headers or {})
        for name in omit_headers:
            sent.pop(name, None)
        if tamper:
            raw = raw.replace(b"e", b"E", 1) if b"e" in raw else raw + b" "
        return self.http.post(self.url, content=raw, headers=sent)

    def _json(self, payload: dict[str, Any], **options: Any) -> httpx.Response:
        self.last_payload = payload
        return self.send(json.dumps(payload), "application/json", **options)

    def _form(self, fields: dict[str, str], payload: Any, **options: Any) -> httpx.Response:
        self.last_payload = payload
        return self.send(urlencode(fields), FORM, **options)

    # -- Events API -----------------------------------------------------------------------------------------

    def url_verification(
        self, challenge: str = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", **options: Any
    ) -> httpx.Response:
        return self._json({"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"}, **options)

    def event(self, event: dict[str, Any], *, event_id: str | None = None, **options: Any) -> httpx.Response:
        """An `event_callback` envelope around `event` (the event gets `event_ts` if it has none)."""
        event = {"event_ts": event.get("ts") or self.new_ts()} | event
        payload = {
            "token": VERIFICATION_TOKEN,
            "team_id": self.team_id,
            # Slack names the org beside the workspace only in an Enterprise Grid org.
            **({"enterprise_id": self.enterprise_id} if self.enterprise_id else {}),
            "context_team_id": self.team_id,
            "context_enterprise_id": self.enterprise_id,
            "api_app_id": self.api_app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or self.new_event_id(),
            "event_time": int(float(event["event_ts"])),
            "authorizations": [
                {
                    "enterprise_id": self.enterprise_id,
                    # An org-wide installation is the org's, of no one workspace: Slack sends its team as null.
                    "team_id": None if self.is_enterprise_install else self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": self.is_enterprise_install,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-{uuid.uuid4().hex}",
        }
        return self._json(payload, **options)

    def deliver(self, body: dict[str, Any], **options: Any) -> httpx.Response:
        """POST an Events API body made elsewhere (the emulator's `uninstall()` bodies), as it is, signed."""
        return self._json(body, **options)

    def app_uninstalled(self, **options: Any) -> httpx.Response:
        """`app_uninstalled` for this sender's workspace (for its org, with `is_enterprise_install`)."""
        body = app_uninstalled_body(
            api_app_id=self.api_app_id,
            team_id=None if self.is_enterprise_install else self.team_id,
            enterprise_id=self.enterprise_id,
            event_id=self.new_event_id(),
        )
        return self._json(body, **options)

    def tokens_revoked(
        self, *, bot: Iterable[str] | None = None, oauth: Iterable[str] = (), **options: Any
    ) -> httpx.Response:
        """`tokens_revoked` for this sender's workspace: the bot's token by default (`bot=[bot_user_id]`)."""
        body = tokens_revoked_body(
            api_app_id=self.api_app_id,
            team_id=None if self.is_enterprise_install else self.team_id,
            enterprise_id=self.enterprise_id,
            bot=[self.bot_user_id] if bot is None else bot,
            oauth=oauth,
            event_id=self.new_event_id(),
        )
        return self._json(body, **options)

    def _message_event(
        self, kind: str, text: str, channel: str, user: str, ts: str | None, thread_ts: str | None
    ) -> dict[str, Any]:
        ts = ts or self.new_ts()
        event = {
            "type": kind,
            "user": user,
            "text": text,
            "ts": ts,
            "channel": channel,
            "team": self.team_id,
            "client_msg_id": str(uuid.uuid4()),
            "event_ts": ts,
            "blocks": [
                {
                    "type": "rich_text",
                    "block_id": "b0",
                    "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}],
                }
            ],
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    def app_mention(
        self,
        text: str,
        *,
        channel: str,
        user: str,
        ts: str | None = None,
        thread_ts: str | None = None,
        event_id: str | None = None,
        files: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> httpx.Response:
        """`app_mention`: write the mention in `text` yourself, e.g. `<@U0BOT> hello`. `files`: the files it
        shares, as Slack describes them (SlackEmulator.share_file makes them)."""
        event = self._message_event("app_mention", text, channel, user, ts, thread_ts)
        if files:
            event["files"] = files
        return self.event(event, event_id=event_id, **options)

    def message(
        self,
        text: str,
        *,
        channel: str,
        user: str,
        ts: str | None = None,
        thread_ts: str | None = None,
        channel_type: str = "channel",
        event_id: str | None = None,
        files: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> httpx.Response:
        """A `message` event (in a thread when `thread_ts` is given; `channel_type="im"` for a DM); with `files`
        (as SlackEmulator.share_file makes them), Slack's `file_share` message that shares them."""
        event = self._message_event("message", text, channel, user, ts, thread_ts) | {"channel_type": channel_type}
        if files:
            event |= {"subtype": "file_share", "files": files, "upload": False}
        return self.event(event, event_id=event_id, **options)

    # -- interactivity and commands -------------------------------------------------------------------------

    def block_action(
        self,
        action_id: str,
        value: str,
        *,
        user: str,
        channel: str,
        message_ts: str,
        thread_ts: str | None = None,
        message: dict[str, Any] | None = None,
        block_id: str = "actions",
        text: str = "Button",
        user_name: str | None = None,
        response_url: str | None = None,
        trigger_id: str | None = None,
        **options: Any,
    ) -> httpx.Response:
        """A `block_actions` payload for a button click on the message `message_ts`."""
        container = {"type": "message", "message_ts": message_ts, "channel_id": channel, "is_ephemeral": False}
        shown = message or {"type": "message", "user": self.bot_user_id, "ts": message_ts, "text": text}
        if thread_ts:
            container["thread_ts"] = thread_ts
            shown = {"thread_ts": thread_ts} | shown
        where = {"channel": {"id": channel, "name": channel.lower()}, "message": shown}
        payload = self._click(action_id, value, user, user_name, block_id, text, container, where, trigger_id)
        payload["response_url"] = response_url or self.new_response_url()
        return self._form({"payload": json.dumps(payload)}, payload, **options)

    def view_action(
        self,
        action_id: str,
        value: str,
        *,
        user: str,
        view: dict[str, Any],
        block_id: str = "actions",
        text: str = "Button",
        user_name: str | None = None,
        trigger_id: str | None = None,
        **options: Any,
    ) -> httpx.Response:
        """A `block_actions` payload for a button click in a view (the App Home): no channel, no message."""
        container = {"type": "view", "view_id": view.get("id", "")}
        payload = self._click(action_id, value, user, user_name, block_id, text, container, {"view": view}, trigger_id)
        return self._form({"payload": json.dumps(payload)}, payload, **options)

    def _click(
        self,
        action_id: str,
        value: str,
        user: str,
        user_name: str | None,
        block_id: str,
        text: str,
        container: dict[str, Any],
        where: dict[str, Any],
        trigger_id: str | None,
    ) -> dict[str, Any]:
        name = user_name or user.lower()
        team: dict[str, Any] = {"id": self.team_id, "domain": self.team_domain}
        if self.enterprise_id:
            team |= {"enterprise_id": self.enterprise_id, "enterprise_name": self.enterprise_name}
        return {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": self.team_id},
            "api_app_id": self.api_app_id,
            "token": VERIFICATION_TOKEN,
            "container": container,
            "trigger_id": trigger_id or self.new_trigger_id(),
            "team": team,
            "enterprise": {"id": self.enterprise_id, "name": self.enterprise_name} if self.enterprise_id else None,
            "is_enterprise_install": self.is_enterprise_install,
            **where,
            "state": {"values": {}},
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": block_id,
                    "value": value,
                    "type": "button",
                    "text": {"type": "plain_text", "text": text, "emoji": True},
                    "action_ts": self.new_ts(),
                }
            ],
        }

    def app_home_opened(self, *, user: str, view: dict[str, Any] | None = None, **options: Any) -> httpx.Response:
        """`app_home_opened` on the Home tab (with the view last published for that person, when there is one)."""
        event: dict[str, Any] = {"type": "app_home_opened", "user": user, "channel": f"D{user[1:]}", "tab": "home"}
        if view is not None:
            event["view"] = view
        return self.event(event, **options)

    def slash_command(
        self,
        command: str,
        text: str,
        *,
        user: str,
        channel: str,
        user_name: str | None = None,
        channel_name: str | None = None,
        response_url: str | None = None,
        trigger_id: str | None = None,
        **options: Any,
    ) -> httpx.Response:
        """A slash command (form-encoded), e.g. `slash_command("/mm", "status", user=..., channel=...)`."""
        fields = {
            "token": VERIFICATION_TOKEN,
            "team_id": self.team_id,
            "team_domain": self.team_domain,
            **({"enterprise_id": self.enterprise_id} if self.enterprise_id else {}),
            **({"enterprise_name": self.enterprise_name or ""} if self.enterprise_id else {}),
            "channel_id": channel,
            "channel_name": channel_name or channel.lower(),
            "user_id": user,
            "user_name": user_name or user.lower(),
            "command": command,
            "text": text,
            "api_app_id": self.api_app_id,
            "is_enterprise_install": "true" if self.is_enterprise_install else "false",
            "response_url": response_url or self.new_response_url(),
            "trigger_id": trigger_id or self.new_trigger_id(),
        }
        return self._form(fields, fields, **options)
