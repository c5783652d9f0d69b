"""GitHub's REST API as GitHub Enterprise Server serves it (under /api/v3), for ForgeServer("github"): pull
requests, their labels, reviewers, reviews and checks, and a GitHub App's installation tokens.

Shapes follow GitHub's OpenAPI description (githubkit's models are generated from it, and the kit's tests parse
every answer with them); refusals are GitHub's: `{"message", "documentation_url", "status"}`, with a 422's
`errors` list.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import TYPE_CHECKING, Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from playground.forge_state import (
    ApiError,
    Call,
    Identity,
    Pull,
    Repo,
    Route,
    Unsupported,
    iso,
    now,
    user_id,
)

if TYPE_CHECKING:
    from playground.forge_server import ForgeServer

PREFIX = "/api/v3"
DOCS = "https://docs.github.com/rest"
API_VERSION = "2022-11-28"
RATE_LIMIT = 5000
_R = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"


def _error(status: int, message: str, doc: str = DOCS, **extra: Any) -> ApiError:
    return ApiError(status, {"message": message, "documentation_url": doc, **extra, "status": str(status)})


def _invalid(errors: list[dict[str, Any]], doc: str) -> ApiError:
    return _error(422, "Validation Failed", doc, errors=errors)


def token_of(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return (value.strip() or None) if scheme.lower() in ("token", "bearer") else None


def unauthorized(server: ForgeServer, token: str | None) -> ApiError:
    # GitHub answers an anonymous call to a private repository 404, and a bad token 401.
    if token is None:
        return _error(404, "Not Found")
    return _error(401, "Bad credentials")


def rate_limited(server: ForgeServer, until: dt.datetime, who: Identity | None) -> ApiError:
    whom = f"installation ID {who.installation_id}" if who is not None and who.bot else "user ID 100"
    headers = _rate_headers(remaining=0, reset=until)
    return ApiError(
        server.rate_limit_status,
        {
            "message": f"API rate limit exceeded for {whom}.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
            "status": str(server.rate_limit_status),
        },
        headers,
    )


def bad_json(server: ForgeServer) -> ApiError:
    return _error(400, "Problems parsing JSON")


def _rate_headers(remaining: int, reset: dt.datetime) -> dict[str, str]:
    return {
        "x-ratelimit-limit": str(RATE_LIMIT),
        "x-ratelimit-remaining": str(remaining),
        "x-ratelimit-used": str(RATE_LIMIT - remaining),
        "x-ratelimit-reset": str(int(reset.timestamp())),
        "x-ratelimit-resource": "core",
    }


def decorate(server: ForgeServer, request: web.Request, response: web.StreamResponse) -> None:
    """The headers every answer of GitHub's carries."""
    if "x-ratelimit-remaining" not in response.headers:
        used = sum(1 for _ in server.requests) % RATE_LIMIT
        response.headers.update(_rate_headers(RATE_LIMIT - used, now() + dt.timedelta(hours=1)))
    response.headers["x-github-api-version-selected"] = request.headers.get("X-GitHub-Api-Version", API_VERSION)
    response.headers["x-github-media-type"] = "github.v3; format=json"
    response.headers["x-github-request-id"] = uuid.uuid4().hex[:20].upper()


# -- shapes ----------------------------------------------------------------------------------------------------


def _api(server: ForgeServer) -> str:
    return f"{server.base}{PREFIX}"


def user(server: ForgeServer, login: str) -> dict[str, Any]:
    api, bot = _api(server), login.endswith("[bot]")
    uid = user_id(server, login)
    u = f"{api}/users/{login}"
    return {
        "login": login,
        "id": uid,
        "node_id": f"U_{uid}",
        "avatar_url": f"{server.base}/avatars/u/{uid}",
        "gravatar_id": "",
        "url": u,
        "html_url": f"{server.base}/{'apps/' + login.removesuffix('[bot]') if bot else login}",
        "followers_url": f"{u}/followers",
        "following_url": f"{u}/following{{/other_user}}",
        "gists_url": f"{u}/gists{{/gist_id}}",
        "starred_url": f"{u}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{u}/subscriptions",
        "organizations_url": f"{u}/orgs",
        "repos_url": f"{u}/repos",
        "events_url": f"{u}/events{{/privacy}}",
        "received_events_url": f"{u}/received_events",
        "type": "Bot" if bot else "User",
        "user_view_type": "public",
        "site_admin": False,
    }


