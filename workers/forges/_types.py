"""The forge-neutral surface (re-exported by workers.forges) and what the three clients share: the types a
forge answers with, the one exception hierarchy, and how a forge's error answer is read."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Protocol
from urllib.parse import urlsplit

from workers.errors import WorkerError
from workers.git import Credentials, masked


@dataclass(frozen=True)
class Repo:
    """A repository on a forge: the host (as the URL writes it, with its port) and its path (`owner/name`;
    GitLab nests groups: `group/sub/name`)."""

    host: str
    path: str


class PullState(StrEnum):
    OPEN = "open"
    CLOSED = "closed"
    MERGED = "merged"


@dataclass(frozen=True)
class PullRequest:
    number: int  # GitHub's and Gitea's number, GitLab's iid: what the forge's pages show after `#` / `!`
    url: str  # the page a person opens
    state: PullState
    draft: bool
    branch: str  # the head branch
    head_sha: str
    base: str
    title: str
    body: str


class CheckState(StrEnum):
    PENDING = "pending"  # queued or running
    SUCCESS = "success"
    FAILURE = "failure"  # failed, errored, timed out, cancelled, action required
    NEUTRAL = "neutral"  # skipped, neutral: neither blocks nor passes


@dataclass(frozen=True)
class Check:
    name: str
    state: CheckState
    url: str | None = None


@dataclass(frozen=True)
class Status:
    """A pull request as `@mm pr` shows it: its state, the review decision and the checks on its head."""

    pull: PullRequest
    review: str | None  # "approved", "changes requested", "review required", or None when the forge says nothing
    checks: tuple[Check, ...] = field(default_factory=tuple)


class ForgeError(WorkerError):
    """A forge refused or failed; `text` is what the thread is told (the forge's own words, tokens masked)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class NoForge(ForgeError):
    """No forge is configured for the repository's host: the text names the key to set."""


class NotAllowed(ForgeError):
    """The token is missing or lacks the rights (401, 403): the forge's message, the token masked."""


class Refused(ForgeError):
    """The forge refused the request itself (a validation error, a protected branch): its message."""


class RateLimited(ForgeError):
    """The forge's rate limit is used up; `reset` is when it says to try again (None: it did not say)."""

    def __init__(self, text: str, reset: datetime | None):
        super().__init__(text)
        self.reset = reset


class Unreachable(ForgeError):
    """The forge did not answer (connection, timeout, a 5xx)."""


class Forge(Protocol):
    """One forge's API for one repository host. Calls are synchronous (the worker runs them in a thread) and
    raise ForgeError's kinds only."""

    kind: str  # github, gitlab, gitea

    def find_open(self, repo: Repo, branch: str) -> PullRequest | None:
        """The open pull request whose head is `branch` of `repo` itself (not a fork's), if any."""
        ...

    def get(self, repo: Repo, number: int) -> PullRequest: ...

    def open(
        self,
        repo: Repo,
        *,
        branch: str,
        base: str,
        title: str,
        body: str,
        draft: bool,
        labels: tuple[str, ...] = (),
        reviewers: tuple[str, ...] = (),
    ) -> PullRequest:
        """Open a pull request of `branch` into `base`; a draft where the forge has drafts. Labels and reviewers
        the forge does not know are left out (the pull request is still opened)."""
        ...

    def update(self, repo: Repo, number: int, *, body: str, title: str | None = None) -> PullRequest: ...

    def status(self, repo: Repo, pull: PullRequest) -> Status: ...

    def git_credentials(self, repo: Repo) -> Credentials:
        """What the worker's git pushes to `repo` with: the token, or a GitHub App's installation token."""
        ...


NAMES = {"github": "GitHub", "gitlab": "GitLab", "gitea": "Gitea"}  # how a thread's text names each kind


# --- what the three clients share ----------------------------------------------------------------------------


def tls_verify(variable: str) -> ssl.SSLContext | bool:
    """The operator's CA bundle from the worker's environment (`SSL_CERT_FILE` for the httpx clients,
    `REQUESTS_CA_BUNDLE` for python-gitlab's requests), read explicitly rather than trusted to each library's
    handling of the variables; else the system's and certifi's trust (True)."""
    path = os.environ.get(variable)
    return ssl.create_default_context(cafile=path) if path else True


def git_host(host: str) -> str:
    """The host as git names it in its prompt (workers.git.Credentials.host): no port, IPv6 in brackets."""
    name = urlsplit(f"https://{host}").hostname or host
    return f"[{name}]" if ":" in name else name


def failed(kind: str, status: int, message: str, headers: Mapping[str, str], secrets: Sequence[str]) -> ForgeError:
    """The ForgeError of a forge's error answer, by its status: one reading for the three forges. `message` is
    the forge's own words; every text is masked of the client's secrets."""
    name, said = NAMES[kind], masked(message.strip() or "(no message)", secrets)
    lowered = {k.lower(): v for k, v in headers.items()}
    limited = status == 429 or (
        status == 403 and (lowered.get("x-ratelimit-remaining") == "0" or "retry-after" in lowered)
    )
    if limited:
        reset = reset_time(lowered)
        when = f"it resets at {reset:%Y-%m-%d %H:%M:%S} UTC" if reset else "it did not say when it resets"
        return RateLimited(f"{name}'s rate limit is used up ({when}): {said}", reset)
    if status == 403 and "protected branch" in said.lower():
        # A 403 about a protected branch refuses the change, not the token (Gitea's words for its branch rules).
        return Refused(f"{name} refused it ({status}): {said}")
    if status in (401, 403):
        return NotAllowed(f"{name} refused the token ({status}): {said}")
    if status == 404:
        return Refused(f"{name} found nothing there (404: it does not exist, or the token may not see it): {said}")
    if status >= 500:
        return Unreachable(f"{name} failed ({status}): {said}")
    return Refused(f"{name} refused it ({status}): {said}")


def unreachable(kind: str, api_url: str, error: Exception, secrets: Sequence[str]) -> Unreachable:
    """A forge that did not answer (a connection refused, a timeout, TLS), in the library's words, masked."""
    why = str(error) or type(error).__name__
    return Unreachable(masked(f"{NAMES[kind]} at {api_url} did not answer: {why}", secrets))


def unexpected(kind: str, error: Exception) -> Unreachable:
    """An answer the client could not read: what it lacked, never the answer itself (it may be long)."""
    return Unreachable(f"{NAMES[kind]} answered something unexpected ({type(error).__name__}: {str(error)[:200]})")


def reset_time(headers: Mapping[str, str]) -> datetime | None:
    """When a rate limit resets: `X-RateLimit-Reset` (GitHub) or `RateLimit-Reset` (GitLab), epoch seconds, when
    the limit is used up; else `Retry-After` (seconds or a date: GitHub's secondary limits, a proxy's 429); else
    the reset of either. `headers`' names in lower case."""
    epoch = next(
        (int(v) for n in ("x-ratelimit-reset", "ratelimit-reset") if (v := headers.get(n, "")).isdigit()), None
    )
    reset = datetime.fromtimestamp(epoch, UTC) if epoch is not None else None
    if reset and "0" in (headers.get("x-ratelimit-remaining"), headers.get("ratelimit-remaining")):
        return reset
    after = headers.get("retry-after", "").strip()
    if after.isdigit():
        return datetime.now(UTC) + timedelta(seconds=int(after))
    if after:
        try:
            return parsedate_to_datetime(after).astimezone(UTC)
        except (TypeError, ValueError):
            pass
    return reset
