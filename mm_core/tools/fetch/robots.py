"""robots.txt per RFC 9309: Protego does the matching (longest match, Allow wins a tie, `*`, `$`); the
status rules, the byte-order mark and the 24-hour cache per origin are here.

Only answers that say something about the site are cached (a parsed file, or a 4xx that allows all): a 5xx or
an unreachable robots.txt forbids the page now, but caching that for a day would lock the agent out of a site
for a passing outage.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from protego import Protego

from mm_core.tools.fetch.errors import INPUT, FetchError

PRODUCT_TOKEN = "mm"
TTL = 24 * 3600.0
MAX_REDIRECTS = 5  # RFC 9309 2.3.1.2
MAX_BYTES = 512 * 1024  # RFC 9309 2.5: at least 500 KiB must be parsed
RESOURCE_KEY = "fetch.robots"


@dataclass(frozen=True)
class RobotsAnswer:
    """What one origin's robots.txt said: `rules` parsed, or a blanket allow (None rules, allow_all)."""

    rules: Protego | None
    allow_all: bool
    why: str = ""

    def allows(self, url: str) -> bool:
        if self.rules is None:
            return self.allow_all
        return self.rules.can_fetch(url, PRODUCT_TOKEN)


# (status, final URL, body) of a GET that follows no redirection, or raises OSError-like failures.
Getter = Callable[[str], Awaitable[tuple[int, str | None, bytes]]]


def parse(body: bytes) -> Protego:
    text = body.decode("utf-8", errors="replace").removeprefix("\ufeff")
    return Protego.parse(text)


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def robots_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/robots.txt"


class RobotsCache:
    """Per-session cache of robots answers by origin (scheme, host, port), with an injectable clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = TTL):
        self.clock = clock
        self.ttl = ttl
        self._answers: dict[str, tuple[float, RobotsAnswer]] = {}

    async def check(self, url: str, get: Getter) -> None:
        """Raise FetchError (input) unless robots.txt lets the product token `mm` fetch `url`."""
        answer = await self.answer(url, get)
        if not answer.allows(url):
            reason = answer.why or f"robots.txt of {robots_url(url).removesuffix('/robots.txt')} forbids {url}"
            raise FetchError(INPUT, reason)

    async def answer(self, url: str, get: Getter) -> RobotsAnswer:
        origin = origin_of(url)
        now = self.clock()
        cached = self._answers.get(origin)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        answer, cacheable = await self._read(robots_url(url), get)
        if cacheable:
            self._answers[origin] = (now, answer)
        return answer

    async def _read(self, url: str, get: Getter) -> tuple[RobotsAnswer, bool]:
        where = url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                status, location, body = await get(where)
            except FetchError:
                raise  # the SSRF guard's refusal is the page's answer, not robots.txt's
            except Exception as exc:  # noqa: BLE001 - any network failure means "unreachable"
                why = f"robots.txt at {url} cannot be read ({exc or type(exc).__name__}) — the page is not fetched"
                return RobotsAnswer(None, False, why), False
            if 200 <= status < 300:
                return RobotsAnswer(parse(body), True), True
            if 300 <= status < 400 and location:
                where = location
                continue
            if 400 <= status < 500 or 300 <= status < 400:
                return RobotsAnswer(None, True), True
            why = f"robots.txt at {url} cannot be read (HTTP {status}) — the page is not fetched"
            return RobotsAnswer(None, False, why), False
        # RFC 9309 2.3.1.2: past five redirections the file counts as unavailable, which allows all.
        return RobotsAnswer(None, True), True
