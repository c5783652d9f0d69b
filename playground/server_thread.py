"""An aiohttp application served from a thread of its own (on 127.0.0.1 unless told otherwise, or on a listening
socket made beforehand: one in a test's network namespace, mm_testkit/netlab.py), so synchronous code (tests, the
playground's supervisor) can use it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from typing import Self

from aiohttp import web


class ThreadedAiohttpServer:
    """Base for the kit's servers: `start()` / `stop()` or a `with` block; `port` once started.

    Subclasses build their routes in `make_app()`. Handlers that wait for long (stalls) should wait on
    `self.stopping` so that `stop()` never hangs on them. With `sock` (a listening TCP socket) the server serves
    on it, `host` and `port` being its address; it is closed when the server stops.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        if sock is not None:
            host, port = sock.getsockname()[:2]
        self.host, self._wanted_port, self._sock = host, port, sock
        self.ssl_context = ssl_context  # set (before start) to serve HTTPS
        self.port: int = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.stopping: asyncio.Event | None = None

    def make_app(self) -> web.Application:
        raise NotImplementedError

    @property
    def base(self) -> str:
        """`http://127.0.0.1:<port>` (https with an ssl_context; no trailing slash)."""
        if not self.port:
            raise RuntimeError(f"{type(self).__name__} is not started")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host if ':' not in host else f'[{host}]'}:{self.port}"

    def start(self) -> Self:
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []
        self._loop = asyncio.new_event_loop()

        async def setup() -> None:
            self.stopping = asyncio.Event()
            # handler_cancellation: a client that hangs up ends its handler (endless streams stop with it).
            self._runner = web.AppRunner(
                self.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
            )
            await self._runner.setup()
            site = (
                web.TCPSite(self._runner, self.host, self._wanted_port, ssl_context=self.ssl_context)
                if self._sock is None
                else web.SockSite(self._runner, self._sock, ssl_context=self.ssl_context)
            )
            await site.start()
            self.port = self._runner.addresses[0][1]

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(setup())
            except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        loop = self._loop

        async def teardown() -> None:
            assert self.stopping is not None and self._runner is not None
            self.stopping.set()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(teardown(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=30)
        loop.close()
        self._thread = None
        self._loop = None
        self.port = 0

    async def wait_or_stop(self, seconds: float) -> None:
        """Sleep `seconds`, cut short when the server stops."""
        assert self.stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
