"""A Slack Web API emulator on 127.0.0.1, with state: behind the playground's page, and in the tests of the bot
and the workers.

    with SlackEmulator() as slack:
        client = slack_sdk.WebClient(token=slack.bot_token, base_url=slack.url)
        client.chat_postMessage(channel="C0TEST", text="hi")
        assert slack.messages("C0TEST")[0]["text"] == "hi"

Methods live at `/api/<method>` and answer Slack's shapes (`{"ok": true, ...}` or `{"ok": false, "error": ...}`,
HTTP 200 either way). Form-encoded, multipart and JSON bodies are accepted; the token comes from
`Authorization: Bearer ...` or a `token` parameter. Every call is recorded (`calls`, `calls_to(method)`).
`fail()` and `rate_limit()` make a method misbehave a number of times; `hold()` keeps its calls waiting until
`release()` (a test's deterministic window: `wait_for_held()` says when the call it waits for is there).
`on_change(listener)` calls the listener (from the server's thread) after every call that changed what a
person would see; `version` counts them.

Messages and views are held to Slack's limits (playground/slack_checks.py: every block and view is parsed with
slack_sdk's models, which check Slack's documented limits): blocks Slack refuses (more than 50 in a message, an
unknown type, a section's text over 3,000 characters, a header's over 150, …) are `invalid_blocks` (with
Slack's `[ERROR] …` lines), a view Slack refuses is `invalid_arguments`; `markdown_text` with `text` or
`blocks` is `markdown_text_conflict`, `markdown_text` over 12,000 characters (in a post, an edit or a stream's
call) is `msg_too_long`; a message's text over 40,000 characters (4,000 for chat.update) is
`msg_too_long`; chat.update refuses a message that is still streaming (`streaming_state_conflict`). The bot
posts only in channels the emulator knows (`channel_not_found` otherwise): `add_channel` seeds one, and a
person's message or event (`add_message`, `push_*`, `response_url(user, channel)`) makes its channel.
conversations.open makes a person's DM with the bot (`user_not_found` for a person it does not know), where
the bot may then post and upload. chat.startStream outside a DM requires `recipient_user_id` and
`recipient_team_id`, as Slack does (`strict_streaming=False` lifts it, for a test that says why). A call of a
method the emulator does not know answers `unknown_method` and is remembered
(`SlackEmulator.take_unknown_methods()`): the test kit fails the test that made it.

Several workspaces and an org, with Slack's OAuth v2 (playground/slack_oauth.py holds the rules):
`add_team(team_id, name, enterprise_id=…)` adds a workspace (in an Enterprise Grid org); channels belong to a team
(`add_channel(…, team=)`, a person's message or event in another team's channel: `team=`). A token belongs to an
installation: of one team, or org-wide (every team of its org); a channel its installation does not reach is
`channel_not_found` to it, and auth.test answers for its own team or org. The constructor's team and token stay
the default ones. `GET /oauth/v2/authorize` (`authorize_url`) is the page a person installs the app from: a
test adds the person's choice with `approve_url(url, team=…)` (or `enterprise=…`, or `deny=True`) and gets the
302 to the bot's redirect URI with `code` and `state`; `oauth.v2.access` (no token: the app's `client_id` and
`client_secret`) exchanges the code (once, within ten minutes) for the installation's token, or with
`token_rotation` a refresh token for a new pair (access tokens then expire after `token_lifetime` seconds:
`token_expired`; `expire(token)` and `advance(seconds)` make it happen now). `install(team=…)` installs without
the page. `uninstall(team_or_enterprise)` (and apps.uninstall) revokes an installation's tokens and gives the
`tokens_revoked` and `app_uninstalled` bodies Slack then sends; auth.revoke revokes one token. Each call records
its token (`call.token`, `tokens_used()`, `calls_with(token)`), and `installation_of(token)` says whose it is.

Socket Mode, on Slack's wire protocol: `apps.connections.open` (app-level token only) answers a
`ws://…/socket?ticket=…` URL on this server; on connect the socket says `hello`; the test then pushes envelopes
(`push_app_mention`, `push_block_action`, `push_slash_command`, or `push(type, payload)`), waits for the app's
ack with `wait_for_ack(envelope_id)`, and asks for a reconnection with `disconnect()`:

    envelope_id = slack.push_slash_command("/mm", "help", user="U0ALICE", channel="C0TEST")
    assert slack.wait_for_ack(envelope_id) == {"envelope_id": envelope_id}
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import mimetypes
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import WSCloseCode, WSMsgType, web

from playground import slack_checks, slack_oauth
from playground.errors import PlaygroundError
from playground.server_thread import ThreadedAiohttpServer
from playground.signed import SlackEventSender
from playground.slack_oauth import AppInstall, OAuthError, Team, Uninstalled

log = logging.getLogger("mm.playground.slack")

Params = dict[str, Any]
# Parameters that form-encoded callers send as JSON text; decoded so state holds one shape.
_JSON_PARAMS = {"blocks", "attachments", "files", "chunks", "metadata", "view", "loading_messages", "prompts"}
SOCKET_PATH = "/socket"
# Methods that only read: a call to one of them changes nothing a person sees.
READ_ONLY = frozenset(
    {
        "auth.test",
        "chat.getPermalink",
        "conversations.replies",
        "conversations.history",
        "conversations.info",
        "users.info",
        "usergroups.users.list",
        "files.info",
        "files.getUploadURLExternal",
        "apps.connections.open",
    }
)
# What a download without the token ends on, after Slack's redirect: its login page, answered 200.
LOGIN_PAGE = "<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in to your workspace</body></html>"
# The one method an app-level token may call, and the one a bot token may not (Slack: not_allowed_token_type).
CONNECTIONS_OPEN = "apps.connections.open"
AUTHORIZE_PATH = "/oauth/v2/authorize"


UNKNOWN_METHOD = "unknown_method"

# hold(method + ANSWER): the call is carried out, its answer held; hold(RESPONSE_URL): answers to response URLs.
ANSWER = ":answer"
RESPONSE_URL = "response_url"


class SlackError(PlaygroundError):
    """Raised by a method handler: answered as `{"ok": false, "error": <error>}`."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


@dataclass
class SlackCall:
    """One recorded Web API call; `response` is the JSON answered, `status` its HTTP status, `token` the token it
    came with (None without one: oauth.v2.access authenticates with the app's client id and secret)."""

    method: str
    params: Params
    headers: dict[str, str]
    time: float
    status: int = 200
    response: dict[str, Any] = field(default_factory=dict)
    token: str | None = None


@dataclass
class _Calling:
    """The call being answered: whose token it came with."""

    installation: AppInstall | None
    token: str | None
    authorization: str


@dataclass
class _Injected:
    times: int
    error: str | None = None  # ok:false with this error
    retry_after: int | None = None  # HTTP 429 with this Retry-After


