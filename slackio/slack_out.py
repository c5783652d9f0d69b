"""The one door every text leaves by on its way to Slack.

The bot and the workers post what the model, tools, git, repositories and people wrote: any of it may hold
`<!channel>`, a disguised link, a user group's mention or a secret. Every Web API call that writes something a
person reads — a message, an edit, an ephemeral, a stream, a status, suggested prompts, an App Home view, a file,
an answer to a slash command's response_url — goes through `outgoing`, which:

- scrubs the process's secrets from every text (and from a file's content);
- escapes `& < >` and neutralises `<!channel>`, `<!here>`, `<!everyone>`, `<!subteam^…>` and the bare
  `@channel` words in every mrkdwn text that is not the service's own `Mrkdwn` (slackio/mrkdwn.py), and breaks
  any special mention but a date in the service's own;
- neutralises mentions in markdown (the streamed answer) and leaves plain_text as written.

`SlackOut` binds a client and the secrets and offers the writes the service makes. `tests/test_slack_out.py`
reads the source of every package and fails on a Web API write, a `respond`, a `say` or a client made
anywhere but here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

from chatops.secrets import MASK
from slackio.mrkdwn import safe_markdown, safe_mrkdwn, safe_plain

# Fields of a method's arguments, by what Slack makes of them.
MRKDWN_FIELDS = frozenset({"text", "initial_comment"})
MARKDOWN_FIELDS = frozenset({"markdown_text"})
PLAIN_FIELDS = frozenset({"status", "title", "content", "filename", "loading_messages"})
BLOCK_FIELDS = frozenset({"blocks", "view", "prompts", "attachments"})


def outgoing(params: dict[str, Any], secrets: Sequence[str] | Callable[[], Sequence[str]]) -> dict[str, Any]:
    """The arguments of a Web API write as they may leave: every text made safe as its field says. `secrets` may
    be a function, asked now (secrets_now)."""
    secrets = secrets_now(secrets)
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if key in MRKDWN_FIELDS and isinstance(value, str):
            out[key] = safe_mrkdwn(value, secrets)
        elif key in MARKDOWN_FIELDS and isinstance(value, str):
            out[key] = safe_markdown(value, secrets)
        elif key in PLAIN_FIELDS:
            out[key] = _plain(value, secrets)
        elif key in BLOCK_FIELDS:
            out[key] = _blocks(value, secrets)
        else:
            out[key] = value
    return out


def _plain(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return safe_plain(value, secrets)
    if isinstance(value, list):
        return [_plain(v, secrets) for v in value]
    if isinstance(value, bytes):  # a file's bytes: the secrets' bytes masked, whatever the encoding around them
        for secret in secrets:
            if secret:
                value = value.replace(secret.encode(), MASK.encode())
        return value
    return value


def _blocks(value: Any, secrets: Sequence[str]) -> Any:
    """Block Kit (blocks, a view, suggested prompts), walked whole: every text object by its type."""
    if isinstance(value, list):
        return [_blocks(v, secrets) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "text" and isinstance(item, str):
            # Shown as written in plain_text and in rich text's text elements; read as mrkdwn anywhere else.
            literal = kind in ("plain_text", "text")
            out[key] = safe_plain(item, secrets) if literal else safe_mrkdwn(item, secrets)
        elif key in ("action_id", "block_id", "type", "value"):  # the service's own ids and the buttons' values
            out[key] = item
        elif isinstance(item, str):  # a URL, an alt text, a prompt's title or message: shown, or followed, as is
            out[key] = safe_plain(item, secrets)
        else:
            out[key] = _blocks(item, secrets)
    return out


def secrets_now(secrets: Sequence[str] | Callable[[], Sequence[str]]) -> list[str]:
    """The secrets to scrub at this write, longest first: `secrets` itself, or what it answers when it is a
    function (the config as it stands)."""
    known = secrets() if callable(secrets) else secrets
    return sorted({s for s in known if s}, key=len, reverse=True)


class SlackOut:
    """A Web API client and the secrets never to post: the service's writes to Slack, each through `outgoing`.
    `secrets` may be a function, asked at each write: the secrets of the config as it stands (a reload may add
    one; chatops.secrets.LiveSecrets)."""

    def __init__(self, client: AsyncWebClient, secrets: Sequence[str] | Callable[[], Sequence[str]]) -> None:
        self.client = client
        self._secrets = secrets

    @property
    def secrets(self) -> list[str]:
        return secrets_now(self._secrets)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Any write, by its Web API name (`chat.postMessage`); Slack's answer. Raises as slack_sdk does."""
        response = await self.client.api_call(method, json=outgoing(params, self.secrets))
        data = getattr(response, "data", None)
        return data if isinstance(data, dict) else {}

    async def post(self, channel: str, text: str, *, thread_ts: str | None = None, **more: Any) -> dict[str, Any]:
        return await self.call("chat.postMessage", channel=channel, thread_ts=thread_ts, text=text, **more)

    async def update(self, channel: str, ts: str, text: str, **more: Any) -> dict[str, Any]:
        return await self.call("chat.update", channel=channel, ts=ts, text=text, **more)

    async def ephemeral(self, channel: str, user: str, text: str, *, thread_ts: str | None = None) -> dict[str, Any]:
        return await self.call("chat.postEphemeral", channel=channel, user=user, text=text, thread_ts=thread_ts)

    async def publish_home(self, user: str, view: dict[str, Any]) -> dict[str, Any]:
        return await self.call("views.publish", user_id=user, view=view)

    async def open_dm(self, user: str) -> str:
        """The id of the bot's direct message with `user` (conversations.open), opened if it was not: where what is
        for that person alone goes (an admin's audit export)."""
        answer = await self.call("conversations.open", users=user)
        return str(answer["channel"]["id"])

    async def upload(self, channel: str, thread_ts: str | None, content: str | bytes, filename: str, title: str) -> Any:
        """A file in the thread (files.getUploadURLExternal, the upload, files.completeUploadExternal); `content`
        text, or bytes (a workspace's file the agent attaches), scrubbed alike."""
        safe = outgoing({"content": content, "title": title, "filename": filename}, self.secrets)
        return await self.client.files_upload_v2(channel=channel, thread_ts=thread_ts, **safe)

    async def respond(self, response_url: str | None, text: str, **more: Any) -> Any:
        """An answer through a slash command's or a click's response_url (bolt's own `respond`)."""
        return await AsyncRespond(response_url=response_url)(**outgoing({"text": text, **more}, self.secrets))


__all__ = ["SlackOut", "outgoing", "secrets_now"]
