"""Pins for edit_file (mutation pass, issue 8): the edges that the matching passes, the re-indenting, the
overlap check and the closest-region hint turn on. The texts are tools.md's (edit_file section)."""

from __future__ import annotations

from pathlib import Path

from test_tool_edit import edit

NOT_FOUND = (
    "f.txt: edit #1: old text not found — it must match the file exactly, including indentation and line breaks:"
)
CLOSEST = "the closest the file comes to it — copy these lines:"


def test_the_indent_pass_compares_the_first_line_too(tmp_path: Path) -> None:
    """Two blocks alike but for their first line: the one whose first line matches is edited, not the other."""
    (tmp_path / "f.go").write_text("func a() {\n\treturn 1\n}\nfunc b() {\n\treturn 1\n}\n")
    out = edit(tmp_path, "f.go", ("func b() {\n    return 1\n}", "func b() {\n    return 2\n}"))
    assert out.startswith("edited f.go: 1 edit applied, +1 -1 lines, first change at line 5 · 1 matched ignoring")
    assert (tmp_path / "f.go").read_text() == "func a() {\n\treturn 1\n}\nfunc b() {\n\treturn 2\n}\n"


def test_the_indent_pass_compares_every_later_line(tmp_path: Path) -> None:
    """A block that shares only its first and last lines with `old` is not a match: nothing is written."""
    text = "if a {\n\tx()\n}\n"
    (tmp_path / "f.go").write_text(text)
    out = edit(tmp_path, "f.go", ("if a {\n    y()\n}", "if a {\n    z()\n}"))
    assert out.startswith("f.go: edit #1: old text not found")
    assert (tmp_path / "f.go").read_text() == text


def test_the_indent_pass_matches_a_block_at_the_very_end(tmp_path: Path) -> None:
    """The last lines of a file without a final newline can be edited with other indentation."""
    (tmp_path / "f.go").write_text("x := 0\nif a {\n\tb()\n}")
    edit(tmp_path, "f.go", ("if a {\n    b()\n}", "if a {\n    c()\n}"))
    assert (tmp_path / "f.go").read_text() == "x := 0\nif a {\n\tc()\n}"


