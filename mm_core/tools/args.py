"""Reading a model's arguments: forgiving where the intent is plain, a clear text where it is not.

Small models send `"start": "5"` or `"numbered": "true"`; those are accepted. Anything else is refused with
a bracketed message naming the field and what was expected, never an exception into the turn.
"""

from __future__ import annotations

import json
from typing import Any


class BadArgument(Exception):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def _bad(tool: str, field: str, expected: str, value: Any) -> BadArgument:
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return BadArgument(f'[error: {tool}: "{field}" must be {expected}, got {shown}]')


def get_str(args: dict[str, Any], tool: str, field: str, default: str | None = None) -> str:
    value = args.get(field, default)
    if value is None:
        raise BadArgument(f'[error: {tool}: missing "{field}"]')
    if not isinstance(value, str):
        raise _bad(tool, field, "a string", value)
    return value


def get_int(args: dict[str, Any], tool: str, field: str, default: int = 0) -> int:
    value = args.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool):
        raise _bad(tool, field, "an integer", value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
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
        raise BadArgument(f"[error: {tool}: the arguments must be a JSON object]")
    return args
