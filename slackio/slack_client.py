"""The worker's Slack Web API client: the bot token, the configured API URL, and bounded retries.

Slack answers a burst with HTTP 429 and a Retry-After; slack_sdk's retry handlers wait that long and try again,
a bounded number of times, and do the same for 5xx answers and dropped connections. What still fails after
that is the caller's to report (the renderer hands it to its on_error), never a silent loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from chatops.teams import Team
from slackio import installations, metrics

if TYPE_CHECKING:
    from chatops.config import Config

# Enough to ride out a burst (Slack's Retry-After is usually a second or a few), few enough that a Slack outage
# costs a turn's rendering a bounded wait rather than the turn.
RATE_LIMIT_RETRIES = 3
SERVER_ERROR_RETRIES = 2
CONNECTION_RETRIES = 2
TIMEOUT = 30


class _Counting(AsyncRetryHandler):
    """Counts what Slack answers, on every attempt of every call (retry handlers see them all, also those of
    the per-request clients bolt makes): 429s (mm_slack_rate_limited_total) and errors (`ok: false`, HTTP 5xx,
    a dropped connection: mm_slack_api_errors_total). It retries nothing: the handlers after it do."""

    def __init__(self) -> None:
        super().__init__(max_retry_count=1_000_000)  # consulted on retried attempts too

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        method = request.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if error is not None:
            metrics.slack_failed(method, "connection")
        elif response is not None and response.status_code == 429:
            metrics.slack_rate_limited(method)
        elif response is not None and response.status_code >= 500:
            metrics.slack_failed(method, f"http_{response.status_code}")
        elif response is not None and isinstance(response.body, dict) and response.body.get("ok") is False:
            metrics.slack_failed(method, str(response.body.get("error") or "unknown"))
        return False


def counted_only() -> list[AsyncRetryHandler]:
    """The bot's: its answers are counted, a dropped connection tried again, and a 429 not waited out (a
    listener must answer Slack within three seconds)."""
    return [_Counting(), AsyncConnectionErrorRetryHandler(max_retry_count=CONNECTION_RETRIES)]


def retry_handlers() -> list[AsyncRetryHandler]:
    return [
        _Counting(),
        AsyncRateLimitErrorRetryHandler(max_retry_count=RATE_LIMIT_RETRIES),
        AsyncServerErrorRetryHandler(max_retry_count=SERVER_ERROR_RETRIES),
        AsyncConnectionErrorRetryHandler(max_retry_count=CONNECTION_RETRIES),
    ]


# What Slack answers for its own trouble rather than for what was asked: a later try may work.
SLACK_TROUBLE = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"})


@dataclass(frozen=True)
class Outage:
    """Slack, or the way to it, failing for a while; `retry_after_s`: what Slack asked to wait, when it said."""

    retry_after_s: float | None = None


def outage(error: BaseException) -> Outage | None:
    """The outage `error` says Slack has (a 429, a 5xx, an error of Slack's own trouble, a connection that failed
    or timed out), or None: an answer about what was asked (`channel_not_found`, `invalid_blocks`…), which no
    retry changes, or an error that is not Slack's."""
    if isinstance(error, SlackApiError):
        response = error.response
        status = getattr(response, "status_code", 200)
        code = response.get("error") if isinstance(getattr(response, "data", None), dict) else None
        if status == 429 or status >= 500 or code in SLACK_TROUBLE:
            headers = {str(k).lower(): v for k, v in (getattr(response, "headers", None) or {}).items()}
            return Outage(_seconds(headers.get("retry-after")))
        return None
    if isinstance(error, aiohttp.ClientError | TimeoutError | ConnectionError):
        return Outage()
    return None


def _seconds(value: object) -> float | None:
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return max(0.0, float(str(value)))
    except ValueError:
        return None


def failed_where(error: BaseException, method: str) -> str:
    """Where a Web API call that failed is recorded in the errors table: `slack:<method>`, the method Slack's own
    answer names when there is one (a helper that makes several calls, such as an upload), else `method`."""
    response = getattr(error, "response", None) if isinstance(error, SlackApiError) else None
    url = getattr(response, "api_url", None) or ""
    return f"slack:{url.rsplit('/', 1)[-1] or method}"


def api_base(url: str) -> str:
    """slack_sdk joins method names onto base_url, so it must end with a slash."""
    return url if url.endswith("/") else url + "/"


def web_client(config: Config, team: Team | None = None) -> AsyncWebClient:
    """The client the worker posts with into `team`'s workspace: `config.slack_api_url` (Slack itself, GovSlack or
    the emulator), with SLACK_BOT_TOKEN, or under OAuth the workspace's own token, asked before each call (a
    rotating one is refreshed before it dies: slackio.installations)."""
    settings: dict[str, Any] = {
        "base_url": api_base(config.slack_api_url),
        "timeout": TIMEOUT,
        "retry_handlers": retry_handlers(),
    }
    if not config.oauth:
        return AsyncWebClient(token=config.slack_bot_token, **settings)
    return TeamClient(installations.tokens(config), team or Team(None), **settings)


class TeamClient(AsyncWebClient):
    """A Web API client of one workspace, whose token is asked of `tokens` before each call: a turn outlives a
    rotating token (12 hours), and a client made before a refresh must not go on with the old one."""

    def __init__(self, tokens: installations.Tokens, team: Team, **settings: Any) -> None:
        super().__init__(**settings)
        self.tokens, self.team = tokens, team

    async def api_call(self, api_method: str, **kwargs: Any) -> AsyncSlackResponse:  # pyright: ignore[reportIncompatibleMethodOverride]
        self.token = await self.tokens.token(self.team)
        return await super().api_call(api_method, **kwargs)
