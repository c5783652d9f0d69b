"""Slack's mrkdwn, typed: which text the service wrote (its markup meant) and which it only passes on.

Slack reads `<…>` in a message as markup: `<@U123>` notifies a person, `<!channel>` a whole channel,
`<https://a|b>` is a link that shows as "b". The service writes such markup on purpose (who asked, who approved,
a date, a link to a pull request page); everything else it posts — what the model, a tool, git, a repository or
a person wrote — must reach Slack as text, never as markup.

`Mrkdwn` marks the first kind. A plain `str` is the second kind, and it is escaped whenever it meets `Mrkdwn`:
formatted into it (`Mrkdwn("✅ Approved by <@{user}>").format(user=…)`), added to it, joined by it. The gateway
(`slackio/slack_out.py`) escapes any plain `str` it is handed as mrkdwn. So the only way to get markup to Slack is
to write it in a `Mrkdwn` literal; forgetting to escape cannot happen, and a mistake shows as text escaped twice
(`&amp;amp;`), which tests see, rather than as a live mention.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

from chatops.secrets import scrub

ZWSP = "\u200b"
# What would notify people: Slack's special mentions (`<!here>`, `<!subteam^S…>`) and the bare words. No
# lookahead, so that a match never depends on text that has not arrived yet (see render's _stable).
MENTION = re.compile(r"<!|@(?:channel|here|everyone)", re.IGNORECASE)
# In the service's own mrkdwn, `<!` is only ever a date (`<!date^…>`): any other special mention is broken.
_SPECIAL = re.compile(r"<!(?!date\^)|@(?:channel|here|everyone)", re.IGNORECASE)
# In markdown (the streamed answer), Slack's own markup that would notify or pose as one of its links: `<!…>`,
# `<@U…>`, `<#C…>`, `<https://…|…>`. Markdown's `<` needs no other escape. The lookahead is short (a scheme of
# at most ten characters), so that a stream's held-back tail (render's _stable) always decides it.
_ANGLED = re.compile(r"<(?=[!@#]|[a-z][a-z0-9+.-]{0,9}:)", re.IGNORECASE)
_BACKTICKS = re.compile(r"`(?=`)")


def escape(text: str) -> str:
    """mrkdwn's control characters as Slack wants them escaped: no `<…>` sequence survives."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def neutralise(text: str) -> str:
    """`<!here>` → `<​!here>`, `@channel` → `@​channel`: shown as written, notifying nobody."""
    return MENTION.sub(lambda m: m.group()[0] + ZWSP + m.group()[1:], text)


class Mrkdwn(str):
    """mrkdwn the service wrote itself: its `<…>` markup is meant. Anything plain combined with it is escaped."""

    __slots__ = ()

    @classmethod
    def of(cls, text: object) -> Mrkdwn:
        """`text` as mrkdwn: itself when it is Mrkdwn already, else escaped and notifying nobody."""
        if isinstance(text, Mrkdwn):
            return text
        return cls(neutralise(escape(str(text))))

    def format(self, *args: object, **kwargs: object) -> Mrkdwn:
        return Mrkdwn(_ESCAPING.vformat(self, args, kwargs))

    def __add__(self, other: str) -> Mrkdwn:
        if not isinstance(other, str):
            return NotImplemented
        return Mrkdwn(str.__add__(self, Mrkdwn.of(other)))

    def __radd__(self, other: str) -> Mrkdwn:
        if not isinstance(other, str):
            return NotImplemented
        return Mrkdwn(str.__add__(Mrkdwn.of(other), self))

    def __mod__(self, _values: object) -> Any:
        raise TypeError("Mrkdwn is formatted with .format(), which escapes the values")

    def join(self, iterable: Iterable[str]) -> Mrkdwn:
        return Mrkdwn(str.join(self, (Mrkdwn.of(item) for item in iterable)))

    def __getitem__(self, key: SupportsIndex | slice) -> Mrkdwn:
        # A slice can cut an entity or a mention short (shown as text), never make one.
        return Mrkdwn(str.__getitem__(self, key))

    def replace(self, old: str, new: str, count: SupportsIndex = -1) -> Mrkdwn:
        return Mrkdwn(str.replace(self, old, Mrkdwn.of(new), count))

    def strip(self, chars: str | None = None) -> Mrkdwn:
        return Mrkdwn(str.strip(self, chars))


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, Mrkdwn) and not format_spec:
            return value
        return Mrkdwn.of(format(value, format_spec))


_ESCAPING = _Escaping()


def unfenced(text: Mrkdwn) -> Mrkdwn:
    """Escaped text made safe to stand inside a code block: no two backticks stay side by side, so neither a
    fence (```, or a run of four) nor an inline code span in it can close the block and turn the rest into
    mrkdwn drawn as the bot's own prose."""
    return Mrkdwn(_BACKTICKS.sub("`" + ZWSP, text))


def code_block(text: str) -> Mrkdwn:
    """Someone else's text as one mrkdwn code block: escaped, and unable to end the block early."""
    return Mrkdwn("```\n{body}\n```").format(body=unfenced(Mrkdwn.of(text)))


def mrkdwn_of(text: str, secrets: Sequence[str]) -> Mrkdwn:
    """Text from the model, a tool or a person as mrkdwn: without the secrets, escaped, notifying nobody."""
    return Mrkdwn.of(scrub(text, list(secrets)))


def safe_mrkdwn(text: str, secrets: Sequence[str]) -> str:
    """What the gateway sends for a mrkdwn text: the service's own with its markup (but never a special mention
    other than a date), anyone else's escaped; secrets scrubbed either way, also in their escaped form."""
    hidden = sorted({*secrets, *(escape(s) for s in secrets)}, key=len, reverse=True)
    if isinstance(text, Mrkdwn):
        kept = scrub(str(text), hidden)
        return _SPECIAL.sub(lambda m: m.group()[0] + ZWSP + m.group()[1:], kept)
    return str(Mrkdwn.of(scrub(str(text), hidden)))


def quiet_markdown(text: str) -> str:
    """Markdown notifying nobody and without Slack's angle-bracket markup (a mention, a channel, a link whose label
    hides its address): a zero-width space after each such `<` (and after the `@` of `@here`…) leaves it as text.
    Each change depends on at most ten characters after it, so the result of a longer text starts with that of
    its prefix but for those last characters: a stream can send it piece by piece."""
    return neutralise(_ANGLED.sub("<" + ZWSP, text))


def safe_markdown(text: str, secrets: Sequence[str]) -> str:
    """Markdown (`markdown_text`: the streamed answer) as the gateway sends it: scrubbed, then quiet."""
    return quiet_markdown(scrub(str(text), sorted(set(secrets), key=len, reverse=True)))


def safe_plain(text: str, secrets: Sequence[str]) -> str:
    """A plain_text field (a button, a header, a status, a file's title or content): Slack shows it as written,
    so it is only scrubbed."""
    return scrub(str(text), sorted(set(secrets), key=len, reverse=True))


__all__ = [
    "MENTION",
    "ZWSP",
    "Mrkdwn",
    "code_block",
    "escape",
    "mrkdwn_of",
    "neutralise",
    "quiet_markdown",
    "safe_markdown",
    "safe_mrkdwn",
    "safe_plain",
    "unfenced",
]
