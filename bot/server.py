"""The bot's HTTP endpoint: `POST /slack/events` (events, interactivity, slash commands) and `GET /healthz`.

In Socket Mode the same server still answers /healthz (the probes of a deployment need it), and Slack's
requests arrive over the socket instead of /slack/events.

A request to /slack/events is checked before anything reads it: its signature (Slack's, with the signing
secret, over the raw body, its timestamp within five minutes) or 401, then its shape (UTF-8, the JSON or form
Slack sends, an object) or 400; no stranger's body reaches a parser, and no body of any shape reaches bolt's
listeners unparsed or makes a traceback. A body that cannot be read (a connection dropped in the middle of it)
is a 400; bodies are taken as sent (`auto_decompress` off: Slack never compresses, and a stranger's compressed
body is only bytes whose signature does not verify). Bolt checks the signature again (defence in depth).
Beside the server run who the bot is (bot.app.Identity) and the replay of requests left unfinished
(bot.requests).

The process ends when the server has shut down, without waiting for threads still blocked in a call that no
timeout ends (a database that accepts connections and never answers): nothing they could finish matters once
the server is gone, and a SIGTERM must end the pod.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import text

from bot.app import IDENTITY_TIMEOUT, SlackApp, create_app
from bot.before_ack import WAIT_S, release_threads
from bot.errors import BotError
from bot.logging_setup import REFUSED, setup_logging
from chatops.config import SLACK_DOCS
from chatops.heap import freeze_loaded
from chatops.secrets import secrets_of
from slackio.metrics import serve_metrics
from workers.celery_app import traced

if TYPE_CHECKING:
    from chatops.config import Config

log = logging.getLogger("mm.bot")

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
DB_PROBE_TIMEOUT = 2.0
# How long the shutdown waits for the engines to close their idle connections.
DISPOSE_TIMEOUT = 5.0
# The process's engine for the work after the ack: connecting waits this long at most (a silent database).
CONNECT_TIMEOUT_S = 10


def build_web_app(config: Config, socket_mode: bool = False) -> web.Application:
    """The aiohttp application. With Slack secrets missing it still starts (so `mm-bot dev` and the probes
    work) but refuses Slack's requests: without the signing secret it cannot tell Slack from a forger."""
    from chatops import db

    web_app = web.Application()
    missing = config.missing_slack_secrets(socket_mode=socket_mode)
    engine = db.engine_for(config.database_url, **_connect_timeout(config.database_url))
    # The work before the ack, on an engine of its own whose every wait is bounded (bot.before_ack).
    inbound = db.engine_for(config.database_url, wait_s=WAIT_S)
    slack = None if missing else create_app(config, engine, inbound)
    verifier = SignatureVerifier(config.slack_signing_secret) if config.slack_signing_secret else None
    probe = _Probe(engine)

    async def health(_request: web.Request) -> web.Response:
        # Liveness must not flap with the database (restarting the bot would not fix it), so this is
        # always 200 and says what it knows; `mm-bot doctor` explains a failure. The pid lets `mm-bot dev`
        # tell its own bot from another process that answers on the same port.
        reachable = await probe.reachable()
        return web.json_response(
            {"ok": True, "database": reachable, "slack": not missing, "missing": missing, "pid": os.getpid()}
        )

    async def events(request: web.Request) -> web.Response:
        if slack is None or verifier is None:
            status = 401 if "SLACK_SIGNING_SECRET" in missing else 503
            return web.json_response({"ok": False, "error": f"not configured: set {', '.join(missing)}"}, status=status)
        return await _events(slack, verifier, request)

    async def dispose(_app: web.Application) -> None:
        if slack is not None:
            # Not waited for past DISPOSE_TIMEOUT: a connection a silent database holds may never close.
            closing = asyncio.ensure_future(slack.inbox.close())
            if not (await asyncio.wait({closing}, timeout=DISPOSE_TIMEOUT))[0]:
                log.warning("the inbox's connections did not close within %.0f s; leaving them", DISPOSE_TIMEOUT)
        # On a thread of its own: the default executor may be full of threads a silent database holds.
        done = asyncio.get_running_loop().create_future()

        def close() -> None:
            for each in (inbound, engine):
                each.dispose()
            done.get_loop().call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        threading.Thread(target=close, name="mm-dispose", daemon=True).start()
        try:
            await asyncio.wait_for(done, DISPOSE_TIMEOUT)
        except TimeoutError:
            log.warning("the database connections did not close within %.0f s; leaving them", DISPOSE_TIMEOUT)

    web_app.router.add_get(HEALTH_PATH, health)
    if not socket_mode:
        web_app.router.add_post(EVENTS_PATH, events)
    if slack is not None and (flow := slack.bolt.oauth_flow) is not None:
        # Installing in a workspace (docs/slack-app.md): bolt's flow, over HTTP and beside Socket Mode alike.
        async def install(request: web.Request) -> web.Response:
            return await to_aiohttp_response(await flow.handle_installation(await to_bolt_request(request)))

        async def redirected(request: web.Request) -> web.Response:
            return await to_aiohttp_response(await flow.handle_callback(await to_bolt_request(request)))

        web_app.router.add_get(flow.install_path, install)
        web_app.router.add_get(flow.redirect_uri_path, redirected)
    web_app.on_cleanup.append(dispose)
    if slack is not None:
        web_app.cleanup_ctx.append(_beside(slack))
    if socket_mode and slack is not None:
        web_app.cleanup_ctx.append(_socket_mode(slack.bolt, config.slack_app_token or ""))
    return web_app


