"""The egress proxy: with `network: allow`, a sandboxed command's only way out (docs/network.md).

The command's network namespace holds nothing but its loopback, where the worker binds a listening socket for
each command and hands it to `EgressProxy.serve` with the channel's policy: the command reaches the outside
only through it (HTTP_PROXY, HTTPS_PROXY), each connection decided as session.py says, and the credentials are
added here, outside the sandbox, so the command never holds them.

One proxy per process (`egress_proxy()`): a daemon thread runs its own event loop, so the proxy's traffic never
waits on a turn's loop, and a listener outlives the turn that started its command. The listener is served until
`Tap.close()`, or until `until_fd` (the read end of a pipe whose write end the command's processes hold) reads
end-of-file: the command's last process has ended, and its connections are closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import resource
import select
import socket
import ssl
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from mm_core.network.ca import CertificateAuthority
from mm_core.network.h1 import Client
from mm_core.network.policy import EgressPolicy
from mm_core.network.session import TOO_MANY, Gate, Limits, Session, upstream_client
from mm_core.network.tap import Tap, TapRecord
from mm_core.tools.fetch.guard import AddressGuard, Lookup

__all__ = ["EgressProxy", "Limits", "Tap", "TapRecord", "egress_proxy"]

log = logging.getLogger(__name__)


# accept(2) failures that pass: the system is short of descriptors or memory for a moment.
TRANSIENT = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
ACCEPT_RETRY = 1.0
# Connections of one listener past its limit are answered 503 (each lingers a moment) up to this many times the
# limit at once; past that they are closed unanswered, so one command cannot fill the process's bound.
OVER_LIMIT_ANSWERS = 2


class _Listener:
    """One listening socket served on the proxy's loop, its connections, and its tap. Everything but `stop` runs
    on the loop."""

    def __init__(
        self,
        proxy: EgressProxy,
        sock: socket.socket,
        policy: EgressPolicy,
        fetch_allow: Sequence[str],
        until_fd: int | None,
    ) -> None:
        self.proxy, self.sock, self.policy, self.until_fd = proxy, sock, policy, until_fd
        self.limits = proxy.limits
        self.guard = AddressGuard(fetch_allow, policy=policy, lookup=proxy.lookup)
        self.tap = Tap(stop=self.stop)
        # Taken now, when the command starts with the bundle as it is: its leaves are signed by this one.
        self.authority = proxy.ca.authority()
        self.sessions: set[asyncio.Task[None]] = set()  # what the limit counts
        self.tasks: set[asyncio.Task[None]] = set()  # every connection's, the over-the-limit answers included
        self.adopting: set[asyncio.Task[None]] = set()  # accepted connections getting their streams
        self.gate: Gate | None = None
        self.finished: asyncio.Task[None] | None = None
        # `until_fd` watched for its hang-up alone (an epoll with no event asked for): the command holds the
        # pipe's write end and may write into it, which must not wake this thread for every byte.
        self.hangup: select.epoll | None = None

    def stop(self) -> None:
        """Stops serving (from any thread)."""
        with contextlib.suppress(RuntimeError):  # the proxy's loop is closed: all is stopped already
            self.proxy.loop.call_soon_threadsafe(self.shut)

    def start(self) -> None:
        if self.finished is not None:  # stopped before it started
            return
        http = upstream_client(self.guard, self.proxy.upstream_ssl, self.limits)
        self.gate = Gate(self.policy, self.guard, http, self.proxy.ca, self.authority, self.limits, self.tap)
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        if self.until_fd is not None:
            self.hangup = select.epoll()
            self.hangup.register(self.until_fd, 0)  # EPOLLHUP and EPOLLERR are reported whatever is asked
            loop.add_reader(self.hangup.fileno(), self.watch)
        self.listen()

    def listen(self) -> None:
        # Accepted here, as asyncio's own servers do, rather than by an asyncio.Server or sock_accept: in 3.11
        # both can drop a connection accepted just as they are closed or cancelled, leaving it open and unserved.
        if self.finished is None:
            asyncio.get_running_loop().add_reader(self.sock.fileno(), self.accept)

    def accept(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.limits.max_connections):  # then other work gets its turn
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                loop.remove_reader(self.sock.fileno())
                if exc.errno not in TRANSIENT:
                    log.warning("egress: the proxy stops serving a listener: %s", exc)
                    self.shut()
                    return
                log.warning("egress: the proxy cannot accept a connection now: %s", exc)
                loop.call_later(ACCEPT_RETRY, self.listen)
                return
            if self.proxy.connections() >= self.limits.max_process_connections:
                # The worker's descriptors are its sessions' too: past the bound, no answer is worth one more.
                log.debug("egress: a connection over the process's limit of %d", self.limits.max_process_connections)
                conn.close()
                continue
            conn.setblocking(False)
            # Never cancelled: it ends at once, and `serve` closes what comes after `shut`.
            adopting = loop.create_task(self.adopt(conn))
            self.adopting.add(adopting)
            adopting.add_done_callback(self.adopting.discard)

    async def adopt(self, conn: socket.socket) -> None:
        def streams() -> asyncio.StreamReaderProtocol:
            # As asyncio.start_server makes them: with a callback, the connection is a server's, and
            # StreamWriter.start_tls takes the server's side of TLS.
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self.serve)

        try:
            await asyncio.get_running_loop().connect_accepted_socket(streams, conn)
        except BaseException:
            conn.close()
            raise

    def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = Client(reader, writer, self.limits.idle_timeout)
        if self.finished is not None or self.gate is None:
            client.close()
            return
        loop = asyncio.get_running_loop()
        if len(self.sessions) < self.limits.max_connections:
            task = loop.create_task(Session(client, self.gate).run())
            self.sessions.add(task)
            task.add_done_callback(self.sessions.discard)
        elif len(self.tasks) < OVER_LIMIT_ANSWERS * self.limits.max_connections:
            task = loop.create_task(self.refuse(client))
        else:
            client.close()  # a command reconnecting as fast as it can: no answer, nothing held for it
            return
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        # Closed when the task ends, however: a task cancelled before it began runs none of its code.
        task.add_done_callback(lambda _: client.close())

    async def refuse(self, client: Client) -> None:
        log.debug("egress: a connection over the limit of %d is refused", self.limits.max_connections)
        with contextlib.suppress(OSError):
            await client.answer(503, TOO_MANY.format(limit=self.limits.max_connections))
            await client.linger()

    def watch(self) -> None:
        """`until_fd` hung up: the command's processes are all gone."""
        assert self.hangup is not None
        if self.hangup.poll(0):
            self.shut()

    def shut(self) -> None:
        """Closes the listener and every connection it accepted (on the loop)."""
        if self.finished is not None:
            return
        if self.hangup is not None:
            asyncio.get_running_loop().remove_reader(self.hangup.fileno())
            self.hangup.close()
        if self.until_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.until_fd)
        with contextlib.suppress(OSError, ValueError):  # the socket failed, or was never listened on
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()
        for task in self.tasks:
            task.cancel()
        self.finished = asyncio.get_running_loop().create_task(self.finish())

    async def finish(self) -> None:
        await asyncio.gather(*self.tasks, *self.adopting, return_exceptions=True)
        if self.gate is not None:
            await self.gate.http.aclose()
        self.proxy.listeners.discard(self)
        self.tap.mark_closed()
        log.debug("egress: a listener is closed: %s", self.tap.snapshot())


