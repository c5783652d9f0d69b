"""The diff write_file and edit_file show: a correct diff of any rewrite, in bounded work.

difflib's matcher is cubic on lines that repeat (blank lines, `}`) between lines that all changed: before the
bounded matcher, the 4,000-line rewrites below took minutes each on the event loop (past this suite's 120 s
per-test limit), before a person was even asked. Their time is reported by bench/bench_tools.py.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from mm_core.tools.diff import diff, split_lines

HUNK = re.compile(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@$")
LINE = re.compile(r"^([ +-])\s*\d+ │ (.*)$", re.DOTALL)


def patched(old: str, rendered: str) -> str:
    """`old` with the rendered hunks applied: what the diff claims the new text is."""
    lines = split_lines(old)
    out: list[str] = []
    at = 0  # next line of `old` not yet copied
    prev: list[str] | None = None
    for row in rendered.split("\n") if rendered else []:
        if m := HUNK.match(row):
            start = int(m.group(1)) - (1 if int(m.group(2)) else 0)
            out += lines[at:start]
            at = start
            continue
        if row == "\\ no newline at end of file":
            if prev is not None:  # after a removed line it speaks of the old text, which is not rebuilt
                prev[-1] = prev[-1].removesuffix("\n")
            continue
        m = LINE.match(row)
        assert m, row
        sign, text = m.groups()
        if sign in " -":
            assert lines[at].removesuffix("\n") == text, (at, lines[at], text)
            at += 1
        if sign in " +":
            out.append(text + "\n")
            prev = out
        else:
            prev = None
    return "".join(out + lines[at:])


def hostile(n: int, salt: str, filler: str) -> str:
    return "".join(f"{salt}{i}\n{filler}" for i in range(n))


def check(old: str, new: str) -> None:
    d = diff(old, new)
    assert patched(old, d.text) == new
    rendered = d.text.split("\n") if d.text else []
    assert d.added == sum(r.startswith("+") for r in rendered)
    assert d.deleted == sum(r.startswith("-") for r in rendered)


def test_a_rewrite_between_repeated_blank_lines_is_a_correct_diff():
    check(hostile(2000, "old", "\n"), hostile(2000, "new", "\n"))


def test_a_rewrite_between_repeated_braces_is_a_correct_diff():
    check(hostile(2000, "f", "}\n"), hostile(1400, "g", "}\n}\n"))


def test_a_small_edit_in_a_large_file_stays_a_small_diff():
    old = "".join(f"line {i}\n" for i in range(3000))
    new = old.replace("line 1500\n", "LINE 1500\n").replace("line 2900\n", "")
    d = diff(old, new)
    assert (d.added, d.deleted, d.first_line) == (1, 2, 1501)
    check(old, new)


def test_swapped_repeated_lines_without_any_unique_line_stay_a_short_diff():
    old, new = "x\ny\n" * 1000, "y\nx\n" * 1000 + "z\n"
    d = diff(old, new)
    assert (d.added, d.deleted) == (2, 1)
    check(old, new)


lines = st.lists(st.sampled_from(["", "}", "a", "b", "return x", "c\r", "  d"]), max_size=120)


@settings(max_examples=300, deadline=None)
@given(lines, lines, st.booleans(), st.booleans())
def test_any_rewrite_is_a_correct_diff(a, b, end_a, end_b):
    old = "\n".join(a) + ("\n" if end_a and a else "")
    new = "\n".join(b) + ("\n" if end_b and b else "")
    check(old, new)
