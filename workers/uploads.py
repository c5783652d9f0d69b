"""Files people share in a thread, downloaded into its workspace for the agent: `.mm/uploads/<message ts>/<name>`.

A shared file is untrusted content from a Slack user, and the workspace is the model's: it may hold any symlink
by the time a file arrives. So the name is made a plain file name (`safe_name`: no `/`, no `..`, no leading
dot, no control character), every directory on the way is opened from the workspace's descriptor without
following a link (mm_core.tools.workspace.open_directory), the file is created new (O_EXCL, O_NOFOLLOW: an
existing name gets a suffix, nothing is overwritten), and its size is bounded twice: by what Slack says before
anything is fetched, and by the bytes read (a file that grows past its bound is removed, not kept in part).

The bot token goes only to Slack's own hosts (`SlackHosts`, derived from the configured Web API URL, so the
emulator's host in tests): a `url_private_download` elsewhere is not fetched, and a redirect elsewhere is not
followed. The bot records the message's files with it (bot.shapes.shared_files); the worker downloads them when
its turn takes the message (workers.turns), well after the bot's 3-second ack.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import os
import re
import stat
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from chatops.config import FilesConfig
from mm_core.tools.workspace import open_directory
from slackio.mrkdwn import Mrkdwn
from workers.errors import WorkerError

UPLOADS = (".mm", "uploads")
# Keeps the uploads out of `git status`, and so out of a push (written once into `.mm/`).
IGNORE_ALL = b"# files people shared in the thread (workers.uploads): never pushed\n*\n"
MB = 1024 * 1024
# A file made new, never an existing one, never through a link.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_REDIRECTS = 5
# All the downloads of one turn, redirects included: they run before the turn, outside its time limit and
# where `stop` does not reach, so they get a bound of their own.
TURN_DOWNLOADS_S = 600.0
# An image goes to a model that takes images (`model.vision`) when it is one of these, at most this large (the
# bound most providers set on one image), and among the first MAX_IMAGES of a turn; else it is only a file.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
MAX_IMAGE_BYTES = 5 * MB
MAX_IMAGES = 4
MAX_NAME_BYTES = 200
CHUNK = 64 * 1024

# The lines the thread reads for a file that was not taken; {name} is the name as shared, escaped by format.
TOO_LARGE = Mrkdwn("📎 `{name}` was not taken: it is {size}, and a file may be at most {most}.")
TURN_FULL = Mrkdwn("📎 `{name}` was not taken: the files of this turn may be at most {most} together.")
NOT_DOWNLOADABLE = Mrkdwn("📎 `{name}` could not be downloaded from Slack ({why}).")
LATE = f"the turn's downloads took more than {TURN_DOWNLOADS_S / 60:g} minutes"
NOT_WRITTEN = Mrkdwn("📎 `{name}` could not be written into the workspace ({why}).")


@dataclass(frozen=True)
class Arrived:
    """A file written into the workspace: its path there (relative), size and Slack's mimetype; an image that
    goes to the model too, as a data URL (`image`)."""

    path: str
    size: int
    mimetype: str
    image: str | None = None


@dataclass
class Received:
    """What one turn's files became: per inbox row, the files written; and the lines for those refused."""

    arrived: dict[int, list[Arrived]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    # Per inbox row, the names of the files not taken (the model hears of them too, without the reasons).
    missing: dict[int, list[str]] = field(default_factory=dict)

    def images(self) -> dict[int, list[str]]:
        """The images that go to the model, by inbox row: at most MAX_IMAGES a turn."""
        kept: dict[int, list[str]] = {}
        for row_id, files in self.arrived.items():
            for file in files:
                if file.image is not None and sum(map(len, kept.values())) < MAX_IMAGES:
                    kept.setdefault(row_id, []).append(file.image)
        return kept

    def notes(self, row_ids: Sequence[int]) -> dict[int, str]:
        """The line added to each message's text for the model: `[files: .mm/uploads/…/log.txt (12 KB), …]`."""
        return {row_id: self.note(row_id) for row_id in row_ids}

    def note(self, row_id: int) -> str:
        lines = []
        if files := self.arrived.get(row_id):
            lines.append("[files: " + ", ".join(f"{f.path} ({human_size(f.size)})" for f in files) + "]")
        if names := self.missing.get(row_id):
            lines.append("[files not taken (too large, or not downloadable): " + ", ".join(names) + "]")
        return "\n".join(lines)


@dataclass(frozen=True)
class SlackHosts:
    """Where the bot token may be sent: Slack's own hosts (`slack.com` and its subdomains, over HTTPS) when the
    Web API is Slack's, else only the configured API's own host, port and scheme (an emulator)."""

    api_url: str

    def allow(self, url: str) -> bool:
        api, to = urlsplit(self.api_url), urlsplit(url)
        host = (api.hostname or "").lower()
        try:
            there = (to.hostname or "").lower(), to.port
        except ValueError:  # a port that is no number
            return False
        if host == "slack.com" or host.endswith(".slack.com"):
            return to.scheme == "https" and (there[0] == "slack.com" or there[0].endswith(".slack.com"))
        return to.scheme == api.scheme and there == (host, api.port)


class Refused(WorkerError):
    """A file that is not taken: str() is the line for the thread."""


def human_size(size: float) -> str:
    for unit in ("bytes", "KB", "MB"):
        if size < 1024 or unit == "MB":
            return f"{size:.0f} {unit}" if unit != "MB" else f"{size:.1f} MB"
        size /= 1024
    return f"{size} bytes"  # not reached


def safe_name(name: str) -> str:
    """`name` as one plain file name: no directory (`/` and `\\` become `_`), no `..`, no leading dot (no hidden
    `.git` or `.bashrc` made by a person), no control or format character, at most MAX_NAME_BYTES in UTF-8
    (its extension kept); `file` when nothing is left."""
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C")
    name = re.sub(r"[/\\]", "_", name)
    name = re.sub(r"\.{2,}", ".", name).lstrip(". ").rstrip(" ")
    stem, dot, ext = name.rpartition(".")
    if not stem:
        stem, dot, ext = ext, "", ""
    ext = ext[:20]
    while len((stem + dot + ext).encode()) > MAX_NAME_BYTES:
        stem = stem[:-1]
    return (stem + dot + ext) or "file"


def _suffixed(name: str, n: int) -> str:
    stem, dot, ext = name.rpartition(".")
    return f"{stem}-{n}{dot}{ext}" if stem else f"{name}-{n}"


def not_received(rows: Sequence[tuple[int, str, list[dict[str, Any]]]]) -> Received:
    """Every file of `rows` refused at once (the downloads themselves failed): the messages still go ahead."""
    received = Received()
    for row_id, _, files in rows:
        for file in files:
            shown = _shown(file)
            received.refused.append(NOT_DOWNLOADABLE.format(name=shown, why="the worker failed, see its errors"))
            received.missing.setdefault(row_id, []).append(shown)
    return received


async def receive(
    rows: Sequence[tuple[int, str, list[dict[str, Any]]]],
    workspace: Path,
    token: str | None,
    api_url: str,
    limits: FilesConfig,
    vision: bool = False,
) -> Received:
    """Download the files of `rows` (inbox row id, message ts, files as shared_files kept them) into the
    workspace, within `limits`; what arrived and the lines for what did not. With `vision`, images are kept
    as data URLs for the model as well."""
    received = Received()
    hosts = SlackHosts(api_url)
    per_file, left = int(limits.maxMB * MB), int(limits.maxTurnMB * MB)
    timeout = aiohttp.ClientTimeout(total=300, sock_connect=10, sock_read=60)
    deadline = time.monotonic() + TURN_DOWNLOADS_S
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for row_id, message_ts, files in rows:
            for file in files:
                shown = _shown(file)
                try:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=LATE))
                    size = file.get("size")
                    if isinstance(size, int) and size > per_file:
                        raise Refused(TOO_LARGE.format(name=shown, size=human_size(size), most=human_size(per_file)))
                    if isinstance(size, int) and size > left:
                        raise Refused(TURN_FULL.format(name=shown, most=human_size(limits.maxTurnMB * MB)))
                    try:
                        arrived = await asyncio.wait_for(
                            _download(session, hosts, token, file, workspace, message_ts, limits, left), remaining
                        )
                    except TimeoutError:
                        raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=LATE)) from None
                    if vision and arrived.mimetype in IMAGE_TYPES and arrived.size <= MAX_IMAGE_BYTES:
                        arrived = await asyncio.to_thread(_with_image, workspace, arrived)  # up to 5 MB
                except Refused as refused:
                    received.refused.append(refused.args[0])  # Mrkdwn, escaped once
                    received.missing.setdefault(row_id, []).append(shown)
                    continue
                left -= arrived.size
                received.arrived.setdefault(row_id, []).append(arrived)
    return received


