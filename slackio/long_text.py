"""A text longer than one Slack message, in messages that each fit: where one ends and the next begins.

An answer, a notice or a summary may outgrow a message (12,000 characters of `markdown_text`, 4,000 of `text`).
It then goes on in the next message, cut at a block's boundary — after a blank line, before a code fence opens,
after one closes — so that a paragraph and a code block stay whole in one message. Only a block longer than a
whole message is cut inside: prose at a line break (else a space, else anywhere), a code block at a line break,
where the fence is closed at the end of one message and opened again, with the same language, at the start of
the next, so that each message's code shows as code and nothing of the text is lost.

Code fences are found as Markdown (and Slack's mrkdwn) draws them: a line of three or more backticks or tildes,
indented at most three spaces, closed by a line of at least as many of the same character.

A streamed answer cannot take back what it has shown: `showable` says how far a message that may still grow
may show its text now so that a good cut stays possible later. Up to a quarter of a message it shows everything
(a short answer streams as it is written); beyond, only whole blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A fence and its language: a close and a reopen longer than this (a fence of a hundred backticks, a "language"
# of a thousand characters) would eat the message they are meant to save; such a block is cut as prose is.
MAX_FENCE_CHARS = 100
_OPENER = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_CLOSER = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")


@dataclass(frozen=True)
class Cut:
    """Where a message ends in the text (`at`), what ends it (`close`: the fence of a code block cut inside) and
    what the next message starts with before text[at:] (`reopen`: that fence again, with its language)."""

    at: int
    close: str = ""
    reopen: str = ""


@dataclass(frozen=True)
class _Fence:
    marks: str  # the fence's run of backticks or tildes
    language: str
    body: int  # where its first line of code starts

    def closed_by(self, line: str) -> bool:
        m = _CLOSER.fullmatch(line)
        return m is not None and m.group(1)[0] == self.marks[0] and len(m.group(1)) >= len(self.marks)

    @property
    def reopen(self) -> str:
        return f"{self.marks}{self.language}\n"


@dataclass(frozen=True)
class _Line:
    """A line's start, the code block it is in (None outside one), and whether a block starts there."""

    at: int
    fence: _Fence | None
    block_start: bool
    closing: bool = False  # the line that closes its fence


def _opener(line: str, at: int, end: int) -> _Fence | None:
    m = _OPENER.fullmatch(line)
    if m is None or (m.group(1)[0] == "`" and "`" in m.group(2)):  # a backtick in the info string: inline code
        return None
    words = m.group(2).split()
    return _Fence(m.group(1), words[0] if words else "", end)


def _lines(text: str, upto: int) -> list[_Line]:
    """Each line start up to `upto`, as its text so far says. A line not yet ended opens or closes nothing: the
    state of a position depends only on the whole lines before it, so it never changes as the text grows."""
    found: list[_Line] = []
    fence: _Fence | None = None
    after_block = True  # the text's start, a blank line or a closing fence just before
    at = 0
    while at <= upto:
        nl = text.find("\n", at)
        line = text[at:nl] if nl != -1 else None
        if fence is None:
            opens = _opener(line, at, nl + 1) if line is not None else None
            found.append(_Line(at, None, after_block or opens is not None))
            if line is None:
                break
            fence, after_block = opens, opens is None and not line.strip()
        else:
            closing = line is not None and fence.closed_by(line)
            found.append(_Line(at, fence, False, closing))
            if line is None:
                break
            if closing:
                fence, after_block = None, True
        at = nl + 1
    return found


def _fence_at(lines: list[_Line], at: int) -> _Fence | None:
    """The code block open at `at` (inside a line: the one its line is in, unless that line closes it)."""
    line = next((ln for ln in reversed(lines) if ln.at <= at), None)
    if line is None or line.fence is None or (line.closing and at > line.at) or at < line.fence.body:
        return None
    return line.fence


def _closing(text: str, at: int, fence: _Fence | None, room: int) -> tuple[str, str]:
    """The close and the reopen a cut at `at` needs (none for a fence too long for a message of `room`)."""
    if fence is None:
        return "", ""
    close = fence.marks if text[at - 1 : at] == "\n" else "\n" + fence.marks
    if len(close) + len(fence.reopen) > min(MAX_FENCE_CHARS, room // 4):
        return "", ""
    return close, fence.reopen


def cut(text: str, start: int, room: int, floor: int | None = None) -> Cut:
    """Where a message showing text[start:] in at most `room` characters (its close included) should end, when
    the rest does not fit: the last block boundary that fits; else the last line break (inside a code block: the
    fence closed and reopened); else the last space; else as much as fits. Never before `floor` (what a stream
    has shown already), and always past `start`."""
    end = start + room
    lowest = min(end, max(start + 1, floor if floor is not None else start))
    lines = [ln for ln in _lines(text, end) if lowest <= ln.at <= end]
    blocks = [ln.at for ln in lines if ln.block_start]
    if blocks:
        return Cut(blocks[-1])
    for line in reversed(lines):
        fence = None if line.fence is None or line.at <= line.fence.body or line.closing else line.fence
        if line.fence is not None and fence is None:
            continue  # just after an opening fence, or at its closing line: an empty block on either side
        close, reopen = _closing(text, line.at, fence, room)
        if line.at + len(close) <= end:
            return Cut(line.at, close, reopen)
    every = _lines(text, end)
    space = text.rfind(" ", lowest, end)
    if space != -1:
        close, reopen = _closing(text, space + 1, _fence_at(every, space + 1), room)
        if space + 1 + len(close) <= end:
            return Cut(space + 1, close, reopen)
    at = end
    close, reopen = _closing(text, at, _fence_at(every, at), room)
    for _ in range(3):  # a close moves the cut back, which may leave the block: settle
        if at + len(close) <= end or at == lowest:
            break
        at = max(lowest, end - len(close))
        close, reopen = _closing(text, at, _fence_at(every, at), room)
    return Cut(at, close, reopen)


def showable(text: str, start: int, room: int) -> int:
    """How far a message from `start`, with `room` characters, may show a text that is still growing, so that a
    cut at a block boundary stays possible once it outgrows the message: all of it up to a quarter of the room,
    beyond that up to the last whole block."""
    free = start + room // 4
    if len(text) <= free:
        return len(text)
    ends = [ln.at for ln in _lines(text, start + room) if ln.block_start and free < ln.at <= len(text)]
    return ends[-1] if ends else free


def pieces(text: str, limit: int) -> list[str]:
    """`text` in messages of at most `limit` characters each, cut as `cut` says."""
    found: list[str] = []
    start, reopen = 0, ""
    while len(reopen) + len(text) - start > limit:
        c = cut(text, start, limit - len(reopen))
        found.append(reopen + text[start : c.at] + c.close)
        start, reopen = c.at, c.reopen
    if start < len(text) or not found:
        found.append(reopen + text[start:])
    return found


def reopening(text: str, at: int) -> str:
    """What a message starting at `at` needs before text[at:]: the fence of the code block open there."""
    return _closing(text, at, _fence_at(_lines(text, at), at), 4 * MAX_FENCE_CHARS)[1] if at > 0 else ""


__all__ = ["MAX_FENCE_CHARS", "Cut", "cut", "pieces", "reopening", "showable"]
