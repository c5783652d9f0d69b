"""Block Kit pieces shared by the thread's renderer and the approval message: text from the model or a tool
made safe to show (no secret, no `<…>` sequence, no mention that notifies), code blocks within Slack's limits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from chatops.secrets import scrub

# Slack's limit is 3,000 characters a section: kept well under.
SECTION_CHARS = 2900
# Code sections a preview or a prompt's details may fill before the rest goes to a file instead.
CODE_SECTIONS = 4
ZWSP = "\u200b"
# What would notify people: Slack's special mentions (`<!here>`, `<!subteam^S…>`) and the bare words. No
# lookahead, so that a match never depends on text that has not arrived yet (see render's _stable).
MENTION = re.compile(r"<!|@(?:channel|here|everyone)", re.IGNORECASE)


def neutralise(text: str) -> str:
    """`<!here>` → `<​!here>`, `@channel` → `@​channel`: shown as written, notifying nobody."""
    return MENTION.sub(lambda m: m.group()[0] + ZWSP + m.group()[1:], text)


def escape(text: str) -> str:
    """mrkdwn's control characters as Slack wants them escaped: no `<…>` sequence survives."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn_of(text: str, secrets: Sequence[str]) -> str:
    """Text from the model or a tool as mrkdwn: without the secrets, its `<…>` escaped, notifying nobody."""
    return neutralise(escape(scrub(text, list(secrets))))


def code_sections(lines: Sequence[str], mrkdwn: Callable[[str], str]) -> tuple[list[dict[str, Any]], bool]:
    """`lines` in code blocks of at most SECTION_CHARS each, CODE_SECTIONS at most; whether some of them (or of
    a line) had to be left out."""
    room = SECTION_CHARS - len("```\n\n```")
    chunks: list[list[str]] = []
    current: list[str] = []
    size, cut = 0, False
    for raw in lines:
        line = mrkdwn(raw).replace("```", f"`{ZWSP}``")  # a fence in the output must not end ours
        if len(line) > room:
            line, cut = line[: room - 1] + "…", True
        if current and size + len(line) + 1 > room:
            chunks.append(current)
            current, size = [], 0
            if len(chunks) == CODE_SECTIONS:
                cut = True
                break
        current.append(line)
        size += len(line) + 1
    else:
        if current:
            chunks.append(current)
    return [section_block("```\n" + "\n".join(chunk) + "\n```") for chunk in chunks], cut


def section_block(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(text, SECTION_CHARS)}}


def context_block(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(text, SECTION_CHARS)}]}


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def duration(seconds: float) -> str:
    """`12 s`, `3 min`, `3 min 5 s`: how long something took, for a person."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min" if minutes and not secs else f"{minutes} min {secs} s" if minutes else f"{secs} s"
