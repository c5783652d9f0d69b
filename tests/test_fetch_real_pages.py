"""Real pages written by others (Python, SQLite and MkDocs documentation from Debian packages, see
fixtures/fetch/README.md): each converted byte for byte to its reviewed Markdown, with focused checks on what a
reviewer looks at first, and one page served over loopback through the real tool."""

from __future__ import annotations

import asyncio
import re
from functools import cache
from pathlib import Path

import pytest

from fetch_site import Site
from mm_core.config import AgentConfig, NetworkConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.fetch import FetchContentTool, encoding
from mm_core.tools.fetch.webmd import Options, to_markdown

REAL = Path(__file__).parent / "fixtures" / "fetch" / "real"
# The base each page would have on its public site, so relative links resolve the same in every run.
BASES = {
    "python_json": "https://docs.python.org/3.11/library/json.html",
    "python_tutorial_controlflow": "https://docs.python.org/3.11/tutorial/controlflow.html",
    "python_whatsnew_3_11": "https://docs.python.org/3.11/whatsnew/3.11.html",
    "sqlite_news": "https://www.sqlite.org/news.html",
    "sqlite_lang_select": "https://www.sqlite.org/lang_select.html",
    "mkdocs_writing_your_docs": "https://www.mkdocs.org/user-guide/writing-your-docs.html",
}


@cache  # the 1.5 MB page takes about a second; convert each page once per run
def converted(name: str) -> str:
    html = encoding.decode((REAL / f"{name}.html").read_bytes(), None)
    return to_markdown(html, Options(BASES[name]))


def expected(name: str) -> str:
    return (REAL / f"{name}.md").read_bytes().decode("utf-8")


def test_every_fixture_page_is_listed() -> None:
    assert {p.stem for p in REAL.glob("*.html")} == set(BASES) == {p.stem for p in REAL.glob("*.md")}


@pytest.mark.parametrize("name", sorted(BASES))
def test_real_page_converts_to_the_reviewed_markdown(name: str) -> None:
    markdown = converted(name)
    assert markdown == expected(name)
    assert markdown.endswith("\n") and not markdown.endswith("\n\n")
    assert "\n\n\n" not in markdown and not re.search(r"[ \t]$", markdown, re.M)


def absent(markdown: str, *texts: str) -> None:
    found = [t for t in texts if t in markdown]
    assert not found, f"page furniture left in the Markdown: {found}"


def test_python_reference_page() -> None:
    md = converted("python_json")
    # the related bars, the sphinxsidebar, the mobile menu and the theme selector are gone
    absent(
        md,
        "Quick search",
        "Previous topic",
        "Table of Contents",
        "Report a Bug",
        "Show Source",
        "Theme",
        "Navigation",
        "modules |",
        "python logo",
    )
    assert md.startswith(
        "# [`json`](https://docs.python.org/3.11/library/json.html#module-json) — JSON encoder "
        "and decoder[¶](https://docs.python.org/3.11/library/json.html#module-json)\n\n"
    )
    # Sphinx puts the language on a wrapping div, not on the pre: no info string by the rules
    assert (
        "Compact encoding:\n\n```\n>>> import json\n>>> json.dumps([1, 2, 3, {'4': 5, '6': 7}], "
        "separators=(',', ':'))\n'[1,2,3,{\"4\":5,\"6\":7}]'\n```\n"
    ) in md
    assert "| JSON | Python |\n| --- | --- |\n| object | dict |\n| array | list |\n" in md
    assert "| int, float, int- & float-derived Enums | number |\n" in md  # cells made of a <p> each
    assert "[`marshal`](https://docs.python.org/3.11/library/marshal.html#module-marshal)" in md  # ../ resolved
    assert "*skipkeys=False*, *ensure_ascii=True*" in md  # an underscore inside a word stays as it is
    assert "*\\**, " in md and "*\\*\\*kw*)" in md  # a literal star in emphasis is escaped
    assert "[Lib/json/\\_\\_init\\_\\_.py](https://github.com/python/cpython/tree/3.11/Lib/json/__init__.py)" in md
    assert "\n\\--sort-keys[¶]" in md  # a line starting with - would be a list item
    assert "the errata for RFC 7159" not in md  # the footnote is an <aside>


def test_python_tutorial_page() -> None:
    md = converted("python_tutorial_controlflow")
    absent(md, "Quick search", "Previous topic", "Next topic", "Show Source")
    assert "\n#### 4.8.3.1. Positional-or-Keyword Arguments[¶](" in md
    # blank lines inside a code block survive
    assert (
        "```\n# Create a sample collection\nusers = {'Hans': 'active', 'Éléonore': 'inactive', '景太郎': "
        "'active'}\n\n# Strategy:  Iterate over a copy\n"
    ) in md
    # a list item holding two paragraphs: the second indented by the marker's width
    assert (
        "- Use 4-space indentation, and no tabs.\n\n  4 spaces are a good compromise between small indentation"
    ) in md
    assert "`lowercase_with_underscores`" in md


