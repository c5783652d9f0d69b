"""What the forge emulator's parts share (playground/forge_server.py, and its API modules forge_github.py,
forge_gitlab.py, forge_gitea.py): the state of repositories and pull requests, who a token is, one request as a
handler sees it, and the errors a handler raises. Its own module, so that the API modules and the server that
routes to them do not import each other."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from playground.errors import PlaygroundError

if TYPE_CHECKING:
    from playground.forge_server import ForgeServer

Kind = Literal["github", "gitlab", "gitea"]
CheckState = Literal["pending", "success", "failure", "neutral"]
ReviewState = Literal["approved", "changes_requested"]
KINDS: tuple[Kind, ...] = ("github", "gitlab", "gitea")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def iso(when: dt.datetime | None) -> str | None:
    """The forges' timestamp shape: `2026-01-02T03:04:05Z`."""
    return None if when is None else when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(PlaygroundError):
    """Raised by an API handler: answered with `status`, the JSON `body` and `headers`."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status, body)
        self.status, self.body, self.headers = status, body, dict(headers or {})


class Unsupported(PlaygroundError):
    """A call the emulator does not emulate: answered 501 and recorded in `ForgeServer.unsupported`."""


@dataclass
class Repo:
    path: str  # owner/name (GitLab: group/sub/name)
    id: int
    git_dir: Path
    default_branch: str
    labels: dict[str, int]  # name -> id (Gitea takes label ids)
    protected: dict[str, str | None] = field(default_factory=dict)  # branch -> the API's refusal (None: default)
    created: dt.datetime = field(default_factory=now)

    @property
    def owner(self) -> str:
        return self.path.rpartition("/")[0]

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


@dataclass
class Review:
    id: int
    user: str
    state: ReviewState | Literal["requested"]
    at: dt.datetime


@dataclass
class Pull:
    repo: Repo
    number: int  # GitHub's and Gitea's number, GitLab's iid
    id: int
    title: str
    body: str
    head: str
    base: str
    author: str
    head_sha: str  # the branch's head when last read (kept when the branch is deleted, as forges do)
    base_sha: str
    draft_flag: bool = False  # GitHub's draft; GitLab and Gitea say draft by the title (see `draft`)
    state: Literal["open", "closed", "merged"] = "open"
    labels: list[str] = field(default_factory=list)
    reviewers: list[str] = field(default_factory=list)
    reviews: list[Review] = field(default_factory=list)
    created: dt.datetime = field(default_factory=now)
    updated: dt.datetime = field(default_factory=now)
    closed: dt.datetime | None = None
    merged: dt.datetime | None = None

    def draft(self, kind: Kind) -> bool:
        if kind == "gitlab":  # GitLab: a title starting "Draft:", "[Draft]" or "(Draft)"
            return re.match(r"(?i)\s*(draft:|\[draft\]|\(draft\))", self.title) is not None
        if kind == "gitea":  # Gitea's default WIP prefixes
            return re.match(r"(?i)\s*(wip:|\[wip\])", self.title) is not None
        return self.draft_flag


@dataclass
class Identity:
    """Who a token is: the login it acts as, the repositories it may write (None: all), when it expires."""

    token: str
    login: str
    repos: frozenset[str] | None
    bot: bool = False
    expires: dt.datetime | None = None
    installation_id: int | None = None  # a GitHub App's installation token

    def may_write(self, repo: str) -> bool:
        return self.repos is None or repo in self.repos


@dataclass
class App:
    id: int
    slug: str
    key: rsa.RSAPrivateKey
    installation_id: int


@dataclass
class Call:
    """One API request as a handler sees it: the route's captures, the query, the decoded JSON body."""

    request: web.Request
    method: str
    match: dict[str, str]
    query: Mapping[str, str]
    body: Any
    who: Identity | None  # None only on routes that authenticate otherwise (a GitHub App's JWT)
    token: str | None


Handler = Callable[["ForgeServer", Call], Awaitable[web.StreamResponse]]
Route = tuple[str, re.Pattern[str], Handler]


def user_id(server: ForgeServer, login: str) -> int:
    """A user's id, the same for a login in every answer of any of the three APIs."""
    return 100 + server.users.index(login) if login in server.users else 900 + sum(map(ord, login))
