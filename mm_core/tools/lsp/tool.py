"""The `lsp` tool: one tool, six actions, answers shaped for a small model (see tools.md and lsp-tool.md).

The model names a symbol instead of counting columns: its whole-word occurrences are tried in order, code
lines before comment lines, until the server answers. Every location comes back with its source line, so
the model need not open the file to know what a hit is. Every failure is a bracketed text.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from lsprotocol import types

from mm_core.config import AgentConfig, LspServer
from mm_core.tools.base import Plan, PlannedTool, ToolContext
from mm_core.tools.lsp.client import LspClient, RequestFailed, ServerGone, read_document
from mm_core.tools.lsp.manager import LspManager, extension_map, server_command
from mm_core.tools.lsp.positions import UTF16, from_wire, line_starts, offset, split_lines, to_wire
from mm_core.tools.sandbox import server_launch
from mm_core.tools.text import truncate
from mm_core.tools.workspace import NotRegularFile, WorkspaceError, read_bytes, resolve, shown_path, write_bytes

ACTIONS = ("definition", "references", "hover", "symbols", "diagnostics", "rename")
NEEDS_POSITION = ("definition", "references", "hover", "rename")
DIAGNOSTICS_WAIT = 3.0
# Occurrences tried per call: a name used 200 times in a file must not cost 200 round trips.
MAX_TRIES = 12

NEEDS_NEW_NAME = (
    '[lsp: rename needs new_name — call lsp again with {"action": "rename", "path": …, "symbol": …, '
    '"new_name": "<the new identifier>"}; do not use edit_file for a rename]'
)
MISSING_SERVER = "[warning: lsp server {name} ({command}) not found on the PATH — skipped]"
# A rename is approved on its whole diff, and carried out as shown: a plan whose diff would be longer than this is
# more than a person can check, so it is refused rather than shown in part.
MAX_RENAME_CHARS = 200_000
RENAME_TOO_LARGE = (
    "[lsp: the rename {symbol} → {new_name} would make {edits} edit(s) in {files} file(s), a diff longer than "
    "{limit:,} characters: more than a person can check before approving it — nothing renamed; rename it in parts "
    "with edit_file, a few files at a time]"
)
_SEVERITY = {1: "error", 2: "warning", 3: "info", 4: "hint"}
_IDENT = re.compile(r"[\w$]+")
_COMMENT_LINE = re.compile(r"^\s*(#|//|/\*|\*|--|;|<!--)")
_COMMENT_START = re.compile(r"#|//|/\*|--")


def find_servers(config: Any) -> tuple[dict[str, LspServer], list[str]]:
    """The configured servers whose command is found (see server_command), and a warning for each one that is not.

    `config` is an AgentConfig or its `lsp` section.
    """
    lsp = getattr(config, "lsp", config)
    available: dict[str, LspServer] = {}
    warnings: list[str] = []
    for name, server in lsp.servers.items():
        if server_command(server.command):
            available[name] = server
        else:
            warnings.append(MISSING_SERVER.format(name=name, command=server.command))
    return available, warnings


# ---- arguments ---------------------------------------------------------------------------------------------


def clean_identifier(raw: str) -> str:
    """`Greet', ` → Greet, `person.Greet` → Greet, `Greet()` → Greet: the last identifier of the first word."""
    words = raw.split()
    if not words:
        return ""
    parts = [p for p in _IDENT.findall(words[0]) if not p.isdigit()]
    return parts[-1] if parts else ""


@dataclass
class Call:
    action: str
    path: str
    symbol: str
    new_name: str
    line: int
    column: int

    def where(self) -> str:
        if self.line and self.column and not self.symbol:
            return f"{self.path}:{self.line}:{self.column}"
        return self.path


def _whole_number(args: dict[str, Any], key: str) -> int | str:
    value = args.get(key)
    if value is None or value == "":
        return 0
    if isinstance(value, bool):
        return f"[lsp: {key} must be a whole number, got {value!r}]"
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        return f"[lsp: {key} must be a whole number, got {value!r}]"
    if number < 0:
        return f"[lsp: {key} is 1-based and cannot be negative, got {number}]"
    return number


def parse(args: dict[str, Any]) -> Call | str:
    action = str(args.get("action") or "").strip().lower()
    if action not in ACTIONS:
        return f'[lsp: unknown action "{action}" — use one of: {", ".join(ACTIONS)}]'
    path = str(args.get("path") or "").strip()
    if not path:
        return f"[lsp: {action} needs a path (the file, relative to the working directory)]"
    line, column = _whole_number(args, "line"), _whole_number(args, "column")
    if isinstance(line, str):
        return line
    if isinstance(column, str):
        return column
    raw_symbol, raw_new = str(args.get("symbol") or ""), str(args.get("new_name") or "")
    symbol, new_name = clean_identifier(raw_symbol), clean_identifier(raw_new)
    if action == "rename" and not new_name:
        # A small model sometimes writes symbol, line, column and new name into one string: `Greet 1 12 Hello`.
        words = [w for w in (clean_identifier(w) for w in raw_symbol.split()) if w]
        if len(words) > 1:
            symbol, new_name = words[0], words[-1]
    return Call(action, path, symbol, new_name, line, column)


# ---- the tool ----------------------------------------------------------------------------------------------


class LspTool(PlannedTool):
    name = "lsp"
    counter = "lsp"
    emoji = "🔎"

    def __init__(self, config: AgentConfig, servers: dict[str, LspServer]):
        self.config = config
        self.servers = servers
        self.extensions = extension_map(servers)

    def _server_list(self) -> str:
        return ", ".join(
            f"{name} ({', '.join(e for e, n in self.extensions.items() if n == name)})" for name in self.servers
        )

    def schema(self) -> dict[str, Any]:
        description = (
            "Ask the language server about the code, as an editor does: where a symbol is defined (definition), "
            "every place that uses it (references), its type and documentation (hover), the outline of a file "
            "(symbols), the compiler's errors and warnings (diagnostics), or rename it across the project "
            "(rename, writes the files). Give `symbol`, the identifier as written in the code, rather than a "
            "line and column. Workflow: references before you change a shared symbol, diagnostics after you "
            f"edit. Servers available: {self._server_list()}."
        )
        return {
            "name": self.name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": list(ACTIONS), "description": "What to ask."},
                    "path": {
                        "type": "string",
                        "description": "File path, relative to the working directory. Its extension picks the server.",
                    },
                    "symbol": {
                        "type": "string",
                        "description": (
                            "The identifier, as written in the code (for definition, references, hover, rename)."
                        ),
                    },
                    "line": {
                        "type": "integer",
                        "description": (
                            "1-based line. With symbol: restricts the search to that line. "
                            "With column: the exact position."
                        ),
                    },
                    "column": {
                        "type": "integer",
                        "description": (
                            "1-based column, in characters, inside the identifier. Only needed without symbol."
                        ),
                    },
                    "new_name": {"type": "string", "description": "The new identifier, for rename."},
                },
                "required": ["action", "path"],
            },
        }

    def needs_approval(self, args: dict[str, Any]) -> bool:
        return str(args.get("action") or "").strip().lower() == "rename"

    def refusal(self, args: dict[str, Any]) -> str:
        return "[rename rejected by the user]"

    def title(self, args: dict[str, Any]) -> str:
        call = parse(args)
        if isinstance(call, str):
            return f"lsp: {args.get('action') or ''} {args.get('path') or ''}".rstrip()
        title = f"lsp: {call.action} {call.where()}"
        if call.symbol and call.action in NEEDS_POSITION:
            title += f" {call.symbol}"
        if call.action == "rename" and call.new_name:
            title += f" → {call.new_name}"
        return title

    async def plan(self, args: dict[str, Any], ctx: ToolContext) -> Plan:
        """A rename's plan: its whole diff (never cut: the approver approves all of it, and the digest covers all
        of it) and the writing of exactly those files' texts. Any other action is not gated."""
        if not self.needs_approval(args):
            return Plan(self.title(args))
        outcome = await self._guarded(args, ctx)
        if isinstance(outcome, Plan):
            return outcome
        answer = truncate(outcome, self.config.maxOutput)

        async def refuse() -> str:
            return answer

        return Plan(outcome, refuse)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if self.needs_approval(args):  # a rename writes the plan it works out, as an approved one does
            return await super().run(args, ctx)
        outcome = await self._guarded(args, ctx)
        assert isinstance(outcome, str)
        return truncate(outcome, self.config.maxOutput)

    async def _guarded(self, args: dict[str, Any], ctx: ToolContext) -> str | Plan:
        try:
            return await self._call(args, ctx)
        except Exception as err:  # noqa: BLE001 - a tool answers, it does not raise
            return self._failure(args, err)

    def _failure(self, args: dict[str, Any], err: Exception) -> str:
        if isinstance(err, WorkspaceError):
            return "[lsp: " + err.text.removeprefix("[error: ")
        if isinstance(err, OSError):  # the file system's refusal (a name too long, no permission): its own words
            return f"[lsp: {args.get('path')}: {err.strerror or err}]"
        return f"[lsp: internal error: {type(err).__name__}: {err}]"

    async def _call(self, args: dict[str, Any], ctx: ToolContext) -> str | Plan:
        call = parse(args)
        if isinstance(call, str):
            return call
        path = resolve(ctx.workspace, call.path)
        server = self.extensions.get(path.suffix.lower())
        if server is None:
            return f'[lsp: no language server for "{call.path}" — configured: {self._server_list()}]'
        try:
            # Through the confined opener: a file swapped for a symlink since resolve() is refused, not followed.
            text = read_document(path, ctx.workspace)
        except NotRegularFile:
            return f"[lsp: {call.path} is not a file]"
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return f"[lsp: {call.path} does not exist]"
            raise
        if call.action == "rename" and not call.new_name:
            return NEEDS_NEW_NAME
        positions: list[tuple[int, int]] = []
        if call.action in NEEDS_POSITION:
            found = symbol_positions(call, split_lines(text))
            if isinstance(found, str):
                return found
            positions = found
        manager: LspManager = await ctx.resources.get(
            "lsp",
            lambda: LspManager(self.config.lsp, self.servers, lambda ws, argv: server_launch(self.config, ws, argv)),
        )
        session = _Session(ctx.workspace, path, call, positions)
        session.read_as(path, text)
        try:
            async with manager.use(ctx.workspace, server) as client:
                session.client = client
                if call.action == "symbols":
                    return await session.symbols()
                if call.action == "diagnostics":
                    return await session.diagnostics()
                if call.action == "rename":
                    renaming = await session.rename()
                    if isinstance(renaming, str):
                        return renaming
                    return self._carrying_out(renaming, args, ctx, manager, server)
                return await session.navigate()
        except ServerGone as err:
            return f"[lsp: {server}: {call.action} failed: {err} — it is started again on the next call]"
        except RequestFailed as err:
            return f"[lsp: {server}: {call.action} failed: {err}]"

    def _carrying_out(
        self, renaming: _Renaming, args: dict[str, Any], ctx: ToolContext, manager: LspManager, server: str
    ) -> Plan:
        """The rename's Plan: its preview, and the writing of the very texts that preview's diff was made of."""

        async def carry_out() -> str:
            try:
                for path, new in renaming.texts.items():
                    write_bytes(ctx.workspace, path, new.encode("utf-8"))
            except Exception as err:  # noqa: BLE001 - a tool answers, it does not raise
                return truncate(self._failure(args, err), self.config.maxOutput)
            try:
                async with manager.use(ctx.workspace, server) as client:
                    for path in renaming.texts:
                        client.sync(path)  # the next question is answered on the renamed code
            except (ServerGone, RequestFailed, OSError, WorkspaceError):
                pass  # written: a server that is gone reads the files anew when it starts again
            return truncate(renaming.report, self.config.maxOutput)

        written = tuple(_relative(path, ctx.workspace) for path in renaming.texts)
        return Plan(renaming.preview, carry_out, written)