def test_python_whats_new_article() -> None:
    md = converted("python_whatsnew_3_11")
    absent(md, "Quick search", "Previous topic", "Report a Bug")
    assert md.startswith(
        "# What\u2019s New In Python 3.11[¶](https://docs.python.org/3.11/whatsnew/3.11.html"
        "#what-s-new-in-python-3-11)\n\nRelease:\n\n3\\.11.2\n\n"
    )  # `N.` at a line start
    assert "  ```\n  >>> from functools import singledispatch\n  >>> @singledispatch\n" in md  # fence in an item
    assert (
        "- The following have been deprecated in [`configparser`](https://docs.python.org/3.11/library/"
        "configparser.html#module-configparser) since Python 3.2."
    ) in md
    assert "\n  - the `configparser.SafeConfigParser` class\n  - the `configparser.ParsingError.filename`" in md
    # two <p> in one cell become a <br>; a table in a blockquote in a list item keeps both prefixes
    assert (
        "| `BINARY_*`<br>`INPLACE_*` | [`BINARY_OP`](https://docs.python.org/3.11/library/dis.html"
        "#opcode-BINARY_OP) | Replaced all numeric binary/in-place opcodes with a single opcode |"
    ) in md
    assert "\n  > | Deprecated alias | Method Name | Deprecated in |\n  > | --- | --- | --- |\n" in md
    assert "| Operation | Form | Specialization | Operation speedup (up to) | Contributor(s) |\n" in md


def test_sqlite_news_page() -> None:
    md = converted("sqlite_news")
    absent(md, "Purchase", "Search Documentation", "Search Changelog", "toggle_div", "Menu")
    assert md.startswith(
        "[![SQLite](https://www.sqlite.org/images/sqlite370_banner.gif)]"
        "(https://www.sqlite.org/index.html)\n\nSmall. Fast. Reliable.\\\nChoose any three.\n\n"
        "## Recent News\n\n### 2022-12-28 - [Version 3.40.1](https://www.sqlite.org/releaselog/"
        "3_40_1.html)\n\n> Version 3.40.1 is a patch release"
    )
    assert (
        "\n>\n> 1. Official support for compiling [SQLite to WASM](https://sqlite.org/wasm/doc/trunk/"
        "index.md) and running it in a web browser.\n> 2. New and improved"
    ) in md
    assert "\n>\n> ![](https://www.sqlite.org/images/sschart20221116.jpg)\n\n---\n\n### 2022-09-29" in md
    assert md.endswith(
        "[Old news...](https://www.sqlite.org/oldnews.html)\n\n*This page last modified on "
        "[2022-12-27 17:04:09](https://sqlite.org/docsrc/honeypot) UTC*\n"
    )


def test_sqlite_large_page() -> None:
    html_size = (REAL / "sqlite_lang_select.html").stat().st_size
    md = converted("sqlite_lang_select")
    assert html_size > 1_000_000 and len(md) < html_size // 20  # 135 inline SVG syntax diagrams dropped
    absent(md, "PRECEDING", "FOLLOWING", "hideorshow", "Search Documentation")
    assert not re.search(r"^(hide|show)$", md, re.M)  # the diagrams' buttons
    assert "\n# 1. Overview\n\n**[select-stmt:](https://www.sqlite.org/syntax/select-stmt.html)**\n" in md
    assert "\n> ```\n> SELECT a, b, sum(c) FROM tab1 GROUP BY a;\n> ```\n" in md  # a pre in a blockquote
    assert "\n1. [FROM clause](https://www.sqlite.org/lang_select.html#fromclause) processing:" in md
    assert 'expression is the special expression "\\*" then all columns' in md


def test_mkdocs_page() -> None:
    md = converted("mkdocs_writing_your_docs")
    # the navbar, the table-of-contents sidebar, both modals (with the shortcut table) and the footer
    absent(
        md,
        "Keyboard Shortcuts",
        "Open this help",
        "Edit on GitHub",
        "Documentation built with",
        "Previous",
        "Next",
        "Table of Contents",
        "Getting Started",
        "Search",
    )
    assert md.startswith(
        "# Writing your docs[\uf0c1](https://www.mkdocs.org/user-guide/writing-your-docs.html"
        "#writing-your-docs)\n\nHow to layout and write your Markdown source files.\n\n---\n\n"
    )
    assert "```yaml\nnav:\n    - 'index.md'\n    - 'about.md'\n```" in md  # info string from language-yaml
    assert "````markdown\n```\nFenced code blocks are like Standard\n" in md  # fence longer than the one inside
    assert "backtick (`` ` ``) characters" in md
    assert "[documentation directory](https://www.mkdocs.org/user-guide/configuration.html#docs_dir)" in md
    assert (
        "  MkDocs will attempt to determine the title of a document in the following ways, in order:\n"
        "  1. A title defined in the [nav](https://www.mkdocs.org/user-guide/configuration.html#nav)"
    ) in md
    assert "- **`permalink`**\n\n  Generate permanent links" in md


def test_real_page_through_the_tool_over_loopback(tmp_path: Path) -> None:
    """The page as a server sends it: no charset in the header, so its <meta charset> decides (a wrong guess
    would garble the page's em dashes and pilcrows)."""
    name = "python_json"
    body = (REAL / f"{name}.html").read_bytes()

    async def scenario() -> tuple[str, dict[str, int]]:
        async with Site("127.0.0.1") as site:
            url = site.page("/3.11/library/json.html", body, content_type="text/html")
            tool = FetchContentTool(
                AgentConfig(fetchAllow=["127.0.0.1"], network=NetworkConfig(policy="open"), maxOutput=1_000_000)
            )
            result = await tool.run(
                {"url": url, "baseUrl": BASES[name]}, ToolContext(workspace=tmp_path, config=tool.config)
            )
            return result, site.hits

    result, hits = asyncio.run(scenario())
    assert len(expected(name)) < 1_000_000  # not truncated
    assert result == expected(name)
    assert hits == {"/robots.txt": 1, "/3.11/library/json.html": 1}