class SlackEmulator(ThreadedAiohttpServer):
    """Stateful Slack Web API emulator. `url` ends with `/api/` (pass it as slack_sdk's `base_url`).

    State a test can read: `messages(channel, thread_ts=None)`, `message(channel, ts)`, `ephemerals`,
    `statuses` ({(channel, thread_ts): [status, ...]}), `suggested_prompts` ({(channel, thread_ts): prompts}),
    `views` (published/opened views), `uploads` ({file_id: bytes}), `responses` (bodies POSTed to
    `response_url()` URLs), `downloads` (of files people shared with `share_file`: (file id, whether the bot
    token came)).
    """

    # Methods called that no emulator knows, across every emulator of this process (the tests' emulators all
    # run in it, on threads): `take_unknown_methods()` reads them, and the test kit fails a test that made one.
    _unknown: list[str] = []  # noqa: RUF012 - shared on purpose
    _unknown_lock = threading.Lock()

    @classmethod
    def take_unknown_methods(cls) -> list[str]:
        """The methods answered `unknown_method` since the last call, oldest first; forgets them."""
        with cls._unknown_lock:
            taken, cls._unknown[:] = list(cls._unknown), []
        return taken

    def __init__(
        self,
        bot_token: str = "xoxb-test-token",
        team_id: str = "T0TESTTEAM",
        team_name: str = "Test Team",
        bot_user_id: str = "U0BOT",
        bot_id: str = "B0BOT",
        app_id: str = "A0TESTAPP",
        bot_name: str = "mm",
        app_token: str = "xapp-1-A0TESTAPP-1-test",
        strict_streaming: bool = True,
        history: int | None = None,
        client_id: str = slack_oauth.CLIENT_ID,
        client_secret: str = slack_oauth.CLIENT_SECRET,
        token_rotation: bool = False,
        token_lifetime: int = slack_oauth.TOKEN_LIFETIME,
    ) -> None:
        super().__init__()
        self.strict_streaming = strict_streaming
        # Calls recorded, at most (the newest): a playground left open for days must not keep them all.
        self.history = history
        self.bot_token, self.team_id, self.team_name = bot_token, team_id, team_name
        self.bot_user_id, self.bot_id, self.app_id, self.bot_name = bot_user_id, bot_id, app_id, bot_name
        self.app_token = app_token
        self._skew = 0.0  # advance(): how far the emulator's clock is ahead, for codes' and tokens' expiry
        # Teams, orgs, installations and their tokens: the default team and its token are seeded by reset().
        self.oauth = slack_oauth.Installations(
            app_id=app_id,
            client_id=client_id,
            client_secret=client_secret,
            token_rotation=token_rotation,
            token_lifetime=token_lifetime,
            clock=lambda: time.time() + self._skew,
        )
        self._calling: _Calling | None = None
        self._lock = threading.RLock()
        self.version = 0
        self._listeners: list[Callable[[int], None]] = []
        self._changed = threading.Condition(self._lock)  # a socket connected or closed, an ack arrived
        self._sockets: list[web.WebSocketResponse] = []  # live Socket Mode connections, oldest first
        # Socket Mode payloads are the HTTP bodies, so the signed-request client builds them (never sending).
        self._payloads = _PayloadBuilder(
            "http://127.0.0.1:9",
            "",
            team_id=team_id,
            api_app_id=app_id,
            bot_user_id=bot_user_id,
            response_url=self.response_url,
        )
        self._payloads.close()  # its HTTP client is never used
        self._pushed_by: SlackEventSender = self._payloads
        self._methods: dict[str, Callable[[Params], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.delete": self._delete,
            "chat.getPermalink": self._permalink,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
            "reactions.add": self._reaction_add,
            "reactions.remove": self._reaction_remove,
            "conversations.replies": self._replies,
            "conversations.history": self._history,
            "conversations.info": self._conversation_info,
            "conversations.open": self._conversations_open,
            "users.info": self._user_info,
            "usergroups.users.list": self._usergroup_users,
            "assistant.threads.setStatus": self._set_status,
            "assistant.threads.setSuggestedPrompts": self._set_suggested_prompts,
            "views.publish": self._views_publish,
            "views.open": self._views_open,
            "views.update": self._views_update,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
            "files.info": self._file_info,
            CONNECTIONS_OPEN: self._connections_open,
            "oauth.v2.access": self._oauth_access,
            "apps.uninstall": self._apps_uninstall,
            "auth.revoke": self._auth_revoke,
        }
        self.reset()

    @property
    def url(self) -> str:
        return f"{self.base}/api/"

    @property
    def authorize_url(self) -> str:
        """The authorize page (bolt's `OAuthSettings(authorization_url=…)`)."""
        return f"{self.base}{AUTHORIZE_PATH}"

    @property
    def client_id(self) -> str:
        return self.oauth.client_id

    @property
    def client_secret(self) -> str:
        return self.oauth.client_secret

    @property
    def token_rotation(self) -> bool:
        """Whether oauth.v2.access answers expiring tokens and refresh tokens (those issued from then on)."""
        return self.oauth.token_rotation

    @token_rotation.setter
    def token_rotation(self, value: bool) -> None:
        with self._lock:
            self.oauth.token_rotation = value

    @property
    def token_lifetime(self) -> int:
        """Seconds a rotating access token lasts (those issued from then on)."""
        return self.oauth.token_lifetime

    @token_lifetime.setter
    def token_lifetime(self, seconds: int) -> None:
        with self._lock:
            self.oauth.token_lifetime = seconds

    @property
    def tokens(self) -> set[str]:
        """The bot tokens a call may use now: issued, not expired, not revoked."""
        with self._lock:
            return self.oauth.live_tokens()

    @property
    def teams(self) -> dict[str, Team]:
        with self._lock:
            return dict(self.oauth.teams)

    @property
    def methods(self) -> list[str]:
        """The Web API methods it answers (`fail` or `rate_limit` each to take Slack away)."""
        return sorted(self._methods)

    # -- seeding and inspection -----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget all state and recorded calls, the added teams and installations too; re-seed the default team,
        its installation (the bot token) and the bot user. Held calls go through."""
        for method in list(getattr(self, "_holds", {})):
            self.release(method)
        with self._lock:
            self.calls: list[SlackCall] = []
            self.users: dict[str, dict[str, Any]] = {}
            self.channels: dict[str, dict[str, Any]] = {}
            self.usergroups: dict[str, dict[str, Any]] = {}
            self._opened: dict[frozenset[str], str] = {}  # conversations.open: the people → their DM's id
            self._messages: dict[str, list[dict[str, Any]]] = {}
            self.ephemerals: list[dict[str, Any]] = []
            self.statuses: dict[tuple[str, str], list[str]] = {}
            self.suggested_prompts: dict[tuple[str, str], list[dict[str, str]]] = {}
            self.views: list[dict[str, Any]] = []
            self.uploads: dict[str, bytes] = {}
            self.files: dict[str, dict[str, Any]] = {}
            self.shared: dict[str, bytes] = {}  # the bytes of files people shared (share_file), by file id
            self.file_redirects: dict[str, str] = {}  # a shared file whose download answers a redirect there
            self.downloads: list[tuple[str, bool]] = []  # (file id, whether the bot token came) per download
            self.responses: list[dict[str, Any]] = []
            self._answering: dict[str, tuple[str, str]] = {}  # response_url → (person, channel)
            self._injected: dict[str, list[_Injected]] = {}
            self._holds: dict[str, asyncio.Event] = {}
            self._waiting: dict[str, int] = {}  # calls held now, by method
            self._last_ts_us = 0
            self._ids = itertools.count(1)
            self._tickets: set[str] = set()
            self.socket_connections = 0  # Socket Mode connections accepted (a reconnection makes it 2)
            self.acks: list[dict[str, Any]] = []  # what the app sent back over the sockets, in order
            self._builders: dict[str, SlackEventSender] = {}  # push_*'s payloads for the other teams
            self.oauth.reset()
            self.oauth.add_team(self.team_id, self.team_name)
            self.oauth.seed(self.bot_token, self.team_id, self.bot_user_id, self.bot_id)
            self.add_user(self.bot_user_id, self.bot_name, is_bot=True)

    # -- teams, installations, tokens ----------------------------------------------------------------------

    def add_team(
        self, team_id: str, name: str, *, enterprise_id: str | None = None, enterprise_name: str | None = None
    ) -> Team:
        """Add a workspace (`T…`), in an Enterprise Grid org (`E…`, named by the first of its teams) when
        `enterprise_id` is given. The app is not installed there until a test installs it."""
        with self._lock:
            return self.oauth.add_team(team_id, name, enterprise_id=enterprise_id, enterprise_name=enterprise_name)

    def approve_url(
        self,
        authorize_url: str,
        team: str | None = None,
        enterprise: str | None = None,
        *,
        user: str | None = None,
        deny: bool = False,
    ) -> str:
        """The bot's authorize URL with a person's choice: install in `team`, or org-wide in `enterprise` (as its
        admin), as `user`; or `deny`. Its GET answers 302 to the redirect URI with `code` and `state` (or
        `error=access_denied`): follow it to the bot's OAuth redirect endpoint."""
        return slack_oauth.approve_url(authorize_url, team, enterprise, user=user, deny=deny)

    def install(
        self,
        team: str | None = None,
        enterprise: str | None = None,
        *,
        scopes: tuple[str, ...] = ("chat:write",),
        user: str | None = None,
    ) -> dict[str, Any]:
        """Install the app in `team` (or org-wide in `enterprise`) without the page: oauth.v2.access's answer,
        its token ready (not recorded as a call: the bot made none)."""
        with self._lock:
            answer = self.oauth.install(team or (None if enterprise else self.team_id), enterprise, scopes, user)
            self._seed_bot(answer["access_token"])
        return {"ok": True} | answer

    def uninstall(self, team_or_enterprise: str) -> Uninstalled:
        """The app removed from a team (`T…`) or, org-wide, from an org (`E…`): its tokens revoked (a call with
        one answers `account_inactive`). Returns what Slack then sends the app, for the test to send the bot:
        `tokens_revoked`, then `app_uninstalled`."""
        with self._lock:
            return self.oauth.uninstall(team_or_enterprise)

    @property
    def uninstalls(self) -> list[Uninstalled]:
        """Every uninstall so far (the bot's apps.uninstall calls too), oldest first."""
        with self._lock:
            return list(self.oauth.uninstalls)

    def expire(self, token: str) -> None:
        """Make an access token expired now: a call with it answers `token_expired` (its refresh token works)."""
        with self._lock:
            self.oauth.expire(token)

    def advance(self, seconds: float) -> None:
        """Move the emulator's clock forward: codes and rotating tokens expire by it."""
        with self._lock:
            self._skew += seconds

    def installation_of(self, token: str) -> AppInstall | None:
        """The installation `token` was issued to (a copy: `team_id`, `enterprise_id`, `is_enterprise_install`,
        `bot_user_id`, `installed`), None for a token never issued."""
        with self._lock:
            return self.oauth.installation_of(token)

    def sender_options(self, team_id: str | None = None) -> dict[str, Any]:
        """A workspace's fields for a SlackEventSender (its constructor's or `for_team`'s keywords): its team, org,
        and the installation that reaches it (its own, else its org's org-wide one) with its bot user."""
        with self._lock:
            return self.oauth.sender_options(team_id or self.team_id)

    def tokens_used(self, method: str | None = None) -> list[str]:
        """The tokens of the recorded calls (of `method`), in order; calls without a token left out."""
        with self._lock:
            return [c.token for c in self.calls if c.token and (method is None or c.method == method)]

    def calls_with(self, token: str) -> list[SlackCall]:
        with self._lock:
            return [call for call in self.calls if call.token == token]

    def _me(self) -> AppInstall:
        """The installation whose token the call being answered came with (the default one outside a call)."""
        calling = self._calling.installation if self._calling is not None else None
        return calling or self.oauth.installs[self.team_id]

    def _seed_bot(self, token: str) -> None:
        """An installation's bot user, for users.info."""
        installation = self.oauth.installation_of(token)
        if installation is not None and installation.bot_user_id not in self.users:
            team = installation.team_id or installation.enterprise_id
            self.add_user(installation.bot_user_id, self.bot_name, is_bot=True, team=team)
            self.users[installation.bot_user_id]["profile"]["bot_id"] = installation.bot_id

    def add_user(
        self,
        user_id: str,
        name: str,
        *,
        real_name: str | None = None,
        is_admin: bool = False,
        is_bot: bool = False,
        tz: str = "Europe/Paris",
        email: str | None = None,
        team: str | None = None,
    ) -> dict[str, Any]:
        """Seed a user that users.info returns (of `team`: the default one unless told)."""
        real = real_name or name.title()
        profile = {"real_name": real, "display_name": name, "email": email or f"{name}@example.com"}
        user = {
            "id": user_id,
            "team_id": team or self.team_id,
            "name": name,
            "deleted": False,
            "real_name": real,
            "tz": tz,
            "tz_offset": 3600,
            "is_admin": is_admin,
            "is_owner": False,
            "is_bot": is_bot,
            "is_app_user": False,
            "profile": profile,
        }
        if is_bot:
            profile["bot_id"] = self.bot_id
        with self._lock:
            self.users[user_id] = user
        return user

    def add_channel(
        self, channel_id: str, name: str, *, is_private: bool = False, team: str | None = None
    ) -> dict[str, Any]:
        """Seed a channel of `team` (the default one unless told): the bot may post there with a token that reaches
        that team, and conversations.info returns it (a seeded message or event from a person makes its channel
        too; a post to any other is channel_not_found, as in Slack)."""
        with self._lock:
            team_id = self.oauth.team(team or self.team_id).id
        channel = {
            "id": channel_id,
            "name": name,
            "is_channel": not is_private,
            "is_group": is_private,
            "is_im": channel_id.startswith("D"),
            "is_private": is_private,
            "is_archived": False,
            "is_member": True,
            "created": 1700000000,
            "creator": self.bot_user_id,
            "context_team_id": team_id,
        }
        with self._lock:
            self.channels[channel_id] = channel
        return channel

    def add_usergroup(self, group_id: str, handle: str, users: list[str]) -> dict[str, Any]:
        """Seed a user group (`S...`) that usergroups.users.list returns."""
        group = {"id": group_id, "team_id": self.team_id, "handle": handle, "name": handle, "users": list(users)}
        with self._lock:
            self.usergroups[group_id] = group
        return group

    def add_message(
        self, channel: str, text: str, user: str, *, thread_ts: str | None = None, team: str | None = None
    ) -> dict[str, Any]:
        """Seed a message from a person (as if typed in Slack; in `team`, the default one unless told); returns it,
        with its ts."""
        message = {
            "type": "message",
            "user": user,
            "text": text,
            "team": team or self.team_id,
            "client_msg_id": f"00000000-0000-4000-8000-{next(self._ids):012d}",
        }
        with self._lock:
            self._seen(channel, team)
            stored = self._store(channel, message, thread_ts)
        self._touch()
        return stored

    def _seen(self, channel: str, team: str | None = None) -> None:
        """A channel a person wrote in (a seeded message or event, in `team`): there, as it could only come from
        one, and of that team."""
        with self._lock:
            if channel not in self.channels:
                self.add_channel(channel, channel.lower(), team=team)

    def share_file(
        self,
        channel: str,
        name: str,
        data: bytes,
        user: str,
        *,
        text: str = "",
        thread_ts: str | None = None,
        mimetype: str | None = None,
        size: int | None = None,
        redirect_to: str | None = None,
    ) -> dict[str, Any]:
        """Seed a message from a person sharing a file (Slack's `file_share`); returns it, its `files` as Slack
        describes them. The file's `url_private_download` is served here, to the bot token only (without it,
        Slack's redirect to its login page); `size` says another size than the data's (as a person's client may
        not), `redirect_to` makes the download a redirect there."""
        with self._lock:
            file_id = f"F{next(self._ids):010d}"
            key = f"{self.team_id}-{file_id}"
            file = {
                "id": file_id,
                "created": int(time.time()),
                "timestamp": int(time.time()),
                "name": name,
                "title": name,
                "mimetype": mimetype or mimetypes.guess_type(name)[0] or "text/plain",
                "filetype": name.rpartition(".")[2] if "." in name else "text",
                "user": user,
                "size": len(data) if size is None else size,
                "mode": "hosted",
                "is_external": False,
                "url_private": f"{self.base}/files-pri/{key}/{quote(name, safe='')}",
                "url_private_download": f"{self.base}/files-pri/{key}/download/{quote(name, safe='')}",
                "permalink": f"https://{self.domain}.slack.com/files/{user}/{file_id}/{quote(name, safe='')}",
            }
            self.files[file_id] = file
            self.shared[file_id] = data
            if redirect_to is not None:
                self.file_redirects[file_id] = redirect_to
            message = {
                "type": "message",
                "subtype": "file_share",
                "user": user,
                "text": text,
                "team": self.team_id,
                "files": [file],
                "upload": False,
                "client_msg_id": f"00000000-0000-4000-8000-{next(self._ids):012d}",
            }
            self._seen(channel)
            stored = self._store(channel, message, thread_ts)
        self._touch()
        return stored

    def file_content(self, file_id: str) -> bytes | None:
        """The bytes of a file a person shared or the bot uploaded (None for an unknown id): what Slack's
        client shows of it (its thumbnail)."""
        with self._lock:
            return self.shared.get(file_id, self.uploads.get(file_id))

    def on_change(self, listener: Callable[[int], None]) -> None:
        """Call `listener(version)` after each change; it runs on the server's thread, so it must be quick."""
        with self._lock:
            self._listeners.append(listener)

    def _touch(self) -> None:
        with self._lock:
            self.version += 1
            version, listeners = self.version, list(self._listeners)
        for listener in listeners:
            try:
                listener(version)
            except Exception:  # a listener's trouble is not the caller's: the change is made
                log.exception("a change listener of the Slack emulator failed")

    def remove_message(self, channel: str, ts: str) -> None:
        """Take a message away (a person's too, with the files it shared), as if it had never been posted."""
        with self._lock:
            message = self._find(channel, ts)
            if message is None:
                return
            self._messages[channel].remove(message)
            self._uncount(channel, message)
            for file in message.get("files") or []:  # a person's shared file goes with its message
                if self.shared.pop(file.get("id"), None) is not None:
                    self.files.pop(file["id"], None)
        self._touch()

    def _uncount(self, channel: str, message: dict[str, Any]) -> None:
        thread_ts = message.get("thread_ts")
        parent = self._find(channel, thread_ts) if thread_ts and thread_ts != message["ts"] else None
        if parent is not None:  # Slack counts the replies that are still there
            parent["reply_count"] = max(0, parent.get("reply_count", 1) - 1)

    def messages(self, channel: str, thread_ts: str | None = None) -> list[dict[str, Any]]:
        """A thread's messages, parent first (thread_ts given), or the channel's top-level messages, oldest first."""
        with self._lock:
            stored = self._messages.get(channel, [])
            if thread_ts is None:
                chosen = [m for m in stored if m.get("thread_ts", m["ts"]) == m["ts"]]
            else:
                chosen = [m for m in stored if m["ts"] == thread_ts or m.get("thread_ts") == thread_ts]
            return json.loads(json.dumps(chosen))  # copies: the server thread keeps mutating its own

    def message(self, channel: str, ts: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._find(channel, ts)
            return json.loads(json.dumps(found)) if found else None

    def calls_to(self, method: str) -> list[SlackCall]:
        with self._lock:
            return [call for call in self.calls if call.method == method]

    def fail(self, method: str, error: str, times: int = 1) -> None:
        """Make `method` answer `{"ok": false, "error": error}` for its next `times` calls."""
        with self._lock:
            self._injected.setdefault(method, []).append(_Injected(times, error=error))

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        """Make `method` answer HTTP 429 with `Retry-After: retry_after` for its next `times` calls."""
        with self._lock:
            self._injected.setdefault(method, []).append(_Injected(times, retry_after=retry_after))

    def hold(self, method: str) -> None:
        """Keep every call of `method` waiting, unanswered and not carried out, until `release(method)`: as if it
        were still on its way to Slack. A call whose caller is gone by then (its connection closed: a process
        killed while it waited) is dropped, never carried out, as a request that never reached Slack.

        `method + ANSWER` holds the answer instead: the call is carried out (what it posts is there), and its
        caller waits for Slack's answer (a process killed then did what it asked without knowing it).
        RESPONSE_URL holds the answers posted to response URLs, as a method's calls."""
        with self._lock:
            self._holds.setdefault(method, asyncio.Event())

    def release(self, method: str) -> None:
        """Let the held calls of `method` through (those whose caller is still there), and the next ones."""
        with self._lock:
            event = self._holds.pop(method, None)
        if event is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(event.set)

    def wait_for_held(self, method: str, count: int = 1, timeout: float = 10) -> None:
        """Until `count` calls of `method` are held."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._waiting.get(method, 0) >= count, timeout):
                raise TimeoutError(f"{self._waiting.get(method, 0)} call(s) of {method} held, not {count}")

    async def _held(self, method: str, request: web.Request) -> bool:
        """Wait while `method` is held; False when the caller went away meanwhile."""
        with self._changed:
            event = self._holds.get(method)
            if event is None:
                return True
            self._waiting[method] = self._waiting.get(method, 0) + 1
            self._changed.notify_all()
        try:
            await event.wait()
        finally:
            with self._changed:
                self._waiting[method] -= 1
                self._changed.notify_all()
        return request.transport is not None and not request.transport.is_closing()

    def response_url(self, user: str | None = None, channel: str | None = None) -> str:
        """A response_url on this emulator; what the bot POSTs there lands in `responses`. Given the person and
        the channel it answers (as Slack knows them), an answer is also shown as Slack shows it: an ephemeral
        for that person, or with `"response_type": "in_channel"` a message in the channel."""
        url = f"{self.base}/response-url/{self.team_id}/{next(self._ids)}"
        if user is not None and channel is not None:
            self._seen(channel)
            with self._lock:
                self._answering[url] = (user, channel)
                if self.history is not None and len(self._answering) > 2 * self.history:
                    for old in list(self._answering)[: -self.history]:  # Slack's expire after 30 minutes
                        del self._answering[old]
        return url

    def snapshot(self, channel: str, user: str) -> dict[str, Any]:
        """What `user` sees of `channel`, read at once (copies): `version`, `messages` (thread replies included,
        oldest first), `ephemerals` sent to them there, `statuses` (each thread's latest assistant status) and
        `home` (the App Home view last published for them, or None)."""
        with self._lock:
            homes = [v for v in self.views if v.get("type") == "home" and v.get("user_id") == user]
            seen = {
                "version": self.version,
                "messages": self._messages.get(channel, []),
                "ephemerals": [e for e in self.ephemerals if e.get("to_user") == user and e.get("channel") == channel],
                "statuses": {thread: said[-1] for (where, thread), said in self.statuses.items() if where == channel},
                "home": homes[-1] if homes else None,
            }
            return json.loads(json.dumps(seen))

    # -- HTTP -----------------------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post("/upload/v1/{file_id}", self._upload)
        app.router.add_get("/files-pri/{key}/download/{name:.+}", self._download)
        app.router.add_get("/files-pri/{key}/{name:.+}", self._download)
        app.router.add_get("/login", self._login)
        app.router.add_get(AUTHORIZE_PATH, self._authorize_page)
        app.router.add_post("/response-url/{team}/{n}", self._response_url_post)
        app.router.add_get(SOCKET_PATH, self._socket)
        app.on_shutdown.append(self._close_sockets)
        return app

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        try:
            params = await _read_params(request)
        except ValueError:
            params = None
        if not await self._held(method, request):
            return web.Response(status=503, text="the caller went away")  # nobody reads it
        call = SlackCall(method, params or {}, dict(request.headers), time.time())
        call.token = _token(params, request.headers)
        with self._lock:
            self.calls.append(call)
            if self.history is not None and len(self.calls) > 2 * self.history:
                del self.calls[: -self.history]  # trimmed in halves: appending stays cheap
            if params is None:
                call.status, call.response, headers = 200, {"ok": False, "error": "invalid_json"}, {}
            else:
                call.status, call.response, headers = self._answer(method, params, request.headers)
        if call.response.get("ok") and method not in READ_ONLY:
            self._touch()
        await self._held(method + ANSWER, request)
        return web.json_response(call.response, status=call.status, headers=headers)

    def _answer(self, method: str, params: Params, headers: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        token = _token(params, headers)
        if method not in self._methods:
            # Logged too: an emulator in another process (the playground's) is checked through its log.
            log.warning("%s: %s (a method Slack has not, or one the emulator lacks)", UNKNOWN_METHOD, method)
            with self._unknown_lock:
                self._unknown.append(method)
            return 200, {"ok": False, "error": UNKNOWN_METHOD}, {}
        installation = None
        if method not in slack_oauth.TOKENLESS:
            if not token:
                return 200, {"ok": False, "error": "not_authed"}, {}
            if token != self.app_token:
                try:
                    installation = self.oauth.check(token)
                except OAuthError as exc:  # unknown, expired, revoked
                    return 200, {"ok": False, "error": exc.error}, {}
            if (token == self.app_token) != (method == CONNECTIONS_OPEN):
                return 200, {"ok": False, "error": "not_allowed_token_type"}, {}
        queue = self._injected.get(method)
        if queue:
            injected = queue[0]
            injected.times -= 1
            if injected.times <= 0:
                queue.pop(0)
            if injected.retry_after is not None:
                return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(injected.retry_after)}
            return 200, {"ok": False, "error": injected.error}, {}
        self._calling = _Calling(installation, token, headers.get("Authorization", ""))
        try:
            if installation is not None:
                self._check_reach(installation, params)
            return 200, {"ok": True} | self._methods[method](params), _scopes(installation)
        except SlackError as exc:
            return 200, {"ok": False, "error": exc.error} | exc.extra, {}
        except OAuthError as exc:
            return 200, {"ok": False, "error": exc.error}, {}
        finally:
            self._calling = None

    def _check_reach(self, installation: AppInstall, params: Params) -> None:
        """Slack answers channel_not_found for a channel of a team the token's installation does not reach."""
        named = [params.get("channel"), params.get("channel_id"), *str(params.get("channels") or "").split(",")]
        for channel in named:
            known = self.channels.get(str(channel)) if channel else None
            if known is not None and not self.oauth.covers(installation, known["context_team_id"]):
                raise SlackError("channel_not_found")

    async def _authorize_page(self, request: web.Request) -> web.Response:
        with self._lock:
            page = self.oauth.authorize(dict(request.query), str(request.url))
        if page.location is not None:
            return web.Response(status=302, headers={"Location": page.location})
        return web.Response(status=page.status, text=page.html, content_type="text/html")

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        data = await request.read()
        with self._lock:
            if file_id not in self.files:
                return web.Response(status=404, text="unknown upload url")
            self.uploads[file_id] = data
        return web.Response(text=f"OK - {len(data)}")

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """A shared file's bytes, as files.slack.com serves them: to a token of the app only; without one, a
        redirect to the login page (Slack's answer, not an error status)."""
        file_id = request.match_info["key"].rpartition("-")[2]
        auth = request.headers.get("Authorization", "")
        authorized = auth.startswith("Bearer ") and auth.removeprefix("Bearer ") in self.tokens  # live ones only
        with self._lock:
            self.downloads.append((file_id, authorized))
            data, file = self.shared.get(file_id), self.files.get(file_id)
            redirect = self.file_redirects.get(file_id)
        if not authorized:
            raise web.HTTPFound(f"{self.base}/login?redir={quote(request.path, safe='')}")
        if data is None or file is None:
            return web.Response(status=404, text="file not found")
        if redirect is not None:
            raise web.HTTPFound(redirect)
        return web.Response(body=data, content_type=file["mimetype"])

    async def _login(self, request: web.Request) -> web.Response:
        return web.Response(text=LOGIN_PAGE, content_type="text/html")

    async def _response_url_post(self, request: web.Request) -> web.Response:
        if not await self._held(RESPONSE_URL, request):
            return web.Response(status=503, text="the caller went away")  # nobody reads it
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        with self._lock:
            self.responses.append({"url": str(request.url), "body": body})
            if self.history is not None and len(self.responses) > 2 * self.history:
                del self.responses[: -self.history]
            answering = self._answering.get(str(request.url))
            if answering is not None and isinstance(body, dict):
                user, channel = answering
                shown = self._bot_message(body)
                if body.get("response_type") == "in_channel":
                    self._store(channel, shown, None)
                else:
                    self.ephemerals.append(shown | {"channel": channel, "to_user": user, "ts": self._new_ts()})
        self._touch()
        return web.Response(text="ok")

    # -- Socket Mode ----------------------------------------------------------------------------------------

    def push(
        self,
        type: str,
        payload: dict[str, Any],
        *,
        envelope_id: str | None = None,
        accepts_response_payload: bool | None = None,
        timeout: float = 10,
    ) -> str:
        """Send an envelope (`events_api`, `interactive`, `slash_commands`) on the newest live connection, as
        Slack does with one of an app's connections; returns its envelope_id. Waits up to `timeout` for one."""
        envelope_id = envelope_id or str(uuid.uuid4())
        if accepts_response_payload is None:
            # Slack lets slash commands (and some interactions) answer in the ack; events never.
            accepts_response_payload = type == "slash_commands"
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": type,
            "accepts_response_payload": accepts_response_payload,
        }
        if type == "events_api":
            envelope |= {"retry_attempt": 0, "retry_reason": ""}
        self._send_socket(envelope, timeout)
        return envelope_id

    @property
    def last_pushed_payload(self) -> Any:
        """The Events API body of the last push_app_mention / push_message: push it again to redeliver it."""
        return self._pushed_by.last_payload

    def _builder(self, team: str | None) -> SlackEventSender:
        """The payloads of `team` (the default one: None), as Slack sends them for the installation reaching it;
        their ids continue the default team's, so they stay unique to a bot that dedupes them."""
        if team is None or team == self.team_id:
            self._pushed_by = self._payloads
        else:
            with self._lock:
                if team not in self._builders:
                    self._builders[team] = self._payloads.for_team(**self.sender_options(team))
                self._pushed_by = self._builders[team]
        return self._pushed_by

    def push_app_mention(
        self, text: str, *, channel: str, user: str, thread_ts: str | None = None, team: str | None = None
    ) -> str:
        """An `events_api` envelope around an app_mention event_callback (the Events API body), in `team`."""
        self._seen(channel, team)
        builder = self._builder(team)
        builder.app_mention(text, channel=channel, user=user, thread_ts=thread_ts)
        return self.push("events_api", builder.last_payload)

    def push_message(
        self,
        text: str,
        *,
        channel: str,
        user: str,
        thread_ts: str | None = None,
        channel_type: str = "channel",
        team: str | None = None,
    ) -> str:
        self._seen(channel, team)
        builder = self._builder(team)
        builder.message(text, channel=channel, user=user, thread_ts=thread_ts, channel_type=channel_type)
        return self.push("events_api", builder.last_payload)

    def push_block_action(
        self,
        action_id: str,
        value: str,
        *,
        user: str,
        channel: str,
        message_ts: str | None = None,
        team: str | None = None,
    ) -> str:
        """An `interactive` envelope around a block_actions payload (a button click), in `team`."""
        ts = message_ts or self._payloads.new_ts()
        self._seen(channel, team)
        builder = self._builder(team)
        builder.block_action(action_id, value, user=user, channel=channel, message_ts=ts)
        return self.push("interactive", builder.last_payload)

    def push_slash_command(self, command: str, text: str, *, user: str, channel: str, team: str | None = None) -> str:
        """A `slash_commands` envelope: its payload is the command's fields, as the HTTP form has them."""
        self._seen(channel, team)
        builder = self._builder(team)
        builder.slash_command(command, text, user=user, channel=channel)
        return self.push("slash_commands", builder.last_payload)

    def push_raw(self, text: str, timeout: float = 10) -> None:
        """Send `text` as it is on the newest connection: what Slack never sends (not JSON, not an envelope)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._sockets, timeout):
                raise TimeoutError(f"no Socket Mode connection within {timeout}s")
            ws = self._sockets[-1]
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(ws.send_str(text), self._loop).result(timeout)

    def disconnect(self, reason: str = "refresh_requested", timeout: float = 10) -> None:
        """Tell the newest connection to go away; slack_sdk's clients then open a new one (apps.connections.open
        again). Slack keeps the old socket open for a while, so the emulator leaves closing it to the client."""
        self._send_socket({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-emulator"}}, timeout)

    def wait_for_ack(self, envelope_id: str, timeout: float = 10) -> dict[str, Any]:
        """The app's ack of `envelope_id` (`{"envelope_id": …}`, with `payload` when it answered in the ack)."""
        found: list[dict[str, Any]] = []

        def acked() -> bool:
            found[:] = [ack for ack in self.acks if ack.get("envelope_id") == envelope_id]
            return bool(found)

        with self._changed:
            if not self._changed.wait_for(acked, timeout):
                raise TimeoutError(f"no ack of envelope {envelope_id} within {timeout}s (acks: {self.acks})")
        return found[0]

    def wait_for_socket_connections(self, count: int, timeout: float = 10) -> None:
        """Until `count` Socket Mode connections have been accepted (and greeted) since the last reset."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.socket_connections >= count, timeout):
                raise TimeoutError(
                    f"{self.socket_connections} Socket Mode connection(s), not {count}, within {timeout}s"
                )

    @property
    def live_sockets(self) -> int:
        with self._lock:
            return len(self._sockets)

    def _send_socket(self, message: dict[str, Any], timeout: float) -> None:
        self.push_raw(json.dumps(message), timeout)

    def _connections_open(self, params: Params) -> dict[str, Any]:
        ticket = str(uuid.uuid4())
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}{SOCKET_PATH}?ticket={ticket}&app_id={self.app_id}"}

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            ticket = request.query.get("ticket", "")
            if ticket not in self._tickets:  # each URL from apps.connections.open is good for one connection
                return web.json_response({"ok": False, "error": "invalid_ticket"}, status=401)
            self._tickets.discard(ticket)
            live = len(self._sockets) + 1
        ws = web.WebSocketResponse()  # answers the client's pings (slack_sdk checks its pongs)
        await ws.prepare(request)
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": live,
                    "debug_info": {"host": "applink-emulator", "build_number": 1, "approximate_connection_time": 18060},
                    "connection_info": {"app_id": self.app_id},
                }
            )
        )
        with self._changed:
            self._sockets.append(ws)
            self.socket_connections += 1
            self._changed.notify_all()
        try:
            async for message in ws:
                if message.type == WSMsgType.TEXT:
                    self._received(message.data)
        finally:
            with self._changed:
                self._sockets.remove(ws)
                self._changed.notify_all()
        return ws

    def _received(self, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        if not isinstance(message, dict) or "envelope_id" not in message:
            return  # Slack ignores what is not an ack
        with self._changed:
            self.acks.append(message)
            self._changed.notify_all()

    async def _close_sockets(self, _app: web.Application) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for ws in sockets:
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")

    # -- state helpers --------------------------------------------------------------------------------------

    @property
    def domain(self) -> str:
        """The team's domain (`<domain>.slack.com`), as its name makes it."""
        return self.team_name.lower().replace(" ", "")

    def _new_ts(self) -> str:
        # Slack's ts: seconds.microseconds of the post time, unique and increasing in a channel.
        self._last_ts_us = max(int(time.time() * 1_000_000), self._last_ts_us + 100)
        return f"{self._last_ts_us // 1_000_000}.{self._last_ts_us % 1_000_000:06d}"

    def _find(self, channel: str, ts: str) -> dict[str, Any] | None:
        return next((m for m in self._messages.get(channel, []) if m["ts"] == ts), None)

    def _require(self, params: Params, *names: str) -> list[Any]:
        missing = [name for name in names if params.get(name) in (None, "")]
        if missing:
            messages = [f"[ERROR] missing required field: {name}" for name in missing]
            raise SlackError("invalid_arguments", response_metadata={"messages": messages})
        return [params[name] for name in names]

    def _existing(self, channel: str, ts: str) -> dict[str, Any]:
        found = self._find(channel, ts)
        if found is None:
            raise SlackError("message_not_found")
        return found

    def _store(self, channel: str, message: dict[str, Any], thread_ts: str | None) -> dict[str, Any]:
        message["ts"] = self._new_ts()
        if thread_ts:
            message["thread_ts"] = thread_ts
            parent = self._find(channel, thread_ts)
            if parent is not None:
                parent.setdefault("thread_ts", thread_ts)
                parent["reply_count"] = parent.get("reply_count", 0) + 1
                users = parent.setdefault("reply_users", [])
                if message.get("user") and message["user"] not in users:
                    users.append(message["user"])
                parent["reply_users_count"] = len(users)
                parent["latest_reply"] = message["ts"]
        self._messages.setdefault(channel, []).append(message)
        return message

    def _check_content(self, params: Params, too_many_blocks: str = "invalid_blocks") -> None:
        """Slack's checks of what a message holds (playground/slack_checks.py): markdown_text alone, blocks
        Slack takes, text no longer than it allows."""
        if params.get("markdown_text") and (params.get("text") or params.get("blocks")):
            raise SlackError("markdown_text_conflict")
        _check_markdown(params)
        if len(str(params.get("text") or "")) > slack_checks.MAX_MESSAGE_TEXT:
            raise SlackError("msg_too_long")
        blocks = params.get("blocks")
        if blocks is None:
            return
        if not isinstance(blocks, list):
            raise SlackError("invalid_blocks_format")
        if too_many_blocks != "invalid_blocks" and slack_checks.too_many_blocks(blocks):
            raise SlackError(too_many_blocks)
        problems = slack_checks.block_problems(blocks)
        if problems:
            raise SlackError("invalid_blocks", response_metadata={"messages": problems})

    def _check_view(self, view: Any) -> None:
        problems = slack_checks.view_problems(view)
        if problems:
            raise SlackError("invalid_arguments", response_metadata={"messages": problems})

    def _known_channel(self, channel: str) -> None:
        """Slack posts only where the channel is: tests seed theirs with `add_channel` (a person's message or
        event seeded with `add_message` or `push_*` makes its channel, as it could only come from one)."""
        if channel not in self.channels:
            raise SlackError("channel_not_found")

    def _bot_message(self, params: Params) -> dict[str, Any]:
        me = self._me()
        message = {
            "type": "message",
            "user": me.bot_user_id,
            "bot_id": me.bot_id,
            "app_id": self.app_id,
            "team": me.team_id or me.enterprise_id,
            "text": params.get("text") or params.get("markdown_text") or "",
        }
        for key in ("blocks", "attachments", "metadata"):
            if params.get(key):
                message[key] = params[key]
        return message

    # -- methods --------------------------------------------------------------------------------------------

    def _auth_test(self, params: Params) -> dict[str, Any]:
        token = self._calling.token if self._calling is not None else None
        return {"user": self.bot_name} | self.oauth.auth_test(self._me(), token)

    def _oauth_access(self, params: Params) -> dict[str, Any]:
        authorization = self._calling.authorization if self._calling is not None else ""
        answer = self.oauth.access(params, authorization)
        self._seed_bot(answer["access_token"])
        return answer

    def _apps_uninstall(self, params: Params) -> dict[str, Any]:
        return self.oauth.apps_uninstall(params, self._me())

    def _auth_revoke(self, params: Params) -> dict[str, Any]:
        assert self._calling is not None and self._calling.token is not None
        return self.oauth.revoke(self._calling.token, str(params.get("test") or "").lower() in ("1", "true"))

    def _post_message(self, params: Params) -> dict[str, Any]:
        [channel] = self._require(params, "channel")
        self._known_channel(channel)
        if not (params.get("text") or params.get("markdown_text") or params.get("blocks") or params.get("attachments")):
            raise SlackError("no_text")
        self._check_content(params)
        message = self._store(channel, self._bot_message(params), params.get("thread_ts"))
        return {"channel": channel, "ts": message["ts"], "message": message}

    def _update(self, params: Params) -> dict[str, Any]:
        channel, ts = self._require(params, "channel", "ts")
        message = self._existing(channel, ts)
        if message.get("user") != self._me().bot_user_id:
            raise SlackError("cant_update_message")
        if message.get("streaming"):
            raise SlackError("streaming_state_conflict")
        if len(params.get("text") or "") > slack_checks.MAX_UPDATE_TEXT:
            raise SlackError("msg_too_long")
        self._check_content(params)
        if params.get("markdown_text"):
            # The markdown replaces what the message showed, blocks included (Slack renders it as its own block).
            message.pop("blocks", None)
            message["text"] = params["markdown_text"]
        elif "text" in params and "blocks" not in params:
            message.pop("blocks", None)  # Slack: text without blocks removes the blocks
        for key in ("text", "blocks", "attachments", "metadata"):
            if key in params:
                message[key] = params[key]
        message["edited"] = {"user": self._me().bot_user_id, "ts": self._new_ts()}
        return {"channel": channel, "ts": ts, "text": message.get("text", ""), "message": message}

    def _post_ephemeral(self, params: Params) -> dict[str, Any]:
        channel, user = self._require(params, "channel", "user")
        self._known_channel(channel)
        self._check_content(params)
        message = self._bot_message(params) | {"channel": channel, "to_user": user, "ts": self._new_ts()}
        if params.get("thread_ts"):
            message["thread_ts"] = params["thread_ts"]
        self.ephemerals.append(message)
        return {"message_ts": message["ts"]}

    def _delete(self, params: Params) -> dict[str, Any]:
        channel, ts = self._require(params, "channel", "ts")
        message = self._existing(channel, ts)
        if message.get("user") != self._me().bot_user_id:
            raise SlackError("cant_delete_message")
        self._messages[channel].remove(message)
        self._uncount(channel, message)
        return {"channel": channel, "ts": ts}

    def _permalink(self, params: Params) -> dict[str, Any]:
        channel, ts = self._require(params, "channel", "message_ts")
        message = self._existing(channel, ts)
        link = f"https://{self.domain}.slack.com/archives/{channel}/p{ts.replace('.', '')}"
        if message.get("thread_ts", ts) != ts:
            link += f"?thread_ts={message['thread_ts']}&cid={channel}"
        return {"channel": channel, "permalink": link}

    def _start_stream(self, params: Params) -> dict[str, Any]:
        channel, thread_ts = self._require(params, "channel", "thread_ts")
        self._known_channel(channel)
        if self.strict_streaming and not channel.startswith("D"):
            # Outside a DM, Slack streams to one person, who must be named.
            for name in ("recipient_user_id", "recipient_team_id"):
                if not params.get(name):
                    raise SlackError(f"missing_{name}")
        _check_markdown(params)
        message = self._bot_message(params) | {"text": params.get("markdown_text", "") + _chunk_text(params)}
        message = self._store(channel, message, thread_ts)
        message["streaming"] = True  # the emulator's own mark: appendStream needs it
        return {"channel": channel, "ts": message["ts"]}

    def _streaming(self, params: Params) -> dict[str, Any]:
        channel, ts = self._require(params, "channel", "ts")
        message = self._existing(channel, ts)
        if not message.get("streaming"):
            raise SlackError("message_not_in_streaming_state")
        return message

    def _append_stream(self, params: Params) -> dict[str, Any]:
        message = self._streaming(params)
        if not params.get("markdown_text") and not params.get("chunks"):
            raise SlackError(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing required field: markdown_text"]}
            )
        _check_markdown(params)
        message["text"] += params.get("markdown_text", "") + _chunk_text(params)
        return {"channel": params["channel"], "ts": message["ts"]}

    def _stop_stream(self, params: Params) -> dict[str, Any]:
        message = self._streaming(params)
        self._check_content({"blocks": params.get("blocks")}, too_many_blocks="msg_blocks_too_many")
        _check_markdown(params)
        message["text"] += params.get("markdown_text", "") + _chunk_text(params)
        for key in ("blocks", "metadata"):
            if params.get(key):
                message[key] = params[key]
        del message["streaming"]
        return {"channel": params["channel"], "ts": message["ts"], "message": message}

    def _reaction_target(self, params: Params) -> tuple[dict[str, Any], str]:
        channel, ts, name = self._require(params, "channel", "timestamp", "name")
        return self._existing(channel, ts), name

    def _reaction_add(self, params: Params) -> dict[str, Any]:
        message, name = self._reaction_target(params)
        reactions = message.setdefault("reactions", [])
        reaction = next((r for r in reactions if r["name"] == name), None)
        if reaction is None:
            reaction = {"name": name, "users": [], "count": 0}
            reactions.append(reaction)
        me = self._me().bot_user_id
        if me in reaction["users"]:
            raise SlackError("already_reacted")
        reaction["users"].append(me)
        reaction["count"] += 1
        return {}

    def _reaction_remove(self, params: Params) -> dict[str, Any]:
        message, name = self._reaction_target(params)
        reactions, me = message.get("reactions", []), self._me().bot_user_id
        reaction = next((r for r in reactions if r["name"] == name and me in r["users"]), None)
        if reaction is None:
            raise SlackError("no_reaction")
        reaction["users"].remove(me)
        reaction["count"] -= 1
        if not reaction["count"]:
            reactions.remove(reaction)
        if not reactions:
            message.pop("reactions", None)
        return {}

    def _replies(self, params: Params) -> dict[str, Any]:
        channel, ts = self._require(params, "channel", "ts")
        if channel not in self.channels:
            raise SlackError("channel_not_found")
        found = self._find(channel, ts)
        if found is None:
            raise SlackError("thread_not_found")
        thread = _as_read(params, self.messages(channel, found.get("thread_ts", ts)))
        return {"messages": thread, "has_more": False, "response_metadata": {"next_cursor": ""}}

    def _history(self, params: Params) -> dict[str, Any]:
        [channel] = self._require(params, "channel")
        if channel not in self.channels:
            raise SlackError("channel_not_found")
        newest_first = list(reversed(_as_read(params, self.messages(channel))))
        return {"messages": newest_first, "has_more": False, "pin_count": 0, "response_metadata": {"next_cursor": ""}}

    def _conversation_info(self, params: Params) -> dict[str, Any]:
        [channel] = self._require(params, "channel")
        if channel not in self.channels:
            raise SlackError("channel_not_found")
        return {"channel": self.channels[channel]}

    def _conversations_open(self, params: Params) -> dict[str, Any]:
        """A direct message between the bot and one person (D…), or a group DM with several (G…), made on the first
        call and the same one after (then `no_op` and `already_open`, as Slack says); the person must exist and be
        active. `channel` resumes a DM or group DM by its id. The id alone comes back, the whole conversation with
        `return_im`."""
        whole = str(params.get("return_im") or "").lower() in ("1", "true")
        if params.get("channel") and not params.get("users"):
            found = self.channels.get(params["channel"])
            if found is None:
                raise SlackError("channel_not_found")
            if not (found.get("is_im") or found.get("is_mpim")):
                raise SlackError("method_not_supported_for_channel_type")
            return {"no_op": True, "already_open": True, "channel": found if whole else {"id": found["id"]}}
        if not params.get("users"):
            raise SlackError("users_list_not_supplied")
        people = [u.strip() for u in str(params["users"]).split(",") if u.strip()]
        if len(people) > 8:
            raise SlackError("too_many_users")
        for person in people:
            if person not in self.users:
                raise SlackError("user_not_found")
            if self.users[person].get("deleted"):
                raise SlackError("user_disabled")
        key = frozenset(people)
        known = self._opened.get(key)
        if known is not None:
            found = self.channels[known]
            return {"no_op": True, "already_open": True, "channel": found if whole else {"id": known}}
        one = len(key) == 1
        channel_id = f"{'D' if one else 'G'}{next(self._ids):010d}"
        # The DM is in the caller's team (an org-wide installation's: the person's).
        team = self._me().team_id or self.users[people[0]]["team_id"]
        name = people[0] if one else "mpdm-" + "--".join(people)
        channel = self.add_channel(channel_id, name, is_private=True, team=team)
        channel |= {"is_group": False, "is_member": True}
        if one:
            channel["user"] = people[0]
        else:
            channel["is_mpim"] = True
        self.channels[channel_id] = channel
        self._opened[key] = channel_id
        return {"channel": channel if whole else {"id": channel_id}}

    def _user_info(self, params: Params) -> dict[str, Any]:
        [user] = self._require(params, "user")
        if user not in self.users:
            raise SlackError("user_not_found")
        return {"user": self.users[user]}

    def _usergroup_users(self, params: Params) -> dict[str, Any]:
        [group] = self._require(params, "usergroup")
        if group not in self.usergroups:
            raise SlackError("no_such_subteam")
        return {"users": self.usergroups[group]["users"]}

    def _set_status(self, params: Params) -> dict[str, Any]:
        channel, thread_ts = self._require(params, "channel_id", "thread_ts")
        if "status" not in params:
            self._require(params, "status")
        said = self.statuses.setdefault((channel, thread_ts), [])
        said.append(params["status"])
        if self.history is not None and len(said) > 2 * self.history:
            del said[: -self.history]
        return {}

    def _set_suggested_prompts(self, params: Params) -> dict[str, Any]:
        channel, thread_ts, prompts = self._require(params, "channel_id", "thread_ts", "prompts")
        problems = slack_checks.prompt_problems(prompts, params.get("title"))
        if problems:
            raise SlackError("invalid_arguments", response_metadata={"messages": problems})
        self.suggested_prompts[(channel, thread_ts)] = prompts
        return {}

    def _store_view(self, view: Any, view_id: str | None = None, **where: Any) -> dict[str, Any]:
        number = next(self._ids)
        stored = (
            view
            | {
                "id": view_id or f"V{number:010d}",
                "team_id": self._me().team_id or self.team_id,
                "app_id": self.app_id,
                "bot_id": self._me().bot_id,
                "hash": f"{number}.hash",
                "state": {"values": {}},
            }
            | where
        )
        self.views.append(stored)
        return {"view": stored}

    def _views_publish(self, params: Params) -> dict[str, Any]:
        user, view = self._require(params, "user_id", "view")
        if user not in self.users:
            raise SlackError("user_not_found")
        self._check_view(view)  # before the old view goes: a refused view leaves the Home tab as it was
        # A person has one Home tab: publishing replaces its view, which keeps its id.
        old = next((v for v in self.views if v.get("type") == "home" and v.get("user_id") == user), None)
        if old is not None and isinstance(view, dict) and view.get("type") == "home":
            self.views.remove(old)
            return self._store_view(view, old["id"], user_id=user)
        return self._store_view(view, user_id=user)

    def _views_open(self, params: Params) -> dict[str, Any]:
        trigger, view = self._require(params, "trigger_id", "view")
        self._check_view(view)
        return self._store_view(view, trigger_id=trigger)

    def _views_update(self, params: Params) -> dict[str, Any]:
        [view] = self._require(params, "view")
        self._check_view(view)  # before the old view goes
        old = next((v for v in self.views if v["id"] == params.get("view_id")), None)
        if old is None:
            raise SlackError("not_found")
        self.views.remove(old)
        return self._store_view(view, old["id"])

    def _upload_url(self, params: Params) -> dict[str, Any]:
        filename, length = self._require(params, "filename", "length")
        file_id = f"F{next(self._ids):010d}"
        self.files[file_id] = {
            "id": file_id,
            "name": filename,
            "title": filename,
            "size": int(length),
            "user": self._me().bot_user_id,
            "created": int(time.time()),
            "mimetype": mimetypes.guess_type(filename)[0] or "text/plain",
            "filetype": filename.rpartition(".")[2] if "." in filename else "text",
            "permalink": f"https://{self.domain}.slack.com/files/{self.bot_user_id}/{file_id}/{filename}",
        }
        return {"upload_url": f"{self.base}/upload/v1/{file_id}", "file_id": file_id}

    def _complete_upload(self, params: Params) -> dict[str, Any]:
        [files] = self._require(params, "files")
        done = []
        for item in files:
            file = self.files.get(item.get("id"))
            if file is None or file["id"] not in self.uploads:
                raise SlackError("file_not_found")
            file["title"] = item.get("title") or file["title"]
            file["size"] = len(self.uploads[file["id"]])
            done.append(file)
        channel = params.get("channel_id") or (params.get("channels") or "").split(",")[0]
        if channel:
            self._known_channel(channel)
            message = self._bot_message({"text": params.get("initial_comment", "")}) | {"files": done, "upload": True}
            self._store(channel, message, params.get("thread_ts"))
            for file in done:
                file.setdefault("channels", []).append(channel)
        return {"files": done}

    def _file_info(self, params: Params) -> dict[str, Any]:
        [file_id] = self._require(params, "file")
        if file_id not in self.files:
            raise SlackError("file_not_found")
        return {"file": self.files[file_id]}


class _PayloadBuilder(SlackEventSender):
    """The sender's payloads without the sending: `last_payload` holds what would have been POSTed."""

    def send(self, *_args: Any, **_kwargs: Any) -> Any:  # the sender's callers ignore it here
        return None


def _as_read(params: Params, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as conversations.history and .replies answer: since `oldest` (a ts, exclusive), with their
    metadata only when `include_all_metadata` asks for it."""
    oldest = float(params.get("oldest") or 0)
    with_metadata = str(params.get("include_all_metadata") or "").lower() in ("1", "true")
    return [
        m if with_metadata else {k: v for k, v in m.items() if k != "metadata"}
        for m in messages
        if float(m.get("ts") or 0) > oldest
    ]


def _token(params: Params | None, headers: Any) -> str | None:
    """The token a call came with: `Authorization: Bearer …`, or a `token` parameter."""
    auth = headers.get("Authorization", "")
    token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else (params or {}).get("token")
    return str(token) if token else None


def _scopes(installation: AppInstall | None) -> dict[str, str]:
    """Slack's header of the scopes a token holds, on every answer to it (bolt reads it from auth.test's)."""
    return {"X-OAuth-Scopes": ",".join(installation.scopes)} if installation and installation.scopes else {}


def _check_markdown(params: Params) -> None:
    """Slack's limit on one call's markdown_text."""
    if len(str(params.get("markdown_text") or "")) > slack_checks.MAX_MARKDOWN_TEXT:
        raise SlackError("msg_too_long")


def _chunk_text(params: Params) -> str:
    return "".join(c.get("text", "") for c in params.get("chunks") or [] if c.get("type") == "markdown_text")


async def _read_params(request: web.Request) -> Params:
    params: Params = dict(request.query)
    if request.content_type == "application/json":
        body = await request.json() if request.can_read_body else {}
        if not isinstance(body, dict):
            raise ValueError("a JSON body must be an object")
        params.update(body)
    elif request.can_read_body:
        form = await request.post()
        params.update({k: _form_value(v) for k, v in form.items()})
    for key in _JSON_PARAMS & params.keys():
        if isinstance(params[key], str):
            with contextlib.suppress(ValueError):  # left as sent: the method answers invalid_arguments where it matters
                params[key] = json.loads(params[key])
    return params


def _form_value(value: str | bytes | bytearray | web.FileField) -> str | bytes:
    """A form field: text as sent, a file read whole (a part with no file name and a non-text type is bytes)."""
    if isinstance(value, web.FileField):
        return value.file.read()
    return value if isinstance(value, str) else bytes(value)