async def _download(
    session: aiohttp.ClientSession,
    hosts: SlackHosts,
    token: str | None,
    file: dict[str, Any],
    workspace: Path,
    message_ts: str,
    limits: FilesConfig,
    left: int,
) -> Arrived:
    shown = _shown(file)
    url = file.get("url_private_download")
    if not isinstance(url, str) or not url:
        raise Refused(NOT_DOWNLOADABLE.format(name=shown, why="Slack gave no download link"))
    if not token:
        raise Refused(NOT_DOWNLOADABLE.format(name=shown, why="no bot token is configured"))
    headers = {"Authorization": f"Bearer {token}"}
    for _ in range(MAX_REDIRECTS + 1):
        if not hosts.allow(url):
            raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=f"its link leads off Slack, to {_host(url)}"))
        try:
            response = await session.get(url, headers=headers, allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=type(e).__name__)) from e
        async with response:
            if response.status in (301, 302, 303, 307, 308):
                url = urljoin(url, response.headers.get("Location", ""))
                continue
            if response.status != 200:
                raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=f"HTTP {response.status}"))
            mimetype = str(file.get("mimetype") or "application/octet-stream")
            if response.content_type == "text/html" and mimetype != "text/html":
                # Slack's answer to a request it does not let through (no token, no `files:read`): its login page.
                raise Refused(NOT_DOWNLOADABLE.format(name=shown, why="Slack answered with its login page"))
            return await _write(response, workspace, message_ts, file, shown, mimetype, limits, left)
    raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=f"more than {MAX_REDIRECTS} redirects"))


