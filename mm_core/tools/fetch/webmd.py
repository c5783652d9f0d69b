"""HTML → Markdown by the reference's rules (its package `internal/webmd`).

The page is parsed by html5lib, which repairs broken HTML the way an HTML5 parser does. Then two walks:
`_clean` removes what is not content and strips attributes in a single pre-order pass (iterative: a page may
nest deeper than Python's recursion limit), and `_Converter` builds the Markdown in a single pass, strings
collected in lists. Below `MAX_DEPTH` levels the converter falls back to a subtree's plain text, which keeps
its own recursion bounded on hostile pages.

Tables are flattened within a budget: spans are clamped to HTML's own limits (1000 columns, 65534 rows, and
never past the table's last row), and every slot of a flattened grid, padding included, is counted while the
grid is built against `FLATTEN_BUDGET` characters per page. A table that would go past it is kept as HTML (as
`tables: html` keeps a spanned one), and so is every later table of that page: a 20 KB page of crossed spans
would otherwise make a grid of gigabytes.

The parser is bounded too: an HTML5 parser re-opens every formatting element a block closed (`<li><b id=1>`,
`<li><b id=2>`, … re-opens all the previous ones in each item), so a 9 KB page made 180 000 elements. More
elements than `len(html) + ELEMENT_SLACK` (one per character of the page) raise PageTooComplex.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast
from urllib.parse import urljoin

from bs4 import BeautifulSoup, Tag
from bs4.builder._html5lib import Element, HTML5TreeBuilder, TreeBuilderForHtml5lib
from bs4.element import NavigableString, PreformattedString

from mm_core.errors import CoreError

MAX_DEPTH = 200
MAX_COLSPAN, MAX_ROWSPAN = 1000, 65534  # HTML's limits
FLATTEN_BUDGET = 8 * 2**20  # characters of flattened tables per page (a slot costs its text plus "| ")
_SLOT = 3
ELEMENT_SLACK = 50_000

BLOCK = frozenset(
    "address article aside blockquote body caption center dd details dialog div dl dt fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 head header hgroup hr html li main menu nav ol p pre search section "
    "summary table tbody td tfoot th thead tr ul".split()
)
_REMOVED_TAGS = frozenset(
    "script style noscript template meta link base title svg canvas iframe object embed nav aside dialog "
    "button select textarea".split()
)
_REMOVED_ROLES = frozenset("navigation banner complementary search contentinfo dialog".split())
# Class/id words of page furniture, with the variants sites use; matched against each word of a class or id
# and against the whole token with its separators removed (`skip-link` → `skiplink`).
_FURNITURE = frozenset(
    "ad ads advert adverts advertisement advertisements advertising adsense adsbygoogle sponsor sponsors "
    "sponsored promo promos promoted promotion cookie cookies cookiebanner consent gdpr newsletter subscribe "
    "subscription popup modal share sharing sharebar social breadcrumb breadcrumbs nav navbar navigation "
    "menu sidebar sphinxsidebar sidenav skiplink skiplinks skipnav skiptocontent".split()
)
_HIDDEN_CLASSES = frozenset(("sr-only", "visually-hidden", "screen-reader-text"))
_CONTENT_HOLDERS = ("main", "article", "h1")
_NEVER_REMOVED = frozenset(("html", "head", "body"))
_WORD_SPLIT = re.compile(r"[-_:.]+")

BR = "\x00"  # a line break inside inline text; html5lib turns a NUL of the page into U+FFFD, so it is free
_WS = re.compile(r"[ \t\n\r\f]+")
_SPACES = re.compile(r" {2,}")
_ESCAPES = str.maketrans({c: "\\" + c for c in "\\*`[]<"})
_UNDERSCORE = re.compile(r"_(?![^\W_])|(?<![^\W_])_")
_LINE_START = re.compile(r"[#>\-+=|]|(\d+)\.")
_BACKTICKS = re.compile(r"`+")
_BLANK_LINES = re.compile(r"\n[ \t]*\n+")
_URL_ESCAPES = str.maketrans({" ": "%20", "(": "%28", ")": "%29", "<": "%3C", ">": "%3E", "\n": "", "\r": "", "\t": ""})


@dataclass(frozen=True)
class Options:
    base_url: str
    tables: str = "html"  # or "flatten"
    strikethrough: bool = False
    task_list: bool = False


class PageTooComplex(CoreError):
    """The page makes more elements once parsed than it has characters."""


class _CountingTreeBuilder(TreeBuilderForHtml5lib):
    budget = 0

    def elementClass(self, name: str, namespace: str) -> Element:
        self.budget -= 1
        if self.budget < 0:
            raise PageTooComplex(
                "makes more elements once parsed than it has characters (formatting tags left "
                "open across blocks, which the HTML5 parser opens again in each)"
            )
        return super().elementClass(name, namespace)


class _Builder(HTML5TreeBuilder):
    """html5lib through bs4, with a budget of elements."""

    def __init__(self, budget: int):
        super().__init__()
        self.budget = budget

    def create_treebuilder(self, namespaceHTMLElements: bool) -> TreeBuilderForHtml5lib:
        builder = _CountingTreeBuilder(namespaceHTMLElements, self.soup, store_line_numbers=self.store_line_numbers)
        builder.budget = self.budget
        self.underlying_builder = builder
        return builder


def to_markdown(html: str, options: Options) -> str:
    """The page's Markdown ending with one newline, or "" when no content is left; PageTooComplex for a page
    the parser would blow up."""
    soup = BeautifulSoup(html, builder=_Builder(len(html) + ELEMENT_SLACK))
    holders = _clean(soup, options.base_url)
    markdown = "\n\n".join(_Converter(options, holders).blocks(soup, 0)).strip("\n")
    return markdown + "\n" if markdown.strip() else ""


# bs4 types a tag's children and descendants as PageElement; in a parsed document each is a Tag or a string.
Node = Tag | NavigableString


def _contents(node: Tag) -> list[Node]:
    return cast("list[Node]", node.contents)


def _descendants(node: Tag) -> Iterator[Node]:
    return cast("Iterator[Node]", node.descendants)


def _text_attr(el: Tag, name: str) -> str | None:
    """A single-valued attribute (href, src, alt): bs4 types every value as a string or a list of them."""
    value = el.attrs.get(name)
    return value if value is None or isinstance(value, str) else " ".join(value)


# --- removals -------------------------------------------------------------------------------------------


def _clean(root: Tag, base: str) -> set[int]:
    """Remove non-content in one walk; return the ids of the elements that hold a block element."""
    order: list[Tag] = []
    stack: list[tuple[Tag, bool]] = [(root, False)]
    while stack:
        node, in_article = stack.pop()
        order.append(node)
        in_article = in_article or node.name in ("article", "main")
        for child in list(_contents(node)):
            if isinstance(child, NavigableString):
                if isinstance(child, PreformattedString):  # comments, doctype, CDATA, processing instructions
                    child.extract()
                continue
            if _is_removed(child, in_article):
                child.extract()
                continue
            _keep_attributes(child, base)
            stack.append((child, in_article))
    holders: set[int] = set()
    for node in reversed(order):  # children come after their parent in `order`
        for child in node.contents:
            if isinstance(child, Tag) and (child.name in BLOCK or id(child) in holders):
                holders.add(id(node))
                break
    return holders


def _is_removed(el: Tag, in_article: bool) -> bool:
    name = el.name
    if name in _REMOVED_TAGS:
        return True
    attrs = el.attrs
    if name == "input":
        return str(attrs.get("type", "")).lower() != "checkbox"
    if name == "footer" and not in_article:
        return True
    if not attrs or name in _NEVER_REMOVED:
        return False
    if "hidden" in attrs or str(attrs.get("aria-hidden", "")).lower() == "true":
        return True
    role = attrs.get("role")
    if role and any(word in _REMOVED_ROLES for word in str(role).lower().split()):
        return True
    classes = attrs.get("class") or []
    if isinstance(classes, str):
        classes = classes.split()
    if any(c.lower() in _HIDDEN_CLASSES for c in classes):
        return True
    tokens = [*classes, *str(attrs.get("id", "")).split()]
    if any(_is_furniture(token) for token in tokens):
        return not (name in _CONTENT_HOLDERS or el.find(_CONTENT_HOLDERS) is not None)
    return False


def _is_furniture(token: str) -> bool:
    words = _WORD_SPLIT.split(token.lower())
    return "".join(words) in _FURNITURE or any(word in _FURNITURE for word in words)


def _resolve(base: str, url: str) -> str:
    url = url.strip()
    if url[:11].lower() == "javascript:" or url[:5].lower() == "data:":
        return url
    try:
        return urljoin(base, url)
    except ValueError:
        return url


def _keep_attributes(el: Tag, base: str) -> None:
    attrs = el.attrs
    if not attrs:
        return
    name, kept = el.name, {}
    if name == "a":
        href = _text_attr(el, "href")
        if href is not None:
            kept["href"] = _resolve(base, href)
    elif name == "img":
        src = _text_attr(el, "src")
        if src is not None:
            kept["src"] = _resolve(base, src)
        if "alt" in attrs:
            kept["alt"] = attrs["alt"]
    elif name in ("td", "th"):
        kept = {k: attrs[k] for k in ("colspan", "rowspan") if k in attrs}
    elif name == "ol":
        if "start" in attrs:
            kept["start"] = attrs["start"]
    elif name == "input":
        kept = {k: attrs[k] for k in ("type", "checked") if k in attrs}
    elif name in ("pre", "code"):
        classes = attrs.get("class") or []
        words = [
            c
            for c in (classes.split() if isinstance(classes, str) else classes)
            if c.startswith(("language-", "lang-"))
        ]
        if words:
            kept["class"] = words
    el.attrs = kept


# --- conversion -----------------------------------------------------------------------------------------


class ListBlock(str):
    """A rendered list: inside a list item it follows the item's text without a blank line."""


