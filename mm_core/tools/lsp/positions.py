"""Positions: 1-based characters at the tool's boundary, 0-based code units on the wire.

LSP counts columns in UTF-16 code units unless the server negotiated another encoding (LSP 3.17
`positionEncoding`: utf-8 bytes or utf-32 code points); in UTF-16 a character outside the BMP (most emoji)
is two units. Lines are split the way the protocol splits them: on \\n, \\r\\n and \\r.
"""

from __future__ import annotations

import re

UTF16, UTF32, UTF8 = "utf-16", "utf-32", "utf-8"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """The document's lines without their breaks; a trailing break opens an empty last line, as in LSP."""
    return _LINE_BREAK.split(text)


def line_starts(text: str) -> list[int]:
    """The string offset at which each line starts."""
    return [0] + [m.end() for m in _LINE_BREAK.finditer(text)]


def _width(ch: str, encoding: str) -> int:
    if encoding == UTF32:
        return 1
    if encoding == UTF8:
        return len(ch.encode("utf-8", errors="surrogatepass"))
    return 2 if ord(ch) > 0xFFFF else 1


def to_wire(line: str, char: int, encoding: str = UTF16) -> int:
    """Wire column of the character at index `char` (0-based) in `line`."""
    return sum(_width(ch, encoding) for ch in line[:char])


def from_wire(line: str, units: int, encoding: str = UTF16) -> int:
    """0-based character index for a wire column. A column inside a character or past the end is clamped:
    servers sometimes send one past the end of a line."""
    count = 0
    for i, ch in enumerate(line):
        if count >= units:
            return i
        count += _width(ch, encoding)
    return len(line)


def offset(text: str, starts: list[int], line: int, units: int, encoding: str = UTF16) -> int:
    """String offset of a wire position (0-based line, column in `encoding` units), clamped to the document."""
    if line >= len(starts):
        return len(text)
    start = starts[line]
    end = starts[line + 1] if line + 1 < len(starts) else len(text)
    body = _LINE_BREAK.sub("", text[start:end])
    return start + from_wire(body, units, encoding)
