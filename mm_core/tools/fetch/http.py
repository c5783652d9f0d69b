"""The request: GET with the reference's limits (10 redirections, 30 s overall, 5 MiB), redirections followed
here so that robots.txt and the SSRF guard see every hop, and the body streamed so a huge page stops at the
limit instead of filling memory.

Content-Encoding is decoded here, not by httpx: httpx inflates each network chunk through every layer in one
call, so `gzip, gzip, gzip` of about 1 KB a layer became a gigabyte before any size check. Here each layer
hands at most `STEP` bytes at a time to the next, every stage (the raw bytes, each intermediate layer, the
page) is capped at the page limit, and more than `MAX_ENCODINGS` stacked encodings are refused: the memory a
body takes stays within a small multiple of the limit whatever the server sends.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from urllib.parse import SplitResult, urljoin, urlsplit

import httpx

from mm_core.errors import CoreError
from mm_core.tools.fetch.errors import CONVERSION, INPUT, FetchError
from mm_core.tools.fetch.guard import AddressGuard, guarded_transport
from mm_core.tools.fetch.robots import MAX_BYTES as ROBOTS_MAX_BYTES
from mm_core.tools.fetch.robots import RobotsCache

MIB = 1024 * 1024
ACCEPTED = ("text/html", "application/xhtml+xml")
# Go's http.DetectContentType signatures for HTML (the reference sniffs with it), each followed by space or >.
_HTML_SIGNATURES = (
    b"<!doctype html",
    b"<html",
    b"<head",
    b"<script",
    b"<iframe",
    b"<h1",
    b"<div",
    b"<font",
    b"<table",
    b"<a",
    b"<style",
    b"<title",
    b"<b",
    b"<body",
    b"<br",
    b"<p",
    b"<!--",
)


# Stacked Content-Encoding layers accepted (identity not counted); servers send one, a misconfigured one two.
MAX_ENCODINGS = 3
STEP = 64 * 1024  # the most one decoding layer outputs at a time
# The codings decoded (what the Accept-Encoding header offers) and the zlib window of each.
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}
ACCEPT_ENCODING = "gzip, deflate"
# Compressions a server may still send unasked, which are not decoded: refused rather than shown as bytes.
# Other names (identity, a charset by mistake) are passed through as httpx did.
_UNDECODED = frozenset(("br", "zstd", "compress", "x-compress"))


def user_agent() -> str:
    try:
        return f"mm/{metadata.version('mm-chatops')}"
    except metadata.PackageNotFoundError:
        return "mm/dev"


@dataclass(frozen=True)
class Limits:
    redirects: int = 10
    timeout: float = 30.0
    max_bytes: int = 5 * MIB


@dataclass(frozen=True)
class Page:
    url: str  # the final URL, after redirections
    content_type: str | None
    body: bytes


def sniff_html(body: bytes) -> bool:
    head = body.removeprefix(b"\xef\xbb\xbf").lstrip(b"\t\n\x0c\r ")[:512].lower()
    return any(
        head.startswith(sig) and (sig == b"<!--" or head[len(sig) : len(sig) + 1] in (b" ", b">"))
        for sig in _HTML_SIGNATURES
    )


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def make_client(guard: AddressGuard, timeout: float) -> httpx.AsyncClient:
    # Every connection, redirections and robots.txt included, opens through the guard. trust_env=False: a proxy
    # from the environment would hide the real target from the guard.
    return httpx.AsyncClient(
        transport=guarded_transport(guard),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(timeout),
        headers={"User-Agent": user_agent(), "Accept-Encoding": ACCEPT_ENCODING},
    )


def parse_url(url: str) -> SplitResult:
    """The URL's parts; ValueError for one the HTTP client would refuse (a port out of range, a malformed
    IP literal, a control character), so that the refusal is a clear answer rather than an exception."""
    parts = urlsplit(url)
    parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(str(exc)) from None
    try:
        # The codec the resolver uses: a name it cannot encode (an empty or 64-character label) is no host.
        (parts.hostname or "").encode("idna")
    except UnicodeError:
        raise ValueError(f"{parts.hostname!r} is not a valid host name") from None
    return parts


def _describe(exc: Exception) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _redirect_target(url: str, location: str) -> str:
    try:
        target = urljoin(url, location)
        parts = parse_url(target)
    except ValueError as exc:
        raise FetchError(INPUT, f"{url} redirects to an invalid URL {location!r} ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise FetchError(INPUT, f"{url} redirects to {target}, which is not an http(s) URL")
    # The same rule as for the url argument: credentials would go to whatever host is named there.
    if parts.username is not None or parts.password is not None:
        raise FetchError(INPUT, f"{url} redirects to a URL carrying a user name or password — not followed")
    return target


class EncodingRefused(CoreError):
    """Content-Encoding names a compression that is not decoded, or stacks too many layers."""


class CorruptEncoding(CoreError):
    """A layer's compressed data is not valid."""