def escape(text: str) -> str:
    text = text.translate(_ESCAPES)
    return _UNDERSCORE.sub(r"\\_", text) if "_" in text else text


def _escape_line_start(line: str) -> str:
    m = _LINE_START.match(line)
    if m is None:
        return line
    if m.group(1) is not None:
        return f"{m.group(1)}\\{line[m.end(1) :]}"
    return "\\" + line


def _one_line(text: str) -> str:
    return _SPACES.sub(" ", text.replace(BR, " ")).strip(" ")


def _paragraph(text: str) -> str:
    lines = [line.strip(" ") for line in _SPACES.sub(" ", text).split(BR)]
    while lines and not lines[-1]:
        lines.pop()
    start = 0
    while start < len(lines) and not lines[start]:
        start += 1
    return "\\\n".join(_escape_line_start(line) for line in lines[start:])


def _destination(url: str) -> str:
    return url.strip().translate(_URL_ESCAPES)


def _indent(marker: str, body: str) -> str:
    pad = " " * len(marker)
    first, *rest = body.split("\n")
    return "\n".join([marker + first, *(pad + line if line else "" for line in rest)])


def _join(blocks: list[str], tight: bool = False) -> str:
    parts = [blocks[0]]
    for block in blocks[1:]:
        parts.append("\n" if tight and isinstance(block, ListBlock) else "\n\n")
        parts.append(block)
    return "".join(parts)


