"""read_file and write_file: the reference's strings, the final-newline rule, diffs, bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_core.tools.files import ReadFileTool, WriteFileTool
from tool_helpers import call, make_ctx, preview

READ, WRITE = ReadFileTool(), WriteFileTool()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


def test_missing_file_answers_with_the_reference_sentence(ws):
    assert call(READ, {"path": "nope.go"}, make_ctx(ws)) == "nope.go does not exist. Create it with write_file"


def test_final_newline_kept_only_when_the_end_of_the_file_is_shown(ws):
    (ws / "f.txt").write_text("one\ntwo\nthree\n")
    ctx = make_ctx(ws)
    assert call(READ, {"path": "f.txt"}, ctx) == "one\ntwo\nthree\n"
    assert call(READ, {"path": "f.txt", "start": 1, "end": 2}, ctx) == "one\ntwo"
    assert call(READ, {"path": "f.txt", "start": 2}, ctx) == "two\nthree\n"
    assert call(READ, {"path": "f.txt", "start": 3, "end": 99}, ctx) == "three\n"
    (ws / "g.txt").write_text("one\ntwo")
    assert call(READ, {"path": "g.txt", "start": 2}, ctx) == "two"


def test_numbered_lines_and_forgiven_string_numbers(ws):
    (ws / "f.txt").write_text("".join(f"l{i}\n" for i in range(1, 13)))
    out = call(READ, {"path": "f.txt", "start": "9", "end": 11, "numbered": "true"}, make_ctx(ws))
    assert out == " 9 │ l9\n10 │ l10\n11 │ l11"


def test_a_carriage_return_stays_part_of_its_line(ws):
    (ws / "dos.txt").write_bytes(b"a\r\nb\r\n")
    assert call(READ, {"path": "dos.txt", "end": 1}, make_ctx(ws)) == "a\r"


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"path": "f.txt", "start": 9}, "[error: start 9 is past the end of f.txt (3 lines)]"),
        ({"path": "f.txt", "start": 3, "end": 2}, "[error: end 2 is before start 3]"),
        ({"path": "f.txt", "start": -1}, '[error: read_file: "start" must be 0 or a line number, got -1]'),
        ({"path": "f.txt", "start": "x"}, '[error: read_file: "start" must be an integer, got "x"]'),
        ({"path": "f.txt", "numbered": 3}, '[error: read_file: "numbered" must be true or false, got 3]'),
        ({"path": 12}, '[error: read_file: "path" must be a string, got 12]'),
        ({}, '[error: read_file: missing "path"]'),
        ({"path": "  "}, "[error: read_file needs a path, relative to the working directory]"),
        ({"path": "sub"}, "[error: sub is a directory — list it with bash (ls sub)]"),
        ({"path": "empty.txt"}, "[empty.txt is empty]"),
        ({"path": "f.txt", "start": "--5"}, '[error: read_file: "start" must be an integer, got "--5"]'),
        ({"path": "f.txt", "start": "²"}, '[error: read_file: "start" must be an integer, got "²"]'),
        (
            {"path": "f.txt", "end": "1" * 5000},
            '[error: read_file: "end" must be an integer, got "' + "1" * 56 + "...]",
        ),
        ({"path": "f.txt", "start": 10**5000}, '[error: read_file: "start" must be an integer, got a huge number]'),
        ({"path": "f.txt", "start": 2**63}, '[error: read_file: "start" must be an integer, got a huge number]'),
        ({"path": "f.txt", "end": 2**62}, "a\nb\nc\n"),
    ],
)
def test_bad_reads_are_answered_in_text(ws, args, expected):
    (ws / "f.txt").write_text("a\nb\nc\n")
    (ws / "sub").mkdir()
    (ws / "empty.txt").write_text("")
    assert call(READ, args, make_ctx(ws)) == expected


def test_output_truncated_to_max_output(ws):
    (ws / "big.txt").write_text("x" * 250)
    out = call(READ, {"path": "big.txt"}, make_ctx(ws, maxOutput=100))
    assert out == "x" * 100 + "\n[... output truncated: 150 more characters not shown ...]"


line_text = st.text(
    alphabet=st.characters(
        blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", blacklist_categories=("Cs",)
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(line_text, min_size=1, max_size=12),
    final=st.booleans(),
    start=st.integers(0, 14),
    end=st.integers(0, 14),
)
def test_start_and_end_agree_with_python_line_splitting(tmp_path_factory, lines, final, start, end):
    ws = tmp_path_factory.mktemp("ws")
    text = "\n".join(lines) + ("\n" if final else "")
    (ws / "f.txt").write_text(text, newline="")
    out = call(READ, {"path": "f.txt", "start": start, "end": end}, make_ctx(ws, maxOutput=10**6))
    expected_lines = text.splitlines(keepends=True)
    # The arguments are checked before the file is read.
    if end and end < start:
        assert out == f"[error: end {end} is before start {start}]"
        return
    if not text:
        assert out == "[f.txt is empty]"
        return
    if start > len(expected_lines):
        assert out.startswith(f"[error: start {start} is past the end of f.txt")
        return
    last = min(end, len(expected_lines)) if end else len(expected_lines)
    want = "".join(expected_lines[max(start, 1) - 1 : last])
    if last < len(expected_lines):
        want = want.removesuffix("\n")
    assert out == want


def test_write_creates_parents_and_shows_a_new_file_diff(ws):
    out = call(WRITE, {"path": "a/b/c.txt", "content": "one\ntwo\n"}, make_ctx(ws))
    assert out == "wrote a/b/c.txt: new file, 2 lines\n@@ -0,0 +1,2 @@\n+1 │ one\n+2 │ two"
    assert (ws / "a/b/c.txt").read_text() == "one\ntwo\n"


def test_write_replaces_and_shows_the_diff_with_line_numbers(ws):
    (ws / "f.txt").write_text("one\ntwo\nthree\n")
    out = call(WRITE, {"path": "f.txt", "content": "one\nTWO\nthree"}, make_ctx(ws))
    assert out == (
        "wrote f.txt: 3 lines, +2 -2\n@@ -1,3 +1,3 @@\n 1 │ one\n-2 │ two\n-3 │ three\n+2 │ TWO\n+3 │ three\n"
        "\\ no newline at end of file"
    )
    assert (ws / "f.txt").read_text() == "one\nTWO\nthree"


def test_identical_content_is_not_written(ws):
    target = ws / "f.txt"
    target.write_text("same\n")
    before = target.stat().st_mtime_ns
    assert call(WRITE, {"path": "f.txt", "content": "same\n"}, make_ctx(ws)) == (
        "f.txt already has exactly this content — nothing written"
    )
    assert target.stat().st_mtime_ns == before


def test_preview_shows_the_change_without_writing(ws):
    (ws / "f.txt").write_text("a\n")
    shown = preview(WRITE, {"path": "f.txt", "content": "b\n"}, make_ctx(ws))
    assert shown == "would write f.txt: 1 line, +1 -1\n@@ -1,1 +1,1 @@\n-1 │ a\n+1 │ b"
    assert (ws / "f.txt").read_text() == "a\n"


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"path": "f.txt"}, '[error: write_file: missing "content"]'),
        ({"path": "f.txt", "content": ["x"]}, '[error: write_file: "content" must be a string, got ["x"]]'),
        ({"path": "d", "content": "x"}, "[error: d is a directory — list it with bash (ls d)]"),
        ("not an object", "[error: write_file: the arguments must be a JSON object]"),
        (
            {"path": "f.txt", "content": "a\ud800b"},
            '[error: write_file: "content" is not valid Unicode text (it holds a lone surrogate)]',
        ),
    ],
)
def test_bad_writes_are_answered_in_text(ws, args, expected):
    (ws / "d").mkdir()
    assert call(WRITE, args, make_ctx(ws)) == expected
    assert not (ws / "f.txt").exists()


def test_declarations_titles_and_gating():
    assert READ.schema()["parameters"]["properties"]["start"] == {
        "type": "integer",
        "default": 0,
        "description": "First line (1-based); 0 = from the start.",
    }
    assert READ.schema()["parameters"]["required"] == ["path"]
    assert WRITE.schema()["parameters"]["required"] == ["path", "content"]
    assert (READ.counter, WRITE.counter, READ.emoji, WRITE.emoji) == ("file_ops", "file_ops", "📄", "📝")
    assert not READ.needs_approval({"path": "x"}) and WRITE.needs_approval({"path": "x"})
    assert WRITE.title({"path": "x.go"}) == "write_file x.go" and READ.title({"path": "x.go"}) == "read_file x.go"
    assert WRITE.refusal({}) == "[write_file rejected by the user]"


def test_bytes_that_are_not_utf8_are_shown_replaced_and_never_rewritten(ws):
    # A Latin-1 file: read_file shows U+FFFD, and writing it back unchanged must not turn é into U+FFFD.
    (ws / "lat.txt").write_bytes(b"caf\xe9\nline2\n")
    ctx = make_ctx(ws)
    assert call(READ, {"path": "lat.txt"}, ctx) == "caf\ufffd\nline2\n"
    out = call(WRITE, {"path": "lat.txt", "content": "caf\ufffd\nline2\n"}, ctx)
    assert out == "wrote lat.txt: 2 lines, +1 -1\n@@ -1,2 +1,2 @@\n-1 │ caf\ufffd\n+1 │ caf\ufffd\n 2 │ line2"
    assert (ws / "lat.txt").read_bytes() == "caf\ufffd\nline2\n".encode()


def test_a_write_through_a_symlink_names_the_file_it_lands_in_to_the_approver(ws):
    """Issue 21, second round: the repository commits `docs/notes.md -> ../.github/workflows/release.yml`; the
    approver read "new file docs/notes.md" while the bytes went into the workflow. The preview (and so the
    approval's digest) names the target; the model's text stays the reference's."""
    from mm_core.tools.fetch.tool import FetchContentTool

    (ws / "docs").mkdir()
    (ws / "docs" / "notes.md").symlink_to("../.github/workflows/release.yml")  # dangling: the file is new
    args = {"path": "docs/notes.md", "content": "on: push\n"}
    ctx = make_ctx(ws)
    assert preview(WRITE, args, ctx) == (
        "would write docs/notes.md → .github/workflows/release.yml (symlink): new file, 1 line\n"
        "@@ -0,0 +1,1 @@\n+1 │ on: push"
    )
    # A directory on the way that is a link, and an existing target: the same.
    (ws / ".github" / "workflows").mkdir(parents=True)
    (ws / "ci").symlink_to(".github/workflows")
    (ws / ".github" / "workflows" / "test.yml").write_text("on: pull_request\n")
    assert preview(WRITE, {"path": "ci/test.yml", "content": "x\n"}, ctx).startswith(
        "would write ci/test.yml → .github/workflows/test.yml (symlink): 1 line, +1 -1\n"
    )
    # A path that names the file itself is shown as given.
    assert preview(WRITE, {"path": "./plain.md", "content": "x\n"}, ctx).startswith("would write ./plain.md: new")
    # What the model reads is unchanged: the path it gave.
    assert call(WRITE, args, ctx) == "wrote docs/notes.md: new file, 1 line\n@@ -0,0 +1,1 @@\n+1 │ on: push"
    assert (ws / ".github" / "workflows" / "release.yml").read_text() == "on: push\n"
    # fetch_content's output: its preview names the target too (nothing is fetched to say so).
    fetch = FetchContentTool(ctx.config)
    page = {"url": "https://docs.example/x", "output": "docs/notes.md"}
    assert preview(fetch, page, ctx) == (
        "fetch_content: https://docs.example/x → docs/notes.md → .github/workflows/release.yml (symlink)"
    )
    assert preview(fetch, {**page, "output": "plain.md"}, ctx) == fetch.title({**page, "output": "plain.md"})
