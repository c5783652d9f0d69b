"""read_file and write_file, confined to the workspace (see workspace.py)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_core.tools.args import check_object, get_bool, get_int, get_str
from mm_core.tools.base import Plan, PlannedTool, Tool, ToolContext, ToolRefusal
from mm_core.tools.diff import Diff, diff, split_lines
from mm_core.tools.text import plural, show, truncate
from mm_core.tools.workspace import (
    EMPTY_PATH,
    SPECIAL,
    NotRegularFile,
    WorkspaceError,
    open_regular,
    resolve,
    shown_path,
    write_bytes,
)

MISSING = "{path} does not exist. Create it with write_file"
IS_DIR = "[error: {path} is a directory — list it with bash (ls {path})]"
EMPTY_FILE = "[{path} is empty]"
TOO_LARGE = (
    "[error: {path} is too large to read at once ({size} bytes) — read part of it with bash (head, tail, sed -n)]"
)
START_PAST_END = "[error: start {start} is past the end of {path} ({lines})]"
END_BEFORE_START = "[error: end {end} is before start {start}]"
NEGATIVE = '[error: read_file: "{field}" must be 0 or a line number, got {value}]'
CANNOT = "[error: cannot {verb} {path}: {reason}]"
WROTE_NEW = "wrote {path}: new file, {lines}"
WROTE = "wrote {path}: {lines}, +{added} -{deleted}"
IDENTICAL = "{path} already has exactly this content — nothing written"

# Reading a whole file into memory is fine for source code; a multi-gigabyte log is read with bash instead.
MAX_READ_BYTES = 64 * 1024 * 1024


# What no check foresaw and the file system, memory or the stack can still raise on a hostile tree (a name
# swapped mid-call, a file grown huge): answered as CANNOT, never raised into the turn.
UNFORESEEN = (OSError, MemoryError, RecursionError, ValueError)


def unforeseen(verb: str, args: Any, exc: BaseException) -> str:
    """CANNOT for an exception of UNFORESEEN."""
    path = args.get("path") if isinstance(args, dict) else None
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc) or type(exc).__name__
    elif isinstance(exc, MemoryError):
        reason = "not enough memory"
    elif isinstance(exc, RecursionError):
        reason = "nested too deeply"
    else:
        reason = str(exc) or type(exc).__name__
    return show(CANNOT.format(verb=verb, path=path if isinstance(path, str) else "", reason=reason))


def path_arg(args: dict[str, Any], tool: str) -> str:
    path = get_str(check_object(args, tool), tool, "path")
    if not path.strip():
        raise ToolRefusal(EMPTY_PATH.format(tool=tool))
    return path


def load(ws: Path, path: str, real: Path, verb: str = "read") -> str | None:
    """The file's text, None when there is no such file. Raises ToolRefusal with the answer otherwise.

    Bytes that are not UTF-8 are kept as surrogate escapes: an edit then writes them back unchanged instead of
    turning every é of a Latin-1 file into U+FFFD. show() gives the text the model sees.
    """
    try:
        fd, st = open_regular(ws, real, os.O_RDONLY)
    except NotRegularFile as e:
        raise ToolRefusal(IS_DIR.format(path=path) if e.is_dir else SPECIAL.format(path=path, kind=e.kind)) from e
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise ToolRefusal(CANNOT.format(verb=verb, path=path, reason=e.strerror or e)) from e
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_READ_BYTES:
            raise ToolRefusal(TOO_LARGE.format(path=path, size=st.st_size))
        try:
            # Never more than the limit, even when the file grows after fstat (a log being written).
            data = f.read(MAX_READ_BYTES + 1)
        except OSError as e:
            raise ToolRefusal(CANNOT.format(verb=verb, path=path, reason=e.strerror or e)) from e
        if len(data) > MAX_READ_BYTES:
            raise ToolRefusal(TOO_LARGE.format(path=path, size=max(os.fstat(fd).st_size, len(data))))
    return data.decode("utf-8", errors="surrogateescape")


def read_text(ws: Path, path: str, real: Path) -> str:
    """load() for a file that must exist."""
    text = load(ws, path, real)
    if text is None:
        raise ToolRefusal(MISSING.format(path=path))
    return text


def select_lines(text: str, start: int, end: int) -> tuple[list[str], int]:
    """Lines `start`..`end` (1-based, inclusive, 0 = open) and the number of the first one.

    The final newline survives only when the last line of the file is among them: the model then knows
    whether the file ends with one, and a partial read never looks like a complete file.
    """
    lines = split_lines(text)
    first = max(start, 1)
    last = min(end, len(lines)) if end else len(lines)
    chosen = lines[first - 1 : last]
    if chosen and last < len(lines):
        chosen[-1] = chosen[-1].removesuffix("\n")
    return chosen, first


class ReadFileTool(Tool):
    name = "read_file"
    counter = "file_ops"
    emoji = "📄"

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "Read a text file of the project. Use start and end to read only some lines, "
            "and numbered to see line numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the working directory."},
                    "start": {
                        "type": "integer",
                        "default": 0,
                        "description": "First line (1-based); 0 = from the start.",
                    },
                    "end": {
                        "type": "integer",
                        "default": 0,
                        "description": "Last line (1-based, inclusive); 0 = to the end.",
                    },
                    "numbered": {
                        "type": "boolean",
                        "default": False,
                        "description": "Prefix each line with its number.",
                    },
                },
                "required": ["path"],
            },
        }

    def title(self, args: dict[str, Any]) -> str:
        return f"read_file {args.get('path', '') if isinstance(args, dict) else ''}"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            return self._read(args, ctx)
        except UNFORESEEN as e:
            return unforeseen("read", args, e)

    def _read(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            path = path_arg(args, self.name)
            start, end = get_int(args, self.name, "start"), get_int(args, self.name, "end")
            numbered = get_bool(args, self.name, "numbered")
            for field, value in (("start", start), ("end", end)):
                if value < 0:
                    return NEGATIVE.format(field=field, value=value)
            if end and end < start:
                return END_BEFORE_START.format(end=end, start=start)
            text = read_text(ctx.workspace, path, resolve(ctx.workspace, path))
        except ToolRefusal as e:
            return e.text
        if not text:
            return EMPTY_FILE.format(path=path)
        total = len(split_lines(text))
        if start > total:
            return START_PAST_END.format(start=start, path=path, lines=plural(total, "line"))
        chosen, first = select_lines(text, start, end)
        if numbered:
            width = len(str(first + len(chosen) - 1))
            chosen = [f"{first + i:>{width}} │ {line}" for i, line in enumerate(chosen)]
        return truncate(show("".join(chosen)), ctx.config.maxOutput)


@dataclass(frozen=True)
class PlannedWrite:
    """A change worked out but not yet written: what the model will read once it is written, what a person
    approving it reads (the same change, the file it lands in named: shown_path), and the bytes."""

    path: str  # as the model gave it
    real: Path
    data: bytes | None  # None when there is nothing to write
    report: str
    preview: str


def plan_write(
    ws: Path, path: str, real: Path, old: str | None, new: str, headline: Callable[[Diff, str, bool], str]
) -> PlannedWrite:
    """The change from `old` to `new`, diffed once. `headline(diff, name, approving)`: the first line, naming the
    file `name`, for the model (approving: False) or for a person approving it (True)."""
    name = shown_path(ws, path, real)
    if old is not None and old == new:
        return PlannedWrite(path, real, None, IDENTICAL.format(path=path), IDENTICAL.format(path=name))
    d = diff(old or "", new)
    body = f"\n{d.text}" if d.text else ""
    data = new.encode("utf-8", "surrogateescape")
    return PlannedWrite(path, real, data, show(headline(d, path, False) + body), show(headline(d, name, True) + body))


def written(planned: PlannedWrite | str, ctx: ToolContext, write: bool = True) -> Plan:
    """The Plan of a planned write (or of a refusal, which writes nothing and answers with itself): carrying it out
    writes exactly the bytes whose diff the preview shows (unless not `write`: a dry run), and answers with the
    report."""
    if isinstance(planned, str):

        async def refuse() -> str:
            return planned

        return Plan(planned, refuse)

    async def carry_out() -> str:
        failure = commit_write(ctx, planned) if write else None
        return failure or truncate(planned.report, ctx.config.maxOutput)

    return Plan(planned.preview, carry_out)


def commit_write(ctx: ToolContext, plan: PlannedWrite) -> str | None:
    """Write a planned change; the failure text, or None."""
    if plan.data is None:
        return None
    try:
        write_bytes(ctx.workspace, plan.real, plan.data)
    except WorkspaceError as e:
        return e.text
    except OSError as e:
        return CANNOT.format(verb="write", path=plan.path, reason=e.strerror or e)
    except UNFORESEEN as e:
        return unforeseen("write", {"path": plan.path}, e)
    return None


class WriteFileTool(PlannedTool):
    name = "write_file"
    counter = "file_ops"
    emoji = "📝"

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": "Create a file, or replace the whole content of an existing one. "
            "To change part of a file, use edit_file instead.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "File path, relative to the working directory; parent directories are created.",
                    },
                    "content": {"type": "string", "description": "The whole content of the file."},
                },
                "required": ["path", "content"],
            },
        }

    def needs_approval(self, args: dict[str, Any]) -> bool:
        return True

    def title(self, args: dict[str, Any]) -> str:
        return f"write_file {args.get('path', '') if isinstance(args, dict) else ''}"

    def _plan(self, args: dict[str, Any], ctx: ToolContext) -> PlannedWrite | str:
        """Run in a thread: reading and diffing a large file must not hold up the worker's other turns."""
        try:
            return self._plan_write(args, ctx)
        except UNFORESEEN as e:
            return unforeseen("write", args, e)

    def _plan_write(self, args: dict[str, Any], ctx: ToolContext) -> PlannedWrite | str:
        try:
            path = path_arg(args, self.name)
            content = get_str(args, self.name, "content")
            real = resolve(ctx.workspace, path)
            old = load(ctx.workspace, path, real, verb="write")
        except ToolRefusal as e:
            return e.text
        lines = plural(len(split_lines(content)), "line")

        def headline(d: Diff, name: str, approving: bool) -> str:
            if old is None:
                head = WROTE_NEW.format(path=name, lines=lines)
            else:
                head = WROTE.format(path=name, lines=lines, added=d.added, deleted=d.deleted)
            # The person approving must not read "wrote": nothing is written until they approve.
            return "would " + head.replace("wrote", "write", 1) if approving else head

        return plan_write(ctx.workspace, path, real, old, content, headline)

    async def plan(self, args: dict[str, Any], ctx: ToolContext) -> Plan:
        planned = await asyncio.to_thread(self._plan, args, ctx)
        return written(planned, ctx)
