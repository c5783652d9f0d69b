"""Gitea's and Forgejo's pull requests through pyforgejo (generated from Forgejo's API description, which
Gitea's pull request API shares).

A draft is a title starting with "WIP: ", Gitea's own marker (its API has no draft field to set). Labels are
given by id: the names are looked up in the repository's labels, and one it does not have is left out.
pyforgejo's retries (with sleeps) are off for every call: a worker never sleeps out a rate limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pydantic
from pyforgejo import PyforgejoApi
from pyforgejo.core.api_error import ApiError
from pyforgejo.core.request_options import RequestOptions
from pyforgejo.types.pull_request import PullRequest as GiteaPull

from workers.forges._types import (
    Check,
    CheckState,
    ForgeError,
    PullRequest,
    PullState,
    Repo,
    Status,
    failed,
    git_host,
    tls_verify,
    unexpected,
    unreachable,
)
from workers.git import Credentials

log = logging.getLogger("mm.worker.forges")

DRAFT = "WIP: "
DRAFT_MARKERS = ("WIP:", "[WIP]")  # Gitea's default WORK_IN_PROGRESS_PREFIXES
ONCE: RequestOptions = {"max_retries": 0}
# A commit status's state as our CheckState (error and failure are failures).
CHECKS = {"success": CheckState.SUCCESS, "pending": CheckState.PENDING, "warning": CheckState.NEUTRAL}
TIMEOUT = 30.0  # seconds for one request: a worker's thread waits on it
PAGE = 50  # Gitea's most per page by default
MOST_PAGES = 20  # of open pull requests looked through for a branch's


class GiteaForge:
    kind = "gitea"

    def __init__(self, host: str, api_url: str, token: str, username: str = "mm"):
        self.host, self.api_url = host, api_url
        self._token, self._username = token, username
        client = httpx.Client(verify=tls_verify("SSL_CERT_FILE"), timeout=TIMEOUT, follow_redirects=False)
        self._api = PyforgejoApi(base_url=f"{api_url}/api/v1", api_key=f"token {token}", httpx_client=client)

    # --- the Forge protocol ------------------------------------------------------------------------------------

    def find_open(self, repo: Repo, branch: str) -> PullRequest | None:
        owner, name = _split(repo)
        with self._answers():
            for page in range(1, MOST_PAGES + 1):
                pulls = self._api.repository.repo_list_pull_requests(
                    owner, name, state="open", page=page, limit=PAGE, request_options=ONCE
                )
                for pull in pulls:
                    head = pull.head
                    full = head.repo.full_name if head and head.repo else None
                    if head and head.ref == branch and (full or "").lower() == repo.path.lower():
                        return _pull(pull)
                if len(pulls) < PAGE:
                    break
        return None

    def get(self, repo: Repo, number: int) -> PullRequest:
        owner, name = _split(repo)
        with self._answers():
            return _pull(self._api.repository.repo_get_pull_request(owner, name, number, request_options=ONCE))

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
        owner, name = _split(repo)
        label_ids = self._label_ids(repo, labels) if labels else []
        with self._answers():
            pull = self._api.repository.repo_create_pull_request(
                owner,
                name,
                head=branch,
                base=base,
                title=DRAFT + title if draft else title,
                body=body,
                labels=label_ids or None,
                request_options=ONCE,
            )
            opened = _pull(pull)
        if reviewers:
            self._request_reviews(repo, opened.number, reviewers)
        return opened

    def update(self, repo: Repo, number: int, *, body: str, title: str | None = None) -> PullRequest:
        owner, name = _split(repo)
        if title is not None and self.get(repo, number).draft:
            title = DRAFT + title  # a new title keeps the draft's marker
        with self._answers():
            edit = self._api.repository.repo_edit_pull_request
            if title is None:
                return _pull(edit(owner, name, number, body=body, request_options=ONCE))
            return _pull(edit(owner, name, number, body=body, title=title, request_options=ONCE))

    def status(self, repo: Repo, pull: PullRequest) -> Status:
        owner, name = _split(repo)
        with self._answers():
            fresh_pull = self._api.repository.repo_get_pull_request(owner, name, pull.number, request_options=ONCE)
            fresh = _pull(fresh_pull)
            reviews = self._api.repository.repo_list_pull_reviews(
                owner, name, pull.number, limit=PAGE, request_options=ONCE
            )
            combined = self._api.repository.repo_get_combined_status_by_ref(
                owner, name, fresh.head_sha, limit=PAGE, request_options=ONCE
            )
        latest: dict[str, str] = {}
        for review in reviews:  # oldest first
            if review.state in ("APPROVED", "REQUEST_CHANGES") and not review.dismissed:
                latest[review.user.login if review.user and review.user.login else "ghost"] = str(review.state)
        if "REQUEST_CHANGES" in latest.values():
            decision = "changes requested"
        elif "APPROVED" in latest.values():
            decision = "approved"
        else:
            decision = "review required" if fresh_pull.requested_reviewers else None
        checks = tuple(
            Check(s.context or "status", CHECKS.get(str(s.status), CheckState.FAILURE), s.target_url)
            for s in combined.statuses or ()
        )
        return Status(fresh, decision, checks)

    def git_credentials(self, repo: Repo) -> Credentials:
        return Credentials(self._username, self._token, host=git_host(self.host))

    # --- the parts ---------------------------------------------------------------------------------------------

    def _label_ids(self, repo: Repo, names: Sequence[str]) -> list[int]:
        owner, name = _split(repo)
        try:
            with self._answers():
                known = self._api.issue.list_labels(owner, name, limit=PAGE, request_options=ONCE)
        except ForgeError as e:  # the pull request opens without them
            log.warning("labels of %s not read: %s", repo.path, e.text)
            return []
        ids = {label.name: label.id for label in known if label.name and label.id is not None}
        missing = [n for n in names if n not in ids]
        if missing:
            log.warning("%s has no labels %s: left out", repo.path, ", ".join(missing))
        return [ids[n] for n in names if n in ids]

    def _request_reviews(self, repo: Repo, number: int, reviewers: tuple[str, ...]) -> None:
        """Ask them all; when Gitea refuses (one is unknown), ask each alone, so that only those it refuses are
        left out."""
        owner, name = _split(repo)
        groups = [list(reviewers)]
        while groups:
            group = groups.pop(0)
            try:
                with self._answers():
                    self._api.repository.repo_create_pull_review_requests(
                        owner, name, number, reviewers=group, request_options=ONCE
                    )
            except ForgeError as e:
                if len(group) > 1:
                    groups = [[r] for r in group]
                else:
                    log.warning("review of %s#%d not requested from %s: %s", repo.path, number, group[0], e.text)

    @contextmanager
    def _answers(self) -> Iterator[None]:
        """pyforgejo's errors as ours, in Gitea's words, masked."""
        try:
            yield
        except ApiError as e:
            if e.status_code is None:
                raise unexpected(self.kind, e) from None
            raise failed(self.kind, e.status_code, _words(e.body), e.headers or {}, [self._token]) from None
        except httpx.HTTPError as e:
            raise unreachable(self.kind, self.api_url, e, [self._token]) from None
        except (pydantic.ValidationError, KeyError, TypeError, ValueError) as e:
            raise unexpected(self.kind, e) from None


def _split(repo: Repo) -> tuple[str, str]:
    owner, name = repo.path.split("/")
    return owner, name


def _words(body: Any) -> str:
    """Gitea's error: `{"message": …, "errors": […]}`, or a text."""
    if isinstance(body, dict):
        errors = [str(e) for e in body.get("errors") or () if e]
        return "; ".join([str(body.get("message") or ""), *errors]).strip("; ")
    return str(body or "")[:300]


def _pull(pull: GiteaPull) -> PullRequest:
    title = pull.title or ""
    draft = bool(pull.draft) or title.startswith(DRAFT_MARKERS)
    for marker in DRAFT_MARKERS:
        title = title.removeprefix(marker).lstrip() if title.startswith(marker) else title
    opened = PullState.OPEN if str(pull.state) == "open" else PullState.CLOSED
    state = PullState.MERGED if pull.merged else opened
    if pull.number is None or pull.head is None or pull.base is None:
        raise KeyError("number, head and base")
    return PullRequest(
        number=pull.number,
        url=pull.html_url or "",
        state=state,
        draft=draft,
        branch=pull.head.ref or "",
        head_sha=pull.head.sha or "",
        base=pull.base.ref or "",
        title=title,
        body=pull.body or "",
    )