_REPO_URLS = {
    "archive_url": "/{archive_format}{/ref}",
    "assignees_url": "/assignees{/user}",
    "blobs_url": "/git/blobs{/sha}",
    "branches_url": "/branches{/branch}",
    "collaborators_url": "/collaborators{/collaborator}",
    "comments_url": "/comments{/number}",
    "commits_url": "/commits{/sha}",
    "compare_url": "/compare/{base}...{head}",
    "contents_url": "/contents/{+path}",
    "contributors_url": "/contributors",
    "deployments_url": "/deployments",
    "downloads_url": "/downloads",
    "events_url": "/events",
    "forks_url": "/forks",
    "git_commits_url": "/git/commits{/sha}",
    "git_refs_url": "/git/refs{/sha}",
    "git_tags_url": "/git/tags{/sha}",
    "hooks_url": "/hooks",
    "issue_comment_url": "/issues/comments{/number}",
    "issue_events_url": "/issues/events{/number}",
    "issues_url": "/issues{/number}",
    "keys_url": "/keys{/key_id}",
    "labels_url": "/labels{/name}",
    "languages_url": "/languages",
    "merges_url": "/merges",
    "milestones_url": "/milestones{/number}",
    "notifications_url": "/notifications{?since,all,participating}",
    "pulls_url": "/pulls{/number}",
    "releases_url": "/releases{/id}",
    "stargazers_url": "/stargazers",
    "statuses_url": "/statuses/{sha}",
    "subscribers_url": "/subscribers",
    "subscription_url": "/subscription",
    "tags_url": "/tags",
    "teams_url": "/teams",
    "trees_url": "/git/trees{/sha}",
}


def repository(server: ForgeServer, repo: Repo) -> dict[str, Any]:
    """A full repository (GET /repos/{owner}/{repo}); a superset of what a pull request's head and base carry."""
    url, html = f"{_api(server)}/repos/{repo.path}", f"{server.base}/{repo.path}"
    when = iso(repo.created)
    open_pulls = sum(p.state == "open" for p in server.pulls_by_repo[repo.path])
    return {
        "id": repo.id,
        "node_id": f"R_{repo.id}",
        "name": repo.name,
        "full_name": repo.path,
        "private": True,
        "owner": user(server, repo.owner),
        "html_url": html,
        "description": None,
        "fork": False,
        "url": url,
        **{key: url + tail for key, tail in _REPO_URLS.items()},
        "git_url": f"git://{server.host}/{repo.path}.git",
        "ssh_url": f"git@{server.host.split(':')[0]}:{repo.path}.git",
        "clone_url": f"{html}.git",
        "svn_url": html,
        "mirror_url": None,
        "homepage": None,
        "language": None,
        "forks_count": 0,
        "forks": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "watchers": 0,
        "size": 1,
        "default_branch": repo.default_branch,
        "open_issues_count": open_pulls,
        "open_issues": open_pulls,
        "is_template": False,
        "topics": [],
        "has_issues": True,
        "has_projects": True,
        "has_wiki": True,
        "has_pages": False,
        "has_downloads": True,
        "has_discussions": False,
        "archived": False,
        "disabled": False,
        "visibility": "private",
        "pushed_at": when,
        "created_at": when,
        "updated_at": when,
        "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
        "allow_forking": False,
        "web_commit_signoff_required": False,
        "subscribers_count": 1,
        "network_count": 0,
        "license": None,
    }


def _label(server: ForgeServer, repo: Repo, name: str) -> dict[str, Any]:
    lid = repo.labels[name]
    return {
        "id": lid,
        "node_id": f"LA_{lid}",
        "url": f"{_api(server)}/repos/{repo.path}/labels/{name}",
        "name": name,
        "description": None,
        "color": "ededed",
        "default": name in ("bug", "enhancement"),
        "archived_at": None,
        "archived_by": None,
    }


