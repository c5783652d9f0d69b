"""Which tools a turn declares, by the reference's rules."""

from __future__ import annotations

import sys
from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.tools import build_tools

PYLSP = str(Path(sys.executable).with_name("pylsp"))


def names(config: dict, workspace: Path) -> tuple[list[str], list[str]]:
    tools, warnings = build_tools(AgentConfig.model_validate(config), workspace)
    return [t.name for t in tools], warnings


def test_defaults_declare_bash_and_the_file_tools(tmp_path):
    assert names({}, tmp_path) == (["bash", "read_file", "write_file", "edit_file"], [])


def test_switches_turn_tools_off(tmp_path):
    assert names({"bashTool": False, "editTools": False}, tmp_path) == ([], [])


def test_read_skill_only_when_a_skill_exists(tmp_path):
    (tmp_path / "skills").mkdir()
    assert "read_skill" not in names({"skillsDir": "skills"}, tmp_path)[0]
    (tmp_path / "skills" / "go.md").write_text("---\ndescription: Go conventions\n---\n# Go\n")
    assert "read_skill" in names({"skillsDir": "skills"}, tmp_path)[0]


def test_lsp_only_when_a_server_is_found(tmp_path):
    missing = {"lsp": {"servers": {"gopls": {"command": "gopls-not-installed", "extensions": [".go"]}}}}
    tools, warnings = names(missing, tmp_path)
    assert "lsp" not in tools
    assert warnings == [
        "[warning: lsp server gopls (gopls-not-installed) not found on the PATH — skipped]",
        "[warning: no language server found — the lsp tool is not declared]",
    ]
    found = {
        "lsp": {
            "servers": {
                "gopls": {"command": "gopls-not-installed", "extensions": [".go"]},
                "pylsp": {"command": PYLSP, "extensions": [".py"]},
            }
        }
    }
    tools, warnings = names(found, tmp_path)
    assert "lsp" in tools
    assert warnings == ["[warning: lsp server gopls (gopls-not-installed) not found on the PATH — skipped]"]


def test_fetch_content_and_ask_agent_by_config(tmp_path):
    assert "fetch_content" in names({"fetchContentTool": True}, tmp_path)[0]
    assert "fetch_content" not in names({}, tmp_path)[0]
    refs = {"mmConfigs": {"reviewer": {"config": "agents/reviewer.yaml", "description": "reviews"}}}
    assert names(refs, tmp_path)[0][-1] == "ask_agent"
