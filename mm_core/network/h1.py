"""HTTP/1.1 with a client of the egress proxy: h11 reads and writes the messages, asyncio streams carry them.

The client is the sandbox, so it is not trusted: h11 refuses what is not HTTP/1.1 and a request head larger than
`MAX_HEAD`; a body's read and a response's write wait at most `idle` seconds for the client (the wait for a
request head is the caller's to bound). Every text this module writes is one the caller gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
from collections.abc import AsyncIterator, Iterable

import h11

from mm_core.errors import CoreError

MAX_HEAD = 16 * 1024  # a request head, and any other incomplete h11 event, past this is refused
CHUNK = 64 * 1024  # the most read from a socket at a time
# After an answer that ends a connection early, what the client still sends is read and dropped for this long, up
# to this many bytes (see Client.linger).
LINGER = 2.0
MAX_LINGER = 1024 * 1024

# Headers that describe one connection, not the message (RFC 9110 section 7.6.1), and those the proxy sets
# itself: the framing (h11 and httpx choose it), Host (from the URL), Expect (the proxy answers 100-continue).
HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"expect",
    )
)

Headers = list[tuple[bytes, bytes]]


class ClientGone(CoreError):
    """The client closed its connection in the middle of a message, or sent something h11 refuses there."""


def end_to_end(headers: Iterable[tuple[bytes, bytes]], drop: Iterable[bytes] = ()) -> Headers:
    """The headers to pass on: without the hop-by-hop ones, those the Connection header names, and `drop`
    (lower-case names). A Content-Length beside a Transfer-Encoding goes too: the body was framed by the
    latter (RFC 9112 section 6.3), and the next hop frames it anew."""
    pairs = [(name.lower(), value) for name, value in headers]
    named = {token.strip().lower() for name, value in pairs if name == b"connection" for token in value.split(b",")}
    if any(name == b"transfer-encoding" for name, _ in pairs):
        named.add(b"content-length")
    dropped = HOP_BY_HOP | named | frozenset(drop)
    return [(name, value) for name, value in pairs if name not in dropped]


def has_body(request: h11.Request) -> bool:
    return any(name in (b"content-length", b"transfer-encoding") for name, _ in request.headers)


class Client:
    """One connection of a client: h11's server side over the stream pair, replaceable by a TLS one
    (`restart`, after the connection became a tunnel)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle: float) -> None:
        self.reader, self.writer, self.idle = reader, writer, idle
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)

    def restart(self) -> None:
        """A new h11 connection on the same streams (inside the TLS just started on them)."""
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)

    async def next_event(self) -> h11.Event:
        """The client's next event; h11.RemoteProtocolError for bytes that are not HTTP/1.1."""
        while True:
            event = self.conn.next_event()
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:  # nothing is read after a CONNECT's head: its bytes are the tunnel's
                raise ClientGone("the connection is a tunnel")
            self.conn.receive_data(await self.reader.read(CHUNK))

    async def request(self) -> h11.Request | None:
        """The next request's head; None when the client closed between requests. The head is read in pieces
        that keep h11's buffer within a byte past MAX_HEAD, so that a larger head is refused even when it comes
        whole (h11 bounds only what is incomplete)."""
        while True:
            event = self.conn.next_event()
            if isinstance(event, h11.Request):
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            if event is not h11.NEED_DATA:
                raise ClientGone(f"expected a request, got {event}")
            buffered = len(self.conn.trailing_data[0])
            self.conn.receive_data(await self.reader.read(max(MAX_HEAD + 1 - buffered, 1)))

    async def end_of_request(self) -> None:
        """Reads the end of a request that has no body (h11 moves on only as its events are read)."""
        if not isinstance(await self.next_event(), h11.EndOfMessage):
            raise ClientGone("a body where none was announced")

    async def body(self) -> AsyncIterator[bytes]:
        """The request's body as it arrives (after a 100 Continue when the client waits for one)."""
        if self.conn.they_are_waiting_for_100_continue:
            await self.send(h11.InformationalResponse(status_code=100, headers=[]))
        while True:
            try:
                async with asyncio.timeout(self.idle):
                    event = await self.next_event()
            except h11.RemoteProtocolError as exc:
                raise ClientGone(f"the request's body is cut short ({exc})") from None
            if isinstance(event, h11.EndOfMessage):
                return
            if not isinstance(event, h11.Data):
                raise ClientGone(f"the request's body is cut short (got {type(event).__name__})")
            yield bytes(event.data)

    async def send(self, event: h11.Event) -> None:
        """Sends one event, waiting while the client reads slower than it comes (backpressure)."""
        data = self.conn.send(event)
        if data:
            self.writer.write(data)
            async with asyncio.timeout(self.idle):
                await self.writer.drain()

    async def respond(self, status: int, headers: Headers, reason: bytes = b"") -> None:
        phrase = reason or _phrase(status)
        await self.send(h11.Response(status_code=status, headers=headers, reason=phrase))

    async def answer(self, status: int, text: str) -> None:
        """A complete response of the proxy's own: `text` as a text/plain body, then the connection closes."""
        body = (text + "\n").encode()
        headers: Headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self.respond(status, headers)
        await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    def can_answer(self) -> bool:
        """Whether a response may still start (none begun on this request)."""
        return self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE)

    def next_cycle(self) -> bool:
        """Readies the connection for the client's next request; False when it must close instead (either
        side asked, or the request's body was not read to its end)."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            return True
        return False

    def trailing(self) -> bytes:
        """Bytes the client sent after its CONNECT request, before the answer: the tunnel's first."""
        return bytes(self.conn.trailing_data[0])

    async def linger(self) -> None:
        """Reads what the client still sends, for a moment, after the proxy's last answer: closing with bytes
        unread makes the kernel reset the connection, and the client could lose the answer with them."""
        with contextlib.suppress(OSError, RuntimeError):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(LINGER):
                read = 0
                while read < MAX_LINGER and (data := await self.reader.read(CHUNK)):
                    read += len(data)

    def close(self) -> None:
        self.writer.close()


def _phrase(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
