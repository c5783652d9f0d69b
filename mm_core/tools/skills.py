"""read_skill: markdown instructions kept in `skillsDir`, listed in the tool's description.

A skill is `<skillsDir>/<name>.md`, or `<skillsDir>/<name>/SKILL.md` when there is no flat file. Its one-line
description in the catalogue is the front matter's `description:` when the file has one, else its first
heading, else its first non-empty line.

skillsDir is usually inside the workspace, which a cloned repository or a command fills: a skill is read
only when its real path stays inside the skills directory (and that directory inside the workspace), so
`leak.md -> /proc/self/environ` is no skill at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mm_core.tools.args import check_object, get_str
from mm_core.tools.base import Tool, ToolContext, ToolRefusal
from mm_core.tools.text import truncate
from mm_core.tools.workspace import WorkspaceError, open_regular, real_path

DESCRIPTION = (
    "Read a skill: step-by-step instructions for a kind of task. When the task matches one of "
    "these skills, read it before starting and follow it. Skills:"
)
CATALOGUE_LINE = "  {name} — {description}"
UNKNOWN = 'No skill named "{name}". Available skills: {names}'
NO_DESCRIPTION = "(no description)"
CANNOT_READ = "[error: read_skill: cannot read {name}: {reason}]"
MAX_DESCRIPTION = 200
# A skill is a page of instructions: what is read of one is bounded, so that a huge (or sparse) file in a
# workspace's skills directory costs neither the worker's memory nor its time. The catalogue only needs the
# front matter or first lines.
MAX_SKILL_BYTES = 4 * 1024 * 1024
MAX_DESCRIBED_BYTES = 64 * 1024
# What a tree can still raise (a name swapped mid-call, a loop of symlinks): the skill is then not there.
UNFORESEEN = (OSError, MemoryError, RecursionError, ValueError)


def describe(markdown: str) -> str:
    lines = markdown.splitlines()
    body = lines
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is not None:
            for line in lines[1:end]:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "description" and value.strip():
                    return _one_line(value.strip().strip("\"'"))
            body = lines[end + 1 :]
    for line in body:
        if line.strip():
            return _one_line(line.strip().lstrip("#").strip())
    return NO_DESCRIPTION


def _one_line(text: str) -> str:
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


def _within(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _skills_root(skills_dir: Path, workspace: Path | None) -> str | None:
    """The skills directory's real path; None when it sits in the workspace but leads out of it."""
    root = real_path(skills_dir)
    if (
        workspace is not None
        and _within(os.path.abspath(skills_dir), os.path.abspath(workspace))
        and not _within(root, real_path(workspace))
    ):
        return None
    return root


def _skill_path(skills_dir: Path, name: str, workspace: Path | None = None) -> tuple[Path, Path] | None:
    """Skill `name` as (its path, its real path): the flat file, else the nested one, only if it stays inside."""
    root = _skills_root(skills_dir, workspace)
    if root is None or "\x00" in name:
        return None
    for candidate in (skills_dir / f"{name}.md", skills_dir / name / "SKILL.md"):
        try:
            real = real_path(candidate)
        except OSError:  # a loop of symlinks: no skill
            continue
        if _within(real, root) and real != root and os.path.isfile(real):
            return candidate, Path(real)
    return None


def _anchor(skills_dir: Path, workspace: Path | None) -> Path:
    """Where a skill file is opened from, walking down without following links: the workspace when the skills
    directory is in it (a command can swap a directory inside the workspace for a link out between the check and
    the open; it cannot swap the workspace itself), else the skills directory (the operator's)."""
    if workspace is not None and _within(os.path.abspath(skills_dir), os.path.abspath(workspace)):
        return workspace
    return skills_dir


def _read(anchor: Path, real: Path, limit: int = MAX_SKILL_BYTES) -> str:
    """The skill's text (its first `limit` bytes), never through a symlink swapped in since _skill_path, never
    blocking on a pipe."""
    fd, _ = open_regular(anchor, real, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def load_skills(
    skills_dir: str | os.PathLike[str] | None, workspace: Path | None = None
) -> dict[str, tuple[str, Path]]:
    """name → (description, path) for every skill in `skills_dir`; {} when it is unset or missing."""
    if not skills_dir:
        return {}
    root = Path(skills_dir)
    try:
        if not root.is_dir():
            return {}
        names = {p.stem for p in root.glob("*.md")} | {p.parent.name for p in root.glob("*/SKILL.md")}
    except UNFORESEEN:  # the directory changed while it was listed, or cannot be listed
        return {}
    skills = {}
    for name in sorted(names):
        found = _skill_path(root, name, workspace)
        if found is None or name.startswith("."):
            continue
        try:
            skills[name] = (describe(_read(_anchor(root, workspace), found[1], MAX_DESCRIBED_BYTES)), found[0])
        except (*UNFORESEEN, WorkspaceError):
            continue
    return skills


class ReadSkillTool(Tool):
    name = "read_skill"
    counter = "skills"
    emoji = "📖"

    def __init__(self, skills_dir: str | os.PathLike[str], workspace: Path | None = None):
        # With the workspace, a skills directory inside it that leads out of it lists nothing.
        self.skills_dir = Path(skills_dir)
        self.skills = load_skills(skills_dir, workspace)

    def schema(self) -> dict[str, Any]:
        catalogue = "\n".join(CATALOGUE_LINE.format(name=n, description=d) for n, (d, _) in sorted(self.skills.items()))
        return {
            "name": self.name,
            "description": f"{DESCRIPTION}\n{catalogue}",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "Skill name, exactly as listed in the tool description."}
                },
                "required": ["name"],
            },
        }

    def title(self, args: dict[str, Any]) -> str:
        return f"read_skill: {args.get('name', '') if isinstance(args, dict) else ''}"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            return self._run(args, ctx)
        except UNFORESEEN as e:
            name = args.get("name") if isinstance(args, dict) else None
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            return CANNOT_READ.format(name=name if isinstance(name, str) else "", reason=reason)

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            given = get_str(check_object(args, self.name), self.name, "name")
        except ToolRefusal as e:
            return e.text
        # Only the base name counts: `../../etc/passwd` is the skill `passwd`, looked up in skillsDir.
        name = os.path.basename(given.strip().rstrip("/")).removesuffix(".md")
        found = _skill_path(self.skills_dir, name, ctx.workspace) if name and not name.startswith(".") else None
        if found is None:
            names = ", ".join(sorted(load_skills(self.skills_dir, ctx.workspace)))
            return UNKNOWN.format(name=given, names=names)
        try:
            text = _read(_anchor(self.skills_dir, ctx.workspace), found[1])
        except (*UNFORESEEN, WorkspaceError) as e:
            return CANNOT_READ.format(name=name, reason=getattr(e, "strerror", None) or getattr(e, "text", e))
        return truncate(text, ctx.config.maxOutput)
