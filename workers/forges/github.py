"""GitHub and GitHub Enterprise through githubkit: a token, or a GitHub App's installation.

githubkit builds the requests, signs the App's JWT and keeps its installation tokens (refreshed before they
expire); its retries are off, because a worker never sleeps out a rate limit: the thread is told when it resets.
The answers are read as JSON rather than through githubkit's models, which require every field of today's
api.github.com: an older GitHub Enterprise leaving one out would fail the whole call for a field never read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from githubkit import AppAuthStrategy, AppInstallationAuthStrategy, GitHub, TokenAuthStrategy
from githubkit.cache import MemCacheStrategy
from githubkit.exception import AuthCredentialError, RequestError, RequestFailed
from githubkit.response import Response

from workers.forges._types import (
    Check,
    CheckState,
    ForgeError,
    NotAllowed,
    PullRequest,
    PullState,
    Refused,
    Repo,
    Status,
    failed,
    git_host,
    tls_verify,
    unexpected,
    unreachable,
)
from workers.git import Credentials, masked

log = logging.getLogger("mm.worker.forges")

# A check run's conclusion (a run not completed is pending) and a commit status's state, as our CheckState.
CONCLUSIONS = {
    "success": CheckState.SUCCESS,
    "neutral": CheckState.NEUTRAL,
    "skipped": CheckState.NEUTRAL,
    "stale": CheckState.NEUTRAL,
}
STATUSES = {"success": CheckState.SUCCESS, "pending": CheckState.PENDING}
TIMEOUT = 30.0  # seconds for one request: a worker's thread waits on it
TOKEN_MARGIN = timedelta(minutes=5)  # an installation token this close to its end is made again


class GitHubForge:
    kind = "github"

    def __init__(
        self,
        host: str,
        api_url: str,
        *,
        token: str | None = None,
        username: str = "x-access-token",
        app: tuple[int, str, int | None] | None = None,  # the App's id, its private key, its installation's id
    ):
        self.host, self.api_url = host, api_url
        self._token, self._username, self._app = token, username, app
        self._own_secrets = [s for s in (token, app[1] if app else None) if s]
        self._secrets = list(self._own_secrets)
        self._lock = threading.Lock()
        self._installations: dict[str, int] = {}  # an owner's installation of the App
        self._clients: dict[int, GitHub[Any]] = {}  # by installation
        self._git_tokens: dict[int, tuple[str, datetime]] = {}  # by installation: git's token and its end
        self._plain = self._github(TokenAuthStrategy(token)) if token else None
        self._as_app = self._github(AppAuthStrategy(app[0], app[1])) if app else None

    def _github(self, auth: Any) -> GitHub[Any]:
        # Its own token cache: githubkit's default is shared by the process, keyed by the App's id alone.
        return GitHub(
            auth,
            base_url=self.api_url,
            auto_retry=False,
            http_cache=False,
            cache_strategy=MemCacheStrategy(),
            ssl_verify=tls_verify("SSL_CERT_FILE"),
            timeout=TIMEOUT,
        )

    # --- the Forge protocol ------------------------------------------------------------------------------------

    def find_open(self, repo: Repo, branch: str) -> PullRequest | None:
        owner, name = _split(repo)
        with self._answers():
            answer = self._for(repo).rest.pulls.list(owner, name, state="open", head=f"{owner}:{branch}", per_page=100)
            pulls = [_pull(p) for p in _json(answer) if _of(p["head"], repo)]
        return next((p for p in pulls if p.branch == branch), None)

    def get(self, repo: Repo, number: int) -> PullRequest:
        owner, name = _split(repo)
        with self._answers():
            return _pull(_json(self._for(repo).rest.pulls.get(owner, name, number)))

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
        try:
            pull = self._create(repo, branch, base, title, body, draft)
        except Refused as e:
            # A private repository on GitHub's free plan has no drafts: the pull request opens as a ready one.
            if not draft or "draft" not in e.text.lower():
                raise
            log.warning("%s has no draft pull requests, opening a ready one: %s", repo.path, e.text)
            pull = self._create(repo, branch, base, title, body, False)
        owner, name = _split(repo)
        if labels:
            try:
                with self._answers():
                    self._for(repo).rest.issues.add_labels(owner, name, pull.number, labels=list(labels))
            except ForgeError as e:  # the pull request is open: the labels are a nicety
                log.warning("labels %s not set on %s#%d: %s", labels, repo.path, pull.number, e.text)
        if reviewers:
            self._request_reviews(repo, pull.number, reviewers)
        return pull

    def update(self, repo: Repo, number: int, *, body: str, title: str | None = None) -> PullRequest:
        owner, name = _split(repo)
        with self._answers():
            pulls = self._for(repo).rest.pulls
            if title is None:
                return _pull(_json(pulls.update(owner, name, number, body=body)))
            return _pull(_json(pulls.update(owner, name, number, body=body, title=title)))

    def status(self, repo: Repo, pull: PullRequest) -> Status:
        owner, name = _split(repo)
        with self._answers():
            github = self._for(repo)
            data = _json(github.rest.pulls.get(owner, name, pull.number))
            fresh = _pull(data)
            reviews = _json(github.rest.pulls.list_reviews(owner, name, pull.number, per_page=100))
            runs = _json(github.rest.checks.list_for_ref(owner, name, fresh.head_sha, per_page=100))["check_runs"]
            combined = _json(github.rest.repos.get_combined_status_for_ref(owner, name, fresh.head_sha, per_page=100))
            checks = [_run(r) for r in runs] + [_commit_status(s) for s in combined["statuses"]]
            return Status(fresh, _decision(reviews, bool(data.get("requested_reviewers"))), tuple(checks))

    def git_credentials(self, repo: Repo) -> Credentials:
        if self._app is None or self._as_app is None:
            assert self._token is not None  # one of the two, as forge_for makes it
            return Credentials(self._username, self._token, host=git_host(self.host))
        # An installation token lives an hour: kept for the installation until five minutes before its end.
        installation = self._installation(repo)
        with self._lock:
            kept = self._git_tokens.get(installation)
        if kept is not None and kept[1] - datetime.now(UTC) > TOKEN_MARGIN:
            return Credentials("x-access-token", kept[0], host=git_host(self.host))
        with self._answers():
            answer = _json(self._as_app.rest.apps.create_installation_access_token(installation))
        token, expires = answer["token"], _expiry(answer.get("expires_at"))
        with self._lock:
            self._git_tokens[installation] = (token, expires)
            # Masked from this client's words too, should any error of the library's ever carry it.
            self._secrets = [*self._own_secrets, *(t for t, _ in self._git_tokens.values())]
        return Credentials("x-access-token", token, host=git_host(self.host))

    # --- the parts ---------------------------------------------------------------------------------------------

    def _create(self, repo: Repo, branch: str, base: str, title: str, body: str, draft: bool) -> PullRequest:
        owner, name = _split(repo)
        with self._answers():
            answer = self._for(repo).rest.pulls.create(
                owner, name, head=branch, base=base, title=title, body=body, draft=draft
            )
            return _pull(_json(answer))

    def _request_reviews(self, repo: Repo, number: int, reviewers: tuple[str, ...]) -> None:
        """Ask them all; when GitHub refuses (one is no collaborator, or unknown), ask each alone, so that only
        those it refuses are left out."""
        owner, name = _split(repo)
        groups = [list(reviewers)]
        while groups:
            group = groups.pop(0)
            try:
                with self._answers():
                    self._for(repo).rest.pulls.request_reviewers(owner, name, number, reviewers=group)
            except ForgeError as e:
                if len(group) > 1:
                    groups = [[r] for r in group]
                else:
                    log.warning("review of %s#%d not requested from %s: %s", repo.path, number, group[0], e.text)

    def _for(self, repo: Repo) -> GitHub[Any]:
        """The client for `repo`: the token's, or the App's installation on the repository's owner."""
        if self._plain is not None:
            return self._plain
        installation = self._installation(repo)
        assert self._app is not None
        with self._lock:
            client = self._clients.get(installation)
            if client is None:
                strategy = AppInstallationAuthStrategy(self._app[0], self._app[1], installation)
                client = self._clients[installation] = self._github(strategy)
            return client

    def _installation(self, repo: Repo) -> int:
        assert self._app is not None and self._as_app is not None
        if self._app[2] is not None:
            return self._app[2]
        owner, name = _split(repo)
        with self._lock:
            known = self._installations.get(owner)
        if known is None:
            with self._answers():
                known = int(_json(self._as_app.rest.apps.get_repo_installation(owner, name))["id"])
            with self._lock:
                self._installations[owner] = known
        return known

    @contextmanager
    def _answers(self) -> Iterator[None]:
        """githubkit's errors as ours, in GitHub's words, masked."""
        try:
            yield
        except RequestFailed as e:
            raise self._failed(e.response) from None
        except RequestError as e:
            inner = e.exc
            if isinstance(inner, RequestFailed):  # the App's token request, failed inside the request it signs
                raise self._failed(inner.response) from None
            if isinstance(inner, httpx.HTTPError):
                raise unreachable(self.kind, self.api_url, inner, self._secrets) from None
            # The App's JWT could not be signed: its private key is no RSA key.
            raise NotAllowed(
                masked(f"The GitHub App of `{self.host}` cannot sign in: {inner}", self._secrets)
            ) from None
        except AuthCredentialError as e:
            raise NotAllowed(masked(f"The GitHub App of `{self.host}` cannot sign in: {e}", self._secrets)) from None
        except (KeyError, TypeError, ValueError) as e:
            raise unexpected(self.kind, e) from None

    def _failed(self, response: Response[Any]) -> ForgeError:
        try:
            data = response.json()
        except ValueError:
            data = None
        if isinstance(data, dict):
            # 422's details: `errors` as messages, or as the field and the code that was wrong.
            details = [
                str(e.get("message") or " ".join(str(e[k]) for k in ("field", "code") if e.get(k)))
                if isinstance(e, dict)
                else str(e)
                for e in data.get("errors") or ()
            ]
            message = "; ".join([str(data.get("message") or ""), *(d for d in details if d)]).strip("; ")
        else:
            message = response.text[:300]
        return failed(self.kind, response.status_code, message, response.headers, self._secrets)


