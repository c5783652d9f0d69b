"""fetch_content against hostile pages (issue 9): the work a page makes is bounded, and every failure is a text.

The two bombs run in a child process under an address-space limit, and the child reports how much its peak
resident memory grew while the tool ran: a memory ceiling is a correctness bound. Before the fix the child
died of MemoryError (a 230-byte `gzip, gzip, gzip` body inflated whole to 1 GiB; a 20 KB table flattened to
gigabytes) instead of eating the machine. Everything is served on loopback by tests/fetch_site.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fetch_site import Route, Site, compress, encoding_bomb, span_bomb
from mm_core.config import AgentConfig, NetworkConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.fetch import FetchContentTool, Limits
from mm_core.tools.fetch import tool as tool_module
from mm_core.tools.fetch.http import MAX_ENCODINGS
from mm_core.tools.fetch.webmd import FLATTEN_BUDGET, Options, to_markdown

ROOT = Path(__file__).resolve().parent.parent
ALLOW = ["127.0.0.1/32"]
CEILING_MIB = 200  # peak memory growth allowed for a hostile page; the limit on a page is 5 MiB
HEADROOM = 768 * 2**20  # the child's address space beyond what it holds when the tool starts
PAGE = b"<!doctype html><h1>Title</h1><p>Body text.</p>"


def make(tmp_path: Path, limits: Limits = Limits()) -> tuple[FetchContentTool, ToolContext]:
    tool = FetchContentTool(AgentConfig(fetchAllow=ALLOW, network=NetworkConfig(policy="open")), limits)
    return tool, ToolContext(workspace=tmp_path, config=tool.config)


def encoded(body: bytes, codings: str) -> Route:
    return Route(body, headers={"Content-Type": "text/html; charset=utf-8", "Content-Encoding": codings})


# --- the child: one hostile page, its answer and the memory it took -----------------------------------------


def _hostile(case: str) -> tuple[dict[str, Route], dict[str, object]]:
    """The routes and the tool's arguments of a case (the page at /p)."""
    if case == "encoding":
        return {"/p": encoded(encoding_bomb(("gzip", "gzip", "gzip")), "gzip, gzip, gzip")}, {}
    if case == "mixed":
        return {"/p": encoded(encoding_bomb(("deflate", "gzip", "deflate")), "deflate, gzip, deflate")}, {}
    if case == "robots":  # the bomb as robots.txt, then an ordinary page
        return {"/robots.txt": encoded(encoding_bomb(), "gzip, gzip, gzip"), "/p": Route(PAGE)}, {}
    if case == "spans":
        return {"/p": Route(span_bomb(20_000).encode())}, {"tables": "flatten"}
    raise AssertionError(case)


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


async def _child_run(case: str) -> dict[str, str | int | float]:
    routes, args = _hostile(case)
    tool = FetchContentTool(AgentConfig(fetchAllow=ALLOW, network=NetworkConfig(policy="open")))
    async with Site() as warm_up:  # another origin: lazy imports and the worker thread, before measuring
        warm_up.routes["/p"] = Route(PAGE)
        await tool.run({"url": warm_up.url("/p")}, ToolContext(workspace=Path.cwd(), config=tool.config))
    async with Site() as site:
        site.routes.update(routes)
        ctx = ToolContext(workspace=Path.cwd(), config=tool.config)
        limit = _vm_size() + HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = await tool.run({"url": site.url("/p"), **args}, ctx)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "out": out[:400],
        "chars": len(out),
        "page_bytes": len(routes["/p"].body),
        "grown_mib": (after - before) / 1024,
    }


