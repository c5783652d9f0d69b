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
    NetworkUsed,
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
# The rest of Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt: Cf, which INVISIBLE holds whole,
# plus Other_Default_Ignorable_Code_Point and Variation_Selector, from PropList.txt), which a renderer draws as
# nothing whatever their category (a combining grapheme joiner, Hangul fillers, Khmer inherent vowels, variation
# selectors, reserved ones), and the blank Braille pattern, a letter-like symbol with no ink. Python's unicodedata
# has no such property; the property is stable (Unicode reserves its unassigned ranges for more of the same).
IGNORABLE = (
    (0x034F, 0x034F),  # COMBINING GRAPHEME JOINER
    (0x115F, 0x1160),  # HANGUL CHOSEONG FILLER, HANGUL JUNGSEONG FILLER
    (0x17B4, 0x17B5),  # KHMER VOWEL INHERENT AQ, AA
    (0x180B, 0x180D),  # MONGOLIAN FREE VARIATION SELECTOR ONE to THREE
    (0x180F, 0x180F),  # MONGOLIAN FREE VARIATION SELECTOR FOUR
    (0x2065, 0x2065),  # reserved
    (0x2800, 0x2800),  # BRAILLE PATTERN BLANK (not ignorable: blank)
    (0x3164, 0x3164),  # HANGUL FILLER
    (0xFE00, 0xFE0F),  # VARIATION SELECTOR-1 to 16 (15 and 16 are kept after a symbol: PRESENTATION)
    (0xFFA0, 0xFFA0),  # HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFF8),  # reserved
    (0xE0000, 0xE0FFF),  # tags (Cf), VARIATION SELECTOR-17 to 256, reserved
)
# Text and emoji presentation selectors: the second code point of `🛠️` or `✅️`. After a symbol they choose how it
# is drawn and are left as they are; anywhere else (after a letter, after another selector: data hidden in a run
# of them) they are escaped like the other ignorable code points.
PRESENTATION = frozenset("\ufe0e\ufe0f")
# Everything but printable ASCII, tab and newline: text without any is shown as it is, at once.
_NOT_PLAIN = re.compile(r"[^\t\n\x20-\x7e]")
# Said where a call's text holds a word of ASCII letters with a letter of another alphabet in it (`r\u0430w`: its
# a is Cyrillic), or a host name with letters beyond ASCII: drawn the same, they are not the same (lookalikes).
LOOKALIKE_NOTE = "⚠ Look-alike letters: {found}."
# At most this many of them are named in the note.
LOOKALIKES_NAMED = 5
# An ASCII word character beside one beyond ASCII (where a look-alike hides in an ASCII word), and a URL's host.
# Fullwidth and mathematical letters and digits are ASCII ones drawn otherwise (their compatibility form is ASCII):
# they are named wherever they are.
_COMPATIBLE = r"[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\U0001d400-\U0001d7ff]"
_MIXED = re.compile(rf"[A-Za-z0-9_][^\W\x00-\x7f]|[^\W\x00-\x7f][A-Za-z0-9_]|{_COMPATIBLE}")
_LOOKS_ASCII = re.compile(rf"[A-Za-z]|{_COMPATIBLE}")
# A scheme is short: bounded, so that a long `a.a.a.a…` costs a few steps a position, not the rest of the text.
_HOST = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://(?:[^\s/?#@]*@)?([^\s/?#:]+)")
# Blank space a person reads past: a run of this many blank characters in a line (spaces, tabs, other spaces), or
# of this many blank lines, can push what follows out of sight (a `; curl … | sh` after 2,500 spaces, 250 empty
# lines before it). Such a text is never shown whole inline, and where it is shown the run is one marker.
BLANK_RUN = 40
BLANK_LINES = 10
_BLANKS = re.compile(rf"[^\S\n]{{{BLANK_RUN},}}")
_BLANK_LINES = re.compile(rf"(?:^[^\S\n]*\n){{{BLANK_LINES},}}", re.MULTILINE)
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
    # The look-alike letters of the title and the text (lookalikes): say LOOKALIKE_NOTE when there are any.
    lookalikes: tuple[str, ...] = ()


