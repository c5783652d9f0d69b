"""The playground's page: a Slack channel in a browser, backed by the Slack Web API emulator.

What a person does on the page becomes what Slack would send the bot: a signed Events API callback for a
message (an `app_mention` and its `message` twin for a mention), a signed `block_actions` payload for a click, a
signed slash command, an `app_home_opened` event. The worker answers through the real Web API client into the
emulator, and the page draws the emulator's state, so what the page shows is what Slack would have received.

    GET  /                     the page (static/index.html)
    GET  /api/state?user=U     the person's workspace and its channel, their ephemerals and App Home, the model,
                               the overlay and the forge emulator's page (its pull requests), when the playground
                               runs one
    GET  /api/events           server-sent events: `change` whenever the emulator's state changed
    GET  /api/files/<id>       a file's picture (a PNG, JPEG, GIF or WebP shared or uploaded), for its thumbnail
    POST /api/messages         {user, text, thread_ts?, file?: {name, mimetype?, data (base64)}}
    POST /api/commands         {user, text}: `/mm <text>`
    POST /api/actions          {user, message_ts | view, action_id, block_id, value, text}
    POST /api/home             {user}

The page shows one workspace or several (`mm-bot playground --workspaces 2`: the app installed in each through
Slack's OAuth flow), each with its channel and its people. A person belongs to one workspace, as an account in
Slack does: what they do is sent with that workspace's ids (its team, the bot user of the installation there),
so the page switches workspaces by switching people.

The page has no login: whoever reaches it may act as any of its people. So it listens on localhost unless told
otherwise, and it takes only JSON from its own origin (a page of another site cannot post a form to it, nor
reach it through a DNS name rebound to 127.0.0.1). A message with a file is shared through the emulator as that
person (Slack's `file_share`, the file served to the bot token only) and sent to the bot with its `files`, as
Slack sends them; a file larger than MAX_FILE is refused with a sentence (413), before its body is read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import json
import re
import threading
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

import httpx
from aiohttp import web

from playground.errors import PlaygroundError
from playground.server_thread import ThreadedAiohttpServer
from playground.signed import SlackEventSender
from playground.slack_api import SlackEmulator
from playground.slack_oauth import OAuthError

MAX_TEXT = 40_000  # Slack's limit on a message's text
# A file a person shares from the page, at most: its body is held in memory here and in the emulator.
MAX_FILE = 5 * 1024 * 1024
MAX_BODY = 256 * 1024  # any other request's body
MAX_NAME = 255
# The pictures the page shows as thumbnails, told by their first bytes (never by what the sender claims): an
# SVG or an HTML file served from this origin could run script.
_PICTURES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}
# "@mm" as a person types it (any case, not "@mm-bot"); Slack's client sends it as the bot's mention.
_TYPED_MENTION = r"(?<![\w<@])@{name}(?![\w-])"
# What every response says to the browser: never inside another site's frame (a click there would be ours),
# and nothing loaded from elsewhere (an image block names any URL).
_SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str, exposed: bool, bound: str = "") -> bool:
    """A request's Host: loopback always; when exposed, also an address typed as such, or the very name the
    page was told to listen on. Any other name is refused: a DNS name can be rebound to this machine by another
    site's page, but not the name its operator chose."""
    host = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    if is_loopback(host):
        return True
    if exposed and bound and host.lower() == bound.lower():
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return exposed


SSE_KEEPALIVE = 15.0  # seconds: a comment line keeps proxies and the browser from closing an idle stream


@dataclass(frozen=True)
class Person:
    id: str
    name: str
    real_name: str
    role: str  # requester, approver or member
    note: str


@dataclass(frozen=True)
class Workspace:
    """A Slack workspace the page shows: its team in the emulator, its one channel and its people."""

    team_id: str
    name: str
    channel_id: str
    channel_name: str
    people: tuple[Person, ...]


@dataclass(frozen=True)
class ModelInfo:
    demo: bool
    name: str
    url: str
    note: str


