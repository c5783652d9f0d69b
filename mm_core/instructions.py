"""What the agent is told besides its own system prompt: the operator's text, and the repository's own files.

The repository's files (AGENTS.md by default) are read from the workspace, which the model and the
repository's authors write: a name that is a symlink, or goes through one, is not read (O_NOFOLLOW at every
step, as the file tools write), nor is anything but a regular file; a file longer than the bound is cut, and
says so. What they say steers the model and grants nothing: approvals and the sandbox still apply.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mm_core.tools.workspace import NotRegularFile, WorkspaceError, open_regular, real_path

# The most of one repository file that goes into the system prompt.
MAX_FILE_BYTES = 16_000
CUT = "\n[… {path} is cut here: {size:,} bytes, the first {limit:,} are shown]"
OPERATOR_HEAD = "Instructions from the operator of this service:"
# Read from the workspace as it stands, which the model and the thread's people change too: not "the authors'".
REPOSITORY_HEAD = "Instructions from the repository's {path} (as the workspace holds it now):"


@dataclass(frozen=True)
class RepoFile:
    """One instruction file looked for in the workspace: read (its text), or why not."""

    path: str
    size: int = 0
    text: str | None = None
    cut: bool = False
    skipped: str | None = None  # "a symlink", "not a regular file", "unreadable"; None when read or absent


def read_repo_files(workspace: Path, names: Sequence[str], limit: int = MAX_FILE_BYTES) -> list[RepoFile]:
    """The files `names` (relative paths) of the workspace that exist, read without following any link."""
    found = []
    for name in names:
        real = Path(real_path(workspace)) / name  # not resolved: a link anywhere on the way is refused below
        try:
            fd, st = open_regular(workspace, real, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except WorkspaceError:
            found.append(RepoFile(name, skipped="a symlink"))
            continue
        except NotRegularFile:
            found.append(RepoFile(name, skipped="not a regular file"))
            continue
        except OSError:
            found.append(RepoFile(name, skipped="unreadable"))
            continue
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        text = data[:limit].decode("utf-8", errors="replace")
        cut = len(data) > limit
        if cut:
            text += CUT.format(path=name, size=st.st_size, limit=limit)
        found.append(RepoFile(name, size=st.st_size, text=text, cut=cut))
    return found


def extra_instructions(operator: str | None, files: Sequence[RepoFile]) -> str:
    """The text that follows the agent's own system prompt: the operator's, then each file read, each headed."""
    parts = [f"{OPERATOR_HEAD}\n{operator.strip()}"] if operator and operator.strip() else []
    parts += [f"{REPOSITORY_HEAD.format(path=f.path)}\n{f.text.strip()}" for f in files if f.text and f.text.strip()]
    return "\n\n".join(parts)