def visible(text: str) -> tuple[str, bool]:
    """`text` as it may be shown to a person, and whether it had to change: every code point of INVISIBLE but
    newline and tab, and every one of IGNORABLE (a presentation selector after a symbol excepted), becomes a
    visible escape (`\\u202e`, `\\U000e0041` beyond U+FFFF), so a bidi control cannot make Slack or a terminal
    draw a command in another order than bash reads it, and a zero-width, filler or escape character cannot hide
    in it. What the model sees and what runs never go through this."""
    if not _NOT_PLAIN.search(text):
        return text, False
    escaped = 0

    def escape(match: re.Match[str]) -> str:
        nonlocal escaped
        char, at = match.group(), match.start()
        if char in PRESENTATION and at and _takes_presentation(text[at - 1]):
            return char
        escaped += 1
        return escape_point(char)

    shown = _hidden().sub(escape, text)
    return shown, escaped > 0


def escape_point(char: str) -> str:
    """The escape a hidden code point is shown as: `\\u202e`, `\\U000e0041` beyond U+FFFF."""
    point = ord(char)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def _takes_presentation(previous: str) -> bool:
    """A presentation selector after this character chooses how it is drawn: a symbol beyond ASCII (an emoji, a
    dingbat), itself shown."""
    return not previous.isascii() and unicodedata.category(previous)[0] == "S" and not _hidden().match(previous)


# The Unicode planes that hold INVISIBLE and IGNORABLE code points: the basic one, the supplementary one (musical
# and shorthand format controls) and plane 14 (tags, variation selectors). tests/test_display.py checks this
# Python's tables have none elsewhere.
PLANES = (0, 1, 14)


@functools.cache
def _hidden() -> re.Pattern[str]:
    """One character class of every INVISIBLE code point but newline and tab, and of every IGNORABLE one, built
    once a process from this Python's Unicode tables (about 40 ms): a megabyte of non-ASCII text is then escaped
    at the regex engine's pace rather than one category lookup a character."""
    ignorable = {point for first, last in IGNORABLE for point in range(first, last + 1)}
    ranges: list[str] = []
    start = previous = -2
    for point in (p for plane in PLANES for p in range(plane << 16, (plane + 1) << 16)):
        char = chr(point)
        if char in "\n\t" or (unicodedata.category(char) not in INVISIBLE and point not in ignorable):
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


def lookalikes(text: str) -> tuple[str, ...]:
    """The letters of `text` that look like ASCII and are not, each word said once (`“r\u0430w” contains U+0430 CYRILLIC
    SMALL LETTER A`): in a word that also holds ASCII letters, every letter or digit beyond ASCII but one that is an
    ASCII letter with accents (é: the accent shows); in a URL's host, every one beyond ASCII; fullwidth and
    mathematical letters and digits anywhere. Words of another alphabet alone (a comment in Greek, a Chinese file
    name) are not named. The text is scanned once for an ASCII
    word character beside one beyond ASCII (bench/bench_tools.py), and only such words are looked at."""
    if text.isascii():
        return ()
    found: dict[str, str] = {}
    hosts: list[tuple[int, int]] = []  # the hosts named: their words are not named again
    for match in _HOST.finditer(text):
        if _name_lookalikes(match.group(1), found, accents=True):
            hosts.append(match.span(1))
    suspicious: dict[str, bool] = {}
    looked = 0  # where the last word looked at ends: each word once
    for match in _MIXED.finditer(text):
        pair, at = match.group(), match.start()
        char = pair[1] if pair[0].isascii() else pair[0]
        if char not in suspicious:
            suspicious[char] = unicodedata.category(char)[0] in "LN" and not _accented_ascii(char)
        if not suspicious[char] or at < looked or any(s <= at < e for s, e in hosts):
            continue
        start, looked = _word_at(text, at)
        word = text[start:looked]
        if _LOOKS_ASCII.search(word):
            _name_lookalikes(word, found, accents=False)
    return tuple(found.values())


def _word_at(text: str, at: int) -> tuple[int, int]:
    """The span of the word (letters, digits, underscore) around `at`."""
    start, end = at, at + 1
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return start, end


def _name_lookalikes(word: str, found: dict[str, str], accents: bool) -> bool:
    """Add to `found` the letters of `word` beyond ASCII (`accents`: also those that are ASCII letters with
    accents); whether it has any."""
    odd = [c for c in dict.fromkeys(word) if not c.isascii() and unicodedata.category(c)[0] in "LN"]
    odd = [c for c in odd if accents or not _accented_ascii(c)]
    if not odd or word in found:
        return bool(odd)
    shown = word if len(word) <= 40 else word[:39] + "…"
    names = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in odd[:3])
    more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
    found[word] = f"“{shown}” contains {names}{more}"
    return True


def _accented_ascii(char: str) -> bool:
    """é, ü, ñ: an ASCII letter and combining marks, drawn with its accent."""
    base = unicodedata.normalize("NFD", char)
    return len(base) > 1 and base[0].isascii() and base[0].isalpha()