def _split(repo: Repo) -> tuple[str, str]:
    owner, name = repo.path.split("/")
    return owner, name


def _json(answer: Response[Any]) -> Any:
    return answer.json()


def _of(head: dict[str, Any], repo: Repo) -> bool:
    """The head is a branch of the repository itself, not a fork's (a deleted fork's has no repository)."""
    full = (head.get("repo") or {}).get("full_name")
    return isinstance(full, str) and full.lower() == repo.path.lower()


def _pull(data: dict[str, Any]) -> PullRequest:
    if data.get("merged_at") or data.get("merged"):
        state = PullState.MERGED
    else:
        state = PullState.OPEN if data["state"] == "open" else PullState.CLOSED
    return PullRequest(
        number=int(data["number"]),
        url=str(data["html_url"]),
        state=state,
        draft=bool(data.get("draft")),
        branch=str(data["head"]["ref"]),
        head_sha=str(data["head"]["sha"]),
        base=str(data["base"]["ref"]),
        title=str(data["title"]),
        body=str(data.get("body") or ""),
    )


def _decision(reviews: list[dict[str, Any]], requested: bool) -> str | None:
    """Each reviewer's latest review that decides (a comment does not): any change request wins, then an
    approval; none yet while reviews are requested: "review required"."""
    latest: dict[str, str] = {}
    for review in reviews:  # oldest first
        state = review.get("state")
        if state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
            latest[str((review.get("user") or {}).get("login") or "ghost")] = state
    if "CHANGES_REQUESTED" in latest.values():
        return "changes requested"
    if "APPROVED" in latest.values():
        return "approved"
    return "review required" if requested else None


def _run(run: dict[str, Any]) -> Check:
    if run.get("status") != "completed":
        state = CheckState.PENDING
    else:
        state = CONCLUSIONS.get(str(run.get("conclusion")), CheckState.FAILURE)
    return Check(str(run["name"]), state, run.get("details_url") or run.get("html_url"))


def _commit_status(status: dict[str, Any]) -> Check:
    return Check(
        str(status["context"]), STATUSES.get(str(status.get("state")), CheckState.FAILURE), status.get("target_url")
    )


def _expiry(text: object) -> datetime:
    """An installation token's `expires_at`; one GitHub did not give lives no longer than the margin (made again
    at its next use)."""
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return datetime.now(UTC)
