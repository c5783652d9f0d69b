"""What a front end shows of a turn, computed once from its events; each front end only lays it out.

The terminal (`mm-bot run`) and the Slack thread show the same things: a line per tool call with the tool's
icon, the first lines of its result, the permission prompt, errors, and the recap after the turn. Their
texts follow the reference's display; only the layout differs (dim text and padding in a terminal, code
blocks and buttons in Slack).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from mm_core.events import (
    CallsDropped,
    Counters,
    Error,
    PendingCall,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from mm_core.log import CallStatus, Outcome

PROMPT_ICON = "🔐"
# Said wherever a call's text held characters a person cannot see, or that reorder what they see.
INVISIBLE_NOTE = "⚠ This call contains invisible or reordering characters, shown as \\u escapes (such as `\\u202e`)."
# A prompt's line names the call; its whole text is in its details. The line shows at most this much of it.
LINE_CHARS = 120
# What the whole text of a gated call is, by tool, for the label of a file that holds it.
WHAT = {"bash": "command", "edit_file": "diff", "write_file": "diff", "lsp": "changes", "ask_agent": "request"}
# Format (Cf: bidi controls, zero-width characters, soft hyphen, tags...), control (Cc), surrogate (Cs), line and
# paragraph separator (Zl, Zp) code points: drawn as nothing, or as a reordering of the text around them, or as
# a line break that bash does not see. Tab and newline are the only ones shown as themselves.
INVISIBLE = frozenset({"Cf", "Cc", "Cs", "Zl", "Zp"})
# Everything but printable ASCII, tab and newline: text without any is shown as it is, at once.
_NOT_PLAIN = re.compile(r"[^\t\n\x20-\x7e]")
# One-shot mode (`mm-bot run -p`, a scheduled job) has nobody to ask: a gated call is rejected. The model is
# told so in the reference's words; the person reading the output is told why, and how to allow it.
ONESHOT_REJECTED = (
    "{tool} was not run: one-shot mode cannot ask for approval — set `yolo: true` in the config to allow "
    "such calls, or run it interactively"
)


@dataclass(frozen=True)
class CallLine:
    """`🛠️ bash: ls -la`, under the name of the asked agent that made the call, if any."""

    icon: str
    title: str
    agent: str | None = None
    # The title held invisible or reordering characters, shown escaped (then say INVISIBLE_NOTE).
    invisible: bool = False

    @property
    def text(self) -> str:
        return f"{self.icon} {self.title}" if self.icon else self.title


@dataclass(frozen=True)
class Prompt:
    """The permission prompt of one gated call: its line, and what a person judges it by."""

    call_id: str
    # The call's icon and the head of its title (head_line): the whole text is in `details`.
    line: CallLine
    # The whole text a person judges, line by line, escaped (visible): the command, the diff.
    details: tuple[str, ...]
    # Invisible or reordering characters were found in the title or the text (then say INVISIBLE_NOTE).
    invisible: bool = False


def visible(text: str) -> tuple[str, bool]:
    """`text` as it may be shown to a person, and whether it had to change: every code point of INVISIBLE but
    newline and tab becomes a visible escape (`\\u202e`, `\\U000e0041` beyond U+FFFF), so a bidi control cannot
    make Slack or a terminal draw a command in another order than bash reads it, and a zero-width or escape
    character cannot hide in it. What the model sees and what runs never go through this."""
    if not _NOT_PLAIN.search(text):
        return text, False
    shown, count = _hidden().subn(_escape, text)
    return shown, count > 0


def _escape(match: re.Match[str]) -> str:
    point = ord(match.group())
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


# The Unicode planes that hold INVISIBLE code points: the basic one, the supplementary one (musical and shorthand
# format controls) and plane 14 (tags). tests/test_display.py checks this Python's tables have none elsewhere.
PLANES = (0, 1, 14)


@functools.cache
def _hidden() -> re.Pattern[str]:
    """One character class of every INVISIBLE code point but newline and tab, built once a process from this
    Python's Unicode tables (about 40 ms): a megabyte of non-ASCII text is then escaped at the regex engine's
    pace rather than one category lookup a character."""
    ranges: list[str] = []
    start = previous = -2
    for point in (p for plane in PLANES for p in range(plane << 16, (plane + 1) << 16)):
        if chr(point) in "\n\t" or unicodedata.category(chr(point)) not in INVISIBLE:
            continue
        if point != previous + 1:
            if start >= 0:
                ranges.append(_range(start, previous))
            start = point
        previous = point
    ranges.append(_range(start, previous))
    return re.compile(f"[{''.join(ranges)}]")


def _range(first: int, last: int) -> str:
    return re.escape(chr(first)) if first == last else f"{re.escape(chr(first))}-{re.escape(chr(last))}"


def head_line(text: str, limit: int = LINE_CHARS) -> str:
    """The first line of `text`, at most `limit` characters of it, and how much more there is (`(+4,210
    characters)`): a name for the call, whose whole text is shown in full elsewhere (a prompt's details). No
    ellipsis: nothing reads as if the text ended there."""
    first = text.partition("\n")[0][:limit]
    more = len(text) - len(first)
    return f"{first} (+{more:,} character{'s' if more != 1 else ''})" if more else first


def excerpt(text: str, chars: int) -> tuple[str, str]:
    """The head and the tail of `text`, at most `chars` characters each, for a front end that cannot show all of
    it (and says so, and where the rest is): each ends (the tail: starts) at a line break when there is one in
    its farther half, so that whole lines show. Both are plain slices: head + what lies between + tail is
    `text`."""
    head = text[:chars]
    if (cut := head.rfind("\n", chars // 2)) != -1:
        head = head[:cut]
    tail = text[len(text) - chars :] if chars else ""
    if (cut := tail.find("\n", 0, chars - chars // 2)) != -1:
        tail = tail[cut + 1 :]
    return head, tail


def whole_text(call: PendingCall) -> str:
    """What a person judges a gated call by, whole: the tool's preview (the command, the diff the edit would make,
    the request to an agent), or its title when the tool shows nothing more."""
    return call.preview or call.title


def call_line(event: ToolCallStarted | PendingCall) -> CallLine:
    """The call's line as the thread and the terminal show it, escaped (visible)."""
    title, invisible = visible(event.title)
    return CallLine(event.icon, title, event.agent, invisible)


