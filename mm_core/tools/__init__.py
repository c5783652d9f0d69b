"""The tool registry: which tools a turn declares, by the reference's rules.

- bash when `bashTool`; read_file, write_file, edit_file when `editTools`;
- read_skill only when `skillsDir` holds at least one skill;
- lsp only when at least one configured server is on the PATH (the others are warned about);
- fetch_content when `fetchContentTool`; ask_agent when `mmConfigs` names agents.
"""

from __future__ import annotations

from pathlib import Path

from mm_core.config import AgentConfig
from mm_core.tools.base import SessionResources, Tool, ToolCancelled, ToolContext

__all__ = ["SessionResources", "Tool", "ToolCancelled", "ToolContext", "build_tools"]


def build_tools(config: AgentConfig, workspace: Path) -> tuple[list[Tool], list[str]]:
    """The tools to declare, and the start-up warnings (servers not found) to show the person."""
    tools: list[Tool] = []
    warnings: list[str] = []
    if config.bashTool:
        from mm_core.tools.bash import BashTool

        tools.append(BashTool(config))
    if config.skillsDir:
        from mm_core.tools.skills import ReadSkillTool, load_skills

        skills_dir = Path(workspace, config.skillsDir)
        if load_skills(skills_dir, workspace):
            tools.append(ReadSkillTool(skills_dir, workspace))
    if config.editTools:
        from mm_core.tools.edit import EditFileTool
        from mm_core.tools.files import ReadFileTool, WriteFileTool

        tools += [ReadFileTool(), WriteFileTool(), EditFileTool()]
    if config.lsp.servers:
        from mm_core.tools.lsp import LspTool, find_servers

        servers, lsp_warnings = find_servers(config)
        warnings += lsp_warnings
        if servers:
            tools.append(LspTool(config, servers))
        else:
            warnings.append("[warning: no language server found — the lsp tool is not declared]")
    if config.fetchContentTool:
        from mm_core.tools.fetch import FetchContentTool

        tools.append(FetchContentTool(config))
    if config.mmConfigs:
        from mm_core.tools.ask_agent import AskAgentTool

        tools.append(AskAgentTool(config))
    return tools, warnings