def pull_request(server: ForgeServer, pull: Pull, *, full: bool) -> dict[str, Any]:
    """A pull request: `full` for GET/POST/PATCH of one (PullRequest), else the list's PullRequestSimple."""
    repo, api = pull.repo, _api(server)
    url = f"{api}/repos/{repo.path}/pulls/{pull.number}"
    issue = f"{api}/repos/{repo.path}/issues/{pull.number}"
    html = server.html_url(pull)
    statuses = f"{api}/repos/{repo.path}/statuses/{pull.head_sha}"
    repo_json = repository(server, repo)
    shape: dict[str, Any] = {
        "url": url,
        "id": pull.id,
        "node_id": f"PR_{pull.id}",
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": issue,
        "commits_url": f"{url}/commits",
        "review_comments_url": f"{url}/comments",
        "review_comment_url": f"{api}/repos/{repo.path}/pulls/comments{{/number}}",
        "comments_url": f"{issue}/comments",
        "statuses_url": statuses,
        "number": pull.number,
        "state": "open" if pull.state == "open" else "closed",
        "locked": False,
        "title": pull.title,
        "user": user(server, pull.author),
        "body": pull.body or None,
        "labels": [_label(server, repo, name) for name in pull.labels],
        "milestone": None,
        "active_lock_reason": None,
        "created_at": iso(pull.created),
        "updated_at": iso(pull.updated),
        "closed_at": iso(pull.closed),
        "merged_at": iso(pull.merged),
        "merge_commit_sha": None,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [user(server, r) for r in pull.reviewers],
        "requested_teams": [],
        "head": {
            "label": f"{repo.owner}:{pull.head}",
            "ref": pull.head,
            "sha": pull.head_sha,
            "user": user(server, repo.owner),
            "repo": repo_json,
        },
        "base": {
            "label": f"{repo.owner}:{pull.base}",
            "ref": pull.base,
            "sha": pull.base_sha,
            "user": user(server, repo.owner),
            "repo": repo_json,
        },
        "_links": {
            "self": {"href": url},
            "html": {"href": html},
            "issue": {"href": issue},
            "comments": {"href": f"{issue}/comments"},
            "review_comments": {"href": f"{url}/comments"},
            "review_comment": {"href": f"{api}/repos/{repo.path}/pulls/comments{{/number}}"},
            "commits": {"href": f"{url}/commits"},
            "statuses": {"href": statuses},
        },
        "author_association": "MEMBER",
        "auto_merge": None,
        "draft": pull.draft_flag,
    }
    if full:
        shape |= {
            "merged": pull.state == "merged",
            "mergeable": True if pull.state == "open" else None,
            "rebaseable": True if pull.state == "open" else None,
            "mergeable_state": "draft" if pull.draft_flag else "clean",
            "merged_by": user(server, "alice") if pull.state == "merged" else None,
            "comments": 0,
            "review_comments": 0,
            "maintainer_can_modify": False,
            "commits": 1,
            "additions": 1,
            "deletions": 0,
            "changed_files": 1,
        }
    return shape


# -- body checks, as GitHub words them -------------------------------------------------------------------------

_TYPES: dict[type, str] = {str: "string", bool: "boolean", int: "integer", list: "array", dict: "object"}


def _check_body(body: Any, fields: dict[str, tuple[type, bool]], doc: str) -> dict[str, Any]:
    """`fields`: name -> (type, required). GitHub refuses a body that is not an object, a missing required
    field, or a value of another type, with `Invalid request.` and the JSON schema's words."""
    if not isinstance(body, dict):
        raise _error(400, "Problems parsing JSON", doc)
    for name, (kind, required) in fields.items():
        if name not in body:
            if required:
                raise _error(422, f'Invalid request.\n\n"{name}" wasn\'t supplied.', doc)
            continue
        value = body[name]
        if value is None and not required:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _error(422, f"Invalid request.\n\nFor 'properties/{name}', {value!r} is not a {_TYPES[kind]}.", doc)
    return body


def _repo(server: ForgeServer, call: Call) -> Repo:
    path = f"{call.match['owner']}/{call.match['repo']}"
    if path not in server.repos:
        raise _error(404, "Not Found", f"{DOCS}/repos/repos#get-a-repository")
    return server.repos[path]


def _pull(server: ForgeServer, call: Call) -> Pull:
    repo = _repo(server, call)
    try:
        return server.pull(repo.path, int(call.match["number"]))
    except KeyError:
        raise _error(404, "Not Found", f"{DOCS}/pulls/pulls#get-a-pull-request") from None


