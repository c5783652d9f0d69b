"""fetch_content's converter against markdownify (same html5lib parser) and html2text, side by side.

ms/page and peak memory (tracemalloc) over the fixture pages and over larger pages made by repeating their
bodies, then a synthetic 5 MiB page end to end through the real HTTP path (loopback server, robots.txt, guard),
then the peak memory (tracemalloc) the tool takes on two hostile pages of issue 9: a `gzip, gzip, gzip` body of a
few hundred bytes that inflates to 1 GiB, and a 20 KB table of crossed spans fetched with `tables: flatten`.
Run: python bench/bench_fetch.py [--repeat N] [--hostile]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import html2text
from bs4 import BeautifulSoup
from markdownify import MarkdownConverter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fetch_site import Route, Site, encoding_bomb, span_bomb  # noqa: E402
from mm_core.config import AgentConfig, NetworkConfig  # noqa: E402
from mm_core.tools.base import ToolContext  # noqa: E402
from mm_core.tools.fetch import FetchContentTool  # noqa: E402
from mm_core.tools.fetch.encoding import decode  # noqa: E402
from mm_core.tools.fetch.webmd import Options, to_markdown  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "fetch"


def ours(html: str) -> str:
    return to_markdown(html, Options("https://docs.example/"))


def md_html5lib(html: str) -> str:
    return MarkdownConverter().convert_soup(BeautifulSoup(html, "html5lib"))


def h2t(html: str) -> str:
    return html2text.html2text(html, "https://docs.example/")


PEERS = {"ours": ours, "markdownify+html5lib": md_html5lib, "html2text": h2t}


def corpus() -> dict[str, str]:
    """The fixture pages: the real ones (tests/fixtures/fetch/real, written by others) and the hand-made ones,
    plus 100 KB and 1 MB pages made by repeating the hand-made bodies."""
    real = {f"real/{p.stem}": decode(p.read_bytes(), None) for p in sorted((FIXTURES / "real").glob("*.html"))}
    made = {p.stem: decode(p.read_bytes(), None) for p in sorted(FIXTURES.glob("*.html"))}
    bodies = "".join(page.split("<body", 1)[-1].split(">", 1)[-1].rsplit("</body>", 1)[0] for page in made.values())
    for size in (100_000, 1_000_000):
        made[f"repeated-{size // 1000}KB"] = "<!doctype html><body>" + bodies * (size // len(bodies) + 1) + "</body>"
    return real | made


def measure(fn, html: str, repeat: int) -> tuple[float, float]:
    """(median ms, peak MiB) of fn(html)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(html)
        times.append((time.perf_counter() - start) * 1000)
    tracemalloc.start()
    fn(html)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return statistics.median(times), peak


def big_page(size: int) -> str:
    """A page of `size` bytes made of a real documentation page's body, repeated."""
    page = (FIXTURES / "real" / "python_json.html").read_text(encoding="utf-8")
    head, body = page.split("<body", 1)
    body = body.split(">", 1)[1].rsplit("</body>", 1)[0]
    return head + "<body>" + body * (size // len(body.encode())) + "</body></html>"


async def end_to_end(size: int) -> tuple[float, int]:
    html = big_page(size)
    async with Site() as site:
        url = site.page("/big", html)
        tool = FetchContentTool(
            AgentConfig(fetchAllow=["127.0.0.1/32"], network=NetworkConfig(policy="open"), maxOutput=10**9)
        )
        with tempfile.TemporaryDirectory() as tmp:
            ctx = ToolContext(workspace=Path(tmp), config=tool.config)
            start = time.perf_counter()
            out = await tool.run({"url": url}, ctx)
            elapsed = time.perf_counter() - start
    assert not out.startswith("[fetch_content:"), out[:200]
    return elapsed, len(html)


async def hostile(name: str, route: Route, args: dict[str, str]) -> None:
    """One hostile page through the tool: its size on the wire, the answer, the time and the peak memory."""
    async with Site() as site:
        site.routes["/p"] = route
        tool = FetchContentTool(AgentConfig(fetchAllow=["127.0.0.1/32"], network=NetworkConfig(policy="open")))
        with tempfile.TemporaryDirectory() as tmp:
            ctx = ToolContext(workspace=Path(tmp), config=tool.config)
            tracemalloc.start()
            start = time.perf_counter()
            out = await tool.run({"url": site.url("/p"), **args}, ctx)
            elapsed = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
    answer = out.split("\n", 1)[0]
    answer = answer if len(answer) <= 90 else answer[:87] + "..."
    print(
        f"hostile page {name}: {len(route.body):,} bytes on the wire, peak {peak:.1f} MiB (tracemalloc), "
        f"{elapsed:.2f} s, answer ({len(out):,} chars): {answer}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hostile", action="store_true", help="only the hostile pages")
    args = parser.parse_args()
    if args.hostile:
        hostile_pages()
        return
    names = list(PEERS)
    print(f"{'page':22} {'KB':>6} " + " ".join(f"{n + ' ms':>26} {'MiB':>6}" for n in names) + "   ratio vs ours (ms)")
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    pages = corpus()
    ours_ms: dict[str, float] = {}
    for page, html in pages.items():
        repeat = 1 if len(html) > 500_000 else args.repeat
        results = {n: measure(fn, html, repeat) for n, fn in PEERS.items()}
        base = ours_ms[page] = results["ours"][0]
        cells = " ".join(f"{results[n][0]:>26.1f} {results[n][1]:>6.1f}" for n in names)
        for n in names[1:]:
            ratios[n].append(results[n][0] / base)
        print(
            f"{page:22} {len(html) / 1000:>6.0f} {cells}   "
            + "  ".join(f"{n}: {results[n][0] / base:.2f}x" for n in names[1:])
        )
    for n, values in ratios.items():
        print(f"median ratio {n} / ours: {statistics.median(values):.2f}x (above 1 means ours is faster)")
    small = [ms for page, ms in ours_ms.items() if len(pages[page]) <= 150_000]
    print(f"ours, median over the pages up to 150 KB: {statistics.median(small):.1f} ms")
    elapsed, size = asyncio.run(end_to_end(5 * 2**20 - 4096))
    print(
        f"end to end through HTTP: a {size / 2**20:.2f} MiB page (a real page's body repeated) in "
        f"{elapsed:.1f} s (limit 30 s)"
    )
    hostile_pages()


def hostile_pages() -> None:
    html = {"Content-Type": "text/html; charset=utf-8"}
    gzipped = {**html, "Content-Encoding": "gzip, gzip, gzip"}
    asyncio.run(
        hostile("gzip, gzip, gzip of 1 GiB", Route(encoding_bomb(("gzip", "gzip", "gzip"), 1024), headers=gzipped), {})
    )
    asyncio.run(
        hostile(
            "20 KB of crossed spans, tables: flatten",
            Route(span_bomb(20_000).encode(), headers=html),
            {"tables": "flatten"},
        )
    )


if __name__ == "__main__":
    main()