def _connect_timeout(url: str) -> dict:
    """PostgreSQL's connection attempts bounded (libpq waits forever by default); SQLite needs none."""
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}} if "postgres" in url.split(":", 1)[0] else {}


async def _events(slack: SlackApp, verifier: SignatureVerifier, request: web.Request) -> web.Response:
    try:
        body = await request.read()  # at most aiohttp's client_max_size (1 MiB): a larger body is a 413
    except web.HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever broke it (a dropped connection, bad chunking), unreadable
        return _refused(400, "unreadable request body", f"its body could not be read ({type(exc).__name__})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:  # Slack signs and sends UTF-8 only
        return _refused(400, "malformed request body", "its body is not UTF-8")
    headers = request.headers
    try:
        signed = verifier.is_valid(text, headers.get("X-Slack-Request-Timestamp"), headers.get("X-Slack-Signature"))
    except ValueError:  # a timestamp that is not a number
        signed = False
    if not signed:
        log.warning(REFUSED)
        return web.json_response({"ok": False, "error": "invalid signature"}, status=401)
    try:
        # Parsed as bolt parses it (JSON, a form, a form's JSON `payload`), and read for its ids: a shape no
        # parser expects (a list, a string, nesting deep enough to exhaust the recursion limit) raises here.
        bolt_request = AsyncBoltRequest(body=text, query=request.query_string, headers=dict(headers))
    except Exception as exc:  # noqa: BLE001 - whatever the shape, the answer is the same
        return _refused(400, "malformed request body", f"signed, but not a body Slack sends ({type(exc).__name__})")
    if not isinstance(bolt_request.body, dict):
        return _refused(400, "malformed request body", "signed, but its body is not an object")
    try:
        return await to_aiohttp_response(await slack.bolt.async_dispatch(bolt_request))
    except Exception as exc:  # noqa: BLE001 - bolt answers its own errors; this is ours, around it
        log.error("a signed Slack request failed (%s); not acked, so Slack may send it again", type(exc).__name__)
        return web.json_response({"ok": False, "error": "internal error"}, status=500)


def _refused(status: int, error: str, why: str) -> web.Response:
    log.warning("refused a request to the Slack endpoint: %s", why)
    return web.json_response({"ok": False, "error": error}, status=status)


def _beside(slack: SlackApp) -> Callable:
    """What runs beside the server: the hand-off process (bot.hand_off), who the bot is, asked before it listens
    (for at most IDENTITY_TIMEOUT, then again in the background until Slack answers), and the replay of
    unfinished requests."""

    async def context(_app: web.Application):
        await slack.hand_off.start()
        tasks = [asyncio.create_task(slack.requests.keep(slack.client_for))]
        if (identity := slack.identity) is not None:  # one workspace's token: who the bot is, asked once
            try:
                known = await asyncio.wait_for(identity.learn(), IDENTITY_TIMEOUT)
            except TimeoutError:
                known = False
            if not known:
                tasks.append(asyncio.create_task(identity.keep_learning()))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await slack.hand_off.close()  # once nothing more is handed off: what it was given is published

    return context


class _Probe:
    """Whether the database answers, for /healthz: one probe at a time, so that a database that never answers
    holds one thread, however often the probes ask (each waits DB_PROBE_TIMEOUT at most)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._running: asyncio.Future[None] | None = None

    def _probe(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    async def reachable(self) -> bool:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(asyncio.to_thread(self._probe))
        try:
            await asyncio.wait_for(asyncio.shield(self._running), DB_PROBE_TIMEOUT)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"; the reason goes to the log
            log.warning("database not reachable: %s", exc or type(exc).__name__)
            return False


class CannotListen(BotError):
    """The server cannot listen where it was told to; str() is the sentence with the fix."""


def port_taken(host: str, port: int) -> CannotListen:
    return CannotListen(
        f"{host}:{port} is already in use by another process: stop what holds it, or pass --port with a free port"
    )


def check_port(host: str, port: int) -> None:
    """Raises CannotListen when the server could not listen on host:port, by binding every address the server
    would (a name such as localhost can have two), before anything else starts or prints."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotListen(
            f"cannot listen on {host}:{port}: {exc.strerror}; pass --host with an address of this machine"
        ) from None
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # As aiohttp binds: a port whose last connections linger in TIME_WAIT is free, a listening one is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise port_taken(host, port) from None
                raise CannotListen(
                    f"cannot listen on {host}:{port}: {exc.strerror}; pass --host and --port that this machine allows"
                ) from None


