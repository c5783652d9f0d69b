"""`mm-bot audit` and `mm-bot purge`: the audit export and a thread's purge, from an operator's shell.

Both read the database the config names (DATABASE_URL) and nothing else: no Slack call, so links to threads are
built only when `--workspace-url` gives the workspace's address (each call always carries its channel and thread
ts), and a purge leaves the workspace's files to the workers' next housekeeping (workers/retention.py), as the
bot's `/mm purge` does: this shell may not mount the workspaces' volume.

Bad input (a time, an id, a link, an output file that exists) is one sentence on stderr and exit 2, with nothing
read or changed; an export written to `--output` appears there whole or not at all.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from sqlalchemy import Engine

from chatops import db
from chatops.audit import AuditFilter, BadFilter, calls, check_channel, check_user, parse_when
from chatops.audit_export import Written, write
from chatops.config import load_config
from chatops.inbox import session_of
from chatops.permalinks import BadLink, parse_link, workspace_url
from chatops.retention import PurgeOutcome, purge_session
from chatops.schema import utcnow
from chatops.secrets import mask_url, secrets_of
from commands.errors import CommandError


class Refused(CommandError):
    """What cannot be done as asked: str() says why, and what to do; nothing was read or changed."""


def audit(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    try:
        where = _filter(args)
        base = workspace_url(args.workspace_url) if args.workspace_url else None
        target = Path(args.output) if args.output else None
        if target is not None and (target.exists() or target.is_symlink()):
            raise Refused(f"--output: {target} exists: name another file, or remove it first")
        if target is not None and not target.parent.is_dir():
            raise Refused(f"--output: the directory {target.parent} does not exist")
    except (BadFilter, BadLink, Refused) as e:
        print(f"mm-bot audit: {e}", file=sys.stderr)
        return 2
    engine = _engine(config.database_url)
    try:
        found = calls(engine, where, secrets=secrets_of(config))
        if target is None:
            return _to_stdout(lambda out: write(found, out, args.format, workspace=base))
        written = _to_file(target, lambda out: write(found, out, args.format, workspace=base))
    finally:
        engine.dispose()
    print(f"mm-bot audit: {written.calls} tool call(s) written to {target}", file=sys.stderr)
    return 0


def purge(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    try:
        thread = parse_link(args.thread)
    except BadLink as e:
        print(f"mm-bot purge: --thread: {e}", file=sys.stderr)
        return 2
    engine = _engine(config.database_url)
    try:
        session = session_of(engine, thread.channel, thread.ts)
        if session is None:
            print(
                f"mm-bot purge: no session is in the thread {thread.ts} of {thread.channel}: nothing to purge "
                "(is it the link to the thread's first message, or to a reply in it?)",
                file=sys.stderr,
            )
            return 1
        done = purge_session(engine, session, by=_who(), why="mm-bot purge", secrets=secrets_of(config))
    finally:
        engine.dispose()
    where = f"mm-bot purge: the thread {thread.ts} of {thread.channel} (session {session})"
    if done is None or done.outcome == PurgeOutcome.BUSY:
        why = done.busy if done is not None else "it is gone"
        print(f"{where} is busy ({why}): nothing was purged; try again once it is idle", file=sys.stderr)
        return 1
    if done.outcome == PurgeOutcome.ALREADY:
        at = done.purged_at.strftime("%Y-%m-%d %H:%M UTC") if done.purged_at else "?"
        print(f"{where} was purged on {at} and has kept nothing since: nothing more to remove")
        return 0
    print(
        f"{where}: purged {done.events} log entry(ies), {done.messages} message(s) and {done.outputs} tool "
        "output(s); "
        f"the audit of its {done.calls} tool call(s) is kept. A worker removes its workspace at its next "
        "housekeeping."
    )
    return 0


def _filter(args: argparse.Namespace) -> AuditFilter:
    now = utcnow()
    since = parse_when(args.since, now, "--since") if args.since else None
    until = parse_when(args.until, now, "--until") if args.until else None
    if since is not None and until is not None and since >= until:
        raise BadFilter(f"--since ({since:%Y-%m-%d %H:%M} UTC) must come before --until ({until:%Y-%m-%d %H:%M} UTC)")
    return AuditFilter(
        since=since,
        until=until,
        channel=check_channel(args.channel) if args.channel else None,
        user=check_user(args.user) if args.user else None,
    )


def _engine(url: str) -> Engine:
    """The database's engine, once its schema is one this code reads (a newer one, after a rollback, is read as
    `migrate --check` lets the service run on it); DatabaseUnavailable or Refused, in words, otherwise."""
    current = db.current_revision(url)
    head = db.head_revision()
    if current != head and (current is None or db.known_revision(current)):
        at = f"is at revision {current}" if current else "has no schema yet"
        raise Refused(f"the database {mask_url(url)} {at}; this code needs {head}: run `mm-bot migrate` first")
    return db.engine_for(url)


def _to_stdout(export: Callable[[TextIO], Written]) -> int:
    try:
        export(sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`| head`): what it read was right; the rest is not wanted. Python would
        # complain flushing at exit, so stdout goes nowhere from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _to_file(target: Path, export: Callable[[TextIO], Written]) -> Written:
    """The export into a file beside `target`, renamed to it once whole: a failed export leaves nothing."""
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            written = export(out)
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return written


def _who() -> str:
    """Who purges from this shell, as the session's record keeps it."""
    try:
        return f"{getpass.getuser()} (mm-bot purge)"
    except (KeyError, OSError):  # no name for this uid (a container's)
        return f"uid {os.getuid()} (mm-bot purge)"
