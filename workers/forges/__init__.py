"""Pull requests on the forges: GitHub (and GitHub Enterprise), GitLab, Gitea and Forgejo, each through its API's
client library (githubkit, python-gitlab, pyforgejo).

The worker alone talks to a forge: its tokens (`forges.<host>.tokenEnv`, a GitHub App's installation tokens) live
in the worker's environment, never in a sandbox, and only for the repositories the config names
(workers.push.token_scope). The rest of the service sees the small, forge-neutral surface below: a `Forge` for a
repository's host, the `PullRequest` it answers with, the `Status` of its review and checks, and one exception
hierarchy whose texts are what a thread is told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from workers.errors import WorkerError
from workers.git import Credentials


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
