"""Slack's links to a thread, both ways: read one a person pasted (`mm-bot purge --thread`, `/mm purge`) into its
channel and thread, and build one from a thread's channel and ts for the audit export.

A message's link is Slack's documented form, `https://<workspace>.slack.com/archives/<channel>/p<ts without its
dot>`; "Copy link" on a reply adds `?thread_ts=<the thread's ts>&cid=<channel>`. Building one needs the
workspace's own address, which only Slack knows (`auth.test`'s `url`): the bot asks for it, the command line is
told it (`--workspace-url`) or leaves links out, giving the channel and the thread's ts instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from chatops.errors import ChatopsError

_CHANNEL = re.compile(r"[CDG][A-Z0-9]{2,40}")
_MESSAGE = re.compile(r"/archives/([^/]+)/p(\d{7,20})/?")
_TS = re.compile(r"\d{1,14}\.\d{6}")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+")

EXPECTED = (
    "expected a Slack message link such as https://acme.slack.com/archives/C0123ABCD/p1700000000123456 "
    "(Slack's \u201cCopy link\u201d on the thread's first message or on a reply)"
)


class BadLink(ChatopsError, ValueError):
    """A text that is not a link this module reads; str() says what was expected."""


@dataclass(frozen=True)
class Thread:
    channel: str
    ts: str  # the thread's ts when the link says it (a reply's link does), else the linked message's own


def parse_link(text: str) -> Thread:
    """The channel and thread of a Slack message link; BadLink saying what was expected otherwise. Slack shows a
    link in a message as `<https://…>` (or `<https://…|label>`): those brackets are taken off."""
    link = text.strip()
    if link.startswith("<") and link.endswith(">"):
        link = link[1:-1].split("|", 1)[0]
    shown = link if len(link) <= 200 else link[:200] + "…"
    try:
        parts = urlsplit(link)
    except ValueError:
        raise BadLink(f"{EXPECTED}, got {shown!r}") from None
    found = _MESSAGE.fullmatch(parts.path)
    if parts.scheme != "https" or not parts.hostname or found is None:
        raise BadLink(f"{EXPECTED}, got {shown!r}")
    channel, digits = found.groups()
    if not _CHANNEL.fullmatch(channel):
        raise BadLink(f"{EXPECTED}; {channel[:60]!r} is not a channel id (C…, G… or D…)")
    ts = f"{digits[:-6]}.{digits[-6:]}"
    thread = parse_qs(parts.query).get("thread_ts", [None])[0]
    if thread is not None:
        if not _TS.fullmatch(thread):
            raise BadLink(f"{EXPECTED}; its thread_ts {thread[:60]!r} is not a Slack ts such as 1700000000.123456")
        ts = thread
    return Thread(channel, ts)


def workspace_url(text: str) -> str:
    """The workspace's address as links start with (`https://acme.slack.com`), from what auth.test answers or a
    person gives; BadLink otherwise."""
    try:
        parts = urlsplit(text.strip())
        host = parts.hostname
    except ValueError:
        host, parts = None, None
    # The address alone: no port, no user, no path, no query (a link pasted whole is not the address).
    if (
        parts is None
        or parts.scheme != "https"
        or not host
        or not _HOST.fullmatch(host)
        or parts.netloc.lower() != host
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise BadLink(f"expected the workspace's address such as https://acme.slack.com, got {text[:200]!r}")
    return f"https://{host}"


def permalink(base: str, channel: str, ts: str) -> str:
    """The link to the message `ts` of `channel` (a thread's root: the thread) under the workspace's address."""
    return f"{base}/archives/{channel}/p{ts.replace('.', '')}"