def run_child(case: str, tmp_path: Path) -> dict[str, str | int | float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "MALLOC_ARENA_MAX": "1"}
    proc = subprocess.run(
        [sys.executable, __file__, case], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.process
@pytest.mark.parametrize("case", ["encoding", "mixed"])
def test_stacked_encoding_bomb_is_refused_within_bounded_memory(case: str, tmp_path: Path) -> None:
    result = run_child(case, tmp_path)
    assert int(result["page_bytes"]) < 2048  # three layers of a GiB of zeros
    assert str(result["out"]).startswith("[fetch_content: error 1 (conversion) — ")
    assert "is larger than 5.0 MiB — pages above that are refused" in str(result["out"])
    assert float(result["grown_mib"]) < CEILING_MIB, result


@pytest.mark.process
def test_robots_txt_bomb_is_read_within_bounded_memory(tmp_path: Path) -> None:
    result = run_child("robots", tmp_path)
    assert result["out"] == "# Title\n\nBody text.\n"  # 512 KiB of NUL bytes say nothing: all is allowed
    assert float(result["grown_mib"]) < CEILING_MIB, result


@pytest.mark.process
def test_span_bomb_flattened_within_bounded_memory(tmp_path: Path) -> None:
    result = run_child("spans", tmp_path)
    out = str(result["out"])
    assert out.startswith('<table><tbody><tr><td colspan="1000" rowspan="65534">x</td></tr>'), out
    assert float(result["grown_mib"]) < CEILING_MIB, result


# --- Content-Encoding: decoded layer by layer, bounded, refused with a text ---------------------------------


def fetch(tmp_path: Path, routes: dict[str, Route], limits: Limits = Limits(), **args: object) -> str:
    async def scenario() -> str:
        async with Site() as site:
            site.routes.update(routes)
            tool, ctx = make(tmp_path, limits)
            return await tool.run({"url": site.url("/p"), **args}, ctx)

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    "codings", ["gzip", "deflate", "x-gzip", "gzip, deflate", "deflate, gzip, gzip", "identity, gzip", "gzip, utf-8"]
)
def test_stacked_encodings_are_decoded(codings: str, tmp_path: Path) -> None:
    body = PAGE
    for coding in codings.split(","):
        coding = coding.strip()
        if coding in ("gzip", "x-gzip", "deflate"):
            body = compress("gzip" if coding == "x-gzip" else coding, body)
    assert fetch(tmp_path, {"/p": encoded(body, codings)}) == "# Title\n\nBody text.\n"


def test_raw_deflate_without_zlib_header_is_decoded(tmp_path: Path) -> None:
    import zlib

    raw = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = raw.compress(PAGE) + raw.flush()
    assert fetch(tmp_path, {"/p": encoded(body, "deflate")}) == "# Title\n\nBody text.\n"


def test_page_just_under_the_limit_through_three_layers(tmp_path: Path) -> None:
    html = b"<p>" + b"x" * 4000 + b"</p>"
    body = compress("gzip", compress("deflate", compress("gzip", html)))
    out = fetch(tmp_path, {"/p": encoded(body, "gzip, deflate, gzip")}, Limits(max_bytes=len(html)))
    assert out == "x" * 4000 + "\n"
    small = fetch(tmp_path, {"/p": encoded(body, "gzip, deflate, gzip")}, Limits(max_bytes=len(html) - 1))
    assert small.startswith("[fetch_content: error 1 (conversion) — ") and "is larger than" in small


def test_more_stacked_encodings_than_allowed_are_refused(tmp_path: Path) -> None:
    codings = ["gzip"] * (MAX_ENCODINGS + 1)
    body = PAGE
    for coding in codings:
        body = compress(coding, body)
    out = fetch(tmp_path, {"/p": encoded(body, ", ".join(codings))})
    assert out.startswith("[fetch_content: error 1 (conversion) — ") and out.endswith(
        f"is compressed {MAX_ENCODINGS + 1} times over (gzip, gzip, gzip, gzip) — more than {MAX_ENCODINGS} "
        "stacked Content-Encodings are refused]"
    )


