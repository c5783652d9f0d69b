"""edit_file: replacements resolved against the original file, verifiable, forgiving only about whitespace.

Every `old` must be found exactly once. Three passes, strictest first, and the first pass that finds anything
at all wins (tools.md, "How old is matched"):

1. exact — byte for byte;
2. edges — `old` without the whitespace around it (an indent kept on a single line, a stray newline);
3. indent — every line compared without its leading and trailing whitespace (tabs versus spaces), for an
   `old` of two lines or more.

A loose match must still be unique, and `new` is then re-indented to the file's own indentation. All edits
are located in the original text before anything changes; if any is refused, nothing is written.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from mm_core.tools.args import check_object, check_text, get_bool
from mm_core.tools.base import Plan, PlannedTool, ToolContext, ToolRefusal
from mm_core.tools.diff import Diff
from mm_core.tools.files import UNFORESEEN, PlannedWrite, path_arg, plan_write, read_text, unforeseen, written
from mm_core.tools.text import plural, show
from mm_core.tools.workspace import resolve

NOT_FOUND = (
    "{path}: edit #{n}: old text not found — it must match the file exactly, including indentation and line breaks:"
)
CLOSEST = "the closest the file comes to it — copy these lines:"
MAX_HINTS = 3  # closest-region hints in one call
AMBIGUOUS = (
    "{path}: edit #{n}: old text appears {count} times (lines {lines}) — to change ONE of them, include "
    "its surrounding lines in old until the text is unique; to change several, send one edit per place, "
    "each with enough context to be unique"
)
OVERLAP = (
    "{path}: edit #{n}: {relation} edit #{other} (line {line}) — edits must not overlap, nest or repeat; "
    "merge them into one edit"
)
EMPTY_OLD = "{path}: edit #{n}: old is empty — quote the exact text to replace; to write a whole file, use write_file"
SAME = "{path}: edit #{n}: old and new are the same — nothing to change"
NOTHING_WRITTEN = "nothing was written to {path}: send all {count} edits again once the refused ones are fixed"
BAD_EDITS = '[error: edit_file: "edits" must be a list of {"old": "...", "new": "..."} objects]'
BAD_EDIT = '[error: edit_file: edit #{n} needs "old" and "new", both strings]'
NO_EDITS = '[error: edit_file: "edits" is empty — send at least one {"old": "...", "new": "..."}]'
EDITED = "edited {path}: {edits} applied, +{added} -{deleted} lines, first change at line {line}"
DRY_RUN = "dry run, {path} not written: {edits} would apply, +{added} -{deleted} lines, first change at line {line}"
RELAXED = " · {count} matched ignoring whitespace"
UNCHANGED = "{path} unchanged: the edits give back the same text — nothing written"

QUOTE = "  │ {line}"
QUOTE_NUMBERED = "  │ {number:>{width}} │ {line}"
MAX_LINES_LISTED = 10
MAX_QUOTED_LINES = 30
# The closest-region search counts, for each window of the file, how many of old's lines it holds. A line
# that occurs everywhere (`}`) costs one step per occurrence, so past this budget the most common lines are
# left out of the count: the hint stays fast on a large file and is only a hint.
CLOSEST_BUDGET = 2_000_000
TAB_COLUMNS = 4


@dataclass(frozen=True)
class Edit:
    old: str
    new: str


@dataclass(frozen=True)
class Located:
    index: int  # position in the request, 0-based
    start: int  # region of the original text to replace
    end: int
    replacement: str
    relaxed: bool


class Refused(ToolRefusal):
    """A refusal that quotes the file: its undecodable bytes are shown as escapes."""


# ---------------------------------------------------------------------------------------------- matching


def _occurrences(text: str, needle: str) -> list[int]:
    """Every start of `needle`, overlapping ones included: `aa` in `aaa` is ambiguous."""
    found, i = [], text.find(needle)
    while i >= 0:
        found.append(i)
        i = text.find(needle, i + 1)
    return found


def _line_offsets(text: str) -> list[int]:
    offsets, i = [0], text.find("\n")
    while i >= 0:
        offsets.append(i + 1)
        i = text.find("\n", i + 1)
    return offsets


def _indent_matches(text: str, core: str) -> list[tuple[int, int]]:
    """Pass 3: windows of lines equal to `core`'s lines once each line is stripped of its edge whitespace."""
    want = [line.strip() for line in core.split("\n")]
    lines = text.split("\n")
    offsets = _line_offsets(text)
    found = []
    for i in range(len(lines) - len(want) + 1):
        if lines[i].strip() != want[0]:
            continue
        if all(lines[i + k].strip() == want[k] for k in range(1, len(want))):
            first, last = lines[i], lines[i + len(want) - 1]
            start = offsets[i] + len(first) - len(first.lstrip())
            end = offsets[i + len(want) - 1] + len(last.rstrip())
            found.append((start, end))
    return found


