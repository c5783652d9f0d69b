"""The bot's logging: one format for every line, and no request body of a refused request in the log.

slack-bolt logs a request whose signature does not verify with its whole body ("Invalid request signature
detected (signature: …, timestamp: …, body: …)", slack_bolt/middleware/request_verification). Anyone can send
such a request, so the log would keep whatever a stranger writes into it, and a real request signed with a
rotated secret holds a person's message. That line is rewritten to say only that the request was refused.

slack_sdk's Socket Mode client logs an envelope it could not read (not JSON, nested past the recursion limit,
a payload of another shape) with a traceback of the library's frames; the client goes on, and so does the bot.
Those lines keep their one-line message (the error, never the envelope), without the traceback.

aiohttp's server logs a request it could not parse (headers too large, bad chunking, a line that is not HTTP)
as "Error handling request" with a traceback whose error quotes the stranger's bytes, at ERROR. Those lines
become one warning naming the error's type alone.
"""

from __future__ import annotations

import logging

from slack_bolt.middleware import RequestVerification

from chatops import logs

REFUSED = (
    "refused a request to the Slack endpoint: its signature did not verify (a forgery, a replay older than five "
    "minutes, or a SLACK_SIGNING_SECRET that is not the app's)"
)
# bolt names a middleware's logger after the class that asks for it (slack_bolt.logger.get_bolt_logger): the
# async verification inherits its logger from the sync one.
VERIFICATION_LOGGER = f"slack_bolt.{RequestVerification.__name__}"


# What slack_sdk's Socket Mode client says (through bolt's logger, the app's) of an envelope it could not read.
SOCKET_FAILURES = ("Failed to process a message", "Failed to run message listeners", "Failed to run a request listener")
BOLT_LOGGER = "mm.bot.bolt"
# aiohttp's server (aiohttp.log.server_logger) and what it says of a request it could not handle.
AIOHTTP_SERVER_LOGGER = "aiohttp.server"
MALFORMED_HTTP = ("Error handling request", "Unhandled exception")


class WithoutBody(logging.Filter):
    """Turns bolt's line about a refused signature, body included, into REFUSED, as a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Invalid request signature detected"):
            record.msg, record.args = REFUSED, ()
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


class WithoutTraceback(logging.Filter):
    """The Socket Mode client's failures to read an envelope, in one line, as warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(SOCKET_FAILURES):
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


class WithoutBytes(logging.Filter):
    """aiohttp's lines about a request it could not handle, in one warning: the error's type, not its message
    (which quotes what the stranger sent), nor the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        said = str(record.msg)
        if said.startswith(MALFORMED_HTTP):
            error = record.exc_info[1] if record.exc_info else None
            what = "refused a malformed HTTP request" if said.startswith("Error") else "an HTTP request failed"
            record.msg, record.args = f"{what} (%s)", (type(error).__name__ if error is not None else "no error",)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def setup_logging(secrets: list[str]) -> None:
    logs.setup_logging(secrets)
    logging.getLogger(VERIFICATION_LOGGER).addFilter(WithoutBody())
    logging.getLogger(BOLT_LOGGER).addFilter(WithoutTraceback())
    logging.getLogger(AIOHTTP_SERVER_LOGGER).addFilter(WithoutBytes())