@pytest.mark.parametrize(
    ("codings", "body", "reason"),
    [
        ("br", b"\x1b\x00\x00", "is compressed with br, which is not decoded: only gzip and deflate are]"),
        ("gzip", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff\xff\xff", "cannot be decoded: its gzip data is corrupt ("),
        ("deflate", b"\xff\xfe\xfd\xfc", "cannot be decoded: its deflate data is corrupt ("),
    ],
)
def test_undecodable_bodies_are_a_text(codings: str, body: bytes, reason: str, tmp_path: Path) -> None:
    out = fetch(tmp_path, {"/p": encoded(body, codings)})
    assert out.startswith("[fetch_content: error 1 (conversion) — http://127.0.0.1:") and reason in out, out


def test_robots_txt_in_an_undecodable_encoding_forbids_with_a_text(tmp_path: Path) -> None:
    out = fetch(tmp_path, {"/robots.txt": encoded(b"User-agent: *", "br"), "/p": Route(PAGE)})
    assert out.startswith("[fetch_content: error 2 (input) — robots.txt at ") and "not decoded" in out


# --- tables: flatten within a budget --------------------------------------------------------------------


def md(html: str, tables: str = "flatten") -> str:
    return to_markdown(html, Options("https://example.com/", tables=tables))


def test_spans_are_clamped_to_the_rows_of_the_table() -> None:
    html = '<table><tr><th>a</th><th>b</th></tr><tr><td rowspan="65534">r</td><td>1</td></tr></table>'
    assert md(html) == "| a | b |\n| --- | --- |\n| r | 1 |\n"
    wide = '<table><tr><td colspan="5000">w</td></tr></table>'
    assert md(wide) == "| " + " | ".join(["w"] * 1000) + " |\n| " + " | ".join(["---"] * 1000) + " |\n"


def test_table_past_the_budget_is_kept_as_html_and_so_are_the_later_ones() -> None:
    row = '<tr><td colspan="1000" rowspan="65534">x</td></tr>'
    bomb = "<table>" + row * 300 + "</table>"
    simple = "<table><tr><td>a</td></tr></table>"
    out = md(bomb + simple)
    assert out.startswith('<table><tbody><tr><td colspan="1000" rowspan="65534">x</td></tr>')
    assert out.endswith("\n\n<table><tbody><tr><td>a</td></tr></tbody></table>\n")
    assert md(simple) == "| a |\n| --- |\n"


def test_padding_of_ragged_rows_counts_against_the_budget() -> None:
    # No span at all: one row 40 000 cells wide, then 1000 one-cell rows to pad. Simple tables are flattened
    # with either option, so both keep this one as HTML.
    html = "<table><tr>" + "<td>h</td>" * 40_000 + "</tr>" + "<tr><td>x</td></tr>" * 1000 + "</table>"
    assert FLATTEN_BUDGET < 40_000 * 1001 * 3
    for tables in ("flatten", "html"):
        assert md(html, tables).startswith("<table><tbody><tr><td>h</td><td>h</td>")


# --- the parser: elements bounded by the page's size -------------------------------------------------------


def test_formatting_reopened_in_every_block_is_refused_with_a_text(tmp_path: Path) -> None:
    # Each item re-opens every <b> before it: 600 items of 15 bytes made 180 000 elements (and seconds).
    page = ("<!doctype html><ul>" + "".join(f"<li><b id={j}>x" for j in range(600))).encode()
    out = fetch(tmp_path, {"/p": Route(page)})
    assert out.startswith("[fetch_content: error 1 (conversion) — http://127.0.0.1:") and out.endswith(
        "/p makes more elements once parsed than it has characters (formatting tags left open across blocks, "
        "which the HTML5 parser opens again in each) — refused]"
    ), out
    sloppy = "<!doctype html><b><font color=red><i>" + "<p>para" * 2000  # left open, re-opened: still a page
    assert md(sloppy) == "para\n\n" * 1999 + "para\n"


# --- every failure is a text ---------------------------------------------------------------------------


@pytest.mark.parametrize(("tag", "markdown"), [("b", "**deep**\n"), ("i", "*deep*\n"), ("del", "~~deep~~\n")])
def test_deeply_nested_styles_convert(tag: str, markdown: str, tmp_path: Path) -> None:
    # Three hundred levels of <b> once ended in a RecursionError (five frames a level).
    page = f"<!doctype html><p>{f'<{tag}>' * 1000}deep</p>".encode()
    assert fetch(tmp_path, {"/p": Route(page)}, strikethrough=True) == markdown


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (MemoryError(), "takes more memory to convert than there is"),
        (RecursionError(), "is nested too deeply to convert"),
        (ValueError("odd"), "the page could not be handled: odd"),
        (OSError(5, "Input/output error"), "the page could not be handled: Input/output error"),
    ],
)
def test_unforeseen_errors_of_the_conversion_are_a_text(
    exc: BaseException, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(html: str, options: Options) -> str:
        raise exc

    monkeypatch.setattr(tool_module, "to_markdown", broken)
    out = fetch(tmp_path, {"/p": Route(PAGE)})
    assert out.startswith("[fetch_content: error 1 (conversion) — ") and reason in out, out


@pytest.mark.parametrize("exc", [OSError(24, "Too many open files"), ValueError("bad header")])
def test_unforeseen_errors_of_the_request_are_a_text(
    exc: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: object, url: str) -> object:
        raise exc

    monkeypatch.setattr(tool_module.Fetcher, "fetch", broken)
    out = fetch(tmp_path, {"/p": Route(PAGE)})
    assert (
        out.startswith("[fetch_content: error 2 (input) — fetching http://127.0.0.1:") and str(exc.args[-1]) in out
    ), out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_child_run(sys.argv[1]))))
