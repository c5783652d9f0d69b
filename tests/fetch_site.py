"""A small web site on a loopback address for the fetch_content tests, counting every request it gets."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/html; charset=utf-8"})
    delay: float = 0.0


class Site:
    """`async with Site("127.0.0.1") as site:`; routes by path, `site.url(path)`, `site.hits[path]`."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.port = 0
        self.routes: dict[str, Route] = {"/robots.txt": Route(status=404, headers={})}
        self.hits: dict[str, int] = {}
        self.user_agents: list[str] = []
        self._runner: web.AppRunner | None = None

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def page(self, path: str, html: str | bytes, content_type: str | None = "text/html; charset=utf-8", **kw) -> str:
        body = html.encode() if isinstance(html, str) else html
        self.routes[path] = Route(body, headers={"Content-Type": content_type} if content_type else {}, **kw)
        return self.url(path)

    def redirect(self, path: str, location: str, status: int = 302) -> str:
        self.routes[path] = Route(status=status, headers={"Location": location})
        return self.url(path)

    @property
    def total(self) -> int:
        return sum(self.hits.values())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        import asyncio

        path = request.path_qs
        self.hits[path] = self.hits.get(path, 0) + 1
        self.user_agents.append(request.headers.get("User-Agent", ""))
        route = self.routes.get(path) or self.routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="not found")
        if route.delay:
            await asyncio.sleep(route.delay)
        response = web.Response(status=route.status, body=route.body)
        response.headers.popall("Content-Type", None)
        for key, value in route.headers.items():
            response.headers[key] = value
        return response

    async def __aenter__(self) -> Site:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


# --- hostile pages (tests/test_attack_fetch.py, bench/bench_fetch.py) -------------------------------------

_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
_FINAL_EMPTY_BLOCK = b"\x03\x00"  # a final fixed-Huffman block holding only its end code


def zeros_compressed(coding: str, mib: int) -> bytes:
    """`mib` MiB of NUL bytes as a gzip or deflate (zlib) stream, built in about a second: the raw deflate of
    one MiB after a full flush does not depend on what came before, so it is repeated."""
    import struct
    import zlib

    mib_of_zeros = bytes(2**20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = compressor.compress(mib_of_zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    deflated = segment * mib + _FINAL_EMPTY_BLOCK
    if coding == "gzip":
        crc = 0
        for _ in range(mib):
            crc = zlib.crc32(mib_of_zeros, crc)
        return _GZIP_HEADER + deflated + struct.pack("<II", crc, (mib * 2**20) & 0xFFFFFFFF)
    assert coding == "deflate", coding
    adler = 1
    for _ in range(mib):
        adler = zlib.adler32(mib_of_zeros, adler)
    return b"\x78\xda" + deflated + struct.pack(">I", adler)


def compress(coding: str, data: bytes) -> bytes:
    import gzip
    import zlib

    if coding == "gzip":
        return gzip.compress(data, 9, mtime=0)
    assert coding == "deflate", coding
    return zlib.compress(data, 9)


def encoding_bomb(codings: tuple[str, ...] = ("gzip", "gzip", "gzip"), mib: int = 1024) -> bytes:
    """A body whose Content-Encoding is `codings` (in the header's order, the first applied first) that
    inflates to `mib` MiB of NUL bytes: a few hundred bytes on the wire for three layers."""
    body = zeros_compressed(codings[0], mib)
    for coding in codings[1:]:
        body = compress(coding, body)
    return body


def span_bomb(size: int = 20_000) -> str:
    """A page of about `size` bytes whose table, flattened, would hold rows * rows * 500 copies of a cell:
    each row's cell spans 1000 columns and every later row."""
    row = '<tr><td colspan="1000" rowspan="65534">x</td></tr>'
    return "<!doctype html><body><table>" + row * (size // len(row)) + "</table></body>"
