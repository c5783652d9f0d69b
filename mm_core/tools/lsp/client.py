"""One language server process and the conversation with it: a thin asyncio JSON-RPC client over lsprotocol.

Why not pygls 2's LanguageClient: it structures every incoming message with the strict lsprotocol converter
before routing it, and a message that does not structure is dropped. python-lsp-server 1.15's `initialize`
answer (its notebookDocumentSync selector) does not structure with lsprotocol 2025.0.0, so with pygls the
handshake simply hangs until its timeout; any server with one unusual field would do the same to any request.
Here the envelope is read as plain JSON, and only the results the tool uses are structured with lsprotocol's
converter, where a failure becomes an answer ("could not read the server's answer") instead of a hang.

What a tool on a shared worker needs around the wire: a timeout on every request (with `$/cancelRequest`), the
pending requests failed the moment the process exits, the server's stderr drained (an undrained pipe blocks a
chatty server), the documents kept in step with the disk, the diagnostics the server publishes, and a shutdown
that always ends with the process gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter

from mm_core.errors import CoreError
from mm_core.tools.base import ToolRefusal
from mm_core.tools.lsp.positions import UTF8, UTF16, UTF32
from mm_core.tools.sandbox import Launch
from mm_core.tools.workspace import OUTSIDE, WorkspaceError, read_bytes, relative

# Documents a server keeps open at once; the least recently used one is closed beyond this, so a long
# session walking a large project does not make the server hold every file it ever saw.
MAX_OPEN_DOCUMENTS = 64
# Bytes read from a server's stderr at a time; also the most of one stderr line kept for an exit message.
READ_CHUNK = 4096

_LANGUAGE_IDS = {
    ".py": "python",
    ".pyi": "python",
    ".go": "go",
    ".rs": "rust",
    ".js": "javascript",
    ".jsx": "javascriptreact",
    ".ts": "typescript",
    ".tsx": "typescriptreact",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".java": "java",
    ".rb": "ruby",
    ".sh": "shellscript",
    ".lua": "lua",
    ".zig": "zig",
}

_CONVERTER = get_converter()


class RequestFailed(CoreError):
    """A request that got no usable answer; the message is the text after `<action> failed: `."""


class ServerGone(RequestFailed):
    """The server process is not running any more; the next call starts it again."""


@dataclass
class Document:
    version: int
    text: str
    # The value of the client's clock when this content was sent: a publication after it is about this text.
    sent_at: int


@dataclass
class Published:
    diagnostics: list[types.Diagnostic]
    at: int


def language_id(path: Path) -> str:
    return _LANGUAGE_IDS.get(path.suffix.lower(), path.suffix.lower().lstrip("."))


def read_document(path: Path, workspace: Path) -> str:
    """The text of `path`, a real path inside `workspace` (from workspace.resolve), read only through the
    workspace's confined opener: walked from the workspace's own directory without following any symlink, so a
    file swapped for a link since it was resolved is refused (WorkspaceError), never followed, and a path
    outside the workspace is never opened."""
    try:
        relative(workspace, path)
    except ValueError:
        raise WorkspaceError(OUTSIDE.format(path=path)) from None
    # Servers want text; a stray invalid byte must not make the whole file unreadable to them.
    return read_bytes(workspace, path).decode("utf-8", errors="replace")


def _answer_server_request(method: str, params: Any) -> Any:
    """Answers to the requests a server may send back; answering them (rather than "method not found") keeps
    servers that insist on an answer from stalling."""
    if method == types.WORKSPACE_CONFIGURATION:
        return [None] * len((params or {}).get("items", []))
    if method == types.WORKSPACE_APPLY_EDIT:
        # Only the tool writes files, after approval; a server does not get to write on its own.
        return {"applied": False, "failureReason": "not supported by this client"}
    return None  # registerCapability, workDoneProgress/create, showMessageRequest, workspaceFolders...


class LspClient:
    def __init__(
        self,
        name: str,
        command: str,
        args: list[str],
        root: Path,
        timeout: float,
        launcher: Callable[[list[str]], Launch] | None = None,
    ):
        self.server_name = name
        self.launcher = launcher
        self.sandboxed = False
        self.command = command
        self.args = args
        self.root = root
        self.timeout = timeout
        self.documents: collections.OrderedDict[str, Document] = collections.OrderedDict()
        self.published: dict[str, Published] = {}
        self.exit_reason = ""
        self.encoding = UTF16
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._news = asyncio.Event()
        self._stderr: collections.deque[str] = collections.deque(maxlen=8)
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle -------------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self.exit_reason

    async def start(self) -> None:
        """Start the process in the project root (through the launcher: the sandbox) and run the initialize
        handshake."""
        argv = [self.command, *self.args]
        try:
            launch = self.launcher(argv) if self.launcher is not None else None
        except ToolRefusal as err:
            raise RequestFailed(f"could not start {self.command}: {err.text}") from err
        self.sandboxed = launch is not None and launch.sandboxed
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *(launch.argv if launch else argv),
                cwd=str(self.root),
                env=launch.env if launch else None,
                preexec_fn=launch.preexec if launch else None,
                user=launch.user if launch else None,
                group=launch.group if launch else None,
                extra_groups=[] if launch and launch.user is not None else None,
                start_new_session=True,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as err:  # SubprocessError: a failed setrlimit
            raise RequestFailed(f"could not start {self.command}: {getattr(err, 'strerror', None) or err}") from err
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._tasks = [
            asyncio.create_task(self._read(self._proc.stdout)),
            asyncio.create_task(self._drain_stderr(self._proc.stderr)),
        ]
        root_uri = self.root.as_uri()
        params = types.InitializeParams(
            # In its own pid namespace the server would find no process of ours by this id, and pylsp ends when
            # it finds none.
            process_id=None if self.sandboxed else os.getpid(),
            root_uri=root_uri,
            root_path=str(self.root),
            workspace_folders=[types.WorkspaceFolder(uri=root_uri, name=self.root.name or "root")],
            capabilities=_CAPABILITIES,
            client_info=types.ClientInfo(name="mm"),
        )
        # Of the server's capabilities only the position encoding matters: every request is simply tried, and an
        # unsupported one answers with an error.
        answer = await self.request(types.INITIALIZE, params, raw=True)
        capabilities = answer.get("capabilities") if isinstance(answer, dict) else None
        encoding = capabilities.get("positionEncoding") if isinstance(capabilities, dict) else None
        self.encoding = encoding if encoding in (UTF8, UTF16, UTF32) else UTF16
        self.notify(types.INITIALIZED, types.InitializedParams())

    async def close(self, grace: float = 2.0) -> None:
        """shutdown, exit, then the process: whatever state the server is in, it is gone afterwards."""
        try:
            if self.alive:
                for uri in list(self.documents):
                    self._close_document(uri)
                await self.request(types.SHUTDOWN, None, timeout=grace, raw=True)
                self.notify(types.EXIT, None)
        except RequestFailed:
            pass
        finally:
            self.documents.clear()
            await self._end_process(grace)

    async def _end_process(self, grace: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            await _reap(proc, grace)
        if proc.stdin is not None:
            proc.stdin.close()
        _, pending = await asyncio.wait(self._tasks, timeout=grace)
        for task in pending:
            task.cancel()

    def _exit_text(self, code: int | None) -> str:
        text = f"the server exited (code {code})"
        tail = " | ".join(line for line in self._stderr if line)
        return f"{text}: {tail[-300:]}" if tail else text

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        # Read in chunks, not lines: `readline` gives up on a line longer than the stream's limit, and a pipe
        # left undrained blocks the server (and, on Python 3.11, `wait()` for its exit) for ever.
        partial = b""
        while chunk := await stream.read(READ_CHUNK):
            *lines, partial = (partial + chunk).split(b"\n")
            partial = partial[-READ_CHUNK:]
            for line in lines[-self._stderr.maxlen :]:  # type: ignore[misc]
                self._stderr.append(line[-READ_CHUNK:].decode("utf-8", errors="replace").rstrip())
        if partial:
            self._stderr.append(partial.decode("utf-8", errors="replace").rstrip())

    # ---- the wire --------------------------------------------------------------------------------------------

    async def _read(self, stream: asyncio.StreamReader) -> None:
        try:
            while True:
                length = 0
                while (header := await stream.readline()) not in (b"\r\n", b"\n"):
                    if not header:
                        return
                    name, _, value = header.decode("ascii", errors="replace").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await stream.readexactly(length)
                try:
                    message = json.loads(body)
                except ValueError:
                    continue  # one garbled message must not end the conversation
                if isinstance(message, dict):
                    self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        finally:
            # What is left of a garbled conversation is read and dropped: a pipe nobody reads fills, pauses, and
            # never reaches its end, which on Python 3.11 keeps the process's exit from being reported at all.
            drain = asyncio.create_task(_discard(stream))
            await self._gone()
            _, pending = await asyncio.wait([drain], timeout=2.0)
            for task in pending:
                task.cancel()

    async def _gone(self) -> None:
        """stdout closed: the server is exiting. Fail what is pending now, with its exit status."""
        proc = self._proc
        assert proc is not None
        await _reap(proc, 2.0)  # a server that closed or garbled its stdout is of no use any more
        await asyncio.sleep(0)  # let the stderr reader take the last words
        self.exit_reason = self._exit_text(proc.returncode)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ServerGone(self.exit_reason))
        self._pending.clear()
        self._news.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            future = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
            if future is not None and not future.done():
                if message.get("error") is not None:
                    error = message["error"]
                    text = error.get("message") if isinstance(error, dict) else None
                    future.set_exception(RequestFailed(str(text or error)))
                else:
                    future.set_result(message.get("result"))
        elif "id" in message:
            self._send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": _answer_server_request(method, message.get("params")),
                }
            )
        elif method == types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS:
            try:
                params = _CONVERTER.structure(message.get("params"), types.PublishDiagnosticsParams)
            except Exception:  # noqa: BLE001 - a publication we cannot read is one we do not have
                return
            self.published[params.uri] = Published(list(params.diagnostics), next(self._clock))
            self._news.set()

    def _send(self, payload: dict[str, Any]) -> None:
        if self._proc is None or self._proc.stdin is None or self._proc.stdin.is_closing():
            return
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self._proc.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def notify(self, method: str, params: Any) -> None:
        if self.alive:
            self._send({"jsonrpc": "2.0", "method": method, "params": _CONVERTER.unstructure(params)})

    async def request(self, method: str, params: Any, timeout: float | None = None, raw: bool = False) -> Any:
        """Send a request and wait for its answer, at most `timeout` (the configured requestTimeout); the answer
        is structured with lsprotocol's type for `method` unless `raw`."""
        if not self.alive:
            if not self.exit_reason and self._proc is not None and self._proc.returncode is not None:
                self.exit_reason = self._exit_text(self._proc.returncode)
            raise ServerGone(self.exit_reason or "the server is not running")
        timeout = self.timeout if timeout is None else timeout
        msg_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = _CONVERTER.unstructure(params)
        self._send(message)
        try:
            result = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self._pending.pop(msg_id, None)
            self.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
            raise RequestFailed(f"no answer within {timeout:g}s") from None
        if raw:
            return result
        response_type = types.METHOD_TO_TYPES[method][1]
        try:
            return _CONVERTER.structure({"jsonrpc": "2.0", "id": msg_id, "result": result}, response_type).result
        except Exception as err:  # noqa: BLE001 - a malformed answer is reported, not raised
            raise RequestFailed(f"could not read the server's answer ({type(err).__name__})") from None

    # ---- documents -------------------------------------------------------------------------------------------

    def sync(self, path: Path) -> bool:
        """Tell the server the file's content on disk: didOpen the first time, a whole-document didChange when it
        moved since. True when something was sent. `path` is a real path inside the root (from resolve); a file
        that is not, or that turned into a symlink since, raises WorkspaceError and nothing is sent."""
        uri = path.as_uri()
        text = read_document(path, self.root)  # confined: the server is never sent a file outside its root
        doc = self.documents.get(uri)
        if doc is not None:
            self.documents.move_to_end(uri)
            if doc.text == text:
                return False
            doc.version += 1
            doc.text, doc.sent_at = text, next(self._clock)
            self.notify(
                types.TEXT_DOCUMENT_DID_CHANGE,
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=doc.version),
                    content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
                ),
            )
            return True
        self.documents[uri] = Document(version=1, text=text, sent_at=next(self._clock))
        self.notify(
            types.TEXT_DOCUMENT_DID_OPEN,
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id=language_id(path), version=1, text=text)
            ),
        )
        while len(self.documents) > MAX_OPEN_DOCUMENTS:
            self._close_document(next(iter(self.documents)))
        return True

    def forget(self, path: Path) -> None:
        """didClose for a file the tool could not use (gone from disk), so the server drops it too."""
        if path.as_uri() in self.documents:
            self._close_document(path.as_uri())

    def _close_document(self, uri: str) -> None:
        self.documents.pop(uri, None)
        self.published.pop(uri, None)
        if self.alive:
            self.notify(
                types.TEXT_DOCUMENT_DID_CLOSE,
                types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)),
            )

    # ---- diagnostics -----------------------------------------------------------------------------------------

    def fresh_diagnostics(self, path: Path) -> list[types.Diagnostic] | None:
        """What the server published about the file's current content, None when it has not spoken since."""
        uri = path.as_uri()
        doc, pub = self.documents.get(uri), self.published.get(uri)
        if doc is None or pub is None or pub.at < doc.sent_at:
            return None
        return pub.diagnostics

    async def wait_diagnostics(self, path: Path, within: float) -> list[types.Diagnostic] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while (found := self.fresh_diagnostics(path)) is None:
            left = deadline - loop.time()
            if left <= 0 or not self.alive:
                return None
            self._news.clear()
            try:
                await asyncio.wait_for(self._news.wait(), left)
            except TimeoutError:
                return self.fresh_diagnostics(path)
        return found


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(READ_CHUNK):
        pass


