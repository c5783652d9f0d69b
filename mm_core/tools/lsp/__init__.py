"""The `lsp` tool: language servers answering a small model's questions about the code."""

from mm_core.tools.lsp.manager import LspManager, running_pids
from mm_core.tools.lsp.tool import LspTool, find_servers

__all__ = ["LspManager", "LspTool", "find_servers", "running_pids"]
