"""The lsp tool's pure parts: wire positions, edits applied back to front, argument cleaning, the order in which a
symbol's occurrences are tried. No server needed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lsprotocol import types

from mm_core.config import LspServer
from mm_core.tools.lsp.manager import extension_map
from mm_core.tools.lsp.positions import UTF8, UTF16, UTF32, from_wire, split_lines, to_wire
from mm_core.tools.lsp.tool import Call, apply_edits, clean_identifier, parse, symbol_positions


def test_utf16_columns_count_non_bmp_characters_twice():
    line = 'x = "🎉é"; greet()'
    char = line.index("greet")
    assert to_wire(line, char, UTF16) == char + 1  # 🎉 is a surrogate pair, é is one unit
    assert to_wire(line, char, UTF32) == char
    assert to_wire(line, char, UTF8) == char + 3 + 1  # 🎉 is 4 bytes, é is 2
    for encoding in (UTF16, UTF32, UTF8):
        assert from_wire(line, to_wire(line, char, encoding), encoding) == char


@given(st.text(max_size=30), st.data())
def test_wire_columns_round_trip(line, data):
    char = data.draw(st.integers(0, len(line)))
    for encoding in (UTF16, UTF32, UTF8):
        assert from_wire(line, to_wire(line, char, encoding), encoding) == char


def test_from_wire_clamps_past_the_end():
    assert from_wire("abc", 10) == 3


def _edit(line1, col1, line2, col2, text):
    return types.TextEdit(
        range=types.Range(
            start=types.Position(line=line1, character=col1), end=types.Position(line=line2, character=col2)
        ),
        new_text=text,
    )


def test_apply_edits_back_to_front_with_utf16_and_crlf():
    text = 'a = "🎉"; greet(greet)\r\nprint(greet)\r\n'
    # UTF-16 columns: `greet` at 10 and 16 on line 0 (🎉 counts 2), at 6 on line 1.
    edits = [_edit(0, 10, 0, 15, "hello"), _edit(1, 6, 1, 11, "hello"), _edit(0, 16, 0, 21, "hello")]
    assert apply_edits(text, edits) == 'a = "🎉"; hello(hello)\r\nprint(hello)\r\n'


def test_apply_edits_whole_file_replacement():
    text = "one\ntwo\n"
    assert apply_edits(text, [_edit(0, 0, 2, 0, "three\n")]) == "three\n"


def parsed(args: dict[str, object]) -> Call:
    call = parse(args)
    assert isinstance(call, Call), call
    return call


@pytest.mark.parametrize(
    "raw, cleaned",
    [
        ("Greet", "Greet"),
        ("Greet', ", "Greet"),
        ("person.Greet", "Greet"),
        ("`Greet()`", "Greet"),
        ("pkg::Greet", "Greet"),
        ("  ", ""),
        ("'.,", ""),
        ("fête", "fête"),
    ],
)
def test_clean_identifier(raw, cleaned):
    assert clean_identifier(raw) == cleaned


def test_rename_written_into_one_string():
    call = parsed({"action": "rename", "path": "main.go", "symbol": "Greet 1 12 Hello"})
    assert (call.symbol, call.new_name) == ("Greet", "Hello")
    call = parsed({"action": "rename", "path": "main.go", "symbol": "Greet", "new_name": "'Hello',"})
    assert (call.symbol, call.new_name) == ("Greet", "Hello")


@pytest.mark.parametrize(
    "args, text",
    [
        (
            {"action": "jump", "path": "a.py"},
            '[lsp: unknown action "jump" — use one of: definition, references, hover, symbols, diagnostics, rename]',
        ),
        ({"action": "hover"}, "[lsp: hover needs a path (the file, relative to the working directory)]"),
        ({"action": "hover", "path": "a.py", "line": "x"}, "[lsp: line must be a whole number, got 'x']"),
        ({"action": "hover", "path": "a.py", "line": True}, "[lsp: line must be a whole number, got True]"),
        ({"action": "hover", "path": "a.py", "column": 2.5}, "[lsp: column must be a whole number, got 2.5]"),
        ({"action": "hover", "path": "a.py", "line": -3}, "[lsp: line is 1-based and cannot be negative, got -3]"),
    ],
)
def test_bad_arguments(args, text):
    assert parse(args) == text


def test_numbers_given_as_strings_are_accepted():
    call = parsed({"action": "hover", "path": "a.py", "line": "9", "column": 14.0})
    assert (call.line, call.column) == (9, 14)


SOURCE = """# greet says hello; greet is used below
def greet(name):  # greet
    return name


x = greet("a")
"""


def test_occurrences_code_lines_first_comments_last():
    call = parsed({"action": "definition", "path": "a.py", "symbol": "greet"})
    # Code occurrences in file order, then the trailing comment on line 2, then the comment line 1.
    assert symbol_positions(call, split_lines(SOURCE)) == [(1, 4), (5, 4), (0, 2), (0, 20), (1, 20)]


def test_occurrences_are_whole_words():
    call = parsed({"action": "definition", "path": "a.py", "symbol": "name"})
    assert symbol_positions(call, split_lines("names = 1\nname = 2\nrename(name)\n")) == [(1, 0), (2, 7)]


def test_line_restricts_and_column_picks_the_occurrence():
    lines = split_lines("a = greet(greet)\n")
    call = parsed({"action": "hover", "path": "a.py", "symbol": "greet", "line": 1, "column": 12})
    assert symbol_positions(call, lines)[0] == (0, 10)
    call = parsed({"action": "hover", "path": "a.py", "symbol": "other", "line": 1})
    assert symbol_positions(call, lines) == '[lsp: "other" not found on line 1 of a.py]'


def test_positions_past_the_end_are_refused_with_the_count():
    lines = split_lines("x = 1\nprint(x)\nvalue = 123456789\n")
    call = parsed({"action": "hover", "path": "main.py", "line": 3, "column": 40})
    assert symbol_positions(call, lines) == "[lsp: column 40 is past the end of line 3 (17 characters)]"
    call = parsed({"action": "hover", "path": "main.py", "line": 9, "column": 1})
    assert symbol_positions(call, lines) == "[lsp: line 9 is past the end of main.py (3 lines)]"
    call = parsed({"action": "hover", "path": "main.py"})
    assert symbol_positions(call, lines) == (
        "[lsp: hover needs a symbol (the identifier, as written in the code), or a line and a column]"
    )


def test_two_servers_on_one_extension_are_refused():
    servers = {
        "pylsp": LspServer(command="pylsp", extensions=[".py"]),
        "jedi": LspServer(command="jedi-language-server", extensions=["py"]),
    }
    with pytest.raises(ValueError, match=r"pylsp and jedi both serve \.py"):
        extension_map(servers)
