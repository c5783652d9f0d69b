"""GitLab's merge requests through python-gitlab, as pull requests.

A merge request's number is its iid (what GitLab's pages show after `!`); a draft is a title starting with
"Draft: ", GitLab's own marker (the create call has no draft field). python-gitlab's retries are off, every call
(`max_retries=0`, `obey_rate_limit=False`): a worker never sleeps out a rate limit, the thread is told when it
resets.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gitlab
import requests
from gitlab.exceptions import GitlabError

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
    unexpected,
    unreachable,
)
from workers.git import Credentials

log = logging.getLogger("mm.worker.forges")

DRAFT = "Draft: "
# What GitLab's older versions and people also write for a draft.
DRAFT_MARKERS = ("Draft:", "[Draft]", "(Draft)", "WIP:", "[WIP]")
ONCE: dict[str, Any] = {"max_retries": 0, "obey_rate_limit": False}
STATES = {"opened": PullState.OPEN, "merged": PullState.MERGED}
# A pipeline's or a commit status's state as our CheckState (the rest, failed and canceled, are failures).
CHECKS = {
    "success": CheckState.SUCCESS,
    "skipped": CheckState.NEUTRAL,
    "manual": CheckState.NEUTRAL,  # waits for a person to start it: neither blocks nor passes
    **{s: CheckState.PENDING for s in ("created", "waiting_for_resource", "preparing", "pending", "running")},
    "scheduled": CheckState.PENDING,
}
TIMEOUT = 30.0  # seconds for one request: a worker's thread waits on it


class GitLabForge:
    kind = "gitlab"

    def __init__(self, host: str, api_url: str, token: str, username: str = "oauth2"):
        self.host, self.api_url = host, api_url
        self._token, self._username = token, username
        self._gl = gitlab.Gitlab(
            api_url,
            private_token=token,
            # The operator's CA bundle, by its path (requests takes no SSL context); else the system's trust.
            ssl_verify=os.environ.get("REQUESTS_CA_BUNDLE") or True,
            retry_transient_errors=False,
            timeout=TIMEOUT,
            keep_base_url=True,  # pagination's links name the host GitLab believes it has, which a proxy changes
        )
        # python-gitlab's errors keep the status and the message, not the headers a rate limit's reset is in.
        self._last = threading.local()
        self._gl.session.hooks["response"].append(self._remember)

    def _remember(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._last.headers = dict(response.headers)

    # --- the Forge protocol ------------------------------------------------------------------------------------

    def find_open(self, repo: Repo, branch: str) -> PullRequest | None:
        with self._answers():
            found = self._project(repo).mergerequests.list(
                source_branch=branch, state="opened", get_all=False, per_page=100, **ONCE
            )
            ours = [m for m in found if m.attributes.get("source_project_id") == m.attributes.get("target_project_id")]
            return _pull(ours[0].attributes) if ours else None

    def get(self, repo: Repo, number: int) -> PullRequest:
        with self._answers():
            return _pull(self._project(repo).mergerequests.get(number, **ONCE).attributes)

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
        fields: dict[str, Any] = {
            "source_branch": branch,
            "target_branch": base,
            "title": DRAFT + title if draft else title,
            "description": body,
        }
        if labels:
            fields["labels"] = ",".join(labels)  # GitLab makes the labels it does not have yet
        if reviewers:
            fields["reviewer_ids"] = self._user_ids(reviewers)
        with self._answers():
            return _pull(self._project(repo).mergerequests.create(fields, **ONCE).attributes)

    def update(self, repo: Repo, number: int, *, body: str, title: str | None = None) -> PullRequest:
        fields: dict[str, Any] = {"description": body}
        if title is not None:
            draft = self.get(repo, number).draft  # a new title keeps the draft's marker
            fields["title"] = DRAFT + title if draft else title
        with self._answers():
            return _pull(self._project(repo).mergerequests.update(number, fields, **ONCE))

    def status(self, repo: Repo, pull: PullRequest) -> Status:
        with self._answers():
            project = self._project(repo)
            merge_request = project.mergerequests.get(pull.number, **ONCE)
            data = merge_request.attributes
            fresh = _pull(data)
            review = self._review(data, merge_request)
            checks = []
            pipeline = data.get("head_pipeline") or data.get("pipeline")
            if isinstance(pipeline, dict):
                checks.append(Check("pipeline", _check(pipeline.get("status")), pipeline.get("web_url")))
            statuses = project.commits.get(fresh.head_sha, lazy=True).statuses.list(get_all=True, **ONCE)
            checks += [
                Check(str(s.attributes["name"]), _check(s.attributes.get("status")), s.attributes.get("target_url"))
                for s in statuses
            ]
            return Status(fresh, review, tuple(checks))

    def git_credentials(self, repo: Repo) -> Credentials:
        return Credentials(self._username, self._token, host=git_host(self.host))

    # --- the parts ---------------------------------------------------------------------------------------------

    def _project(self, repo: Repo) -> Any:
        return self._gl.projects.get(repo.path, lazy=True)  # no request: the path is the id

    def _user_ids(self, names: tuple[str, ...]) -> list[int]:
        """The users' ids (GitLab asks for reviewers by id); a name it does not know is left out, and logged."""
        ids = []
        for name in names:
            try:
                with self._answers():
                    users = self._gl.users.list(username=name, get_all=False, **ONCE)
            except ForgeError as e:
                log.warning("reviewer %s not looked up on %s: %s", name, self.host, e.text)
                continue
            if users:
                ids.append(int(users[0].attributes["id"]))
            else:
                log.warning("reviewer %s is no user of %s: left out", name, self.host)
        return ids

    def _review(self, data: dict[str, Any], merge_request: Any) -> str | None:
        """Each reviewer's state (any change request wins, then an approval), then the approval rules: what they
        still require. `detailed_merge_status` names one reason only (a draft's hides a change request)."""
        with self._answers():
            reviewers = merge_request.reviewer_details.list(get_all=True, **ONCE)
        states = {str(r.attributes.get("state")) for r in reviewers}
        if "requested_changes" in states or data.get("detailed_merge_status") == "requested_changes":
            return "changes requested"
        try:
            with self._answers():
                approvals = merge_request.approvals.get(**ONCE).attributes
        except ForgeError as e:  # a GitLab without approvals (its free tier before 13.2) says nothing of them
            log.info("no approvals of merge request %s on %s: %s", data.get("iid"), self.host, e.text)
            approvals = {}
        # `approved` is true where no approval is required, too: an approval is someone's.
        if approvals.get("approvals_left"):
            return "review required"
        if approvals.get("approved_by") or "approved" in states:
            return "approved"
        return "review required" if "unreviewed" in states else None

    @contextmanager
    def _answers(self) -> Iterator[None]:
        """python-gitlab's errors as ours, in GitLab's words, masked."""
        self._last.headers = {}
        try:
            yield
        except GitlabError as e:
            status = e.response_code
            if status is None:  # no answer to read: python-gitlab's own complaint
                raise unexpected(self.kind, e) from None
            raise failed(self.kind, status, _words(e.error_message), self._last.headers, [self._token]) from None
        except requests.RequestException as e:
            raise unreachable(self.kind, self.api_url, e, [self._token]) from None
        except (KeyError, TypeError, ValueError) as e:
            raise unexpected(self.kind, e) from None


def _words(message: Any) -> str:
    """GitLab's `message`: a text, a list of texts, or the problems by field ({"title": ["is too long"]})."""
    if isinstance(message, list):
        return "; ".join(_words(m) for m in message)
    if isinstance(message, dict):
        return "; ".join(f"{k} {_words(v)}" for k, v in message.items())
    return str(message)


def _pull(data: dict[str, Any]) -> PullRequest:
    title = str(data["title"])
    draft = bool(data.get("draft") or data.get("work_in_progress")) or title.startswith(DRAFT_MARKERS)
    for marker in DRAFT_MARKERS:
        title = title.removeprefix(marker).lstrip() if title.startswith(marker) else title
    return PullRequest(
        number=int(data["iid"]),
        url=str(data["web_url"]),
        state=STATES.get(str(data["state"]), PullState.CLOSED),  # closed, locked
        draft=draft,
        branch=str(data["source_branch"]),
        head_sha=str(data.get("sha") or ""),
        base=str(data["target_branch"]),
        title=title,
        body=str(data.get("description") or ""),
    )


def _check(status: object) -> CheckState:
    return CHECKS.get(str(status), CheckState.FAILURE)
