"""fetch_content end to end over loopback: request limits, robots.txt, encodings, error codes, output mode and
the SSRF guard (which must refuse before any byte is sent)."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest

from fetch_site import Site
from mm_core.config import AgentConfig
from mm_core.events import Status
from mm_core.tools.base import ToolContext
from mm_core.tools.fetch import FetchContentTool, Limits
from mm_core.tools.fetch.guard import blocked_kind
from mm_core.tools.fetch.robots import RESOURCE_KEY, RobotsCache

ALLOW = ["127.0.0.1/32"]
PAGE = "<h1>Title</h1><p>Body text.</p>"


def make(tmp_path: Path, allow=ALLOW, limits: Limits = Limits(), **config) -> tuple[FetchContentTool, ToolContext]:
    # The loopback servers these tests make are reached under `network: open` unless a test says otherwise: the
    # allow-list has tests of its own (test_egress_fetch.py).
    tool = FetchContentTool(AgentConfig.model_validate({"fetchAllow": allow, "network": "open"} | config), limits)
    return tool, ToolContext(workspace=tmp_path, config=tool.config)


async def fetch(tmp_path: Path, args: dict, allow=ALLOW, **config) -> str:
    """One call of a tool made with `allow` and `config`, in a context of the same config."""
    tool, ctx = make(tmp_path, allow, **config)
    return await tool.run(args, ctx)


def run(coro):
    return asyncio.run(coro)


def test_declaration_title_and_approval(tmp_path: Path) -> None:
    tool, _ = make(tmp_path)
    schema = tool.schema()
    assert schema["name"] == "fetch_content" and schema["parameters"]["required"] == ["url"]
    properties = {"url", "output", "baseUrl", "tables", "strikethrough", "taskList"}
    assert set(schema["parameters"]["properties"]) == properties
    assert tool.emoji == "🌐" and tool.counter is None
    assert tool.title({"url": "k33g.org"}) == "fetch_content: k33g.org"
    assert tool.title({"url": "k33g.org", "output": "a.md"}) == "fetch_content: k33g.org → a.md"
    assert not tool.needs_approval({"url": "x"}) and tool.needs_approval({"url": "x", "output": "a.md"})
    assert tool.refusal({}) == "[fetch_content rejected by the user]"


def test_page_as_markdown_with_user_agent_status_and_robots_cache(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            tool, ctx = make(tmp_path)
            events = []
            ctx.emit = events.append
            first = await tool.run({"url": site.page("/p", PAGE)}, ctx)
            second = await tool.run({"url": site.url("/p")}, ctx)
            return first, second, events, site

    first, second, events, site = run(scenario())
    assert first == second == "# Title\n\nBody text.\n"
    assert Status("Fetching") in events
    assert site.hits == {"/robots.txt": 1, "/p": 2}  # robots.txt read once per origin per session
    assert all(ua.startswith("mm/") for ua in site.user_agents)


def test_redirects_are_followed_and_relative_links_use_the_final_url(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/docs/final", '<p><a href="next">n</a></p>')
            site.redirect("/start", "/docs/final", 301)
            tool, ctx = make(tmp_path)
            plain = await tool.run({"url": site.url("/start")}, ctx)
            based = await tool.run({"url": site.url("/start"), "baseUrl": "https://b.example/x/"}, ctx)
            return plain, based, site

    plain, based, site = run(scenario())
    assert plain == f"[n]({site.url('/docs/next')})\n"
    assert based == "[n](https://b.example/x/next)\n"


def test_more_than_ten_redirections_is_error_2(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            for i in range(12):
                site.redirect(f"/r{i}", f"/r{i + 1}")
            site.page("/r12", PAGE)
            tool, ctx = make(tmp_path)
            ten = await tool.run({"url": site.url("/r2")}, ctx)
            eleven = await tool.run({"url": site.url("/r1")}, ctx)
            return ten, eleven

    ten, eleven = run(scenario())
    assert ten == "# Title\n\nBody text.\n"
    assert eleven.startswith("[fetch_content: error 2 (input) — more than 10 redirections")


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ({"status": 404}, "[fetch_content: error 2 (input) — HTTP 404 Not Found for "),
        ({"status": 500}, "[fetch_content: error 2 (input) — HTTP 500 Internal Server Error for "),
        ({"content_type": "application/pdf"}, "[fetch_content: error 1 (conversion) — "),
    ],
)
def test_http_failures_and_types(tmp_path: Path, route: dict, expected: str) -> None:
    async def scenario():
        async with Site() as site:
            html = route.pop("html", PAGE)
            url = site.page("/p", html, **route)
            return await fetch(tmp_path, {"url": url}), url

    out, _ = run(scenario())
    assert out.startswith(expected) and out.endswith("]")
    if "pdf" in str(route):
        assert "not an HTML page" in out or "does not look like HTML" in out


async def raw_server(response: bytes) -> asyncio.Server:
    """A server that answers every request with `response` as is (aiohttp always adds a Content-Type)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"\n <!DOCTYPE html><p>sniffed</p>", "sniffed\n"),
        (b"%PDF-1.4 binary", "does not look like HTML"),
    ],
)
def test_missing_content_type_is_sniffed(tmp_path: Path, body: bytes, expected: str) -> None:
    async def scenario():
        server = await raw_server(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        async with server:
            port = server.sockets[0].getsockname()[1]
            tool, ctx = make(tmp_path)
            await ctx.resources.get(RESOURCE_KEY, RobotsCache)  # robots.txt answers with the same raw page
            return await tool.run({"url": f"http://127.0.0.1:{port}/p"}, ctx)

    assert expected in run(scenario())


def test_size_limit_and_timeout(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            big = site.page("/big", "<p>" + "x" * 3000 + "</p>")
            slow = site.page("/slow", PAGE, delay=5)
            tool, ctx = make(tmp_path, limits=Limits(max_bytes=2000, timeout=0.5))
            return await tool.run({"url": big}, ctx), await tool.run({"url": slow}, ctx)

    big, slow = run(scenario())
    assert big.startswith("[fetch_content: error 1 (conversion) — ") and "larger than" in big
    assert slow.startswith("[fetch_content: error 2 (input) — ") and "did not answer within 0.5s" in slow


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"url": ""}, "url is empty"),
        ({"url": "ftp://x.org/f"}, "scheme 'ftp' is not supported"),
        ({"url": "mailto:a@b.c"}, "scheme 'mailto' is not supported"),
        ({"url": "http://"}, "no host name"),
        ({"url": "http://x.org:99999/"}, "cannot parse url"),
        ({"url": "x.org", "tables": "grid"}, 'tables must be "html" or "flatten"'),
        ({"url": "x.org", "baseUrl": "/docs/"}, "baseUrl '/docs/' is not an absolute URL"),
        ({"url": "https://user:pw@x.org/"}, "URLs with credentials are not fetched"),
        ({"url": "x.org", "strikethrough": "maybe"}, "strikethrough must be true or false"),
        ({"url": "http://[v1.x]/"}, "cannot parse url"),
        ({"url": "http://0177.0.0.1/"}, "cannot parse url"),
        ({"url": "http://x.org/a\x00b"}, "cannot parse url"),
        ({"url": "http://a..b/"}, "not a valid host name"),
        ({"url": "https://" + "a" * 64 + ".org/"}, "not a valid host name"),
    ],
)
def test_usage_errors_are_code_3_and_send_nothing(tmp_path: Path, args: dict, reason: str) -> None:
    tool, ctx = make(tmp_path, allow=[])
    out = run(tool.run(args, ctx))
    assert out.startswith("[fetch_content: error 3 (usage) — ") and reason in out, out


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("http://127.0.0.1:99999/p", "redirects to an invalid URL"),
        ("http://[::1", "Invalid URL in location header"),  # refused by httpx itself, as the answer arrives
        ("http://user:pw@127.0.0.1:{port}/p", "carrying a user name or password"),
    ],
)
def test_redirect_to_an_unusable_url_is_error_2(tmp_path: Path, location: str, reason: str) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/p", PAGE)
            site.redirect("/go", location.format(port=site.port))
            tool, ctx = make(tmp_path)
            return await tool.run({"url": site.url("/go")}, ctx), site.hits

    out, hits = run(scenario())
    assert out.startswith("[fetch_content: error 2 (input) — ") and reason in out, out
    assert "/p" not in hits