def _may_write(call: Call, repo: Repo, doc: str) -> None:
    assert call.who is not None
    if not call.who.may_write(repo.path):
        whom = "integration" if call.who.bot else "personal access token"
        raise _error(403, f"Resource not accessible by {whom}", doc)


def _query(call: Call, allowed: set[str]) -> None:
    unknown = set(call.query) - allowed
    if unknown:
        raise Unsupported(f"query parameters {sorted(unknown)}")


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers)


# -- handlers --------------------------------------------------------------------------------------------------


async def get_repo(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    return _json(repository(server, _repo(server, call)))


async def list_pulls(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"state", "head", "base", "per_page", "page", "sort", "direction"})
    repo = _repo(server, call)
    q = call.query
    state = q.get("state", "open")
    if state not in ("open", "closed", "all"):
        raise _invalid([{"resource": "PullRequest", "field": "state", "code": "invalid"}], f"{DOCS}/pulls/pulls")
    if q.get("sort", "created") != "created" or q.get("direction", "desc") != "desc":
        raise Unsupported("sort/direction other than created/desc")
    if "head" in q and ":" not in q["head"]:
        raise Unsupported("head without `owner:` (GitHub wants `user:ref-name`)")
    per_page, page = _int(q.get("per_page", "30")), _int(q.get("page", "1"))
    per_page = min(max(per_page, 1), 100)
    heads = await server.heads(repo)
    with server._lock:
        pulls = [
            p
            for p in reversed(server.pulls_by_repo[repo.path])
            if (state == "all" or (p.state == "open") == (state == "open"))
            and ("head" not in q or q["head"] == f"{repo.owner}:{p.head}")
            and ("base" not in q or q["base"] == p.base)
        ]
        for p in pulls:
            server.refresh(p, heads)
        chosen = pulls[(page - 1) * per_page : page * per_page]
        data = [pull_request(server, p, full=False) for p in chosen]
    headers = {}
    if page * per_page < len(pulls):
        link = f"{_api(server)}/repos/{repo.path}/pulls?per_page={per_page}&page={page + 1}&state={state}"
        headers["Link"] = f'<{link}>; rel="next"'
    return _json(data, headers=headers)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 1


async def create_pull(server: ForgeServer, call: Call) -> web.Response:
    doc = f"{DOCS}/pulls/pulls#create-a-pull-request"
    _query(call, set())
    repo = _repo(server, call)
    body = _check_body(
        call.body,
        {
            "title": (str, False),
            "head": (str, True),
            "base": (str, True),
            "body": (str, False),
            "draft": (bool, False),
            "maintainer_can_modify": (bool, False),
            "head_repo": (str, False),
            "issue": (int, False),
        },
        doc,
    )
    if "title" not in body and "issue" not in body:
        raise _error(422, 'Invalid request.\n\n"title" wasn\'t supplied.', doc)
    if "issue" in body or "head_repo" in body:
        raise Unsupported("a pull request from an issue or a fork")
    _may_write(call, repo, doc)
    owner, _, head = body["head"].rpartition(":")
    base = body["base"]
    heads = await server.heads(repo)
    if (owner and owner != repo.owner) or head not in heads:
        raise _invalid([{"resource": "PullRequest", "field": "head", "code": "invalid"}], doc)
    if base not in heads:
        raise _invalid([{"resource": "PullRequest", "field": "base", "code": "invalid"}], doc)
    if heads[head] == heads[base] or head == base:
        raise _invalid(
            [{"resource": "PullRequest", "code": "custom", "message": f"No commits between {base} and {head}"}], doc
        )
    if base in repo.protected:
        words = repo.protected[base] or f"Protected branch update failed for refs/heads/{base}."
        raise _invalid([{"resource": "PullRequest", "code": "custom", "message": words}], doc)
    with server._lock:
        if any(p.state == "open" and p.head == head and p.base == base for p in server.pulls_by_repo[repo.path]):
            raise _invalid(
                [
                    {
                        "resource": "PullRequest",
                        "code": "custom",
                        "message": f"A pull request already exists for {repo.owner}:{head}.",
                    }
                ],
                doc,
            )
        assert call.who is not None
        number = len(server.pulls_by_repo[repo.path]) + 1
        pull = Pull(
            repo,
            number,
            server.next_id(),
            body.get("title") or "",
            body.get("body") or "",
            head,
            base,
            call.who.login,
            heads[head],
            heads[base],
            draft_flag=bool(body.get("draft")),
        )
        server.pulls_by_repo[repo.path].append(pull)
        data = pull_request(server, pull, full=True)
    return _json(data, 201, {"Location": data["url"]})