async def _reap(proc: asyncio.subprocess.Process, grace: float) -> None:
    """Wait `grace` for the process to exit, then kill its group. Past the kill the wait is bounded too: on
    Python 3.11 `wait()` also waits for the pipes to close, and a pipe nobody reads any more (a garbled stdout)
    stays paused for ever; the exit status is known by then all the same."""
    try:
        await asyncio.wait_for(proc.wait(), grace)
        return
    except TimeoutError:
        kill_group(proc.pid)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace)


def kill_group(pid: int | None) -> None:
    """Kill a server and whatever it spawned (it was started in its own session)."""
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_CAPABILITIES = types.ClientCapabilities(
    # UTF-16 is what every server must speak. Offering UTF-32 first is for the servers that negotiate (pygls-based
    # ones such as jedi-language-server): they count in code points internally, and announced UTF-16 they still
    # send code points, which misplaces every column after an emoji; negotiated UTF-32 they are exact.
    general=types.GeneralClientCapabilities(
        position_encodings=[types.PositionEncodingKind.Utf32, types.PositionEncodingKind.Utf16]
    ),
    workspace=types.WorkspaceClientCapabilities(
        workspace_edit=types.WorkspaceEditClientCapabilities(document_changes=True, resource_operations=[]),
        workspace_folders=True,
        configuration=True,
    ),
    text_document=types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(),
        definition=types.DefinitionClientCapabilities(link_support=True),
        references=types.ReferenceClientCapabilities(),
        hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown, types.MarkupKind.PlainText]),
        document_symbol=types.DocumentSymbolClientCapabilities(hierarchical_document_symbol_support=True),
        rename=types.RenameClientCapabilities(prepare_support=False),
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
    ),
)
