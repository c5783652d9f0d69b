"""Reading a model's arguments: forgiving where the intent is plain, a clear text where it is not.

Small models send `"start": "5"` or `"numbered": "true"`; those are accepted. Anything else is refused with
a bracketed message naming the field and what was expected, never an exception into the turn.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mm_core.tools.base import ToolRefusal

# Line numbers and the like: anything beyond a 64-bit integer is a model's garbage, not a position, and
# Python refuses to print an int of more than 4300 digits.
INT_LIMIT = 2**63
_INT_TEXT = re.compile(r"\s*-?[0-9]{1,19}\s*", re.ASCII)
NOT_UNICODE = '[error: {tool}: {where}"{field}" is not valid Unicode text (it holds a lone surrogate)]'


def _bad(tool: str, field: str, expected: str, value: Any) -> ToolRefusal:
    if isinstance(value, int) and not -INT_LIMIT < value < INT_LIMIT:
        shown = "a huge number"
    else:
        try:
            shown = json.dumps(value, ensure_ascii=False)
            shown.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: shown escaped, as JSON allows
            shown = json.dumps(value)
        except RecursionError:
            shown = "a value nested too deep to show"
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ToolRefusal(f'[error: {tool}: "{field}" must be {expected}, got {shown}]')


def get_str(args: dict[str, Any], tool: str, field: str, default: str | None = None) -> str:
    value = args.get(field, default)
    if value is None:
        raise ToolRefusal(f'[error: {tool}: missing "{field}"]')
    if not isinstance(value, str):
        raise _bad(tool, field, "a string", value)
    return check_text(value, tool, field)


def check_text(value: str, tool: str, field: str, where: str = "") -> str:
    """`value` when it can be encoded: JSON lets a lone surrogate (`"\\ud800"`) through, and the file system,
    a subprocess or the session log would then raise instead of answering."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolRefusal(NOT_UNICODE.format(tool=tool, where=where, field=field)) from None
    return value


def get_int(args: dict[str, Any], tool: str, field: str, default: int = 0) -> int:
    value = args.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool):
        raise _bad(tool, field, "an integer", value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and -INT_LIMIT < value < INT_LIMIT:
        return value
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        return int(value)
    raise _bad(tool, field, "an integer", value)


def get_bool(args: dict[str, Any], tool: str, field: str, default: bool = False) -> bool:
    value = args.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _bad(tool, field, "true or false", value)


def check_object(args: Any, tool: str) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise ToolRefusal(f"[error: {tool}: the arguments must be a JSON object]")
    return args
