"""Block Kit pieces shared by the thread's renderer, the approval message and the bot: sections, context lines and
code blocks within Slack's limits, of mrkdwn (slackio/mrkdwn.py: a plain `str` handed to them is someone else's
text, and the gateway escapes it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from slackio.mrkdwn import Mrkdwn, unfenced

# Slack's limit is 3,000 characters a section: kept well under.
SECTION_CHARS = 2900
# Code sections a preview or a prompt's details may fill before the rest goes to a file instead.
CODE_SECTIONS = 4
FENCE = Mrkdwn("```")
_Text = TypeVar("_Text", bound=str)


def code_sections(lines: Sequence[str], mrkdwn: Callable[[str], Mrkdwn]) -> tuple[list[dict[str, Any]], bool]:
    """`lines` in code blocks of at most SECTION_CHARS each, CODE_SECTIONS at most; whether some of them (or of
    a line) had to be left out."""
    room = SECTION_CHARS - len("```\n\n```")
    chunks: list[list[str]] = []
    current: list[str] = []
    size, cut = 0, False
    for raw in lines:
        line = unfenced(mrkdwn(raw))  # a fence (or any run of backticks) in the output must not end ours
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
    return [section_block(FENCE + "\n" + Mrkdwn("\n").join(chunk) + "\n" + FENCE) for chunk in chunks], cut


def section_block(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(text, SECTION_CHARS)}}


def context_block(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(text, SECTION_CHARS)}]}


def clip(text: _Text, limit: int) -> _Text:
    """`text` cut to `limit` characters, an ellipsis marking the cut; Mrkdwn stays Mrkdwn (a cut can break an entity
    or a mention into text, never make one)."""
    return text if len(text) <= limit else cast(_Text, text[: limit - 1] + "…")


def duration(seconds: float) -> str:
    """`12 s`, `3 min`, `3 min 5 s`: how long something took, for a person."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min" if minutes and not secs else f"{minutes} min {secs} s" if minutes else f"{secs} s"
