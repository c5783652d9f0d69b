"""The reference's encoding chain, exactly: byte-order mark, the header's charset, a `<meta>` charset in the
first 4 KiB, UTF-8 when the bytes are valid UTF-8, else windows-1252. No guessing: on real Western European
pages a detector's guess was wrong where this rule was right.

Labels follow the WHATWG Encoding Standard, as browsers (and the reference's Go library) read them, through
`webencodings` (html5lib's own label table): `iso-8859-1`, `latin1` and `ascii` mean windows-1252, a name
that is not a charset there (`base64`, `unicode_escape`: Python codecs, not encodings of text) is unknown,
and a `<meta>` that says UTF-16 means UTF-8.
"""

from __future__ import annotations

import codecs
import re

import webencodings

_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([^\s"';>/]+)""", re.I)
_META = re.compile(r"<meta\b[^>]*>", re.I)
_HTTP_EQUIV = re.compile(r"""http-equiv\s*=\s*["']?\s*content-type""", re.I)
_META_CHARSET = re.compile(r"""^<meta\b[^>]*?\bcharset\s*=\s*["']?\s*([^\s"'>/;]+)""", re.I)
_CONTENT = re.compile(r"""\bcontent\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
PRESCAN_BYTES = 4096


def _c1_passthrough(exc: UnicodeError) -> tuple[str, int]:
    # WHATWG windows-1252 maps the five bytes Python's cp1252 leaves undefined to the C1 controls.
    if not isinstance(exc, UnicodeDecodeError):  # registered for decoding only
        raise exc
    return "".join(chr(b) for b in exc.object[exc.start : exc.end]), exc.end


codecs.register_error("mm-c1-passthrough", _c1_passthrough)


def lookup(label: str | None) -> str | None:
    """The Python codec for a charset label, or None for an unknown one (which the chain skips)."""
    if not label:
        return None
    encoding = webencodings.lookup(label.strip().strip("\"'"))
    if encoding is None:
        return None
    try:  # x-user-defined has a codec in webencodings only, not in Python's registry
        return codecs.lookup(encoding.codec_info.name).name
    except LookupError:
        return None


def header_charset(content_type: str | None) -> str | None:
    match = _CHARSET.search(content_type or "")
    return match.group(1) if match else None


def meta_charset(head: bytes) -> str | None:
    """The first usable charset declared by a `<meta>` in the first 4 KiB."""
    text = head[:PRESCAN_BYTES].decode("latin-1")
    for tag in _META.finditer(text):
        found = _META_CHARSET.match(tag.group(0))
        label = found.group(1) if found else None
        if label is None and _HTTP_EQUIV.search(tag.group(0)):
            content = _CONTENT.search(tag.group(0))
            label = header_charset(next(g for g in content.groups() if g is not None)) if content else None
        codec = lookup(label)
        if codec is not None:
            return "utf-8" if codec.startswith("utf-16") else codec
    return None


def choose(body: bytes, content_type: str | None) -> tuple[str, int]:
    """(codec, bytes of BOM to skip) for a page."""
    for bom, codec in _BOMS:
        if body.startswith(bom):
            return codec, len(bom)
    codec = lookup(header_charset(content_type)) or meta_charset(body)
    if codec is not None:
        return codec, 0
    try:
        body.decode("utf-8")
        return "utf-8", 0
    except UnicodeDecodeError:
        return "cp1252", 0


def decode(body: bytes, content_type: str | None) -> str:
    codec, skip = choose(body, content_type)
    errors = "mm-c1-passthrough" if codec == "cp1252" else "replace"
    return body[skip:].decode(codec, errors=errors)
