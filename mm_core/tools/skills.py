"""read_skill: markdown instructions kept in `skillsDir`, listed in the tool's description.

A skill is `<skillsDir>/<name>.md`, or `<skillsDir>/<name>/SKILL.md` when there is no flat file. Its one-line
description in the catalogue is the front matter's `description:` when the file has one, else its first
heading, else its first non-empty line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mm_core.tools.args import BadArgument, check_object, get_str
from mm_core.tools.base import Tool, ToolContext
from mm_core.tools.text import truncate

DESCRIPTION = ("Read a skill: step-by-step instructions for a kind of task. When the task matches one of "
               "these skills, read it before starting and follow it. Skills:")
CATALOGUE_LINE = "  {name} — {description}"
UNKNOWN = 'No skill named "{name}". Available skills: {names}'
NO_DESCRIPTION = "(no description)"
CANNOT_READ = "[error: read_skill: cannot read {name}: {reason}]"
MAX_DESCRIPTION = 200


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


def _skill_path(skills_dir: Path, name: str) -> Path | None:
    flat = skills_dir / f"{name}.md"
    if flat.is_file():
        return flat
    nested = skills_dir / name / "SKILL.md"
    return nested if nested.is_file() else None


def load_skills(skills_dir: str | os.PathLike[str] | None) -> dict[str, tuple[str, Path]]:
    """name → (description, path) for every skill in `skills_dir`; {} when it is unset or missing."""
    if not skills_dir:
        return {}
    root = Path(skills_dir)
    if not root.is_dir():
        return {}
    names = {p.stem for p in root.glob("*.md") if p.is_file()} | {p.parent.name for p in root.glob("*/SKILL.md")}
    skills = {}
    for name in sorted(names):
        path = _skill_path(root, name)
        if path is None or name.startswith("."):
            continue
        try:
            skills[name] = (describe(path.read_text(encoding="utf-8", errors="replace")), path)
        except OSError:
            continue
    return skills


class ReadSkillTool(Tool):
    name = "read_skill"
    counter = "skills"
    emoji = "📖"

    def __init__(self, skills_dir: str | os.PathLike[str]):
        self.skills_dir = Path(skills_dir)
        self.skills = load_skills(skills_dir)

    def schema(self) -> dict[str, Any]:
        catalogue = "\n".join(CATALOGUE_LINE.format(name=n, description=d) for n, (d, _) in sorted(self.skills.items()))
        return {
            "name": self.name,
            "description": f"{DESCRIPTION}\n{catalogue}",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string",
                                        "description": "Skill name, exactly as listed in the tool description."}},
                "required": ["name"],
            },
        }

    def title(self, args: dict[str, Any]) -> str:
        return f"read_skill: {args.get('name', '') if isinstance(args, dict) else ''}"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            given = get_str(check_object(args, self.name), self.name, "name")
        except BadArgument as e:
            return e.text
        # Only the base name counts: `../../etc/passwd` is the skill `passwd`, looked up in skillsDir.
        name = os.path.basename(given.strip().rstrip("/")).removesuffix(".md")
        path = _skill_path(self.skills_dir, name) if name and not name.startswith(".") else None
        if path is None:
            names = ", ".join(sorted(load_skills(self.skills_dir)))
            return UNKNOWN.format(name=given, names=names)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            return CANNOT_READ.format(name=name, reason=e.strerror or e)
        return truncate(text, ctx.config.maxOutput)