class SocketModeRefused(BotError):
    """Slack said no to SLACK_APP_TOKEN: no retry will change that."""


def _socket_mode(bolt, app_token: str) -> Callable:
    from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

    async def context(_app: web.Application):
        url = await _first_socket_url(bolt.client, app_token)
        handler = AsyncSocketModeHandler(bolt, app_token)
        handler.client.wss_uri = url  # None: the client asks for one itself, with its own retries
        await handler.connect_async()
        yield
        await handler.close_async()

    return context


async def _first_socket_url(client, app_token: str) -> str | None:
    """The app-level token checked once, at start-up. slack_sdk's client retries every failure every 5 seconds
    with a traceback, forever; a refused token never heals, so that ends the server in one sentence instead.
    Slack not answering, or rate limiting, is left to the client's retries."""
    from slack_sdk.errors import SlackApiError

    try:
        return (await client.apps_connections_open(app_token=app_token))["url"]
    except SlackApiError as exc:
        error = exc.response.get("error")
        if error == "ratelimited":
            return None
        raise SocketModeRefused(
            f"Slack refused SLACK_APP_TOKEN ({error}): it must be the app-level token (xapp-…) with "
            f"connections:write, from the app's Basic Information page; see {SLACK_DOCS}"
        ) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("Slack did not answer apps.connections.open (%s); retrying", exc)
        return None


def serve(config: Config, host: str, port: int, socket_mode: bool = False, quiet: bool = False) -> None:
    """Serve until SIGINT/SIGTERM (aiohttp's run_app handles both and shuts down cleanly).

    Raises CannotListen when host:port is taken or not this machine's. `quiet`: say nothing at start (`mm-bot
    dev` says where the bot listens and what is missing, once)."""
    check_port(host, port)
    setup_logging(secrets_of(config))
    serve_metrics()  # on MM_METRICS_PORT when set: never on the public port, behind the Ingress
    _trace_requests()
    web_app = build_web_app(config, socket_mode=socket_mode)
    routes = f"GET {HEALTH_PATH}" if socket_mode else f"POST {EVENTS_PATH}, GET {HEALTH_PATH}"
    if config.oauth:
        routes += ", GET /slack/install, GET /slack/oauth_redirect"
    mode = "; Slack over Socket Mode" if socket_mode else ""

    def announce(_message: str) -> None:  # called by run_app once the socket is bound
        if not quiet:
            print(f"mm-bot serve: listening on http://{host}:{port} ({routes}){mode}", flush=True)

    missing = config.missing_slack_secrets(socket_mode=socket_mode)
    if missing and not quiet:
        print(
            f"mm-bot serve: {', '.join(missing)} not set: Slack requests are refused until you set "
            f"{'it' if len(missing) == 1 else 'them'}; see {SLACK_DOCS}",
            file=sys.stderr,
            flush=True,
        )
    freeze_loaded()  # what start-up loaded is kept for the process's life: no full collection walks it again
    try:
        # Slack never compresses what it sends: bodies are taken as sent (a compressed one does not verify).
        web.run_app(web_app, host=host, port=port, print=announce, access_log=None, auto_decompress=False)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:  # taken since check_port looked
            raise
        raise port_taken(host, port) from None
    except SocketModeRefused as exc:
        print(f"mm-bot serve: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    _end_without_stuck_threads()


def _trace_requests() -> None:
    """With traces on (the OTEL_* variables, slackio.traces): a server span for each request to the Slack
    endpoint, which the listeners' hand-off continues (bot.handlers), so a turn is in its request's trace. The
    probes' /healthz is left out unless the variables name what to leave out."""
    if not traced("mm-bot"):
        return
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

    if not any(os.environ.get(n) for n in ("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS", "OTEL_PYTHON_EXCLUDED_URLS")):
        os.environ["OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS"] = HEALTH_PATH
    AioHttpServerInstrumentor().instrument()  # the web.Application made next carries its middleware


# How long the threads left at shutdown get to end: an idle pool thread ends within it, a blocked one never does.
IDLE_GRACE_S = 1.0


def _end_without_stuck_threads() -> None:
    """The server has shut down: end the process now when threads are still blocked (a database or a broker
    that never answers: no timeout of theirs ends such a call, and Python would wait for them at exit)."""
    release_threads()  # idle threads of the pools end at once; one blocked in a call never does
    deadline = time.monotonic() + IDLE_GRACE_S
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if not left:
        return
    log.info("ending without waiting for %d worker thread(s) (any may be blocked on the database)", len(left))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
