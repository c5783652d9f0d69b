"""Sends requests to a bot the way Slack does: signed Events API callbacks, interactivity and slash commands.

    sender = SlackEventSender("http://127.0.0.1:3000", signing_secret="s3cret")
    response = sender.app_mention("<@U0BOT> fix the tests", channel="C0TEST", user="U0ALICE")
    assert response.status_code == 200

Each helper returns the `httpx.Response` (status_code, text, json(), elapsed). `sender.last_payload` holds
the payload just sent (its event_id, ts...). Forgeries for negative tests go through the same helpers'
keyword arguments: `secret=` (sign with another secret), `timestamp=` (e.g. `stale_timestamp()`),
`omit_headers=("X-Slack-Signature",)`, `tamper=True` (sign one body, send another).
"""

from __future__ import annotations

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


class SlackEventSender:
    """Signed requests to a bot's endpoint. `url` is the bot's base URL; `path` is appended.

    team_id / api_app_id / bot_user_id fill the envelopes (match them to the SlackEmulator's).
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
        api_app_id: str = "A0TESTAPP",
        bot_user_id: str = "U0BOT",
        response_url: str | Callable[[], str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/") + path
        self.signing_secret = signing_secret
        self.team_id, self.team_domain = team_id, team_domain
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
        return self._json(
            {"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge, "type": "url_verification"}, **options
        )

    def event(self, event: dict[str, Any], *, event_id: str | None = None, **options: Any) -> httpx.Response:
        """An `event_callback` envelope around `event` (the event gets `event_ts` if it has none)."""
        event = {"event_ts": event.get("ts") or self.new_ts()} | event
        payload = {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "team_id": self.team_id,
            "context_team_id": self.team_id,
            "context_enterprise_id": None,
            "api_app_id": self.api_app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or self.new_event_id(),
            "event_time": int(float(event["event_ts"])),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-{uuid.uuid4().hex}",
        }
        return self._json(payload, **options)

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
        return {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": self.team_id},
            "api_app_id": self.api_app_id,
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "container": container,
            "trigger_id": trigger_id or self.new_trigger_id(),
            "team": {"id": self.team_id, "domain": self.team_domain},
            "enterprise": None,
            "is_enterprise_install": False,
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
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "team_id": self.team_id,
            "team_domain": self.team_domain,
            "channel_id": channel,
            "channel_name": channel_name or channel.lower(),
            "user_id": user,
            "user_name": user_name or user.lower(),
            "command": command,
            "text": text,
            "api_app_id": self.api_app_id,
            "is_enterprise_install": "false",
            "response_url": response_url or self.new_response_url(),
            "trigger_id": trigger_id or self.new_trigger_id(),
        }
        return self._form(fields, fields, **options)