def _shown(file: dict[str, Any]) -> str:
    """The file's name as the thread shows it, in a code span (which a backtick would end)."""
    return str(file.get("name") or file.get("id") or "file")[:100].replace("`", "'")


def _host(url: str) -> str:
    return urlsplit(url).netloc[:100] or "nowhere"


async def _write(
    response: aiohttp.ClientResponse,
    workspace: Path,
    message_ts: str,
    file: dict[str, Any],
    shown: str,
    mimetype: str,
    limits: FilesConfig,
    left: int,
) -> Arrived:
    per_file = int(limits.maxMB * MB)
    folder = (*UPLOADS, safe_name(message_ts))
    try:
        _ignore_uploads(workspace)
        directory = open_directory(workspace, folder, create=True)
    except OSError as e:
        raise Refused(NOT_WRITTEN.format(name=shown, why=_why(e))) from e
    try:
        try:
            name, fd = _create(directory, safe_name(str(file.get("name") or file.get("id") or "")))
        except OSError as e:  # a full disk, a name too long for the file system: this file is refused, not all
            raise Refused(NOT_WRITTEN.format(name=shown, why=_why(e))) from e
        written = 0
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in response.content.iter_chunked(CHUNK):
                    written += len(chunk)
                    if written > per_file:
                        raise Refused(TOO_LARGE.format(name=shown, size="larger", most=human_size(per_file)))
                    if written > left:
                        raise Refused(TURN_FULL.format(name=shown, most=human_size(limits.maxTurnMB * MB)))
                    out.write(chunk)
        except BaseException as e:  # cancelled too (the turn's deadline): a part of a file is no file
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=directory)
            if isinstance(e, (OSError, aiohttp.ClientError, TimeoutError)) and not isinstance(e, Refused):
                raise Refused(NOT_DOWNLOADABLE.format(name=shown, why=_why(e))) from e
            raise
    finally:
        os.close(directory)
    return Arrived(str(PurePosixPath(*folder, name)), written, mimetype)


def _with_image(workspace: Path, arrived: Arrived) -> Arrived:
    """`arrived` with its bytes as a data URL, read back as written (by descriptor, without following a link)."""
    folder, name = PurePosixPath(arrived.path).parent.parts, PurePosixPath(arrived.path).name
    try:
        directory = open_directory(workspace, folder)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        finally:
            os.close(directory)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO or a directory since it was written
            os.close(fd)
            return arrived
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError:  # the model changed it since: it stays a file, named in the message
        return arrived
    if data is None or len(data) > MAX_IMAGE_BYTES:
        return arrived
    return replace(arrived, image=f"data:{arrived.mimetype};base64,{base64.b64encode(data).decode()}")


def _create(directory: int, name: str) -> tuple[str, int]:
    """A new file in `directory`, never an existing one nor through a link: `name`, else `name-1`, `name-2`…"""
    for n in range(100):
        candidate = name if n == 0 else _suffixed(name, n)
        try:
            return candidate, os.open(candidate, _NEW_FILE, 0o644, dir_fd=directory)
        except FileExistsError:
            continue
    raise Refused(NOT_WRITTEN.format(name=name, why="too many files of that name"))


def _ignore_uploads(workspace: Path) -> None:
    """`.mm/uploads/.gitignore` ignoring all of the uploads, written once (never through a link, never over a
    file). In the uploads' own folder, not `.mm`'s: a repository may track a `.mm/.gitignore` of its own, which
    is never overwritten, and then people's files would have been counted as changes and pushed."""
    directory = open_directory(workspace, UPLOADS, create=True)
    try:
        fd = os.open(".gitignore", _NEW_FILE, 0o644, dir_fd=directory)
    except FileExistsError:
        return
    finally:
        os.close(directory)
    with os.fdopen(fd, "wb") as out:
        out.write(IGNORE_ALL)


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a link or a file is in the way of `.mm/uploads`"
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "the disk is full"
    return type(error).__name__