class PageError(PlaygroundError):
    """A request the page should not have sent: answered 400 with the sentence."""


class FileTooLarge(PageError):
    """A file over MAX_FILE: answered 413 with the sentence."""


class BotUnreachable(PlaygroundError):
    """The bot did not take what the page sent: answered 502. `reached` is False when the request never left
    (nothing listens: the bot is starting or stopped), True when the bot may have recorded it (too slow, an
    error after recording)."""

    def __init__(self, sentence: str, reached: bool) -> None:
        super().__init__(sentence)
        self.reached = reached


class PlaygroundPage(ThreadedAiohttpServer):
    def __init__(
        self,
        slack: SlackEmulator,
        *,
        bot_url: str,
        signing_secret: str,
        workspaces: list[Workspace],
        model: ModelInfo,
        overlay: str,
        config_path: str | None,
        forge_url: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        exposed: bool = False,
    ) -> None:
        super().__init__(host, port)
        self.slack, self.workspaces, self.model = slack, workspaces, model
        self.overlay, self.config_path, self.exposed = overlay, config_path, exposed
        self.forge_url = forge_url  # a page a person opens: the emulator's token is never part of it
        # The emulator's own team's (the one workspace of the default playground).
        self._sender = SlackEventSender(
            bot_url,
            signing_secret,
            team_id=slack.team_id,
            team_domain=slack.domain,
            api_app_id=slack.app_id,
            bot_user_id=slack.bot_user_id,
            timeout=10.0,
        )
        # The other teams' senders, made once the app is installed there: their event ids continue the first's, so the
        # bot, which drops an event id it has seen, takes every workspace's.
        self._senders: dict[str, SlackEventSender] = {}
        self._sending = threading.Lock()  # a sender keeps its last payload: one send at a time
        self._mention = re.compile(_TYPED_MENTION.format(name=re.escape(slack.bot_name)), re.IGNORECASE)
        self._wakers: set[asyncio.Event] = set()
        slack.on_change(self._changed)

    def stop(self) -> None:
        super().stop()
        self._sender.close()

    # -- HTTP ---------------------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=_MESSAGE_BODY)
        # Before any response's headers leave: the event stream's and aiohttp's own error pages' too.
        app.on_response_prepare.append(_secure)
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/events", self._events)
        app.router.add_get("/api/files/{file_id}", self._file)
        app.router.add_post("/api/messages", self._post_message)
        app.router.add_post("/api/commands", self._post_command)
        app.router.add_post("/api/actions", self._post_action)
        app.router.add_post("/api/home", self._open_home)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response = self._refusal(request)
        if response is None:
            try:
                response = await handler(request)
            except FileTooLarge as exc:
                response = _refuse(413, str(exc))
            except PageError as exc:
                response = _refuse(400, str(exc))
            except BotUnreachable as exc:
                response = _refuse(502, str(exc))
        return response

    def _refusal(self, request: web.Request) -> web.Response | None:
        # A DNS name rebound to 127.0.0.1 brings its own Host; another site's page brings its Origin.
        if not host_allowed(request.host, self.exposed, self.host):
            allowed = "its address" if self.exposed else "localhost"
            return _refuse(403, f"this playground answers only to {allowed}, not to {request.host!r}")
        if request.method == "POST":
            origin = request.headers.get("Origin")
            if origin is not None and origin != f"{request.scheme}://{request.host}":
                return _refuse(403, "requests from another site's page are refused")
            if request.content_type != "application/json":
                return _refuse(415, "send JSON (Content-Type: application/json)")
            # Refused before it is read (a body without a length stops at the app's bound, _body says so).
            length = request.content_length or 0
            if request.path == "/api/messages" and length > _MESSAGE_BODY:
                return _refuse(413, _too_large(length * 3 // 4))
            if request.path != "/api/messages" and length > MAX_BODY:
                return _refuse(413, f"the request is larger than the playground takes ({MAX_BODY // 1024} KB)")
        return None

    async def _index(self, _request: web.Request) -> web.Response:
        return web.Response(text=_static_text("index.html"), content_type="text/html", headers=_NO_CACHE)

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        kinds = {".js": "text/javascript", ".css": "text/css", ".json": "application/json", ".png": "image/png"}
        kind = next((k for suffix, k in kinds.items() if name.endswith(suffix)), None)
        if kind is None or "/" in name or name.startswith("."):
            raise web.HTTPNotFound()
        try:
            return web.Response(text=_static_text(name), content_type=kind, headers=_NO_CACHE)
        except FileNotFoundError:
            raise web.HTTPNotFound() from None

    async def _state(self, request: web.Request) -> web.Response:
        # A browser's first visit knows nobody yet: it sees the page as the first person.
        here, person = self._person(request.query.get("user") or self.workspaces[0].people[0].id)
        slack = self.slack
        try:
            bot_user = self._sender_for(here).bot_user_id
        except BotUnreachable:  # not installed there yet: the page draws the channel all the same
            bot_user = ""
        state = slack.snapshot(here.channel_id, person.id) | {
            "me": person.id,
            "users": [asdict(p) for p in here.people],
            "bot": {"id": bot_user, "name": slack.bot_name},
            "team": here.name,
            "team_id": here.team_id,
            # Each with the person the page becomes there, until one is chosen.
            "workspaces": [{"id": w.team_id, "name": w.name, "user": w.people[0].id} for w in self.workspaces],
            "channel": {"id": here.channel_id, "name": here.channel_name},
            "model": asdict(self.model),
            "overlay": self.overlay,
            "config_path": self.config_path,
            "forge_url": self.forge_url,
            "mention": f"<@{bot_user}>" if bot_user else "",
            "max_file_bytes": MAX_FILE,
        }
        return web.json_response(state, headers=_NO_CACHE)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **_NO_CACHE})
        await response.prepare(request)
        woken = asyncio.Event()
        self._wakers.add(woken)
        try:
            await response.write(_sse("change", {"version": self.slack.version}))
            while True:
                try:
                    await asyncio.wait_for(woken.wait(), SSE_KEEPALIVE)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                woken.clear()
                await response.write(_sse("change", {"version": self.slack.version}))
        finally:
            self._wakers.discard(woken)

    def _changed(self, _version: int) -> None:
        # Called on the emulator's thread: wake this server's streams on this server's loop.
        loop = self._loop
        if loop is None:
            return
        for woken in list(self._wakers):
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the page is stopping
                loop.call_soon_threadsafe(woken.set)

    async def _file(self, request: web.Request) -> web.Response:
        data = self.slack.file_content(request.match_info["file_id"])
        kind = _picture(data) if data is not None else None
        if data is None or kind is None:
            raise web.HTTPNotFound()
        return web.Response(body=data, content_type=kind, headers=_NO_CACHE)

    async def _post_message(self, request: web.Request) -> web.Response:
        body = await _body(request)
        here, person = self._person(body.get("user"))
        sender = self._sender_for(here)  # before anything is posted: there is no bot to send it to otherwise
        shared = _shared_file(body.get("file"))
        text = _text(body.get("text", "" if shared else None), empty_ok=shared is not None)
        thread_ts = self._existing_thread(here, body.get("thread_ts"))
        mention = f"<@{sender.bot_user_id}>"
        text = self._mention.sub(mention, text)
        if shared is None:
            message = self.slack.add_message(here.channel_id, text, person.id, thread_ts=thread_ts, team=here.team_id)
        else:
            name, mimetype, data = shared
            message = self.slack.share_file(
                here.channel_id, name, data, person.id, text=text, thread_ts=thread_ts, mimetype=mimetype
            )
        ts, files = message["ts"], message.get("files")

        def deliver() -> None:
            where = {"channel": here.channel_id, "user": person.id, "ts": ts, "thread_ts": thread_ts, "files": files}
            if mention not in text:
                self._check(sender.message(text, **where))
                return
            # Slack delivers a mention twice (app_mention, and the message.channels twin); the bot keeps one, so
            # once the mention is taken the twin's fate changes nothing.
            self._check(sender.app_mention(text, **where))
            with contextlib.suppress(BotUnreachable, httpx.HTTPError):
                self._check(sender.message(text, **where))

        try:
            await self._send(deliver)
        except BotUnreachable as exc:
            if not exc.reached:  # the page must not show what the bot never received
                self.slack.remove_message(here.channel_id, ts)
            raise
        return web.json_response({"ok": True, "ts": ts})

    async def _post_command(self, request: web.Request) -> web.Response:
        body = await _body(request)
        here, person = self._person(body.get("user"))
        sender = self._sender_for(here)
        text = _text(body.get("text"), empty_ok=True)
        url = self.slack.response_url(person.id, here.channel_id)

        def deliver() -> None:
            self._check(
                sender.slash_command(
                    "/mm",
                    text,
                    user=person.id,
                    channel=here.channel_id,
                    user_name=person.name,
                    channel_name=here.channel_name,
                    response_url=url,
                )
            )

        await self._send(deliver)
        return web.json_response({"ok": True})

    async def _post_action(self, request: web.Request) -> web.Response:
        body = await _body(request)
        here, person = self._person(body.get("user"))
        sender = self._sender_for(here)
        action_id, block_id, value, label = (_field(body, k) for k in ("action_id", "block_id", "value", "text"))
        if body.get("view"):
            view = self.slack.snapshot(here.channel_id, person.id)["home"]
            if view is None:
                raise PageError("there is no App Home view to click in")

            def click_view() -> None:
                self._check(
                    sender.view_action(
                        action_id,
                        value,
                        user=person.id,
                        view=view,
                        block_id=block_id,
                        text=label,
                        user_name=person.name,
                    )
                )

            await self._send(click_view)
            return web.json_response({"ok": True})
        ts = _field(body, "message_ts")
        message = self.slack.message(here.channel_id, ts)
        if message is None:
            raise PageError(f"there is no message {ts} in #{here.channel_name}")
        url = self.slack.response_url(person.id, here.channel_id)

        def click() -> None:
            self._check(
                sender.block_action(
                    action_id,
                    value,
                    user=person.id,
                    channel=here.channel_id,
                    message_ts=ts,
                    thread_ts=message.get("thread_ts"),
                    message=message,
                    block_id=block_id,
                    text=label,
                    user_name=person.name,
                    response_url=url,
                )
            )

        await self._send(click)
        return web.json_response({"ok": True})

    async def _open_home(self, request: web.Request) -> web.Response:
        here, person = self._person((await _body(request)).get("user"))
        sender = self._sender_for(here)
        # Slack sends the view it last showed that person along with the event.
        shown = self.slack.snapshot(here.channel_id, person.id)["home"]
        await self._send(lambda: self._check(sender.app_home_opened(user=person.id, view=shown)))
        return web.json_response({"ok": True})

    # -- helpers ------------------------------------------------------------------------------------------

    def _person(self, user: object) -> tuple[Workspace, Person]:
        """The person and the workspace they are in."""
        for workspace in self.workspaces:
            found = next((p for p in workspace.people if p.id == user), None)
            if found is not None:
                return workspace, found
        known = ", ".join(p.id for w in self.workspaces for p in w.people)
        raise PageError(f"unknown user {user!r}: pick one of {known}")

    def _sender_for(self, workspace: Workspace) -> SlackEventSender:
        """What sends the bot that workspace's requests: its team's ids and the bot user of the installation there."""
        if workspace.team_id == self.slack.team_id:
            return self._sender
        if workspace.team_id not in self._senders:
            try:
                options = self.slack.sender_options(workspace.team_id)
            except OAuthError:  # the playground installs the app once its bot answers
                raise BotUnreachable(
                    f"the app is not installed in {workspace.name} yet: the playground installs it as soon as the "
                    "bot answers; try again in a moment.",
                    reached=False,
                ) from None
            self._senders[workspace.team_id] = self._sender.for_team(**options)
        return self._senders[workspace.team_id]

    def _existing_thread(self, workspace: Workspace, thread_ts: object) -> str | None:
        if thread_ts in (None, ""):
            return None
        parent = self.slack.message(workspace.channel_id, str(thread_ts))
        if parent is None or parent.get("thread_ts", parent["ts"]) != parent["ts"]:
            raise PageError(f"there is no thread {thread_ts} in #{workspace.channel_name}")
        return str(thread_ts)

    async def _send(self, deliver: Any) -> None:
        def locked() -> None:
            with self._sending:
                try:
                    deliver()
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    raise BotUnreachable(
                        f"the bot did not take it ({type(exc).__name__}: {exc}); is `mm-bot` still starting, or did "
                        "it stop? Its terminal says.",
                        reached=False,
                    ) from None
                except httpx.HTTPError as exc:
                    raise BotUnreachable(
                        f"the bot did not answer in time ({type(exc).__name__}); it may still take it: watch the "
                        "thread before sending it again.",
                        reached=True,
                    ) from None

        await asyncio.to_thread(locked)

    @staticmethod
    def _check(response: httpx.Response) -> None:
        if response.status_code != 200:
            raise BotUnreachable(f"the bot answered HTTP {response.status_code}: {response.text[:300]}", reached=True)


