"""`mm-bot`: the one command of the service (serve, worker, beat, migrate, dev, playground, run, doctor, init, audit,
purge).

A bad configuration is printed as the config module words it (`file:line: key: expected …`), without a
traceback, and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from chatops.config import SLACK_DOCS, ConfigError, load_config

DEFAULT_PORT = 3000
DEFAULT_HOST = "127.0.0.1"  # a deployment says --host 0.0.0.0 (the Helm chart does)

# What each secret is and where to find it, for the messages of `serve` and `dev`.
SECRET_HELP = {
    "SLACK_BOT_TOKEN": "the Bot User OAuth Token (xoxb-…), on the app's OAuth & Permissions page",
    "SLACK_SIGNING_SECRET": "the Signing Secret, on the app's Basic Information page",
    "SLACK_APP_TOKEN": "an app-level token (xapp-…) with connections:write, for Socket Mode",
    "SLACK_CLIENT_ID": "the Client ID, on the app's Basic Information page (installing in many workspaces)",
    "SLACK_CLIENT_SECRET": "the Client Secret, on the app's Basic Information page (installing in many workspaces)",
}


def _serve(args: argparse.Namespace) -> int:
    from bot.server import serve

    config = load_config(args.config)
    missing = config.missing_slack_secrets(socket_mode=args.socket)
    if missing and not args.dev:
        lines = [f"mm-bot serve: cannot start without {', '.join(missing)}:"]
        lines += [f"  {name}: {SECRET_HELP[name]}" for name in missing]
        lines.append(f"Set them in the environment (see {SLACK_DOCS}), or run `mm-bot dev`, which starts without them.")
        print("\n".join(lines), file=sys.stderr)
        return 2
    _export_config_path(args.config)  # Celery, which the bot enqueues through, reads the config by itself
    serve(config, host=args.host, port=args.port, socket_mode=args.socket, quiet=args.dev)
    return 0


def _worker(args: argparse.Namespace) -> int:
    load_config(args.config)  # fail here, worded, rather than inside Celery's start-up
    _export_config_path(args.config)
    from workers.celery_app import app

    # Under `mm-bot dev`, which says itself when the worker is up and what its sandbox is: no banner (Celery's
    # --quiet, an option of `celery`, before the command), warnings and errors only, and no sandbox check.
    celery = ["--quiet", "worker", "--loglevel=WARNING", "--dev"] if args.dev else ["worker", "--loglevel=INFO"]
    queues = [] if {"-Q", "--queues"} & set(args.passthrough) else ["--queues", _queues()]
    app.worker_main([*celery, *queues, *args.passthrough])
    return 0


def _beat(args: argparse.Namespace) -> int:
    load_config(args.config)
    _export_config_path(args.config)
    from workers.celery_app import app

    # Housekeeping's schedule and the config's jobs (workers/scheduler.py: one scheduler fires at a time). The
    # schedule file goes under ./var, beside the embedded database, not into the current directory.
    Path("var").mkdir(exist_ok=True)
    app.start(["beat", "--loglevel=INFO", "--schedule", str(Path("var") / "celerybeat-schedule"), *args.passthrough])
    return 0


def _queues() -> str:
    from workers.celery_app import HOUSEKEEPING_QUEUE, TURNS_QUEUE

    return f"{TURNS_QUEUE},{HOUSEKEEPING_QUEUE}"


def _migrate(args: argparse.Namespace) -> int:
    from chatops import db
    from chatops.secrets import mask_url

    config = load_config(args.config)
    url = config.database_url
    if args.check:
        return _migrate_check(url)
    before = db.current_revision(url)
    db.migrate(url, args.revision)
    after = db.current_revision(url)
    where = f"mm-bot migrate: {mask_url(url)}"
    if before == after:
        print(f"{where}: already at {after or 'the empty schema'}")
    else:
        print(f"{where}: from {before or 'an empty database'} to {after}")
    return 0


def _migrate_check(url: str) -> int:
    """Whether the schema is the code's (an init container waits on it while the migration hook runs)."""
    from chatops import db
    from chatops.secrets import mask_url

    where = f"mm-bot migrate --check: {mask_url(url)}"
    try:
        current = db.current_revision(url)
    except Exception as e:  # noqa: BLE001 - a database that does not answer yet is "not ready", said plainly
        print(f"{where}: cannot read the schema's revision: {e}", file=sys.stderr)
        return 1
    head = db.head_revision()
    if current is not None and current != head and not db.known_revision(current):
        # A newer release migrated it, and this one was rolled back to: the schema is kept (downgrading is the
        # newer release's `mm-bot migrate --revision`), and this code runs on it, as additive migrations allow.
        print(f"{where}: at {current}, newer than this code's {head} (a rollback?): going on with it")
        return 0
    if current != head:
        print(f"{where}: at {current or 'the empty schema'}, the code needs {head}", file=sys.stderr)
        return 1
    print(f"{where}: at {head}, as the code needs")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from commands.probe import live, ready

    ok, said = live(args.max_age) if args.what == "live" else ready(args.max_age)
    print(f"mm-bot probe {args.what}: {said}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _dev(args: argparse.Namespace) -> int:
    from commands.dev import run_dev

    return run_dev(args.config, host=args.host, port=args.port)


def _playground(args: argparse.Namespace) -> int:
    from commands.playground import run_playground

    return run_playground(
        args.config,
        args.host,
        args.port,
        expose=args.expose,
        demo=args.demo,
        browser=not args.no_browser,
        workspaces=args.workspaces,
    )


def _run(args: argparse.Namespace) -> int:
    try:
        terminal = importlib.import_module("commands.terminal")
    except ModuleNotFoundError as exc:
        if exc.name != "commands.terminal":
            raise
        print("mm-bot run: not available yet", file=sys.stderr)
        return 2
    _export_config_path(args.config)
    _warn_about_the_sandbox(args)
    return int(terminal.main(args.passthrough) or 0)


def _warn_about_the_sandbox(args: argparse.Namespace) -> None:
    # Where a worker would refuse to start, the terminal says it once and runs: it is the person's own machine,
    # which may well lack bubblewrap.
    if {"-h", "--help"} & set(args.passthrough):
        return
    from commands.doctor import sandbox_note

    note = sandbox_note(load_config(args.config).agent)
    if note is not None:
        print(f"mm-bot run: {note}", file=sys.stderr, flush=True)


def _doctor(args: argparse.Namespace) -> int:
    from commands.doctor import main as doctor

    return doctor(args.config)


def _init(args: argparse.Namespace) -> int:
    from chatops.config import example_config

    path = Path(args.path)
    if path.exists() and not args.force:
        print(f"mm-bot init: {path} already exists; use --force to overwrite it", file=sys.stderr)
        return 2
    text = example_config()
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"mm-bot init: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"mm-bot init: wrote {path}; edit it, then run `mm-bot doctor`")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from commands.audit import audit

    return audit(args)


def _purge(args: argparse.Namespace) -> int:
    from commands.audit import purge

    return purge(args)


def _export_config_path(path: str | None) -> None:
    # Celery and the terminal front end read the config themselves, through MM_CONFIG.
    if path is not None:
        os.environ["MM_CONFIG"] = str(Path(path).absolute())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mm-bot", description="mm chat-ops: a coding agent that teams use from Slack")
    parser.add_argument("--config", metavar="PATH", help="the config file (default: $MM_CONFIG, else ./mm.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], help: str, add_help: bool = True
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, add_help=add_help)
        p.set_defaults(handler=handler)
        return p

    def listen_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
        p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")

    p = command("serve", _serve, "serve Slack's requests: POST /slack/events and GET /healthz")
    listen_options(p)
    p.add_argument("--socket", action="store_true", help="receive Slack's requests over Socket Mode (SLACK_APP_TOKEN)")
    # Started by `dev`, which says what is missing and where the bot listens: the bot starts before the secrets
    # exist (it then refuses what it cannot verify), and prints nothing of its own at start.
    p.add_argument("--dev", action="store_true", help=argparse.SUPPRESS)

    p = command("worker", _worker, "run a Celery worker (extra arguments go to celery worker)")
    p.add_argument("--dev", action="store_true", help=argparse.SUPPRESS)  # started by `dev`: see _worker
    p.add_argument("passthrough", nargs=argparse.REMAINDER, help="e.g. --concurrency 4 -Q mm")
    p = command("beat", _beat, "run the scheduler: housekeeping and the config's jobs (one scheduler fires at a time)")
    p.add_argument("passthrough", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p = command("migrate", _migrate, "upgrade the database schema (DATABASE_URL)")
    p.add_argument("--revision", default="head", help="target revision (default head)")
    p.add_argument("--check", action="store_true", help="change nothing: exit 1 unless the schema is at the head")
    p = command("probe", _probe, "a pod's exec probe: live (the process beats) or ready (the worker takes turns)")
    p.add_argument("what", choices=["live", "ready"])
    p.add_argument(
        "--max-age", type=float, default=60.0, help="the oldest heartbeat still alive, in seconds (default 60)"
    )
    p = command(
        "dev",
        _dev,
        "everything one machine needs: migrations, the bot, a worker and the scheduler (the playground when there "
        "is no SLACK_BOT_TOKEN)",
    )
    listen_options(p)
    p = command("playground", _playground, "the bot in a Slack-like page of your browser, with no Slack workspace")
    listen_options(p)
    p.add_argument(
        "--expose",
        action="store_true",
        help="allow a --host other than loopback: unsafe, the page has no login and approves commands on this machine",
    )
    p.add_argument("--demo", action="store_true", help="use the scripted demo model even when a model answers")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument(
        "--workspaces",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: two Slack workspaces, the app installed in each through Slack's OAuth flow (default 1)",
    )
    # Its options (--help included) belong to the terminal front end.
    p = command(
        "run", _run, "the agent in the terminal, in the current directory (-p PROMPT: one shot)", add_help=False
    )
    p.add_argument("passthrough", nargs=argparse.REMAINDER)
    command("doctor", _doctor, "check the config, database, broker, model endpoint and Slack auth")
    p = command("audit", _audit, "export every tool call: who asked, the rule, each decision, the outcome")
    when = "an ISO date or time (UTC unless it says), or an age such as 7d or 24h"
    p.add_argument("--since", metavar="WHEN", help=f"calls asked from then on: {when}")
    p.add_argument("--until", metavar="WHEN", help="calls asked before then (the same forms)")
    p.add_argument("--channel", metavar="ID", help="calls of one channel (C…)")
    p.add_argument("--user", metavar="ID", help="calls one person asked for or decided on (U…)")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="jsonl (default) or csv")
    p.add_argument("--output", metavar="FILE", help="write there (a new file) instead of to stdout")
    p.add_argument(
        "--workspace-url",
        metavar="URL",
        help="the workspace's address (https://acme.slack.com): links to each thread; without it, channel and ts",
    )
    p = command("purge", _purge, "remove one thread's log, messages, tool outputs and workspace; keep its audit")
    p.add_argument("--thread", required=True, metavar="LINK", help="the link to the thread (Slack's Copy link)")
    p = command("init", _init, "write a commented example config")
    p.add_argument("--path", default="mm.yaml", help="where to write it (default ./mm.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    return parser


PASSTHROUGH = ("worker", "beat", "run")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """`worker` and `run` hand their arguments on untouched (to Celery, to the terminal front end)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command not in PASSTHROUGH:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        return args
    # argparse puts leading options it does not know in `unknown` and the rest, from the first word on, in
    # the REMAINDER: together, in order, they are what the user typed after the command.
    rest = [*unknown, *args.passthrough]
    args.passthrough = rest[1:] if rest[:1] == ["--"] else rest
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not _worded(exc):
            raise
        print(f"mm-bot {args.command}: {exc}", file=sys.stderr)
        return 1


# Errors whose str() is the whole sentence, with the fix: (module, class).
WORDED_ERRORS = (
    ("chatops.db", "DatabaseUnavailable"),
    ("bot.server", "CannotListen"),
    ("commands.playground", "Refused"),
    ("commands.audit", "Refused"),
)


def _worded(exc: Exception) -> bool:
    # Those modules are imported only by the commands that use them (chatops.db takes half a second), so an
    # error class is looked up only once its module is there, which it is whenever it can have been raised.
    for module, name in WORDED_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


if __name__ == "__main__":
    sys.exit(main())
