"""Every process's log: one format, the session a line is about, and no secret in any line.

- **Format**: plain lines for a terminal, or one JSON object a line (`MM_LOG_FORMAT=json`, what the chart sets)
  for a log pipeline: `time`, `level`, `logger`, `message`, `session_id` when the line is about a session, and
  `exc_info` for a traceback.
- **Session**: the worker sets `session_id` (a context variable) around a session's work, so every line logged
  meanwhile, by any module, carries it.
- **Redaction**: the final text of every line (message, arguments, traceback) is scrubbed of the secrets the
  process knows (Slack's tokens and signing secret, the model's key, the git token, the URLs' passwords) and of
  any password written in a URL: a library that puts a token in an exception, or a tool output quoted in a
  warning, cannot carry it into the log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from chatops.secrets import MASK, scrub

FORMAT_ENV = "MM_LOG_FORMAT"
PLAIN = "%(asctime)s %(levelname)s %(name)s%(session)s: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"

session_id: ContextVar[str | None] = ContextVar("session_id", default=None)

# user:password@ in any URL-looking text (scheme://user:password@host): the password is masked. A scheme is
# looked for within 32 characters: unbounded, every start in a long run of letters scanned to its end (a line
# of 4 MB a tool printed took minutes).
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]{0,31}://[^\s:/@]*:)(?P<password>[^\s@/]+)@")


def redact(text: str, secrets: list[str]) -> str:
    """The text without the secrets (also as JSON escapes them) nor any URL's password."""
    text = scrub(text, [*secrets, *(json.dumps(s)[1:-1] for s in secrets)])
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}@", text)


class _Session(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        current = session_id.get()
        record.session_id = current
        record.session = f" [session {current}]" if current else ""
        return True


class _Redacting(logging.Formatter):
    """Formats with `inner`, then redacts the whole line, traceback included."""

    def __init__(self, inner: logging.Formatter, secrets: list[str]) -> None:
        super().__init__()
        self.inner, self.secrets = inner, secrets

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record), self.secrets)


# A record's own attributes: every other one (session_id, and a call's `extra`) becomes a field.
_RESERVED = [
    *logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys(),
    "message",
    "asctime",
    "taskName",
]


def _json() -> logging.Formatter:
    return JsonFormatter(
        JSON_FIELDS,
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        reserved_attrs=[*_RESERVED, "session"],
        datefmt="%Y-%m-%dT%H:%M:%S%z",
    )


def log_format(environ: dict[str, str] | None = None) -> tuple[str, str | None]:
    """ "plain" or "json", and what to say about a value that is neither (then plain lines are kept)."""
    value = (os.environ if environ is None else environ).get(FORMAT_ENV, "").strip().lower()
    if value in ("", "plain", "json"):
        return value or "plain", None
    return "plain", f"{FORMAT_ENV}={value[:40]!r} is neither `plain` nor `json`: the log stays in plain lines"


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is not SystemExit:
        exc = (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)
        logging.getLogger("mm").error("uncaught in thread %s", getattr(args.thread, "name", "?"), exc_info=exc)


def setup_logging(secrets: list[str], level: int | str = logging.INFO, stream: Any = None) -> None:
    """Route every logger through one handler on the root: the chosen format, the session, redaction."""
    handler = logging.StreamHandler(stream or sys.stderr)
    chosen, problem = log_format()
    inner = _json() if chosen == "json" else logging.Formatter(PLAIN)
    handler.setFormatter(_Redacting(inner, sorted(set(secrets), key=len, reverse=True)))
    handler.addFilter(_Session())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Warnings and a thread's uncaught exception go through the same handler (redacted), not straight to stderr.
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin registry is chatter at INFO
    if problem:
        logging.getLogger("mm.logs").warning(problem)