def test_leading_padding_stays_on_a_new_that_does_not_carry_it(tmp_path: Path) -> None:
    """`old` with stray leading newlines, `new` without them: `new` is written whole, not cut."""
    (tmp_path / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    edit(tmp_path, "f.py", ("\n\nb = 2", "b = 20"))
    assert (tmp_path / "f.py").read_text() == "a = 1\nb = 20\nc = 3\n"


def test_trailing_padding_stays_on_a_new_that_does_not_carry_it(tmp_path: Path) -> None:
    """`old` with stray trailing newlines, `new` without them: `new` is written whole, not cut."""
    (tmp_path / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    edit(tmp_path, "f.py", ("b = 2\n\n", "b = 20"))
    assert (tmp_path / "f.py").read_text() == "a = 1\nb = 20\nc = 3\n"


def test_a_loose_multi_line_match_that_starts_mid_line(tmp_path: Path) -> None:
    """An `old` found after other text on its first line: that text stays, and the later lines take the file's
    indentation (not the text before the match)."""
    (tmp_path / "f.py").write_text("value = compute(\n    1,\n    2)\n")
    out = edit(tmp_path, "f.py", ("compute(\n    1,\n    2)\n\n", "compute(\n    1,\n    3)"))
    assert out.startswith("edited f.py: 1 edit applied, +1 -1 lines, first change at line 3 · 1 matched ignoring")
    assert (tmp_path / "f.py").read_text() == "value = compute(\n    1,\n    3)\n"


def test_a_loose_match_at_line_start_takes_the_files_indent(tmp_path: Path) -> None:
    """A two-space `old` in a tab file: `new`'s deeper line becomes two tabs, its first line one tab."""
    (tmp_path / "f.go").write_text("func f() {\n\tif a {\n\t\tb()\n\t}\n}\n")
    edit(tmp_path, "f.go", ("  if a {\n    b()\n  }", "  if a {\n    c()\n    d()\n  }"))
    assert (tmp_path / "f.go").read_text() == "func f() {\n\tif a {\n\t\tc()\n\t\td()\n\t}\n}\n"


def test_edits_on_consecutive_lines_both_apply(tmp_path: Path) -> None:
    """One edit ending where the next begins (a line and its newline, then the next line) is not an overlap."""
    (tmp_path / "f.txt").write_text("a\nb\nc\n")
    out = edit(tmp_path, "f.txt", ("a\n", "A\n"), ("b", "B"))
    assert out.startswith("edited f.txt: 2 edits applied, +2 -2 lines, first change at line 1")
    assert (tmp_path / "f.txt").read_text() == "A\nB\nc\n"


def test_edits_touching_inside_one_line_both_apply(tmp_path: Path) -> None:
    """`ab` edited as `a` and `b` separately: adjacent regions, each applied once, in order."""
    (tmp_path / "f.txt").write_text("xab\n")
    edit(tmp_path, "f.txt", ("b", "2"), ("xa", "1"))
    assert (tmp_path / "f.txt").read_text() == "12\n"


def test_an_overlapping_match_counts_as_a_second_occurrence(tmp_path: Path) -> None:
    """`aa` in `aaa` appears twice (at 0 and 1): refused as ambiguous, never silently the first one."""
    (tmp_path / "f.txt").write_text("aaa\n")
    assert edit(tmp_path, "f.txt", ("aa", "b")) == (
        "f.txt: edit #1: old text appears 2 times (lines 1, 1) — to change ONE of them, include its surrounding "
        "lines in old until the text is unique; to change several, send one edit per place, each with enough "
        "context to be unique"
    )
    assert (tmp_path / "f.txt").read_text() == "aaa\n"


def test_an_ambiguous_refusal_lists_ten_lines_at_most(tmp_path: Path) -> None:
    """Twelve occurrences: the count is exact and the line list stops at ten with an ellipsis."""
    (tmp_path / "f.txt").write_text("x\n" * 12)
    out = edit(tmp_path, "f.txt", ("x", "y"))
    assert out.startswith("f.txt: edit #1: old text appears 12 times (lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …) — ")


def test_the_closest_region_hint_can_start_at_line_1(tmp_path: Path) -> None:
    """The file's first lines are the closest region: they are quoted from line 1."""
    (tmp_path / "f.txt").write_text("alpha()\nbeta()\ngamma()\nomega()\n")
    assert edit(tmp_path, "f.txt", ("alpha()\nbeta()\nGAMMA()", "x")) == "\n".join(
        [
            NOT_FOUND,
            "  │ alpha()",
            "  │ beta()",
            "  │ GAMMA()",
            CLOSEST,
            "  │ 1 │ alpha()",
            "  │ 2 │ beta()",
            "  │ 3 │ gamma()",
        ]
    )


def test_the_closest_region_hint_is_offered_when_exactly_half_the_lines_line_up(tmp_path: Path) -> None:
    """tools.md: half the lines have to line up, so two of four is enough for the excerpt."""
    (tmp_path / "f.txt").write_text("zero()\none()\ntwo()\nthree()\nfour()\n")
    assert edit(tmp_path, "f.txt", ("one()\nTWO()\nthree()\nFOUR()", "x")) == "\n".join(
        [
            NOT_FOUND,
            "  │ one()",
            "  │ TWO()",
            "  │ three()",
            "  │ FOUR()",
            CLOSEST,
            "  │ 2 │ one()",
            "  │ 3 │ two()",
            "  │ 4 │ three()",
            "  │ 5 │ four()",
        ]
    )


def test_the_closest_region_can_end_at_the_files_last_line(tmp_path: Path) -> None:
    """The last window of the file is searched too, and the excerpt's numbers are the file's."""
    (tmp_path / "f.txt").write_text("a()\nb()\nc()\nd()\n")
    assert edit(tmp_path, "f.txt", ("c()\nD()", "x")) == "\n".join(
        [NOT_FOUND, "  │ c()", "  │ D()", CLOSEST, "  │ 3 │ c()", "  │ 4 │ d()"]
    )


def test_the_closest_region_prefers_the_earliest_of_equal_windows(tmp_path: Path) -> None:
    """Two regions hold as much of `old`: the first one in the file is shown, line numbers padded to the
    widest one."""
    lines = [f"l{i}()" for i in range(1, 13)]
    lines[7:9] = ["a()", "b()"]  # lines 8 and 9
    lines[10:12] = ["a()", "b()"]  # lines 11 and 12
    (tmp_path / "f.txt").write_text("\n".join(lines) + "\n")
    assert edit(tmp_path, "f.txt", ("a()\nb()\nZ()", "x")) == "\n".join(
        [NOT_FOUND, "  │ a()", "  │ b()", "  │ Z()", CLOSEST, "  │  8 │ a()", "  │  9 │ b()", "  │ 10 │ l10()"]
    )


def test_blank_edges_of_old_are_not_quoted(tmp_path: Path) -> None:
    """The refusal quotes `old` without its blank first and last lines, which the model cannot see anyway."""
    (tmp_path / "f.txt").write_text("a\n")
    assert edit(tmp_path, "f.txt", ("\n  \nzzz\n\n", "x")) == "\n".join([NOT_FOUND, "  │ zzz"])


def test_a_model_that_indents_with_tabs_keeps_its_alignment_spaces(tmp_path: Path) -> None:
    """A tab-indented `new` with a continuation line aligned by two spaces, into a four-space file: the tab
    becomes the file's unit and the two alignment spaces stay two spaces (not another level)."""
    (tmp_path / "f.py").write_text("def f():\n    a = 1\n    b = 2\n")
    edit(tmp_path, "f.py", ("\ta = 1\n\tb = 2", "\ta = 1\n\tb = (2 +\n\t  3)"))
    assert (tmp_path / "f.py").read_text() == "def f():\n    a = 1\n    b = (2 +\n      3)\n"


def test_a_new_that_opens_with_a_blank_line_keeps_it(tmp_path: Path) -> None:
    """`old` padded with spaces only, `new` opening with a newline: the blank line is the model's and is
    added (only padding that `old` itself carried comes off `new`)."""
    (tmp_path / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    edit(tmp_path, "f.py", (" b = 2", "\nb = 20"))
    assert (tmp_path / "f.py").read_text() == "a = 1\n\nb = 20\nc = 3\n"


def test_a_crlf_new_in_a_crlf_file_stays_crlf(tmp_path: Path) -> None:
    """A model that types CRLF itself into a CRLF file gets CRLF line ends, never `\\r\\r\\n`."""
    (tmp_path / "f.py").write_bytes(b"def f():\r\n    a = 1\r\n    b = 2\r\n")
    edit(tmp_path, "f.py", ("a = 1\nb = 2", "a = 10\r\nb = 20"))
    assert (tmp_path / "f.py").read_bytes() == b"def f():\r\n    a = 10\r\n    b = 20\r\n"


def test_a_bare_carriage_return_in_an_lf_file_is_kept(tmp_path: Path) -> None:
    """In an LF file `new` is written as sent: a `\\r` the model put at a line's end is its own business."""
    (tmp_path / "f.txt").write_bytes(b"x:\n    a\n    b\n")
    edit(tmp_path, "f.txt", ("a\nb", "a\r\nb"))
    assert (tmp_path / "f.txt").read_bytes() == b"x:\n    a\r\n    b\n"


def test_line_numbers_count_a_leading_blank_line(tmp_path: Path) -> None:
    """A file that opens with a blank line: the refusal's line numbers are the editor's (2 and 3, not 1 and 2)."""
    (tmp_path / "f.txt").write_text("\nx\nx\n")
    assert edit(tmp_path, "f.txt", ("x", "y")).startswith("f.txt: edit #1: old text appears 2 times (lines 2, 3) — ")


def test_no_closest_region_reaches_before_the_first_line(tmp_path: Path) -> None:
    """`old`'s last lines match the file's first ones: no window starts before line 1, so there is no hint
    (rather than one numbered -1)."""
    (tmp_path / "f.txt").write_text("a()\nb()\nc()\n")
    assert edit(tmp_path, "f.txt", ("x()\ny()\na()\nb()", "z")) == "\n".join(
        [NOT_FOUND, "  │ x()", "  │ y()", "  │ a()", "  │ b()"]
    )


def test_a_long_old_is_quoted_up_to_thirty_lines(tmp_path: Path) -> None:
    """An `old` of 31 lines that is not found: the refusal quotes 30 of them and an ellipsis; of 30, all."""
    (tmp_path / "f.txt").write_text("a\n")
    old = "\n".join(f"line {i}" for i in range(1, 32))
    out = edit(tmp_path, "f.txt", (old, "x"))
    assert out == "\n".join([NOT_FOUND, *(f"  │ line {i}" for i in range(1, 31)), "  │ …"])
    # Exactly thirty: all of them, and no ellipsis claiming more.
    old = "\n".join(f"line {i}" for i in range(1, 31))
    assert edit(tmp_path, "f.txt", (old, "x")) == "\n".join([NOT_FOUND, *(f"  │ line {i}" for i in range(1, 31))])