def _relative(path: Path, workspace: Path) -> str:
    """A written file as the workspace names it (the rename's texts are keyed by absolute paths inside it)."""
    return path.relative_to(workspace).as_posix() if path.is_relative_to(workspace) else str(path)


@dataclass(frozen=True)
class _Renaming:
    """A rename worked out: its whole diff for the approver, the new text of each file, the model's report."""

    preview: str
    texts: dict[Path, str]
    report: str


def symbol_positions(call: Call, lines: list[str]) -> list[tuple[int, int]] | str:
    """Candidate positions (0-based line, character index), in the order they are tried."""
    count = len(lines) - 1 if len(lines) > 1 and lines[-1] == "" else len(lines)
    if call.line > count or (call.line and not lines):
        return f"[lsp: line {call.line} is past the end of {call.path} ({count} lines)]"
    if call.symbol:
        pattern = re.compile(r"(?<![\w$])" + re.escape(call.symbol) + r"(?![\w$])")
        rows = [call.line - 1] if call.line else range(len(lines))
        code, comments = [], []
        for row in rows:
            text = lines[row]
            for m in pattern.finditer(text):
                comment_start = _COMMENT_START.search(text)
                in_comment = _COMMENT_LINE.match(text) or (comment_start and comment_start.start() < m.start())
                (comments if in_comment else code).append((row, m.start(), m.end()))
        found = code + comments
        if call.line and call.column:
            found.sort(key=lambda hit: not hit[1] < call.column <= hit[2])
        if not found:
            where = f"on line {call.line} of {call.path}" if call.line else f"in {call.path}"
            return f'[lsp: "{call.symbol}" not found {where}]'
        return [(row, start) for row, start, _ in found[:MAX_TRIES]]
    if call.line and call.column:
        text = lines[call.line - 1]
        if call.column > len(text) + 1:
            return f"[lsp: column {call.column} is past the end of line {call.line} ({len(text)} characters)]"
        return [(call.line - 1, call.column - 1)]
    return f"[lsp: {call.action} needs a symbol (the identifier, as written in the code), or a line and a column]"