def test_url_repairs(tmp_path: Path) -> None:
    from mm_core.tools.fetch.tool import normalize_url

    assert normalize_url("k33g.org") == "https://k33g.org"
    assert normalize_url("https//k33g.org/a") == "https://k33g.org/a"
    assert normalize_url(" localhost:8080/x ") == "https://localhost:8080/x"


def test_unreachable_host_is_error_2(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            port = site.port
        return await fetch(tmp_path, {"url": f"http://127.0.0.1:{port}/"})

    out = run(scenario())
    assert out.startswith("[fetch_content: error 2 (input) — ")


def test_output_mode_writes_the_file_and_refuses_escapes(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            url = site.page("/p", PAGE)
            empty = site.page("/e", "<nav>menu</nav><script>x</script>")
            tool, ctx = make(tmp_path)
            saved = await tool.run({"url": url, "output": "notes/page.md"}, ctx)
            nothing = await tool.run({"url": empty, "output": "empty.md"}, ctx)
            escape = await tool.run({"url": url, "output": "../outside.md"}, ctx)
            before = site.total
            return saved, nothing, escape, url, empty, before, site.total

    saved, nothing, escape, url, empty, before, after = run(scenario())
    assert saved == (
        f"[fetch_content: saved 3 lines of Markdown (20 bytes) from {url} to notes/page.md — the content is not shown]"
    )
    assert (tmp_path / "notes" / "page.md").read_text() == "# Title\n\nBody text.\n"
    assert nothing == (
        f"[fetch_content: {empty} has no text content once scripts, navigation and ads are removed — nothing saved]"
    )
    assert not (tmp_path / "empty.md").exists()
    assert escape == (
        "[fetch_content: error 1 (conversion) — cannot write ../outside.md: "
        "the path leads outside the working directory]"
    )
    assert before == after and not (tmp_path.parent / "outside.md").exists()


def test_output_name_too_long_is_error_1_before_fetching(tmp_path: Path) -> None:
    name = "x" * 300 + ".md"
    out = run(fetch(tmp_path, {"url": "http://127.0.0.1:9/", "output": name}, allow=[]))
    assert out == f"[fetch_content: error 1 (conversion) — cannot write {name}: File name too long]"


def test_output_is_truncated_to_max_output(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            tool, ctx = make(tmp_path, maxOutput=100)
            return await tool.run({"url": site.page("/p", "<p>" + "word " * 100 + "</p>")}, ctx)

    out = run(scenario())
    assert out.startswith("word word") and "output truncated" in out and len(out) < 200


# --- encodings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type", "text"),
    [
        ("\ufeff<p>café</p>".encode(), "text/html; charset=windows-1252", "café"),  # BOM beats the header
        ("<p>café</p>".encode("cp1252"), "text/html; charset=ISO-8859-1", "café"),  # header
        ('<meta charset="windows-1252"><p>café €</p>'.encode("cp1252"), "text/html", "café €"),  # meta charset
        (
            '<meta http-equiv="Content-Type" content="text/html; charset=koi8-r"><p>мир</p>'.encode("koi8-r"),
            "text/html",
            "мир",
        ),
        ('<meta charset="no-such-thing"><p>café</p>'.encode(), "text/html", "café"),  # unknown name skipped → UTF-8
        ("<p>naïve “quotes”</p>".encode("cp1252"), "text/html", "naïve “quotes”"),  # invalid UTF-8 → windows-1252
        ("<p>\u0161\u00e9</p>".encode("utf-16-le").join([b"\xff\xfe", b""]), "text/html", "šé"),  # UTF-16 BOM
        # Python codec names that are no charset are unknown names, skipped: here the valid UTF-8 decides.
        ("<p>café</p>".encode(), "text/html; charset=base64", "café"),
        ("<p>café</p>".encode(), "text/html; charset=unicode_escape", "café"),
        ('<meta charset="rot13"><p>café</p>'.encode(), "text/html", "café"),
    ],
)
def test_encoding_chain(tmp_path: Path, body: bytes, content_type: str, text: str) -> None:
    async def scenario():
        async with Site() as site:
            return await fetch(tmp_path, {"url": site.page("/p", body, content_type)})

    assert run(scenario()) == text + "\n"


# --- robots.txt --------------------------------------------------------------------------------------------


def robots_case(tmp_path: Path, robots_route: dict | None, path: str = "/page"):
    async def scenario():
        async with Site() as site:
            site.page("/page", PAGE)
            site.page("/a/b", PAGE)
            site.page("/x.pdf.html", PAGE)
            site.page("/free", PAGE)
            if robots_route is not None:
                body = robots_route.pop("body", "")
                site.page("/robots.txt", body, "text/plain", **robots_route)
            else:
                site.routes.pop("/robots.txt")
            return await fetch(tmp_path, {"url": site.url(path)})

    return run(scenario())


FORBIDS = "[fetch_content: error 2 (input) — "


@pytest.mark.parametrize(
    ("robots", "path", "allowed"),
    [
        ("User-agent: *\nDisallow: /page\n", "/page", False),
        ("User-agent: *\nDisallow: /page\nAllow: /page\n", "/page", True),  # Allow wins a tie
        ("User-agent: *\nDisallow: /a\nAllow: /a/b\n", "/a/b", True),  # longest match
        ("User-agent: *\nAllow: /a\nDisallow: /a/b\n", "/a/b", False),
        ("User-agent: *\nDisallow: /*.pdf$\n", "/x.pdf.html", True),  # $ anchors the end
        ("User-agent: *\nDisallow: /*.html$\n", "/x.pdf.html", False),  # * matches any run
        ("User-agent: *\nDisallow: /\n\nUser-agent: mm\nAllow: /\n", "/page", True),  # the mm group wins over *
        ("User-agent: mm\nDisallow: /\n", "/page", False),
        ("User-agent: mmbot\nDisallow: /\n", "/page", True),  # another product token
        ("\ufeffUser-agent: *\nDisallow: /\n", "/page", False),  # a UTF-8 BOM is not part of the first line
    ],
)
def test_robots_rules(tmp_path: Path, robots: str, path: str, allowed: bool) -> None:
    out = robots_case(tmp_path, {"body": robots}, path)
    assert (out == "# Title\n\nBody text.\n") is allowed, out
    if not allowed:
        assert out.startswith(FORBIDS) and "robots.txt" in out and "forbids" in out


@pytest.mark.parametrize(
    ("route", "allowed"),
    [
        ({"status": 401}, True),
        ({"status": 403}, True),
        ({"status": 404}, True),  # 4xx allows everything
        ({"status": 500}, False),
        ({"status": 503}, False),  # 5xx forbids everything
    ],
)
def test_robots_status_rules(tmp_path: Path, route: dict, allowed: bool) -> None:
    out = robots_case(tmp_path, {"body": "User-agent: *\nDisallow: /\n", **route})
    assert (out == "# Title\n\nBody text.\n") is allowed, out
    if not allowed:
        assert out.startswith(FORBIDS) and "robots.txt" in out and "cannot be read" in out


def test_robots_redirect_is_followed(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/page", PAGE)
            site.redirect("/robots.txt", "/real-robots.txt")
            site.page("/real-robots.txt", "User-agent: *\nDisallow: /page\n", "text/plain")
            return await fetch(tmp_path, {"url": site.url("/page")})

    assert "forbids" in run(scenario())


def test_unreachable_robots_forbids(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/page", PAGE)
            site.routes["/robots.txt"] = site.routes["/page"].__class__(delay=5)
            tool, ctx = make(tmp_path, limits=Limits(timeout=0.5))
            return await tool.run({"url": site.url("/page")}, ctx), site.hits.get("/page", 0)

    out, page_hits = run(scenario())
    assert out.startswith(FORBIDS) and page_hits == 0


async def _endless(request):
    """A body that never ends: robots.txt as fast as it goes, a page one byte at a time (slowloris)."""
    from aiohttp import web

    robots = request.path == "/robots.txt"
    response = web.StreamResponse(headers={"Content-Type": "text/plain" if robots else "text/html"})
    await response.prepare(request)
    line = b"User-agent: *\nDisallow: /private\n" if robots else b"<p>"
    while True:
        await response.write(line * (1000 if robots else 1))
        await asyncio.sleep(0 if robots else 0.05)


async def _page(request):
    from aiohttp import web

    return web.Response(text=PAGE, content_type="text/html")


def test_endless_robots_is_read_up_to_its_limit_and_a_slowloris_page_times_out(tmp_path: Path) -> None:
    from aiohttp import web

    async def scenario():
        app = web.Application()
        app.router.add_get("/robots.txt", _endless)
        app.router.add_get("/drip", _endless)
        app.router.add_get("/page", _page)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            tool, ctx = make(tmp_path, limits=Limits(timeout=2))
            return (
                await tool.run({"url": base + "/page"}, ctx),
                await tool.run({"url": base + "/private"}, ctx),
                await tool.run({"url": base + "/drip"}, ctx),
            )
        finally:
            await runner.cleanup()

    page, private, drip = run(scenario())
    assert page == "# Title\n\nBody text.\n"
    assert private.startswith(FORBIDS) and "forbids" in private
    assert drip.startswith(FORBIDS) and "did not answer within 2s" in drip


def test_robots_cache_expires_after_24_hours(tmp_path: Path) -> None:
    now = [1000.0]

    async def scenario():
        async with Site() as site:
            site.page("/page", PAGE)
            tool, ctx = make(tmp_path)
            await ctx.resources.get(RESOURCE_KEY, lambda: RobotsCache(clock=lambda: now[0]))
            await tool.run({"url": site.url("/page")}, ctx)
            now[0] += 23 * 3600
            await tool.run({"url": site.url("/page")}, ctx)
            cached = site.hits["/robots.txt"]
            now[0] += 2 * 3600
            await tool.run({"url": site.url("/page")}, ctx)
            return cached, site.hits["/robots.txt"]

    assert run(scenario()) == (1, 2)


def test_robots_checked_on_every_redirect_hop(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site, Site("127.0.0.2") as other:
            other.page("/robots.txt", "User-agent: *\nDisallow: /\n", "text/plain")
            other.page("/page", PAGE)
            site.redirect("/go", other.url("/page"))
            tool, ctx = make(tmp_path, allow=["127.0.0.0/8"])
            return await tool.run({"url": site.url("/go")}, ctx), other.hits.get("/page", 0)

    out, hits = run(scenario())
    assert "forbids" in out and hits == 0


# --- SSRF guard --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("fc00::1", "private"),
        ("fd00:ec2::254", "cloud metadata"),
        ("64:ff9b::a00:1", "private"),
        ("2002:7f00:1::", "loopback"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "private"),
        ("fec0::1", "site-local"),
        ("feff::1", "site-local"),
    ],
)
def test_internal_addresses_are_classified(address: str, kind: str) -> None:
    assert kind in (blocked_kind(ipaddress.ip_address(address)) or "")


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert blocked_kind(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1:{port}/",
        "http://[::1]:{port}/",
        "http://[::ffff:127.0.0.1]:{port}/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0:{port}/",
        "http://2130706433:{port}/",
        "http://0x7f000001:{port}/",
        "http://localhost:{port}/",
        "http://127.1:{port}/",
    ],
)
def test_hostile_urls_are_refused_before_connecting(tmp_path: Path, template: str) -> None:
    async def scenario():
        async with Site() as site:
            site.page("/", PAGE)
            site.page("/latest/meta-data/", PAGE)
            out = await fetch(tmp_path, {"url": template.format(port=site.port)}, allow=[])
            return out, site.total

    out, hits = run(scenario())
    assert out.startswith("[fetch_content: error 2 (input) — ") and "fetchAllow in the config lifts this" in out, out
    assert hits == 0


def test_refusal_names_the_address_and_its_kind(tmp_path: Path) -> None:
    out = run(fetch(tmp_path, {"url": "http://127.0.0.1:9/"}, allow=[]))
    assert out == (
        "[fetch_content: error 2 (input) — 127.0.0.1 is a loopback address — fetching internal "
        "addresses is not allowed (fetchAllow in the config lifts this)]"
    )


def test_redirect_to_a_blocked_address_is_refused_on_that_hop(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as allowed, Site("127.0.0.2") as internal:
            internal.page("/secret", "<p>secret</p>")
            allowed.redirect("/go", internal.url("/secret"))
            tool, ctx = make(tmp_path, allow=["127.0.0.1"])
            return await tool.run({"url": allowed.url("/go")}, ctx), allowed.hits, internal.total

    out, allowed_hits, internal_hits = run(scenario())
    assert out.startswith("[fetch_content: error 2 (input) — 127.0.0.2 is a loopback address")
    assert allowed_hits == {"/robots.txt": 1, "/go": 1} and internal_hits == 0


def test_allow_list_by_host_name(tmp_path: Path) -> None:
    async def scenario():
        async with Site() as site:
            tool, ctx = make(tmp_path, allow=["localhost"])
            site.page("/p", PAGE)
            return await tool.run({"url": f"http://localhost:{site.port}/p"}, ctx)

    assert run(scenario()) == "# Title\n\nBody text.\n"