def find(text: str, old: str) -> tuple[list[tuple[int, int]], bool]:
    """The regions where `old` matches in the first pass that finds any, and whether that pass was loose."""
    exact = _occurrences(text, old)
    if exact:
        return [(i, i + len(old)) for i in exact], False
    core = old.strip()
    if not core:
        return [], False
    if core != old:
        edges = _occurrences(text, core)
        if edges:
            return [(i, i + len(core)) for i in edges], True
    if "\n" in core:
        return _indent_matches(text, core), True
    return [], False


# --------------------------------------------------------------------------------------------- indenting


def _lead(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _columns(ws: str) -> int:
    return sum(TAB_COLUMNS if c == "\t" else 1 for c in ws)


def file_unit(text: str) -> str | None:
    """The file's indent unit: a tab, or the most common step between space indents; None if unindented."""
    tabs = spaces = 0
    steps: Counter[int] = Counter()
    previous = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        lead = _lead(line)
        if lead.startswith("\t"):
            tabs += 1
            continue
        if lead:
            spaces += 1
        if "\t" not in lead:
            if abs(len(lead) - previous) > 0:
                steps[abs(len(lead) - previous)] += 1
            previous = len(lead)
    if tabs and tabs >= spaces:
        return "\t"
    if steps:
        step = max(steps, key=lambda s: (steps[s], -s))
        return " " * min(step, 8)
    return None


def _model_unit(lines: list[str], base: str) -> int:
    """Columns per level in the model's text: a tab's worth if it used tabs, else the gcd of its steps."""
    leads = [_lead(line) for line in lines if line.strip()]
    if any("\t" in lead for lead in leads):
        return TAB_COLUMNS
    step = 0
    for lead in leads:
        step = math.gcd(step, abs(_columns(lead) - _columns(base)))
    return step or TAB_COLUMNS


def _shift(file_base: str, rel: int, unit_columns: int, unit: str) -> str:
    levels, rest = divmod(rel, unit_columns)
    if levels >= 0:
        return file_base + unit * levels + " " * rest
    return file_base[: max(0, len(file_base) + levels * len(unit))] + " " * rest


def relaxed_replacement(text: str, start: int, old: str, new: str, unit: str | None) -> tuple[int, str]:
    """For a loose match of `old` at `start`: the region start to use and `new` in the file's indentation.

    The padding `old` carried comes off `new` when `new` carries the same; every line of `new` keeps its depth
    relative to `old`'s first line, expressed in the file's base indent and unit; blank lines stay empty.
    """
    lead = old[: len(old) - len(old.lstrip())]
    trail = old[len(old.rstrip()) :]
    newlines, _, model_base = lead.rpartition("\n")
    newlines = newlines + "\n" if "\n" in lead else ""
    if newlines and new.startswith(newlines):
        new = new[len(newlines) :]
    if trail and new.endswith(trail):
        new = new[: -len(trail)]
    line_start = text.rfind("\n", 0, start) + 1
    at_line_start = not text[line_start:start].strip(" \t")
    file_base = text[line_start:start] if at_line_start else _lead(text[line_start:start])
    # A file with CRLF line ends keeps them: a model types `new` with bare newlines.
    newline_at = text.find("\n", start)
    eol = "\r\n" if newline_at > 0 and text[newline_at - 1] == "\r" else "\n"
    new_lines = [line.removesuffix("\r") for line in new.split("\n")] if eol == "\r\n" else new.split("\n")
    unit_columns = _model_unit(old.split("\n") + new_lines, model_base)
    if unit is None:
        unit = "\t" if any(_lead(line).startswith("\t") for line in new_lines) else " " * unit_columns
    out = []
    for i, line in enumerate(new_lines):
        if not line.strip():
            out.append("")
        elif i == 0 and not at_line_start:
            out.append(line.lstrip(" \t"))
        else:
            lead_ws = _lead(line)
            rel = _columns(lead_ws) - _columns(model_base)
            out.append(_shift(file_base, rel, unit_columns, unit) + line[len(lead_ws) :])
    return (line_start if at_line_start else start), eol.join(out)


# ------------------------------------------------------------------------------------------- refusals


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _trimmed_lines(old: str) -> list[str]:
    lines = old.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def closest_region(text: str, old: str) -> tuple[int, list[str]] | None:
    """The window of the file holding most of `old`'s non-blank lines (compared stripped), when at least half
    of them line up: (first line number, the file's lines). None when nothing comes that close."""
    want = _trimmed_lines(old)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    needed = [(k, line.strip()) for k, line in enumerate(want) if line.strip()]
    if not needed or not lines:
        return None
    positions: dict[str, list[int]] = {}
    wanted = {s for _, s in needed}
    for p, line in enumerate(lines):
        s = line.strip()
        if s in wanted:
            positions.setdefault(s, []).append(p)
    span = min(len(want), len(lines))
    last_window = len(lines) - span
    scores: Counter[int] = Counter()
    work = 0
    for k, s in sorted(needed, key=lambda item: len(positions.get(item[1], ()))):
        found = positions.get(s, ())
        work += len(found)
        if work > CLOSEST_BUDGET:
            break
        for p in found:
            w = p - k
            if 0 <= w <= last_window:
                scores[w] += 1
    if not scores:
        return None
    best = max(scores, key=lambda w: (scores[w], -w))
    if scores[best] * 2 < len(needed):
        return None
    return best + 1, lines[best : best + span]


def not_found(path: str, n: int, text: str, old: str, hint: bool = True) -> str:
    quoted = _trimmed_lines(old) or [old]
    shown = [QUOTE.format(line=line) for line in quoted[:MAX_QUOTED_LINES]]
    if len(quoted) > MAX_QUOTED_LINES:
        shown.append(QUOTE.format(line="…"))
    out = [NOT_FOUND.format(path=path, n=n), *shown]
    region = closest_region(text, old) if hint else None
    # Below half the lines lining up, nothing is offered: an innocent region would mislead more than silence.
    if region is not None:
        first, lines = region
        width = len(str(first + len(lines) - 1))
        out.append(CLOSEST)
        out.extend(QUOTE_NUMBERED.format(number=first + i, width=width, line=line) for i, line in enumerate(lines))
    return "\n".join(out)


def ambiguous(path: str, n: int, text: str, regions: list[tuple[int, int]]) -> str:
    numbers = [str(_line_of(text, start)) for start, _ in regions[:MAX_LINES_LISTED]]
    if len(regions) > MAX_LINES_LISTED:
        numbers.append("…")
    return AMBIGUOUS.format(path=path, n=n, count=len(regions), lines=", ".join(numbers))


# ------------------------------------------------------------------------------------------- resolving


def locate(path: str, text: str, edits: list[Edit]) -> list[Located]:
    """Every edit located in the original text. Raises Refused with all the refusals when any edit fails."""
    refusals: list[str] = []
    located: list[Located] = []
    unit: str | bool | None = False  # computed once, on the first loose match
    misses = 0
    for index, edit in enumerate(edits):
        n = index + 1
        if not edit.old:
            refusals.append(EMPTY_OLD.format(path=path, n=n))
            continue
        if edit.old == edit.new:
            refusals.append(SAME.format(path=path, n=n))
            continue
        regions, relaxed = find(text, edit.old)
        if not regions:
            # The hint scans the whole file: a call with thousands of stray edits must not burn minutes.
            refusals.append(not_found(path, n, text, edit.old, hint=misses < MAX_HINTS))
            misses += 1
        elif len(regions) > 1:
            refusals.append(ambiguous(path, n, text, regions))
        elif relaxed:
            if unit is False:
                unit = file_unit(text)
            start, end = regions[0]
            start, replacement = relaxed_replacement(text, start, edit.old, edit.new, unit)  # type: ignore[arg-type]
            located.append(Located(index, start, end, replacement, True))
        else:
            start, end = regions[0]
            located.append(Located(index, start, end, edit.new, False))
    refusals.extend(_overlaps(path, text, located))
    if refusals:
        if len(edits) > 1:
            refusals.append(NOTHING_WRITTEN.format(path=path, count=len(edits)))
        raise Refused("\n\n".join(refusals))
    return located


def _overlaps(path: str, text: str, located: list[Located]) -> list[str]:
    found = []
    ordered = sorted(located, key=lambda e: (e.start, e.end))
    for a, b in itertools.pairwise(ordered):
        if b.start < a.end:
            first, second = sorted((a, b), key=lambda e: e.index)
            relation = "repeats" if (a.start, a.end) == (b.start, b.end) else "overlaps"
            found.append(
                OVERLAP.format(
                    path=path,
                    n=second.index + 1,
                    relation=relation,
                    other=first.index + 1,
                    line=_line_of(text, first.start),
                )
            )
    return found


def apply(text: str, located: list[Located]) -> str:
    pieces, position = [], 0
    for edit in sorted(located, key=lambda e: e.start):
        pieces.append(text[position : edit.start])
        pieces.append(edit.replacement)
        position = edit.end
    pieces.append(text[position:])
    return "".join(pieces)


def parse_edits(args: dict[str, Any]) -> list[Edit]:
    """The edits, accepting what small models send: a JSON string, one object, or top-level old/new."""
    raw = args.get("edits")
    if raw is None and "old" in args:
        raw = [{"old": args.get("old"), "new": args.get("new")}]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raise ToolRefusal(BAD_EDITS) from None
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise ToolRefusal(BAD_EDITS)
    if not raw:
        raise ToolRefusal(NO_EDITS)
    edits = []
    for n, item in enumerate(raw, 1):
        old, new = (item.get("old"), item.get("new", "")) if isinstance(item, dict) else (None, None)
        if not isinstance(old, str) or not isinstance(new, str):
            raise ToolRefusal(BAD_EDIT.format(n=n))
        where = f"edit #{n}: "
        edits.append(Edit(check_text(old, "edit_file", "old", where), check_text(new, "edit_file", "new", where)))
    return edits


# ------------------------------------------------------------------------------------------------ tool


class EditFileTool(PlannedTool):
    name = "edit_file"
    counter = "file_ops"
    emoji = "📝"

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "Change parts of an existing file. Each edit replaces old (copied exactly from the "
            "file, found exactly once) with new. All edits apply to the original file; if one fails, none is "
            "written.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path of an existing file."},
                    "edits": {
                        "type": "array",
                        "description": "Replacements, all resolved against the original file.",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old": {
                                    "type": "string",
                                    "description": "Exact text to find, present exactly "
                                    "once. Include surrounding lines to make it unique.",
                                },
                                "new": {"type": "string", "description": "Replacement; empty deletes the text."},
                            },
                            "required": ["old", "new"],
                        },
                    },
                    "dry_run": {
                        "type": "boolean",
                        "default": False,
                        "description": "Report what would change, write nothing.",
                    },
                },
                "required": ["path", "edits"],
            },
        }

    def needs_approval(self, args: dict[str, Any]) -> bool:
        return True

    def title(self, args: dict[str, Any]) -> str:
        return f"edit_file {args.get('path', '') if isinstance(args, dict) else ''}"

    def _plan(self, args: dict[str, Any], ctx: ToolContext, dry_run: bool) -> PlannedWrite | str:
        """Run in a thread: matching in and diffing a large file must not hold up the worker's other turns."""
        try:
            return self._plan_edit(args, ctx, dry_run)
        except UNFORESEEN as e:
            return unforeseen("edit", args, e)

    def _plan_edit(self, args: dict[str, Any], ctx: ToolContext, dry_run: bool) -> PlannedWrite | str:
        try:
            path = path_arg(args, self.name)
            edits = parse_edits(args)
            real = resolve(ctx.workspace, path)
            text = read_text(ctx.workspace, path, real)
            located = locate(path, text, edits)
        except Refused as e:
            return show(e.text)
        except ToolRefusal as e:
            return e.text
        new = apply(text, located)
        if new == text:
            return UNCHANGED.format(path=path)
        loose = sum(e.relaxed for e in located)

        def headline(d: Diff, name: str, approving: bool) -> str:
            # A person approving reads it as a dry run: nothing is written until they approve.
            template = DRY_RUN if dry_run or approving else EDITED
            head = template.format(
                path=name, edits=plural(len(edits), "edit"), added=d.added, deleted=d.deleted, line=d.first_line
            )
            return head + (RELAXED.format(count=loose) if loose else "")

        return plan_write(ctx.workspace, path, real, text, new, headline)

    async def plan(self, args: dict[str, Any], ctx: ToolContext) -> Plan:
        try:
            dry_run = get_bool(check_object(args, self.name), self.name, "dry_run")
        except ToolRefusal as e:
            return written(e.text, ctx)
        planned = await asyncio.to_thread(self._plan, args, ctx, dry_run)
        return written(planned, ctx, write=not dry_run)