# Descriptors the worker keeps for everything but the proxy (its database, broker, Slack and model connections,
# its sessions' pipes and files), and the most the proxy raises the soft limit to.
RESERVED_DESCRIPTORS = 256
MAX_DESCRIPTORS = 65536


def _within_descriptors(limits: Limits) -> Limits:
    """`limits` with the process's connection bound within its descriptors: the soft RLIMIT_NOFILE is raised to
    the hard one (containers often start at 1024), then each proxied connection counts three (the command's, the
    host's, a kept-alive one of the listener's pool) beside RESERVED_DESCRIPTORS for the rest of the worker."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    room = MAX_DESCRIPTORS if soft == resource.RLIM_INFINITY else soft
    bound = max(16, (room - RESERVED_DESCRIPTORS) // 3)
    return dataclasses.replace(limits, max_process_connections=min(limits.max_process_connections, bound))


class EgressProxy:
    """The proxy and its thread (see the module's docstring). `lookup` resolves host names (None: the system's
    resolver; a test passes its own); `upstream_ssl` verifies the credentialed hosts' certificates (None:
    httpx's default, which honours the operator's SSL_CERT_FILE); `limits` the bounds (session.Limits)."""

    def __init__(
        self, lookup: Lookup | None = None, upstream_ssl: ssl.SSLContext | None = None, limits: Limits | None = None
    ) -> None:
        self.lookup = lookup
        self.upstream_ssl = upstream_ssl if upstream_ssl is not None else httpx.create_ssl_context()
        # The credentials go over this TLS only: to a server whose certificate and name are verified.
        if self.upstream_ssl.verify_mode != ssl.CERT_REQUIRED or not self.upstream_ssl.check_hostname:
            raise ValueError("upstream_ssl must verify certificates and host names")
        self.limits = _within_descriptors(limits or Limits())
        self.ca = CertificateAuthority()
        self.loop = asyncio.new_event_loop()
        self.listeners: set[_Listener] = set()  # touched on the loop only
        self._closed = False
        self._thread = threading.Thread(target=self.loop.run_forever, name="mm-egress-proxy", daemon=True)
        self._thread.start()

    def serve(
        self,
        listener: socket.socket,
        policy: EgressPolicy,
        fetch_allow: Sequence[str] = (),
        until_fd: int | None = None,
    ) -> Tap:
        """Serves `listener` (a listening TCP socket, now the proxy's) with `policy` and the SSRF guard's
        `fetch_allow`, until the tap is closed or `until_fd` reads end-of-file (it is closed then); returns at
        once. Thread-safe."""
        if self._closed:
            listener.close()
            if until_fd is not None:
                os.close(until_fd)
            raise RuntimeError("the egress proxy is closed")
        served = _Listener(self, listener, policy, fetch_allow, until_fd)

        def begin() -> None:
            self.listeners.add(served)
            try:
                served.start()
            except Exception:  # out of descriptors for its epoll, say: the command's listener is closed, not left
                log.exception("egress: a listener could not start")
                served.shut()

        self.loop.call_soon_threadsafe(begin)
        return served.tap

    def connections(self) -> int:
        """The connections every listener holds now (on the loop)."""
        return sum(len(served.tasks) + len(served.adopting) for served in self.listeners)

    def bundle_path(self) -> Path:
        """The CA bundle a sandboxed command trusts (SSL_CERT_FILE and its kin): the system's roots and the
        proxy's authority."""
        return self.ca.bundle_path()

    def close(self, timeout: float = 10.0) -> None:
        """Closes every listener and stops the thread (not from the proxy's own thread)."""
        if self._closed:
            return
        self._closed = True
        future = asyncio.run_coroutine_threadsafe(self._close_listeners(), self.loop)
        with contextlib.suppress(TimeoutError):
            future.result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
        self.ca.close()

    async def _close_listeners(self) -> None:
        for served in list(self.listeners):
            served.shut()
        await asyncio.gather(*(s.finished for s in list(self.listeners) if s.finished), return_exceptions=True)


_lock = threading.Lock()
_proxy: tuple[int, EgressProxy] | None = None


def egress_proxy() -> EgressProxy:
    """The process's proxy, made on first use. A child forked after it was made gets its own: the thread did
    not come along."""
    global _proxy
    with _lock:
        if _proxy is None or _proxy[0] != os.getpid():
            _proxy = (os.getpid(), EgressProxy())
        return _proxy[1]


@contextlib.contextmanager
def use_egress_proxy(proxy: EgressProxy) -> Iterator[EgressProxy]:
    """`proxy` as this process's while in the block, then closed and the one before it back: a test's, made with
    its own resolver (mm_testkit.netlab). No setting reaches it: only code that makes a proxy can."""
    global _proxy
    with _lock:
        before, _proxy = _proxy, (os.getpid(), proxy)
    try:
        yield proxy
    finally:
        with _lock:
            _proxy = before
        proxy.close()