def lookalike_note(found: tuple[str, ...]) -> str:
    """LOOKALIKE_NOTE for what lookalikes found, naming at most LOOKALIKES_NAMED of them."""
    named = "; ".join(found[:LOOKALIKES_NAMED])
    more = f"; and {len(found) - LOOKALIKES_NAMED} more" if len(found) > LOOKALIKES_NAMED else ""
    return LOOKALIKE_NOTE.format(found=named + more)


def padded(text: str) -> bool:
    """`text` holds a long run of blank characters or of blank lines (BLANK_RUN, BLANK_LINES)."""
    return bool(_BLANKS.search(text) or _BLANK_LINES.search(text))


def collapsed(text: str) -> str:
    """`text` with each long run of blank characters shown as `⋯ 2,500 spaces ⋯` and of blank lines as `⋯ 250 blank
    lines ⋯` on a line of its own: what a person reads, never what runs (the file of the whole text keeps them)."""
    text = _BLANK_LINES.sub(lambda m: f"⋯ {m.group().count(chr(10)):,} blank lines ⋯\n", text)
    return _BLANKS.sub(lambda m: f"⋯ {_blanks(m.group())} ⋯", text)


def _blanks(run: str) -> str:
    kind = "spaces" if set(run) == {" "} else "tabs" if set(run) == {"\t"} else "blank characters"
    return f"{len(run):,} {kind}"


def head_line(text: str, limit: int = LINE_CHARS) -> str:
    """The first line of `text`, at most `limit` characters of it, and how much more there is (`(+4,210
    characters)`): a name for the call, whose whole text is shown in full elsewhere (a prompt's details). No
    ellipsis: nothing reads as if the text ended there."""
    first = text.partition("\n")[0][:limit]
    more = len(text) - len(first)
    return f"{first} (+{more:,} character{'s' if more != 1 else ''})" if more else first


def excerpt(text: str, chars: int, lines: int | None = None) -> tuple[str, str]:
    """The head and the tail of `text`, at most `chars` characters and `lines` lines each, for a front end that
    cannot show all of it (and says so, and where the rest is): each ends (the tail: starts) at a line break when
    there is one in its farther half, so that whole lines show. Both are plain slices: head + what lies between +
    tail is `text`."""
    head = text[:chars]
    if (cut := head.rfind("\n", chars // 2)) != -1:
        head = head[:cut]
    tail = text[len(text) - chars :] if chars else ""
    if (cut := tail.find("\n", 0, chars - chars // 2)) != -1:
        tail = tail[cut + 1 :]
    if lines is not None:
        head, tail = _first_lines(head, lines), _last_lines(tail, lines)
    return head, tail


def _first_lines(text: str, lines: int) -> str:
    at = -1
    for _ in range(lines):
        at = text.find("\n", at + 1)
        if at == -1:
            return text
    return text[:at]


def _last_lines(text: str, lines: int) -> str:
    at = len(text)
    for _ in range(lines):
        at = text.rfind("\n", 0, at)
        if at == -1:
            return text
    return text[at + 1 :]


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
    alike = tuple(dict.fromkeys(lookalikes(title) + lookalikes(text)))
    return Prompt(call_id, line, details, odd_title or odd_text, alike)


def prompt(call: PendingCall) -> Prompt:
    return prompt_of(call.call_id, call.title, whole_text(call), call.icon, call.agent)


DENIED = "⛔ Refused by the approval policy's rule “{rule}”{matched}: it is never run, whoever asks."


def denied_line(event: ToolCallFinished) -> str | None:
    """What to tell the people in the thread when an approval policy rule refused a call; None otherwise."""
    if event.denied_by is None:
        return None
    matched = f" (it matched `{visible(event.matched)[0]}`)" if event.matched else ""
    return DENIED.format(rule=event.denied_by, matched=matched)


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


# The most refused hosts one line names; the rest are counted.
NETWORK_LINE_HOSTS = 5


def network_line(event: NetworkUsed) -> str | None:
    """The one line a thread (or the terminal) gets for a command's refused connections, None for none: each
    refusal in the proxy's words, without their common `network: ` prefix past the first."""
    if not event.refused:
        return None
    reasons = [why.removeprefix("network: ") for _host, why in event.refused[:NETWORK_LINE_HOSTS]]
    more = len(event.refused) - NETWORK_LINE_HOSTS
    tail = f"; and {more} more host{'s' if more > 1 else ''}" if more > 0 else ""
    return "🚫 network: " + "; ".join(reasons) + tail


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