class BodyTooLarge(CoreError):
    """A stage of the body went past its limit; `head` is what the page stage could still take."""

    def __init__(self, head: bytes = b""):
        super().__init__("body too large")
        self.head = head


def content_codings(headers: httpx.Headers) -> list[str]:
    """The Content-Encoding layers to undo, in the order they were applied."""
    names = [v.strip().lower() for v in headers.get_list("content-encoding", split_commas=True)]
    names = [n for n in names if n]
    undecoded = [n for n in names if n in _UNDECODED]
    if undecoded:
        raise EncodingRefused(f"compressed with {undecoded[0]}, which is not decoded: only gzip and deflate are")
    codings = [n for n in names if n in _WBITS]
    if len(codings) > MAX_ENCODINGS:
        raise EncodingRefused(
            f"compressed {len(codings)} times over ({', '.join(codings)}) — more than "
            f"{MAX_ENCODINGS} stacked Content-Encodings are refused"
        )
    return codings


class _Layer:
    """One gzip or deflate layer, decoded at most STEP bytes at a time."""

    def __init__(self, coding: str):
        self.coding = coding
        self.inflater = zlib.decompressobj(_WBITS[coding])
        self.started = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data and not self.inflater.eof:  # after the end of the stream, the rest is ignored (as httpx)
            try:
                out = self.inflater.decompress(data, STEP)
            except zlib.error as exc:
                if self.coding == "deflate" and not self.started:  # raw deflate without the zlib header
                    self.started = True
                    self.inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise CorruptEncoding(f"its {self.coding} data is corrupt ({exc})") from None
            self.started = True
            rest = self.inflater.unconsumed_tail
            if not out and len(rest) == len(data):
                return  # no progress possible on these bytes
            data = rest
            if out:
                yield out

    def finish(self) -> bytes:
        # feed() leaves no input behind, so what flush() still holds is a few hundred bytes at most.
        try:
            return self.inflater.flush() if not self.inflater.eof else b""
        except zlib.error as exc:
            raise CorruptEncoding(f"its {self.coding} data is corrupt ({exc})") from None


class BodyDecoder:
    """The raw bytes of a response through its Content-Encoding layers, innermost last, every stage capped
    at `limit` bytes: a stage that goes past it raises BodyTooLarge."""

    def __init__(self, codings: list[str], limit: int):
        self.layers = [_Layer(c) for c in reversed(codings)]
        self.limit = limit
        self.sizes = [0] * (len(self.layers) + 1)  # bytes that entered each stage; the last is the page

    def feed(self, raw: bytes) -> Iterator[bytes]:
        return self._push(0, raw)

    def finish(self) -> Iterator[bytes]:
        for i, layer in enumerate(self.layers):
            rest = layer.finish()
            if rest:
                yield from self._push(i + 1, rest)

    def _push(self, stage: int, data: bytes) -> Iterator[bytes]:
        size = self.sizes[stage]
        self.sizes[stage] = size + len(data)
        if stage == len(self.layers):
            if size + len(data) > self.limit:
                raise BodyTooLarge(data[: max(self.limit - size, 0)])
            yield data
            return
        if size + len(data) > self.limit:
            raise BodyTooLarge()
        for out in self.layers[stage].feed(data):
            yield from self._push(stage + 1, out)


