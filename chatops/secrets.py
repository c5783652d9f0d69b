"""Keeping secrets out of what the service prints: URLs with their passwords masked, texts scrubbed of the
secret values the process knows, and exceptions reduced to one readable line.

Every command and every log line that may carry a URL or an error message goes through here, so a password
in DATABASE_URL or a token echoed by a failing library never reaches a terminal, a log or a Slack thread.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from chatops.config import Config

MASK = "***"
_SECRET_PARAM = re.compile(r"pass|secret|token|key", re.IGNORECASE)


def mask_url(url: str) -> str:
    """The URL with its password (and secret-looking query parameters) replaced by ***.

    Only those parts are rewritten: urlunsplit would also "normalize" `sqlite:///./var/x` into another URL.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if password is not None:
        userinfo, host = parts.netloc.rsplit("@", 1)
        url = url.replace(parts.netloc, f"{userinfo.split(':', 1)[0]}:{MASK}@{host}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        masked = "&".join(f"{k}={MASK if _SECRET_PARAM.search(k) else v}" for k, v in pairs)
        url = url.replace(f"?{parts.query}", f"?{masked}", 1)
    return url


def secrets_of(config: Config) -> list[str]:
    values = [
        config.slack_bot_token,
        config.slack_signing_secret,
        config.slack_app_token,
        config.slack_client_secret,
        config.model_api_key,
        config.git_token,
        *config.model_api_keys.values(),
        *config.forge_tokens.values(),
        *config.forge_app_keys.values(),
    ]
    model_urls = [m.url for m in config.service.models.values()]
    for url in (config.database_url, config.broker_url, config.agent.model.url, config.slack_api_url, *model_urls):
        with contextlib.suppress(ValueError):  # an unparsable URL has no password to hide
            values.append(urlsplit(url).password)
    # Longest first, so that a secret containing another is masked whole.
    return sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)


def known_secrets(start: Iterable[str], config: Config) -> tuple[str, ...]:
    """What a long-running process never posts nor logs: the secrets it knew at its start and those of its config
    as it stands now (a reload may bring a new `model.apiKeyEnv`, a password in `model.url`), longest first."""
    return tuple(sorted({*start, *secrets_of(config)}, key=len, reverse=True))


class LiveSecrets:
    """known_secrets of a process whose config is read again on change (`config`: its ConfigFile's `current`),
    asked anew each time: what the bot's gateway and its texts scrub, as the workers' do (workers.turns.Process)."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        self.start = tuple(secrets_of(config()))

    def __call__(self) -> tuple[str, ...]:
        return known_secrets(self.start, self.config())


def scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def with_json_forms(secrets: Iterable[str]) -> list[str]:
    """The secrets, and each as it reads inside a JSON string (a tool call's arguments are JSON text, where a `"` or
    a `\\` of a secret is escaped), longest first: what `scrub` takes for a JSON text."""
    known = [s for s in secrets if s]
    return sorted({*known, *(json.dumps(s)[1:-1] for s in known)}, key=len, reverse=True)


def describe_error(exc: BaseException) -> str:
    """The first line of an exception, without errno prefixes or SQLAlchemy's wrapping: "connection refused"."""
    exc = getattr(exc, "orig", None) or exc  # SQLAlchemy's DBAPIError prefixes "(psycopg.OperationalError)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text)
    if re.search(r"connection refused", text, re.IGNORECASE):
        return "connection refused"
    return text