async def get_pull(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _pull(server, call)
    heads = await server.heads(pull.repo)
    with server._lock:
        server.refresh(pull, heads)
        return _json(pull_request(server, pull, full=True))


async def update_pull(server: ForgeServer, call: Call) -> web.Response:
    doc = f"{DOCS}/pulls/pulls#update-a-pull-request"
    _query(call, set())
    pull = _pull(server, call)
    body = _check_body(
        call.body,
        {
            "title": (str, False),
            "body": (str, False),
            "state": (str, False),
            "base": (str, False),
            "maintainer_can_modify": (bool, False),
        },
        doc,
    )
    _may_write(call, pull.repo, doc)
    if body.get("state") not in (None, "open", "closed"):
        raise _invalid([{"resource": "PullRequest", "field": "state", "code": "invalid"}], doc)
    if "base" in body:
        raise Unsupported("changing a pull request's base")
    heads = await server.heads(pull.repo)
    with server._lock:
        if body.get("state") == "open" and pull.state == "closed":
            others = [p for p in server.pulls_by_repo[pull.repo.path] if p.state == "open" and p.head == pull.head]
            if others:
                raise _invalid(
                    [
                        {
                            "resource": "PullRequest",
                            "code": "custom",
                            "message": f"A pull request already exists for {pull.repo.owner}:{pull.head}.",
                        }
                    ],
                    doc,
                )
            pull.state, pull.closed = "open", None
        elif body.get("state") == "closed" and pull.state == "open":
            pull.state, pull.closed = "closed", now()
        if body.get("title") is not None:
            pull.title = body["title"]
        if "body" in body:
            pull.body = body["body"] or ""
        pull.updated = now()
        server.refresh(pull, heads)
        return _json(pull_request(server, pull, full=True))


async def add_labels(server: ForgeServer, call: Call) -> web.Response:
    doc = f"{DOCS}/issues/labels#add-labels-to-an-issue"
    _query(call, set())
    pull = _pull(server, call)
    body = _check_body(call.body, {"labels": (list, True)}, doc)
    names = body["labels"]
    if not all(isinstance(n, str) for n in names):
        raise Unsupported("labels as objects")
    _may_write(call, pull.repo, doc)
    with server._lock:
        for name in names:  # GitHub makes a label it does not know
            pull.repo.labels.setdefault(name, server.next_id())
            if name not in pull.labels:
                pull.labels.append(name)
        return _json([_label(server, pull.repo, n) for n in pull.labels])


async def request_reviewers(server: ForgeServer, call: Call) -> web.Response:
    doc = f"{DOCS}/pulls/review-requests#request-reviewers-for-a-pull-request"
    _query(call, set())
    pull = _pull(server, call)
    body = _check_body(call.body, {"reviewers": (list, False), "team_reviewers": (list, False)}, doc)
    if body.get("team_reviewers"):
        raise Unsupported("team reviewers")
    _may_write(call, pull.repo, doc)
    names = body.get("reviewers") or []
    if pull.author in names:
        raise _invalid(
            [
                {
                    "resource": "PullRequest",
                    "code": "custom",
                    "message": "Review cannot be requested from pull request author.",
                }
            ],
            doc,
        )
    if any(n not in server.users for n in names):
        raise _error(
            422,
            "Reviews may only be requested from collaborators. One or more of the users or teams you specified is "
            f"not a collaborator of the {pull.repo.path} repository.",
            doc,
        )
    with server._lock:
        for n in names:
            if n not in pull.reviewers:
                pull.reviewers.append(n)
        return _json(pull_request(server, pull, full=False), 201)


async def list_reviews(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"per_page", "page"})
    pull = _pull(server, call)
    html = server.html_url(pull)
    states = {"approved": "APPROVED", "changes_requested": "CHANGES_REQUESTED"}
    data = [
        {
            "id": r.id,
            "node_id": f"PRR_{r.id}",
            "user": user(server, r.user),
            "body": "",
            "state": states[r.state],
            "html_url": f"{html}#pullrequestreview-{r.id}",
            "pull_request_url": f"{_api(server)}/repos/{pull.repo.path}/pulls/{pull.number}",
            "_links": {
                "html": {"href": f"{html}#pullrequestreview-{r.id}"},
                "pull_request": {"href": f"{_api(server)}/repos/{pull.repo.path}/pulls/{pull.number}"},
            },
            "submitted_at": iso(r.at),
            "commit_id": pull.head_sha,
            "author_association": "MEMBER",
        }
        for r in pull.reviews
        if r.state != "requested"
    ]
    return _json(data)