async def read_body(response: httpx.Response, limit: int, *, truncate: bool = False) -> bytes:
    """The decoded body, at most `limit` bytes: past it BodyTooLarge, or with `truncate` the first `limit`
    bytes. EncodingRefused and CorruptEncoding for what cannot be decoded; httpx's errors go through."""
    decoder = BodyDecoder(content_codings(response.headers), limit)
    chunks: list[bytes] = []
    try:
        async for raw in response.aiter_raw():
            chunks.extend(decoder.feed(raw))
        chunks.extend(decoder.finish())
    except BodyTooLarge as exc:
        if not truncate:
            raise
        chunks.append(exc.head)
    return b"".join(chunks)


class Fetcher:
    def __init__(self, client: httpx.AsyncClient, robots: RobotsCache, limits: Limits = Limits()):
        self.client = client
        self.robots = robots
        self.limits = limits

    async def fetch(self, url: str) -> Page:
        try:
            async with asyncio.timeout(self.limits.timeout):
                return await self._follow(url)
        except TimeoutError:
            raise FetchError(INPUT, f"{url} did not answer within {self.limits.timeout:g}s") from None

    async def _follow(self, url: str) -> Page:
        for _ in range(self.limits.redirects + 1):
            await self.robots.check(url, self._get_robots)
            location = await self._get_page(url)
            if isinstance(location, Page):
                return location
            url = location
        raise FetchError(INPUT, f"more than {self.limits.redirects} redirections, the last to {url}")

    async def _send(self, url: str) -> httpx.Response:
        try:
            return await self.client.send(self.client.build_request("GET", url), stream=True)
        except FetchError:
            raise
        except httpx.HTTPError as exc:
            host = urlsplit(url).hostname
            raise FetchError(INPUT, f"cannot reach {host}: {_describe(exc)}") from None

    async def _get_page(self, url: str) -> Page | str:
        """The page, or the next URL of a redirection."""
        response = await self._send(url)
        try:
            if response.is_redirect:
                return _redirect_target(url, response.headers["location"])
            if response.status_code >= 300:
                raise FetchError(INPUT, f"HTTP {response.status_code} {response.reason_phrase} for {url}".rstrip())
            content_type = response.headers.get("content-type")
            if content_type and _media_type(content_type) not in ACCEPTED:
                raise FetchError(CONVERSION, f"{url} is {_media_type(content_type)}, not an HTML page")
            body = await self._read(response, url)
            if not content_type and not sniff_html(body):
                raise FetchError(CONVERSION, f"{url} has no Content-Type and does not look like HTML")
            return Page(url, content_type, body)
        finally:
            await response.aclose()

    async def _read(self, response: httpx.Response, url: str) -> bytes:
        limit = self.limits.max_bytes
        too_big = FetchError(CONVERSION, f"{url} is larger than {_size(limit)} — pages above that are refused")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit and "content-encoding" not in response.headers:
            raise too_big
        try:
            return await read_body(response, limit)
        except BodyTooLarge:
            raise too_big from None
        except EncodingRefused as exc:
            raise FetchError(CONVERSION, f"{url} is {exc}") from None
        except CorruptEncoding as exc:
            raise FetchError(CONVERSION, f"{url} cannot be decoded: {exc}") from None
        except httpx.HTTPError as exc:
            raise FetchError(INPUT, f"reading {url} failed: {_describe(exc)}") from None

    async def _get_robots(self, url: str) -> tuple[int, str | None, bytes]:
        # httpx's own errors go through: robots.py words an unreachable robots.txt itself.
        response = await self.client.send(self.client.build_request("GET", url), stream=True)
        try:
            if response.is_redirect:
                return response.status_code, urljoin(url, response.headers["location"]), b""
            body = b""
            if 200 <= response.status_code < 300:
                # A refused or corrupt encoding goes through as an unreadable robots.txt.
                body = await read_body(response, ROBOTS_MAX_BYTES, truncate=True)
            return response.status_code, None, body
        finally:
            await response.aclose()
