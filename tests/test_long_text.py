"""slackio.long_text: a text longer than a message, in messages that each fit, cut between blocks, never inside
a code block that could have stayed whole, and closing and reopening one that could not."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from long_answers import open_fence_at_end, rejoined
from slackio.long_text import cut, pieces, showable


@st.composite
def markdown(draw: st.DrawFn) -> str:
    """Paragraphs, lists and code blocks (some with a language, some with tildes, some left open at the end)."""
    # Prose never opens a fence by chance (the test's reading of blocks is simpler than Markdown's); inline code
    # and stray backticks are there all the same. Any text at all is the next test's.
    words = st.text(alphabet="abcdefgh <@!*_", min_size=1, max_size=12) | st.sampled_from(["`x`", "a`b", "``y``"])
    blocks: list[str] = []
    for _ in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["paragraph", "code", "list"]))
        if kind == "code":
            marks = draw(st.sampled_from(["```", "````", "~~~"]))
            language = draw(st.sampled_from(["", "python", "sh"]))
            lines = draw(st.lists(words, min_size=0, max_size=30))
            blocks.append(f"{marks}{language}\n" + "".join(line + "\n" for line in lines) + marks)
        elif kind == "list":
            blocks.append("\n".join("- " + draw(words) for _ in range(draw(st.integers(1, 8)))))
        else:
            blocks.append(" ".join(draw(st.lists(words, min_size=1, max_size=60))))
    text = "\n\n".join(blocks)
    if draw(st.booleans()):
        text += "\n\n```go\n" + "x := 1\n" * draw(st.integers(0, 40))  # a block the model did not close
    return text


def check(parts: list[str], text: str, limit: int) -> None:
    assert all(len(p) <= limit for p in parts), [len(p) for p in parts]
    assert rejoined(parts, text) == text
    for part in parts[:-1]:  # only the last may leave a fence open: the text's own, unclosed
        assert open_fence_at_end(part) is None, part[-120:]


@settings(max_examples=300, deadline=None)
@given(markdown(), st.integers(120, 700))
def test_every_piece_fits_and_the_pieces_give_back_the_text(text: str, limit: int) -> None:
    check(pieces(text, limit), text, limit)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab `~\n", max_size=1500), st.integers(120, 400))
def test_any_text_at_all_is_cut_within_the_limit_and_lost_nowhere(text: str, limit: int) -> None:
    check(pieces(text, limit), text, limit)


@settings(max_examples=200, deadline=None)
@given(markdown(), st.integers(300, 700))
def test_a_code_block_that_fits_in_a_message_is_never_cut(text: str, limit: int) -> None:
    blocks = re.finditer(r"^(```|````|~~~)(?:python|sh|go)?\n.*?^\1$", text, re.M | re.S)
    whole = [b.group() for b in blocks if len(b.group()) <= limit // 2]
    parts = pieces(text, limit)
    for block in whole:
        assert any(block in part for part in parts), block[:80]


@settings(max_examples=200, deadline=None)
@given(markdown(), st.integers(200, 700), st.lists(st.integers(1, 400), max_size=40))
def test_a_stream_never_has_to_take_back_what_it_showed(text: str, room: int, steps: list[int]) -> None:
    """As the renderer streams: show what `showable` allows, and when the text outgrows the message, cut no
    earlier than what was shown. The messages fit and give back the text."""
    ends = sorted({min(len(text), sum(steps[: i + 1])) for i in range(len(steps))} | {len(text)})
    messages: list[str] = []
    start, sent, reopen = 0, 0, ""
    for end in ends:
        prefix, final = text[:end], end == len(text)
        while len(reopen) + len(prefix) - start > room:
            c = cut(prefix, start, room - len(reopen), floor=sent)
            assert c.at >= sent  # nothing shown is taken back
            messages.append(reopen + prefix[start : c.at] + c.close)
            start = sent = c.at
            reopen = c.reopen
        sent = max(sent, len(prefix) if final else showable(prefix, start, room - len(reopen)))
    messages.append(reopen + text[start:])
    check(messages, text, room)


def test_a_long_answer_is_cut_between_paragraphs_and_around_code_blocks() -> None:
    code = "```python\n" + "print('hello')\n" * 30 + "```"
    text = "\n\n".join(["Intro " * 40, code, "Middle " * 60, code, "End " * 20])
    parts = pieces(text, 900)
    assert all(len(p) <= 900 for p in parts)
    assert "".join(parts) == text  # no cut needed a fence closed: the text is given back as it was
    assert all(p.count("```") % 2 == 0 for p in parts)
    assert sum(p.count(code) for p in parts) == 2


def test_a_code_block_longer_than_a_message_is_closed_and_reopened_with_its_language() -> None:
    code = "~~~~rust\n" + "".join(f"let x{i} = {i};\n" for i in range(200)) + "~~~~\n"
    parts = pieces("Look:\n\n" + code + "\nDone.", 1000)
    assert len(parts) > 3
    assert parts[0] == "Look:\n\n"  # the block starts its own message rather than being cut early
    for part in parts[1:-1]:
        assert part.startswith("~~~~rust\n") and part.endswith("\n~~~~"), (part[:20], part[-20:])
        assert len(part) <= 1000
    assert parts[-1].startswith("~~~~rust\n") and parts[-1].endswith("\nDone.")


def test_a_line_longer_than_a_message_is_cut_anywhere_and_a_short_text_is_one_piece() -> None:
    assert pieces("", 100) == [""]
    assert pieces("short", 100) == ["short"]
    assert pieces("x" * 250, 100) == ["x" * 100, "x" * 100, "x" * 50]
    inside = pieces("```\n" + "y" * 300 + "\n```", 100)
    assert all(len(p) <= 100 for p in inside)
    assert all(p.startswith("```\n") for p in inside[1:]) and all(p.endswith("\n```") for p in inside)


def test_a_hostile_fence_too_long_to_repeat_is_cut_as_prose() -> None:
    marks = "`" * 300
    text = marks + "\n" + "z\n" * 2000 + marks
    parts = pieces(text, 1000)
    assert all(len(p) <= 1000 for p in parts)
    assert "".join(parts) == text  # nothing added, nothing lost


def test_showable_streams_a_short_text_whole_and_a_long_one_by_blocks() -> None:
    assert showable("abc def", 0, 1000) == 7
    text = "a" * 300 + "\n\n" + "b" * 100 + " still writing"
    assert showable(text, 0, 1000) == 302  # past a quarter: up to the last whole block
