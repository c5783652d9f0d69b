"""The audit's two formats, written as the calls come (chatops/audit.py reads them a page at a time):

- `jsonl`: one JSON object a line, a call with the list of its decisions; exact, for programs (`jq`).
- `csv`: one row a call, its decisions in one readable column (`approve by U0BOB at 2026-01-31T09:00:00Z`);
  for a spreadsheet, so a cell that a spreadsheet would run as a formula (one starting `=`, `+`, `-`, `@`, or a
  tab or carriage return: the model writes the arguments) starts with `'` instead, which shows the text as
  written.

Times are UTC, ISO 8601, to the second, with `Z`. A call's thread is its channel and thread ts, and its link when
the workspace's address is known (chatops/permalinks.py).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from chatops.audit import AuditCall, Decided
from chatops.permalinks import permalink
from chatops.schema import Vote

FORMATS = ("jsonl", "csv")
CSV_COLUMNS = (
    "at",
    "call_id",
    "tool",
    "agent",
    "outcome",
    "requested_by",
    "rule",
    "matched",
    "needed",
    "approval",
    "decisions",
    "decision",
    "decided_by",
    "channel",
    "thread_ts",
    "permalink",
    "session_id",
    "kind",
    "started_at",
    "finished_at",
    "duration_ms",
    "purged_at",
    "purged_by",
    "arguments",
)
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Written:
    calls: int
    complete: bool  # False: it stopped at `max_chars`, with calls left


def write(
    calls: Iterable[AuditCall],
    out: TextIO,
    fmt: str,
    *,
    workspace: str | None = None,
    max_chars: int | None = None,
) -> Written:
    """Write `calls` to `out` in `fmt` (FORMATS); `workspace`: the address links start with (none without it).
    With `max_chars`, it stops before the call that would pass it (at least one call is written)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown audit format {fmt!r}: {', '.join(FORMATS)}")
    size = count = 0
    lines = _Lines()
    table = csv.writer(lines, lineterminator="\n")
    if fmt == "csv":
        table.writerow(CSV_COLUMNS)
        out.write(lines.take())
    for call in calls:
        if fmt == "jsonl":
            text = json.dumps(_record(call, workspace)) + "\n"
        else:
            table.writerow([_cell(v) for v in _row(call, workspace)])
            text = lines.take()
        if max_chars is not None and count and size + len(text) > max_chars:
            return Written(count, complete=False)
        out.write(text)
        size += len(text)
        count += 1
    return Written(count, complete=True)


class _Lines:
    """What csv.writer writes, taken a row at a time (so a row's size is known before it is kept)."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def take(self) -> str:
        text, self._parts = "".join(self._parts), []
        return text


def when(moment: datetime | None) -> str | None:
    """A time as the export writes it: `2026-01-31T09:00:00Z`."""
    if moment is None:
        return None
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def _link(call: AuditCall, workspace: str | None) -> str | None:
    if workspace is None or not call.channel_id or not call.thread_ts:
        return None
    return permalink(workspace, call.channel_id, call.thread_ts)


def _record(call: AuditCall, workspace: str | None) -> dict[str, Any]:
    return {
        "at": when(call.at),
        "call_id": call.call_id,
        "session_id": call.session_id,
        "kind": call.kind,
        "channel": call.channel_id,
        "thread_ts": call.thread_ts,
        "permalink": _link(call, workspace),
        "requested_by": list(call.requested_by),
        "tool": call.tool,
        "agent": call.agent,
        "arguments": call.arguments,
        "rule": call.rule,
        "matched": call.matched,
        "needed": call.needed,
        "approval": call.approval,
        "decisions": [
            {"by": d.by, "vote": d.vote, "approve_all": d.approve_all, "rule": d.rule, "at": when(d.at)}
            for d in call.decisions
        ],
        "decision": call.decision,
        "decided_by": call.decided_by,
        "outcome": call.outcome,
        "started_at": when(call.started_at),
        "finished_at": when(call.finished_at),
        "duration_ms": call.duration_ms,
        "purged_at": when(call.purged_at),
        "purged_by": call.purged_by,
    }


def _row(call: AuditCall, workspace: str | None) -> list[Any]:
    record = _record(call, workspace)
    values = {
        **record,
        "requested_by": ",".join(call.requested_by),
        "decisions": "; ".join(_said(d) for d in call.decisions),
    }
    return [values[column] for column in CSV_COLUMNS]


def _said(decided: Decided) -> str:
    """One decision in words: `approve by U0BOB at 2026-01-31T09:00:00Z (approve all; rule prod-deploy)`."""
    at = when(decided.at) or "an unknown time"
    head = f"expired at {at}" if decided.vote == Vote.EXPIRE else f"{decided.vote} by {decided.by or '?'} at {at}"
    notes = ["approve all"] if decided.approve_all else []
    notes += [f"rule {decided.rule}"] if decided.rule else []
    return f"{head} ({'; '.join(notes)})" if notes else head


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    return value