def _commit(server: ForgeServer, call: Call) -> tuple[Repo, str]:
    repo = _repo(server, call)
    sha = server_commit(server, repo, call.match["ref"])
    if sha is None:
        raise _error(422, f"No commit found for SHA: {call.match['ref']}", f"{DOCS}/commits/statuses")
    return repo, sha


def server_commit(server: ForgeServer, repo: Repo, ref: str) -> str | None:
    from playground import forge_git

    return forge_git.commit_exists(repo.git_dir, server.git_env, ref)


async def check_runs(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"per_page", "page", "filter", "status", "check_name", "app_id"})
    if call.query.get("filter", "latest") != "latest" or {"status", "check_name", "app_id"} & set(call.query):
        raise Unsupported("check-runs filters")
    repo, sha = _commit(server, call)
    api = _api(server)
    runs = []
    for i, (name, state) in enumerate(server.checks.get((repo.path, sha), []), 1):
        rid = repo.id * 1000 + i
        done = state != "pending"
        runs.append(
            {
                "id": rid,
                "head_sha": sha,
                "node_id": f"CR_{rid}",
                "external_id": "",
                "url": f"{api}/repos/{repo.path}/check-runs/{rid}",
                "html_url": f"{server.base}/{repo.path}/runs/{rid}",
                "details_url": f"{server.base}/{repo.path}/runs/{rid}",
                "status": "completed" if done else "in_progress",
                "conclusion": state if done else None,
                "started_at": iso(repo.created),
                "completed_at": iso(now()) if done else None,
                "output": {
                    "title": None,
                    "summary": None,
                    "text": None,
                    "annotations_count": 0,
                    "annotations_url": f"{api}/repos/{repo.path}/check-runs/{rid}/annotations",
                },
                "name": name,
                "check_suite": {"id": repo.id * 1000},
                "app": None,
                "pull_requests": [],
            }
        )
    return _json({"total_count": len(runs), "check_runs": runs})


async def combined_status(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"per_page", "page"})
    repo, sha = _commit(server, call)
    api = _api(server)
    statuses = []
    for i, (name, state) in enumerate(server.statuses.get((repo.path, sha), []), 1):
        sid = repo.id * 1000 + i
        when = iso(repo.created)
        statuses.append(
            {
                "url": f"{api}/repos/{repo.path}/statuses/{sha}",
                "avatar_url": None,
                "id": sid,
                "node_id": f"SC_{sid}",
                "state": "success" if state == "neutral" else state,
                "description": None,
                "target_url": None,
                "context": name,
                "created_at": when,
                "updated_at": when,
            }
        )
    states = {s["state"] for s in statuses}
    combined = (
        "failure" if states & {"failure", "error"} else "pending" if "pending" in states or not states else "success"
    )
    full = repository(server, repo)
    minimal = {
        k: full[k]
        for k in (
            "id",
            "node_id",
            "name",
            "full_name",
            "owner",
            "private",
            "html_url",
            "description",
            "fork",
            "url",
            *_REPO_URLS,
        )
    }
    return _json(
        {
            "state": combined,
            "statuses": statuses,
            "sha": sha,
            "total_count": len(statuses),
            "repository": minimal,
            "commit_url": f"{api}/repos/{repo.path}/commits/{sha}",
            "url": f"{api}/repos/{repo.path}/commits/{sha}/status",
        }
    )


# -- GitHub Apps -----------------------------------------------------------------------------------------------