def result_lines(event: ToolCallFinished) -> tuple[str, ...]:
    """The lines shown under a call once it returned: its first `previewLines` lines, or what the tool shows
    in their place, "(no output)" when there was none; escaped (visible), line by line."""
    return tuple(visible(line)[0] for line in event.preview.splitlines())


def prompt_of(call_id: str, title: str, text: str, icon: str = "", agent: str | None = None) -> Prompt:
    """The prompt of a call from its title (the tool's, or the whole line as it was recorded) and its whole text
    (whole_text): the front ends' one way to show a gated call. The text is escaped as a whole before it is cut
    into lines, so that a carriage return or a line separator shows as what it is, not as a line break."""
    shown_title, odd_title = visible(title)
    shown_text, odd_text = visible(text)
    details = tuple(shown_text.split("\n")) if text else ()
    line = CallLine(icon, head_line(shown_title), agent, odd_title)
    return Prompt(call_id, line, details, odd_title or odd_text)


def prompt(call: PendingCall) -> Prompt:
    return prompt_of(call.call_id, call.title, whole_text(call), call.icon, call.agent)


def oneshot_note(event: ToolCallFinished) -> str | None:
    """What to tell the person when one-shot mode rejected a call (nobody was there to ask)."""
    return ONESHOT_REJECTED.format(tool=event.tool) if event.status == CallStatus.REJECTED else None


def error_line(event: Error) -> str:
    return event.message


def dropped_line(event: CallsDropped) -> str:
    """The one line a thread gets for an answer's calls beyond maxToolCallsPerAnswer (not one per call)."""
    return (
        f"✂️ The model asked for {event.asked} tool calls in one answer; only the first {event.carried} are taken "
        f"up, the other {event.asked - event.carried} were not run."
    )


def counters_line(counters: Counters) -> str:
    """The reference's recap: `⚙ N command(s) 📝 N file op(s) 📖 N skill(s) 🔎 N lsp call(s)`, zeros left out."""
    parts = []
    if counters.commands:
        parts.append(f"⚙ {counters.commands} command(s)")
    if counters.file_ops:
        parts.append(f"📝 {counters.file_ops} file op(s)")
    if counters.skills:
        parts.append(f"📖 {counters.skills} skill(s)")
    if counters.lsp:
        parts.append(f"🔎 {counters.lsp} lsp call(s)")
    return " ".join(parts)


def recap(event: TurnFinished) -> str | None:
    """The turn's last line: its counters and the tokens it used; None while it waits for a person."""
    if event.outcome in (Outcome.SUSPENDED, Outcome.IDLE):
        return None
    counters = counters_line(event.counters)
    tokens = f"{event.usage.total_tokens:,} tokens"
    return f"{counters} · {tokens}" if counters else tokens