# ---- one call against one server -----------------------------------------------------------------------------


def _uri_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


def _within(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


class _Session:
    def __init__(self, workspace: Path, path: Path, call: Call, positions: list[tuple[int, int]]):
        self.root = Path(os.path.realpath(workspace))
        self.workspace = workspace
        self.path = path
        self.call = call
        self.positions = positions
        self.client: LspClient
        # A file's lines, or None for a file outside the workspace, which is never read.
        self._files: dict[Path, list[str] | None] = {}
        # A renamed file the server named through a symlink: how the approver is shown it (shown_path).
        self._named: dict[Path, str] = {}

    # -- helpers

    def _document(self) -> types.TextDocumentIdentifier:
        return types.TextDocumentIdentifier(uri=self.path.as_uri())

    def read_as(self, path: Path, text: str) -> None:
        """The named file's text, already read: its lines are not read again."""
        self._files[path] = split_lines(text)

    def _inside(self, path: Path) -> Path | None:
        """The real path of a path a server sent, when it resolves inside the workspace; None when it, or a
        symlink on the way (a workspace file linked to /etc/shadow or to another thread's workspace), leads out."""
        try:
            return resolve(self.workspace, str(path))
        except WorkspaceError:
            return None

    def _source(self, path: Path) -> list[str] | None:
        """The lines of a file a server named; None when it is outside the workspace: then it is never opened.
        Inside, it is read through the confined opener (no symlink followed, regular files only)."""
        if path not in self._files:
            real = self._inside(path)
            lines: list[str] | None = None
            if real is not None:
                try:
                    lines = split_lines(read_document(real, self.workspace))
                except (OSError, WorkspaceError):
                    lines = []
            self._files[path] = lines
        return self._files[path]

    def _lines(self, path: Path) -> list[str]:
        return self._source(path) or []

    def _reached_through(self, path: Path) -> bool:
        """A location the workspace leads out of itself to: its path lies in the workspace, but a symlink on the
        way (a workspace file linked to /etc/shadow, a directory linked to another thread's workspace) leads
        out. What the server says about a symbol defined there (its hover) is that file's content. A library the
        server finds on its own (the standard library, site-packages) is not reached through the workspace."""
        if self._inside(path) is not None:
            return False
        lexical = Path(os.path.normpath(os.path.abspath(path)))
        given = Path(os.path.normpath(os.path.abspath(self.workspace)))
        return _within(lexical, self.root) or _within(lexical, given)

    def _given(self, path: Path) -> str:
        """A path the server sent, relative to the workspace as the server wrote it (links not followed)."""
        lexical = os.path.normpath(os.path.abspath(path))
        for top in (os.path.normpath(os.path.abspath(self.workspace)), str(self.root)):
            if _within(Path(lexical), Path(top)):
                return os.path.relpath(lexical, top)
        return lexical

    def display(self, path: Path) -> str:
        real = Path(os.path.realpath(path))
        if real == self.root or self.root in real.parents:
            return real.relative_to(self.root).as_posix()
        return str(path)

    def _column(self, path: Path, line: int, units: int) -> tuple[int, str]:
        """1-based character column and the source line for a wire position. A file outside the workspace is
        not read: no source line, and the wire column as it came."""
        lines = self._source(path)
        if lines is None:
            return units + 1, ""
        text = lines[line] if 0 <= line < len(lines) else ""
        return from_wire(text, units, self.client.encoding) + 1, text

    def _wire(self, row: int, char: int) -> types.Position:
        return types.Position(line=row, character=to_wire(self._lines(self.path)[row], char, self.client.encoding))

    def _at(self, row: int, char: int) -> str:
        return f"{self.call.path}:{row + 1}:{char + 1}"

    async def _first_answer(self, ask: Callable[[types.Position], Awaitable[Any]]) -> tuple[Any, tuple[int, int]]:
        """Try the candidate positions in order until the server answers something. A server error on one
        position moves on to the next; when every position failed, the first error is the answer."""
        first_error: RequestFailed | None = None
        for row, char in self.positions:
            self.client.sync(self.path)
            try:
                answer = await ask(self._wire(row, char))
            except ServerGone:
                raise
            except RequestFailed as err:
                if str(err).startswith("no answer within"):
                    raise
                first_error = first_error or err
                continue
            if answer:
                return answer, (row, char)
        if first_error is not None:
            raise first_error
        return None, self.positions[0]

    # -- definition, references, hover

    async def navigate(self) -> str:
        doc, action = self._document(), self.call.action
        if action == "definition":
            result, at = await self._first_answer(
                lambda pos: self._locations(
                    types.TEXT_DOCUMENT_DEFINITION, types.DefinitionParams(text_document=doc, position=pos)
                )
            )
            if not result:
                return f"[lsp: no definition found for the symbol at {self._at(*at)}]"
            return "\n".join(result)
        if action == "references":
            result, at = await self._first_answer(
                lambda pos: self._locations(
                    types.TEXT_DOCUMENT_REFERENCES,
                    types.ReferenceParams(
                        text_document=doc, position=pos, context=types.ReferenceContext(include_declaration=True)
                    ),
                )
            )
            if not result:
                return f"[lsp: no references found for the symbol at {self._at(*at)}]"
            return f"{len(result)} reference(s):\n" + "\n".join(result)
        result, at = await self._first_answer(self._hover)
        if not result:
            return f"[lsp: no hover information for the symbol at {self._at(*at)}]"
        outside = await self._defined_through_the_workspace(at)
        if outside is not None:
            return (
                f"[lsp: the symbol at {self._at(*at)} is defined in {outside}, outside the workspace — "
                "its hover is not shown]"
            )
        return result

    async def _defined_through_the_workspace(self, at: tuple[int, int]) -> str | None:
        """Where the hovered symbol is defined, when that is a file outside the workspace that a symlink in the
        workspace leads to: the server read that file to answer, and the tool does not show it. None otherwise,
        and when the server cannot say (an error other than a timeout)."""
        params = types.DefinitionParams(text_document=self._document(), position=self._wire(*at))
        try:
            places = await self._places(types.TEXT_DOCUMENT_DEFINITION, params)
        except ServerGone:
            raise
        except RequestFailed as err:
            if str(err).startswith("no answer within"):
                raise
            return None
        for _, path, _ in places:
            if path is not None and self._reached_through(path):
                return self.display(path)
        return None

    async def _places(self, method: str, params: Any) -> list[tuple[str, Path | None, types.Position]]:
        """The server's locations: uri, the file's path (None for a uri that is not a file), start."""
        answer = await self.client.request(method, params)
        if answer is None:
            return []
        items = answer if isinstance(answer, (list, tuple)) else [answer]
        places = []
        for item in items:
            if isinstance(item, types.LocationLink):
                uri, start = item.target_uri, item.target_selection_range.start
            else:
                uri, start = item.uri, item.range.start
            places.append((uri, _uri_path(uri), start))
        return places

    async def _locations(self, method: str, params: Any) -> list[str]:
        found: set[tuple[str, int, int, str]] = set()
        for uri, path, start in await self._places(method, params):
            if path is None:
                found.add((uri, start.line + 1, start.character + 1, ""))
                continue
            # A file outside the workspace (or reached through a symlink leading out) is shown as a path only:
            # _column never reads it.
            column, text = self._column(path, start.line, start.character)
            found.add((self.display(path), start.line + 1, column, text.strip()))
        return [f"{p}:{line}:{col}  {src}" if src else f"{p}:{line}:{col}" for p, line, col, src in sorted(found)]

    async def _hover(self, position: types.Position) -> str:
        answer = await self.client.request(
            types.TEXT_DOCUMENT_HOVER, types.HoverParams(text_document=self._document(), position=position)
        )
        if answer is None:
            return ""
        contents = answer.contents
        parts = contents if isinstance(contents, (list, tuple)) else [contents]
        texts = []
        for part in parts:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, types.MarkedStringWithLanguage):
                texts.append(f"```{part.language}\n{part.value}\n```")
            else:
                texts.append(part.value)
        return "\n\n".join(t.strip() for t in texts if t.strip())

    # -- symbols

    async def symbols(self) -> str:
        self.client.sync(self.path)
        answer = await self.client.request(
            types.TEXT_DOCUMENT_DOCUMENT_SYMBOL, types.DocumentSymbolParams(text_document=self._document())
        )
        out: list[str] = []

        def walk(node: _Symbol, depth: int) -> None:
            detail = f"  [{node.detail}]" if node.detail else ""
            out.append(f"{'  ' * depth}{node.kind} {node.name}{detail}  line {node.line + 1}")
            for child in node.children:
                walk(child, depth + 1)

        for node in symbol_tree(answer or []):
            walk(node, 0)
        return "\n".join(out) if out else f"no symbols in {self.call.path}"

    # -- diagnostics

    async def diagnostics(self) -> str:
        changed = self.client.sync(self.path)
        found = None if changed else self.client.fresh_diagnostics(self.path)
        suffix = " (as last published)" if found is not None else ""
        if found is None:
            found = await self.client.wait_diagnostics(self.path, DIAGNOSTICS_WAIT)
        if found is None:
            return (
                f"no diagnostics received for {self.call.path} within {DIAGNOSTICS_WAIT:g}s "
                "(the server may not publish diagnostics for this file, or is still starting; ask again)"
            )
        if not found:
            return f"no diagnostics: {self.call.path} is clean{suffix}"
        rows = []
        for d in sorted(found, key=lambda d: (d.range.start.line, d.range.start.character)):
            column, _ = self._column(self.path, d.range.start.line, d.range.start.character)
            severity = _SEVERITY.get(int(d.severity or 1), "error")
            message = " ".join(d.message.split("\n")).strip()
            source = f" [{d.source}]" if d.source else ""
            rows.append(f"{severity} {self.call.path}:{d.range.start.line + 1}:{column} {message}{source}")
        return f"{len(found)} diagnostic(s) in {self.call.path}{suffix}:\n" + "\n".join(rows)

    # -- rename

    async def rename(self) -> str | _Renaming:
        async def ask(position: types.Position) -> types.WorkspaceEdit | None:
            edit = await self.client.request(
                types.TEXT_DOCUMENT_RENAME,
                types.RenameParams(text_document=self._document(), position=position, new_name=self.call.new_name),
            )
            # An edit that changes nothing (pylsp's answer on a word inside a string) is no answer: the next
            # occurrence is tried, as for the other actions.
            return edit if edit is not None and _changes_something(edit) else None

        edit, at = await self._first_answer(ask)
        planned = self._plan(edit) if edit else f"[lsp: nothing to rename for the symbol at {self._at(*at)}]"
        if isinstance(planned, str):
            return planned
        new_texts: dict[Path, tuple[str, str]] = {}
        for path, edits in planned.items():
            try:
                # Through the confined opener: a file swapped for a symlink since _plan resolved it is refused.
                old = read_bytes(self.workspace, path).decode("utf-8")
            except WorkspaceError:
                return f"[lsp: the rename would edit {path}, outside the project — nothing renamed]"
            except (OSError, UnicodeDecodeError) as err:
                reason = "is not UTF-8 text" if isinstance(err, UnicodeDecodeError) else "cannot be read"
                return f"[lsp: {self.display(path)} {reason} — nothing renamed]"
            new_texts[path] = (old, apply_edits(old, edits, self.client.encoding))
        counts = sorted((self.display(p), len(e)) for p, e in planned.items())
        total = sum(n for _, n in counts)
        diffs = [f"rename {self.call.symbol} → {self.call.new_name}: {total} edit(s) in {len(counts)} file(s)"]
        size = len(diffs[0])
        for path, (old, new) in sorted(new_texts.items(), key=lambda kv: self.display(kv[0])):
            name = self.display(path)
            # Named as the server named it, and, when that goes through a symlink, with the file written.
            header = self._named.get(path, name)
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{header}", f"b/{header}"
                    )
                ).rstrip("\n")
            )
            size += len(diffs[-1]) + 1
            if size > MAX_RENAME_CHARS:  # the rest is not diffed
                return RENAME_TOO_LARGE.format(
                    symbol=self.call.symbol,
                    new_name=self.call.new_name,
                    edits=total,
                    files=len(counts),
                    limit=MAX_RENAME_CHARS,
                )
        lines = [f"renamed to {self.call.new_name}: {total} edit(s) in {len(counts)} file(s)"]
        lines += [f"{name}: {n} edit(s)" for name, n in counts]
        texts = {path: new for path, (_, new) in new_texts.items()}
        return _Renaming("\n".join(diffs), texts, "\n".join(lines))

    def _plan(self, edit: types.WorkspaceEdit) -> dict[Path, list[types.TextEdit]] | str:
        by_uri: dict[str, list[types.TextEdit]] = {}
        for uri, edits in (edit.changes or {}).items():
            by_uri.setdefault(uri, []).extend(edits)
        for change in edit.document_changes or []:
            if not isinstance(change, types.TextDocumentEdit):
                return (
                    "[lsp: the server's rename also creates, renames or deletes files, which this tool does not do "
                    "— nothing renamed]"
                )
            by_uri.setdefault(change.text_document.uri, []).extend(
                e for e in change.edits if isinstance(e, types.TextEdit)
            )
        planned: dict[Path, list[types.TextEdit]] = {}
        for uri, edits in by_uri.items():
            path = _uri_path(uri)
            if path is None:
                return f"[lsp: the rename would edit {uri}, which is not a file — nothing renamed]"
            try:
                real = resolve(self.workspace, str(path))
            except WorkspaceError:
                return f"[lsp: the rename would edit {path}, outside the project — nothing renamed]"
            if edits:
                planned.setdefault(real, []).extend(edits)
                named = shown_path(self.workspace, self._given(path), real)
                if named != self.display(real):
                    self._named[real] = named
        if not planned:
            return f"[lsp: nothing to rename: the server proposed no edit for {self.call.symbol}]"
        return planned


