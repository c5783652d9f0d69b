"""read_skill: the catalogue in the description, flat and nested skills, unknown names, base-name safety."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mm_core.tools.skills import ReadSkillTool, load_skills
from tool_helpers import call, make_ctx


@pytest.fixture
def skills(tmp_path: Path) -> Path:
    d = tmp_path / "skills"
    d.mkdir()
    (d / "release.md").write_text(
        '---\nname: release\ndescription: "Cut a release: tag, changelog"\n---\n# Release\nsteps\n'
    )
    (d / "go-tests").mkdir()
    (d / "go-tests" / "SKILL.md").write_text("# Run Go tests with the race detector\n\nbody\n")
    (d / "both").mkdir()
    (d / "both" / "SKILL.md").write_text("nested one\n")
    (d / "both.md").write_text("\n\nflat one wins\n")
    (d / "notes.txt").write_text("not a skill")
    (tmp_path / "secret.md").write_text("outside the skills dir")
    return d


def test_catalogue_sorted_with_descriptions(skills):
    tool = ReadSkillTool(skills)
    assert tool.schema()["description"] == (
        "Read a skill: step-by-step instructions for a kind of task. When the task matches one of these skills, "
        "read it before starting and follow it. Skills:\n"
        "  both — flat one wins\n"
        "  go-tests — Run Go tests with the race detector\n"
        "  release — Cut a release: tag, changelog"
    )
    assert tool.schema()["parameters"]["required"] == ["name"]


def test_reads_flat_file_first_then_nested_skill(skills, tmp_path):
    tool, ctx = ReadSkillTool(skills), make_ctx(tmp_path)
    assert call(tool, {"name": "both"}, ctx) == "\n\nflat one wins\n"
    assert call(tool, {"name": "go-tests"}, ctx) == "# Run Go tests with the race detector\n\nbody\n"


def test_unknown_name_lists_the_skills(skills, tmp_path):
    assert call(ReadSkillTool(skills), {"name": "x"}, make_ctx(tmp_path)) == (
        'No skill named "x". Available skills: both, go-tests, release'
    )


@pytest.mark.parametrize("name", ["../secret", "../secret.md", "/etc/passwd", "..", "."])
def test_only_the_base_name_is_used(skills, tmp_path, name):
    out = call(ReadSkillTool(skills), {"name": name}, make_ctx(tmp_path))
    assert out == f'No skill named "{name}". Available skills: both, go-tests, release'


def test_a_path_to_a_real_skill_reads_that_skill(skills, tmp_path):
    answer = call(ReadSkillTool(skills), {"name": "../../x/release.md"}, make_ctx(tmp_path))
    assert answer.startswith("---\nname: release")


def test_truncated_to_max_output(skills, tmp_path):
    (skills / "long.md").write_text("y" * 300)
    out = call(ReadSkillTool(skills), {"name": "long"}, make_ctx(tmp_path, maxOutput=100))
    assert out == "y" * 100 + "\n[... output truncated: 200 more characters not shown ...]"


def test_load_skills_only_when_there_are_some(tmp_path, skills):
    assert load_skills(None) == {} and load_skills(tmp_path / "missing") == {}
    (tmp_path / "empty").mkdir()
    assert load_skills(tmp_path / "empty") == {}
    assert sorted(load_skills(skills)) == ["both", "go-tests", "release"]
    assert load_skills(skills)["both"][1] == skills / "both.md"


def test_display_and_counter(skills, tmp_path):
    tool = ReadSkillTool(skills)
    assert (tool.title({"name": "release"}), tool.emoji, tool.counter) == ("read_skill: release", "📖", "skills")
    assert not tool.needs_approval({"name": "release"})
    assert call(tool, {"name": 3}, make_ctx(tmp_path)) == '[error: read_skill: "name" must be a string, got 3]'


def test_a_skill_that_is_a_symlink_out_of_the_skills_dir_is_not_read(skills, tmp_path):
    # skillsDir lives in the workspace, which a cloned repository or a command fills: `leak.md -> /etc/passwd`
    # must not put the worker's files into the tool's description or its answers.
    (skills / "leak.md").symlink_to("/etc/passwd")
    (skills / "away").symlink_to(tmp_path)
    (tmp_path / "SKILL.md").write_text("outside\n")
    (skills / "alias.md").symlink_to("release.md")
    assert sorted(load_skills(skills)) == ["alias", "both", "go-tests", "release"]
    tool = ReadSkillTool(skills)
    assert "root:" not in tool.schema()["description"]
    for name in ("leak", "away"):
        assert call(tool, {"name": name}, make_ctx(tmp_path)) == (
            f'No skill named "{name}". Available skills: alias, both, go-tests, release'
        )
    assert call(tool, {"name": "alias"}, make_ctx(tmp_path)).startswith("---\nname: release")


def test_a_skills_dir_in_the_workspace_that_leads_out_of_it_is_not_read(tmp_path):
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.md").write_text("secret\n")
    (ws / "skills").symlink_to(outside)
    assert load_skills(ws / "skills", ws) == {}
    tool = ReadSkillTool(ws / "skills", ws)
    assert "secret" not in tool.schema()["description"]
    assert call(tool, {"name": "secret"}, make_ctx(ws)) == 'No skill named "secret". Available skills: '
    # Configured outside the workspace (an absolute skillsDir shared by every team), it is the operator's.
    assert sorted(load_skills(outside, ws)) == ["secret"]


def test_a_named_pipe_is_not_a_skill(skills, tmp_path):
    os.mkfifo(skills / "pipe.md")
    assert call(ReadSkillTool(skills), {"name": "pipe"}, make_ctx(tmp_path)) == (
        'No skill named "pipe". Available skills: both, go-tests, release'
    )


@pytest.mark.parametrize("name", ["x" * 5000, "a\x00b"])
def test_hostile_names_are_unknown_skills(skills, tmp_path, name):
    assert call(ReadSkillTool(skills), {"name": name}, make_ctx(tmp_path)) == (
        f'No skill named "{name}". Available skills: both, go-tests, release'
    )
