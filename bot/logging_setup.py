"""The bot's logging: one format for every line, and no request body of a refused request in the log.

slack-bolt logs a request whose signature does not verify with its whole body ("Invalid request signature
detected (signature: …, timestamp: …, body: …)", slack_bolt/middleware/request_verification). Anyone can send
such a request, so the log would keep whatever a stranger writes into it, and a real request signed with a
rotated secret holds a person's message. That line is rewritten to say only that the request was refused.
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


class WithoutBody(logging.Filter):
    """Turns bolt's line about a refused signature, body included, into REFUSED, as a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Invalid request signature detected"):
            record.msg, record.args = REFUSED, ()
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def setup_logging(secrets: list[str]) -> None:
    logs.setup_logging(secrets)
    logging.getLogger(VERIFICATION_LOGGER).addFilter(WithoutBody())