def _app_of(server: ForgeServer, call: Call) -> Any:
    """The app whose JWT authenticates the call, checked as GitHub does (RS256, iss, iat, exp at most ten
    minutes ahead); 401 otherwise."""
    token = call.token
    if token is None:
        raise _error(401, "A JSON web token could not be decoded", f"{DOCS}/apps")
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
        app = server.apps.get(int(claims["iss"]))
    except (jwt.PyJWTError, KeyError, TypeError, ValueError):
        raise _error(401, "A JSON web token could not be decoded", f"{DOCS}/apps") from None
    if app is None:
        raise _error(401, "Integration not found", f"{DOCS}/apps")
    public = app.key.public_key()
    assert isinstance(public, rsa.RSAPublicKey)
    try:
        claims = jwt.decode(token, public, algorithms=["RS256"], options={"require": ["iss", "iat", "exp"]}, leeway=60)
    except jwt.ExpiredSignatureError:
        raise _error(
            401,
            "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the "
            "assertion expires",
            f"{DOCS}/apps",
        ) from None
    except jwt.ImmatureSignatureError:
        raise _error(
            401,
            "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued",
            f"{DOCS}/apps",
        ) from None
    except jwt.PyJWTError:
        raise _error(401, "A JSON web token could not be decoded", f"{DOCS}/apps") from None
    if claims["exp"] > now().timestamp() + 600 + 60:
        raise _error(401, "'Expiration time' claim ('exp') is too far in the future", f"{DOCS}/apps")
    return app


def _installation(server: ForgeServer, app: Any, owner: str) -> dict[str, Any]:
    when = iso(now())
    return {
        "id": app.installation_id,
        "account": user(server, owner),
        "access_tokens_url": f"{_api(server)}/app/installations/{app.installation_id}/access_tokens",
        "repositories_url": f"{_api(server)}/installation/repositories",
        "html_url": f"{server.base}/settings/installations/{app.installation_id}",
        "app_id": app.id,
        "app_slug": app.slug,
        "target_id": user_id(server, owner),
        "target_type": "Organization",
        "permissions": {
            "contents": "write",
            "pull_requests": "write",
            "checks": "read",
            "statuses": "read",
            "metadata": "read",
        },
        "events": [],
        "created_at": when,
        "updated_at": when,
        "single_file_name": None,
        "repository_selection": "all",
        "suspended_by": None,
        "suspended_at": None,
    }


async def repo_installation(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    app = _app_of(server, call)
    repo = _repo(server, call)
    return _json(_installation(server, app, repo.owner))


repo_installation.own_auth = True  # pyright: ignore[reportFunctionMemberAccess]


async def access_token(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    app = _app_of(server, call)
    if int(call.match["id"]) != app.installation_id:
        raise _error(404, "Not Found", f"{DOCS}/apps/apps#create-an-installation-access-token-for-an-app")
    if call.body not in (None, {}) and not isinstance(call.body, dict):
        raise _error(400, "Problems parsing JSON")
    if call.body:
        raise Unsupported("an installation token narrowed to repositories or permissions")
    who = server.issue_installation_token(app)
    assert who.expires is not None
    return _json(
        {
            "token": who.token,
            "expires_at": iso(who.expires),
            "permissions": {"contents": "write", "pull_requests": "write", "metadata": "read"},
            "repository_selection": "all",
        },
        201,
    )


access_token.own_auth = True  # pyright: ignore[reportFunctionMemberAccess]


ROUTES: list[Route] = [
    ("GET", re.compile(_R), get_repo),
    ("GET", re.compile(_R + "/pulls"), list_pulls),
    ("POST", re.compile(_R + "/pulls"), create_pull),
    ("GET", re.compile(_R + r"/pulls/(?P<number>\d+)"), get_pull),
    ("PATCH", re.compile(_R + r"/pulls/(?P<number>\d+)"), update_pull),
    ("POST", re.compile(_R + r"/issues/(?P<number>\d+)/labels"), add_labels),
    ("POST", re.compile(_R + r"/pulls/(?P<number>\d+)/requested_reviewers"), request_reviewers),
    ("GET", re.compile(_R + r"/pulls/(?P<number>\d+)/reviews"), list_reviews),
    ("GET", re.compile(_R + r"/commits/(?P<ref>.+)/check-runs"), check_runs),
    ("GET", re.compile(_R + r"/commits/(?P<ref>.+)/status"), combined_status),
    ("GET", re.compile(_R + "/installation"), repo_installation),
    ("POST", re.compile(r"/app/installations/(?P<id>\d+)/access_tokens"), access_token),
]
