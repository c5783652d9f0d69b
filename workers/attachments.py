"""Files the agent gives people: a line `[attach: <path>]` of its answer uploads that workspace file into the
thread once the answer is shown.

The convention is the system prompt's (ATTACH_HINT, added for thread sessions by workers.turns): a line of the
final answer that is only `[attach: path/in/workspace]`, a path relative to the workspace. The path comes from
the model, and the workspace is the model's: it is taken literally (no `~`, no globbing), refused when it
leads out of the workspace (`..`, an absolute path elsewhere), and opened from the workspace's descriptor
without following any link (mm_core.tools.workspace.open_directory, then O_NOFOLLOW), so a link anywhere on the
way refuses it instead of sending what it points to. Only regular files, at most `workspaces.files.maxMB`
each and `maxAttachments` an answer; each one refused gets a line in the thread. The upload goes through the
gateway (SlackOut.upload), which scrubs the worker's secrets from the bytes.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from chatops.config import FilesConfig
from mm_core.tools.workspace import open_directory, real_path
from slackio.mrkdwn import Mrkdwn
from slackio.slack_out import SlackOut
from workers.errors import WorkerError
from workers.uploads import MB, human_size

ATTACH_HINT = (
    "\n\nTo give the person a file of your workspace, end your answer with one line per file, each only "
    "`[attach: path/relative/to/the/workspace]`: the file is then uploaded into the Slack thread. At most "
    "{count} files of at most {size} each."
)
ATTACH_LINE = re.compile(r"^[ \t]*\[attach:[ \t]*([^\]\n]+?)[ \t]*\][ \t]*$", re.MULTILINE)
NOT_ATTACHED = Mrkdwn("📎 `{path}` was not attached: {why}.")
TOO_MANY = "an answer attaches at most {most} files"


@dataclass(frozen=True)
class Attachment:
    name: str
    data: bytes


class Refused(WorkerError):
    """A path that is not attached: str() says why, in a few words."""


def requested(answer: str) -> list[str]:
    """The paths the answer's `[attach: …]` lines name, each once, in order."""
    return list(dict.fromkeys(m.group(1) for m in ATTACH_LINE.finditer(answer)))


def hint(limits: FilesConfig) -> str:
    """What the system prompt says of the convention, with the bounds."""
    return ATTACH_HINT.format(count=limits.maxAttachments, size=human_size(limits.maxMB * MB))


async def attach(
    slack: SlackOut, channel: str, thread_ts: str | None, workspace: Path, answer: str, limits: FilesConfig
) -> list[str]:
    """Upload the files the answer names into the thread; a line in the thread for each one refused. The
    paths uploaded."""
    done = []
    for n, path in enumerate(requested(answer)):
        try:
            if n >= limits.maxAttachments:
                raise Refused(TOO_MANY.format(most=limits.maxAttachments))
            # Up to maxMB read from a disk the worker shares: off the event loop, which runs other sessions' turns.
            file = await asyncio.to_thread(read, workspace, path, int(limits.maxMB * MB))
            await slack.upload(channel, thread_ts, file.data, file.name, file.name)
            done.append(path)
            continue
        except Refused as refused:
            why = str(refused)
        except Exception as e:  # noqa: BLE001 - Slack refused the upload: said in the thread, the turn is done
            why = f"Slack refused it ({e})"
        shown = path[:200].replace("`", "'")
        await slack.post(channel, NOT_ATTACHED.format(path=shown, why=why), thread_ts=thread_ts)
    return done


def read(workspace: Path, path: str, most: int) -> Attachment:
    """The workspace file `path` names, read without following a link, at most `most` bytes; Refused else."""
    parts = _parts(workspace, path)
    try:
        directory = open_directory(workspace, parts[:-1])
    except OSError as e:
        raise Refused(_why(e)) from e
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except OSError as e:
        raise Refused(_why(e)) from e
    finally:
        os.close(directory)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # checked on the descriptor: fdopen of a directory raises, leaving it open
        os.close(fd)
        raise Refused("it is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > most:
            raise Refused(f"it is {human_size(st.st_size)}, and a file may be at most {human_size(most)}")
        data = f.read(most + 1)
    if len(data) > most:
        raise Refused(f"it is larger than {human_size(most)}")
    return Attachment(parts[-1], data)


def _parts(workspace: Path, path: str) -> tuple[str, ...]:
    """`path`'s names under the workspace, taken literally; Refused when it leads out or names nothing."""
    if not path or "\x00" in path:
        raise Refused("it is not a path")
    given = PurePosixPath(path)
    if given.is_absolute():
        root = PurePosixPath(real_path(workspace))
        if not given.is_relative_to(root):
            raise Refused("it is outside the workspace")
        given = given.relative_to(root)
    normal = PurePosixPath(os.path.normpath(given))
    if not normal.parts or normal.parts[0] == ".." or str(normal) == ".":
        raise Refused("it is outside the workspace")
    return normal.parts


def _why(error: OSError) -> str:
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a link is on its way, and links are not followed"
    if error.errno == errno.ENOENT:
        return "there is no such file in the workspace"
    if error.errno == errno.EISDIR:
        return "it is a directory"
    return os.strerror(error.errno or 0).lower()