_NO_CACHE = {"Cache-Control": "no-store"}


def _static_text(name: str) -> str:
    return resources.files("playground").joinpath("static", name).read_text(encoding="utf-8")


async def _secure(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(_SECURITY_HEADERS)


def _refuse(status: int, sentence: str) -> web.Response:
    return web.json_response({"ok": False, "error": sentence}, status=status)


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except web.HTTPRequestEntityTooLarge:
        raise FileTooLarge(_too_large(None)) from None
    except ValueError:
        raise PageError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise PageError("the body must be a JSON object")
    return body


def _text(value: object, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or (not value.strip() and not empty_ok):
        raise PageError("the message has no text")
    if len(value) > MAX_TEXT:
        raise PageError(f"the message is longer than Slack allows ({len(value)} > {MAX_TEXT} characters)")
    # Slack's clients escape these three in what they send; the bot reads them back the same way.
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or len(value) > 2000:
        raise PageError(f"{name} must be a string (at most 2,000 characters)")
    return value


# A file's body: base64 (4 characters for 3 bytes) and the message's other fields.
_MESSAGE_BODY = (MAX_FILE + 2) // 3 * 4 + MAX_TEXT * 6 + MAX_BODY


def _too_large(size: int | None) -> str:
    said = f" ({_megabytes(size)})" if size is not None else ""
    return f"the file is too large for the playground{said}: it takes files of at most {_megabytes(MAX_FILE)}"


def _megabytes(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


def _shared_file(value: object) -> tuple[str, str | None, bytes] | None:
    """The page's `file` ({name, mimetype?, data: base64}) checked: its name, its claimed type and its bytes."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PageError("file must be an object: {name, mimetype, data}")
    name, mimetype, data = value.get("name"), value.get("mimetype") or None, value.get("data")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or not name.isprintable():
        raise PageError(f"the file's name must be printable text of 1 to {MAX_NAME} characters")
    if mimetype is not None and (not isinstance(mimetype, str) or not re.fullmatch(r"[\w.+-]+/[\w.+-]+", mimetype)):
        raise PageError("the file's mimetype must look like type/subtype")
    if not isinstance(data, str):
        raise PageError("the file's data must be base64 text")
    if len(data) > (MAX_FILE + 2) // 3 * 4:
        raise FileTooLarge(_too_large(len(data) * 3 // 4))
    try:
        content = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise PageError("the file's data is not base64") from None
    if len(content) > MAX_FILE:
        raise FileTooLarge(_too_large(len(content)))
    return name, mimetype, content


def _picture(data: bytes) -> str | None:
    for magic, kind in _PICTURES.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None
