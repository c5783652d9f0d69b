"""fetch_content: a web page as Markdown (the reference's `internal/webmd`), behind an SSRF guard."""

from mm_core.tools.fetch.http import Limits
from mm_core.tools.fetch.tool import FetchContentTool

__all__ = ["FetchContentTool", "Limits"]