def _changes_something(edit: types.WorkspaceEdit) -> bool:
    in_changes = any(edits for edits in (edit.changes or {}).values())
    return in_changes or any(
        not isinstance(change, types.TextDocumentEdit) or change.edits for change in edit.document_changes or []
    )


@dataclass
class _Symbol:
    kind: str
    name: str
    detail: str
    line: int
    span: tuple[tuple[int, int], tuple[int, int]]
    children: list[_Symbol]


def _node(symbol: types.DocumentSymbol | types.SymbolInformation) -> _Symbol:
    kind = symbol.kind.name.lower() if isinstance(symbol.kind, types.SymbolKind) else str(symbol.kind)
    if isinstance(symbol, types.DocumentSymbol):
        r, line, detail = symbol.range, symbol.selection_range.start.line, symbol.detail or ""
        children = [_node(c) for c in symbol.children or []]
    else:
        r, detail, children = symbol.location.range, "", []
        line = r.start.line
    span = ((r.start.line, r.start.character), (r.end.line, r.end.character))
    return _Symbol(kind, symbol.name, detail.strip(), line, span, children)


def symbol_tree(answer: list[Any]) -> list[_Symbol]:
    """Symbols as a tree in file order. A server answering with the flat SymbolInformation form (pylsp does)
    gets its tree rebuilt from the ranges: a symbol strictly inside another's range is its child."""
    nodes = sorted((_node(s) for s in answer), key=lambda n: (n.span[0], (-n.span[1][0], -n.span[1][1])))
    if any(isinstance(s, types.DocumentSymbol) for s in answer):
        return nodes
    roots: list[_Symbol] = []
    stack: list[_Symbol] = []
    for node in nodes:
        # Strictly inside: two names of one import line share a range and are siblings.
        while stack and not (
            stack[-1].span[0] <= node.span[0] and node.span[1] <= stack[-1].span[1] and node.span != stack[-1].span
        ):
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def apply_edits(text: str, edits: list[types.TextEdit], encoding: str = UTF16) -> str:
    """Apply LSP text edits, wire positions (UTF-16 unless negotiated) converted, from the end of the file
    backwards so that the positions of the edits not yet applied stay valid."""
    starts = line_starts(text)
    spans = []
    for index, e in enumerate(edits):
        begin = offset(text, starts, e.range.start.line, e.range.start.character, encoding)
        end = offset(text, starts, e.range.end.line, e.range.end.character, encoding)
        spans.append((begin, end, index, e.new_text))
    for begin, end, _, new_text in sorted(spans, reverse=True):
        text = text[:begin] + new_text + text[end:]
    return text
