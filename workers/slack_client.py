"""The worker's Slack Web API client: the bot token, the configured API URL, and bounded retries.

Slack answers a burst with HTTP 429 and a Retry-After; slack_sdk's retry handlers wait that long and try again,
a bounded number of times, and do the same for 5xx answers and dropped connections. What still fails after
that is the caller's to report (the renderer hands it to its on_error), never a silent loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

if TYPE_CHECKING:
    from chatops.config import Config

# Enough to ride out a burst (Slack's Retry-After is usually a second or a few), few enough that a Slack outage
# costs a turn's rendering a bounded wait rather than the turn.
RATE_LIMIT_RETRIES = 3
SERVER_ERROR_RETRIES = 2
CONNECTION_RETRIES = 2
TIMEOUT = 30


def retry_handlers() -> list[AsyncRetryHandler]:
    return [
        AsyncRateLimitErrorRetryHandler(max_retry_count=RATE_LIMIT_RETRIES),
        AsyncServerErrorRetryHandler(max_retry_count=SERVER_ERROR_RETRIES),
        AsyncConnectionErrorRetryHandler(max_retry_count=CONNECTION_RETRIES),
    ]


def api_base(url: str) -> str:
    """slack_sdk joins method names onto base_url, so it must end with a slash (bot.app has the same rule)."""
    return url if url.endswith("/") else url + "/"


def web_client(config: Config) -> AsyncWebClient:
    """The client the worker posts with: `config.slack_api_url` (Slack itself, GovSlack or the emulator)."""
    return AsyncWebClient(
        token=config.slack_bot_token,
        base_url=api_base(config.slack_api_url),
        timeout=TIMEOUT,
        retry_handlers=retry_handlers(),
    )