def _wrap_spaces(content: str, before: str, after: str) -> str:
    """`before`core`after` with the content's outer spaces and breaks moved outside the markers."""
    core = content.strip(" " + BR)
    if not core:
        return " " if content else ""
    start = content.index(core[0])
    end = start + len(core)
    return f"{content[:start]}{before}{core}{after}{content[end:]}"


def _as_html(table: Tag) -> str:
    return _BLANK_LINES.sub("\n", table.decode()).strip()


def _int(value: object, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(str(value).strip()), low), high)
    except ValueError:
        return default


class _Converter:
    def __init__(self, options: Options, holders: set[int]):
        self.options = options
        self.holders = holders
        self.strong = 0
        self.em = 0
        self.strike = 0
        self.budget = FLATTEN_BUDGET  # characters of flattened tables left for this page

    # Block context: a list of finished Markdown blocks.

    def blocks(self, node: Tag, depth: int) -> list[str]:
        out: list[str] = []
        if depth > MAX_DEPTH:
            self._flush([escape(_WS.sub(" ", node.get_text()))], out)
            return out
        buf: list[str] = []
        for child in _contents(node):
            if isinstance(child, NavigableString):
                buf.append(escape(_WS.sub(" ", child)))
                continue
            name = child.name
            if name in BLOCK or (id(child) in self.holders and name != "a"):
                self._flush(buf, out)
                self._block(child, out, depth + 1)
            else:
                buf.append(self.inline(child, depth + 1))
        self._flush(buf, out)
        return out

    def _flush(self, buf: list[str], out: list[str]) -> None:
        if buf:
            paragraph = _paragraph("".join(buf))
            buf.clear()
            if paragraph:
                out.append(paragraph)

    def _block(self, el: Tag, out: list[str], depth: int) -> None:
        name = el.name
        if name == "p":
            self._flush([self.children(el, depth)], out)
        elif name in ("h1", "h2", "h3", "h4", "h5", "h6"):
            text = _one_line(self.children(el, depth))
            if text:
                out.append("#" * int(name[1]) + " " + text)
        elif name == "pre":
            self._pre(el, out)
        elif name == "blockquote":
            inner = self.blocks(el, depth)
            if inner:
                out.append("\n".join("> " + line if line else ">" for line in _join(inner).split("\n")))
        elif name in ("ul", "ol", "menu"):
            self._list(el, out, depth)
        elif name == "li":
            body = self._item(el, depth)
            if body:
                out.append(ListBlock(_indent("- ", body)))
        elif name == "table":
            self._table(el, out, depth)
        elif name == "hr":
            out.append("---")
        else:  # containers, known or not
            out.extend(self.blocks(el, depth))

    def _pre(self, el: Tag, out: list[str]) -> None:
        parts = [
            str(d) if isinstance(d, NavigableString) else "\n"
            for d in _descendants(el)
            if isinstance(d, NavigableString) or d.name == "br"
        ]
        text = "".join(parts).rstrip("\n")
        if not text.strip():
            return
        lang = ""
        for tag in (el, el.find("code")):
            for word in (tag.attrs.get("class") or []) if tag is not None else []:
                lang = lang or word.split("-", 1)[1]
        longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
        fence = "`" * max(3, longest + 1)
        out.append(f"{fence}{lang}\n{text}\n{fence}")

    def _list(self, el: Tag, out: list[str], depth: int) -> None:
        ordered = el.name == "ol"
        number = _int(el.attrs.get("start", 1), 1, -(10**9), 10**9) if ordered else 0
        items: list[str] = []
        for child in _contents(el):
            if isinstance(child, NavigableString):
                if child.strip():
                    items.append(_indent("- ", escape(_WS.sub(" ", child).strip())))
                continue
            marker = f"{number}. " if ordered else "- "
            if child.name == "li":
                body = self._item(child, depth + 1)
                number += ordered
            else:  # a stray element in the list is shown as its own item
                if child.name in BLOCK:
                    inner = self.blocks(child, depth + 1)
                else:
                    inner = [_paragraph(self.inline(child, depth + 1))]
                inner = [b for b in inner if b]
                body = _join(inner, tight=True) if inner else ""
                marker = "- "
            if body:
                items.append(_indent(marker, body))
        if items:
            out.append(ListBlock("\n".join(items)))

    def _item(self, li: Tag, depth: int) -> str:
        task = self._checkbox(li) if self.options.task_list else None
        blocks = self.blocks(li, depth)
        if task is not None:
            if blocks and not isinstance(blocks[0], ListBlock):
                blocks[0] = task + " " + blocks[0]
            else:
                blocks.insert(0, task)
        return _join(blocks, tight=True) if blocks else ""

    @staticmethod
    def _checkbox(li: Tag) -> str | None:
        """`[ ]` or `[x]` when the item starts with a checkbox."""
        for d in _descendants(li):
            if isinstance(d, NavigableString):
                if d.strip():
                    return None
            elif d.name == "input":
                if str(d.attrs.get("type", "")).lower() != "checkbox":
                    return None
                return "[x]" if "checked" in d.attrs else "[ ]"
            elif d.name in ("img", "br", "hr"):
                return None
        return None

    def _table(self, el: Tag, out: list[str], depth: int) -> None:
        caption, rows = None, []
        for child in el.contents:
            if not isinstance(child, Tag):
                continue
            if child.name == "caption":
                caption = child
            elif child.name == "tr":
                rows.append(child)
            elif child.name in ("thead", "tbody", "tfoot"):
                rows.extend(c for c in child.contents if isinstance(c, Tag) and c.name == "tr")
        cells = [[c for c in tr.contents if isinstance(c, Tag) and c.name in ("td", "th")] for tr in rows]
        spanned = any(
            ("colspan" in c.attrs and str(c.attrs["colspan"]).strip() != "1")
            or ("rowspan" in c.attrs and str(c.attrs["rowspan"]).strip() != "1")
            for row in cells
            for c in row
        )
        if (spanned or el.find("table") is not None) and self.options.tables == "html":
            out.append(_as_html(el))
            return
        lines = self._flattened(cells, depth)
        if lines is None:  # past the page's budget
            out.append(_as_html(el))
            return
        if caption is not None:
            self._flush([self.children(caption, depth)], out)
        if lines:
            out.append("\n".join(lines))

    def _flattened(self, cells: list[list[Tag]], depth: int) -> list[str] | None:
        """The GFM lines of a table ([] when it has no text), or None when they would exceed the budget."""
        grid = self._grid(cells, depth)
        if grid is None:
            return None
        if not any(any(cell for cell in row) for row in grid):
            return []
        width = max(len(row) for row in grid)
        padding = sum(width - len(row) for row in grid) + 2 * width  # the empty slots and the --- line
        if padding * _SLOT > self.budget:
            self.budget = -1
            return None
        self.budget -= padding * _SLOT
        lines = ["| " + " | ".join(row + [""] * (width - len(row))) + " |" for row in grid]
        lines.insert(1, "| " + " | ".join(["---"] * width) + " |")
        return lines

    def _grid(self, rows: list[list[Tag]], depth: int) -> list[list[str]] | None:
        """Cells by row, a spanned cell copied into every slot it covers; None past the budget (which a
        table that does not fit uses up, so that a page's later tables are not flattened either)."""
        grid: list[list[str]] = []
        pending: dict[int, list] = {}  # column → [rows still covered, text]

        def fill(row: list[str]) -> None:
            while len(row) in pending and self.budget >= 0:
                slot = pending[len(row)]
                row.append(slot[1])
                self.budget -= len(slot[1]) + _SLOT
                slot[0] -= 1
                if slot[0] == 0:
                    del pending[len(row) - 1]

        for index, cells in enumerate(rows):
            row: list[str] = []
            for cell in cells:
                fill(row)
                text = self._cell(cell, depth) if self.budget >= 0 else ""
                span = _int(cell.attrs.get("colspan", 1), 1, 1, MAX_COLSPAN)
                down = min(_int(cell.attrs.get("rowspan", 1), 1, 1, MAX_ROWSPAN), len(rows) - index)
                self.budget -= span * (len(text) + _SLOT)
                if self.budget < 0:
                    self.budget = -1
                    return None
                for _ in range(span):
                    if down > 1:
                        pending[len(row)] = [down - 1, text]
                    row.append(text)
            fill(row)
            if self.budget < 0:
                self.budget = -1
                return None
            grid.append(row)
        return grid

    def _cell(self, cell: Tag, depth: int) -> str:
        lines = [line.strip(" ") for line in _SPACES.sub(" ", self.children(cell, depth)).split(BR)]
        return "<br>".join(line for line in lines if line).replace("|", "\\|")

    # Inline context: one string, BR where a line breaks.

    def children(self, node: Tag, depth: int) -> str:
        if depth > MAX_DEPTH:
            return escape(_WS.sub(" ", node.get_text()))
        # A loop, not a generator in join(): three frames a level (inline, _styled, children) keep MAX_DEPTH
        # levels of nested <b> under the recursion limit, where five did not.
        parts: list[str] = []
        for c in _contents(node):
            parts.append(escape(_WS.sub(" ", c)) if isinstance(c, NavigableString) else self.inline(c, depth + 1))
        return "".join(parts)

    def inline(self, el: Tag, depth: int) -> str:
        name = el.name
        if name in ("strong", "b"):
            return self._styled(el, depth, "strong", "**")
        if name in ("em", "i"):
            return self._styled(el, depth, "em", "*")
        if name in ("del", "s", "strike"):
            if self.options.strikethrough:
                return self._styled(el, depth, "strike", "~~")
            return self.children(el, depth)
        if name in ("code", "kbd", "samp", "tt"):
            return self._code(el)
        if name == "a":
            return self._link(el, depth)
        if name == "img":
            return self._image(el)
        if name == "br":
            return BR
        if name == "input":
            return ""  # a checkbox; a task list item's is rendered by the item
        if name == "pre":
            return BR + self._code(el) + BR
        if name in BLOCK:  # a block inside inline text (a heading, a cell, a link): its own line
            return BR + self.children(el, depth) + BR
        return self.children(el, depth)

    def _styled(self, el: Tag, depth: int, kind: str, marker: str) -> str:
        level = getattr(self, kind)
        setattr(self, kind, level + 1)
        try:
            content = self.children(el, depth)
        finally:
            setattr(self, kind, level)
        if level:  # already inside the same style
            return content
        return _wrap_spaces(content, marker, marker)

    @staticmethod
    def _code(el: Tag) -> str:
        text = _WS.sub(" ", el.get_text())
        if not text.strip(" "):
            return " " if text else ""
        longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
        fence = "`" * (longest + 1)
        if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " "):
            text = f" {text} "
        return fence + text + fence

    def _link(self, el: Tag, depth: int) -> str:
        content = self.children(el, depth).replace(BR, " ")
        href = _text_attr(el, "href")
        if href is None or href.strip()[:11].lower() == "javascript:":
            return content
        if not content.strip(" "):
            return f"[{escape(href.strip())}]({_destination(href)})" if href.strip() else content
        return _wrap_spaces(content, "[", f"]({_destination(href)})")

    @staticmethod
    def _image(el: Tag) -> str:
        alt = escape(_WS.sub(" ", _text_attr(el, "alt") or "").strip())
        src = (_text_attr(el, "src") or "").strip()
        if not src or src[:5].lower() == "data:":
            return alt
        return f"![{alt}]({_destination(src)})"
