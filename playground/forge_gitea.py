"""Gitea's (and Forgejo's) REST API (/api/v1) for ForgeServer("gitea"): repositories, pull requests, labels,
review requests, reviews and commit statuses.

Shapes follow Gitea's swagger description (pyforgejo's types are generated from Forgejo's); refusals are Gitea's:
`{"message", "url"}` (a 404 adds `errors`), and the binding's 422 list
`[{"fieldNames": [...], "classification": "RequiredError", "message": "Required"}]` for a body that misses a
required field or holds a value of the wrong JSON type.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from playground import forge_git
from playground.forge_state import (
    ApiError,
    Call,
    CheckState,
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

PREFIX = "/api/v1"
_R = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"
# Gitea's commit status states, from the kit's four (Gitea has no neutral: its `warning` is the nearest).
_STATE: dict[CheckState, str] = {"pending": "pending", "success": "success", "failure": "failure", "neutral": "warning"}
# Gitea's combined state is the worst of its statuses, in this order (worst first).
_WORST = ("error", "failure", "warning", "pending", "success")
_GO_TYPES = {str: "string", bool: "bool", int: "number", float: "number", list: "array", dict: "object"}


def _swagger(server: ForgeServer) -> str:
    return f"{server.base}/api/swagger"


def _error(server: ForgeServer, status: int, message: str) -> ApiError:
    body: dict[str, Any] = {"message": message, "url": _swagger(server)}
    if status == 404:
        body["errors"] = []
    return ApiError(status, body)


def _not_found(server: ForgeServer) -> ApiError:
    return _error(server, 404, "The target couldn't be found.")


def token_of(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return (value.strip() or None) if scheme.lower() in ("token", "bearer") else None


def unauthorized(server: ForgeServer, token: str | None) -> ApiError:
    # Gitea hides a private repository from an anonymous caller (404) and refuses an unknown token (401).
    if token is None:
        return _not_found(server)
    return _error(server, 401, "token is required")


def rate_limited(server: ForgeServer, until: dt.datetime, who: Identity | None) -> ApiError:
    # Gitea has no API rate limit of its own; a proxy in front of it answers 429 with Retry-After.
    wait = max(1, int((until - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    refused = _error(server, 429, "rate limit exceeded")
    refused.headers["Retry-After"] = str(wait)
    return refused


def bad_json(server: ForgeServer) -> ApiError:
    return ApiError(422, [{"fieldNames": [], "classification": "DeserializationError", "message": "invalid JSON"}])


def decorate(server: ForgeServer, request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("X-Gitea-Version", "1.22.0")


# -- shapes ----------------------------------------------------------------------------------------------------


def user(server: ForgeServer, login: str) -> dict[str, Any]:
    uid = user_id(server, login)
    return {
        "id": uid,
        "login": login,
        "login_name": "",
        "source_id": 0,
        "full_name": login.capitalize(),
        "email": f"{login}@noreply.{server.host.split(':')[0]}",
        "avatar_url": f"{server.base}/avatars/{uid}",
        "html_url": f"{server.base}/{login}",
        "language": "",
        "is_admin": False,
        "last_login": "0001-01-01T00:00:00Z",
        "created": "2024-01-01T00:00:00Z",
        "restricted": False,
        "active": False,
        "prohibit_login": False,
        "location": "",
        "pronouns": "",
        "website": "",
        "description": "",
        "visibility": "public",
        "followers_count": 0,
        "following_count": 0,
        "starred_repos_count": 0,
        "username": login,
    }


def repository(server: ForgeServer, repo: Repo) -> dict[str, Any]:
    html = f"{server.base}/{repo.path}"
    when = iso(repo.created)
    opened = sum(p.state == "open" for p in server.pulls_by_repo[repo.path])
    return {
        "id": repo.id,
        "owner": user(server, repo.owner),
        "name": repo.name,
        "full_name": repo.path,
        "description": "",
        "empty": False,
        "private": True,
        "fork": False,
        "template": False,
        "parent": None,
        "mirror": False,
        "size": 1,
        "language": "",
        "languages_url": f"{server.base}{PREFIX}/repos/{repo.path}/languages",
        "html_url": html,
        "url": f"{server.base}{PREFIX}/repos/{repo.path}",
        "link": "",
        "ssh_url": f"git@{server.host.split(':')[0]}:{repo.path}.git",
        "clone_url": f"{html}.git",
        "original_url": "",
        "website": "",
        "stars_count": 0,
        "forks_count": 0,
        "watchers_count": 1,
        "open_issues_count": 0,
        "open_pr_counter": opened,
        "release_counter": 0,
        "default_branch": repo.default_branch,
        "archived": False,
        "created_at": when,
        "updated_at": when,
        "archived_at": "1970-01-01T00:00:00Z",
        "permissions": {"admin": False, "push": True, "pull": True},
        "has_issues": True,
        "has_wiki": True,
        "has_pull_requests": True,
        "has_projects": True,
        "has_releases": True,
        "has_packages": True,
        "has_actions": True,
        "ignore_whitespace_conflicts": False,
        "allow_merge_commits": True,
        "allow_rebase": True,
        "allow_rebase_explicit": True,
        "allow_squash_merge": True,
        "allow_fast_forward_only_merge": False,
        "allow_rebase_update": True,
        "default_delete_branch_after_merge": False,
        "default_merge_style": "merge",
        "default_allow_maintainer_edit": False,
        "avatar_url": "",
        "internal": False,
        "mirror_interval": "",
        "object_format_name": "sha1",
        "mirror_updated": "0001-01-01T00:00:00Z",
        "topics": [],
    }


def _label(server: ForgeServer, repo: Repo, name: str) -> dict[str, Any]:
    lid = repo.labels[name]
    return {
        "id": lid,
        "name": name,
        "exclusive": False,
        "is_archived": False,
        "color": "ededed",
        "description": "",
        "url": f"{server.base}{PREFIX}/repos/{repo.path}/labels/{lid}",
    }


def pull_request(server: ForgeServer, pull: Pull) -> dict[str, Any]:
    repo = pull.repo
    html = server.html_url(pull)
    repo_json = repository(server, repo)

    def branch(name: str, sha: str) -> dict[str, Any]:
        return {"label": name, "ref": name, "sha": sha, "repo_id": repo.id, "repo": repo_json}

    merged = pull.state == "merged"
    return {
        "id": pull.id,
        "url": html,
        "number": pull.number,
        "user": user(server, pull.author),
        "title": pull.title,
        "body": pull.body,
        "labels": [_label(server, repo, n) for n in pull.labels],
        "milestone": None,
        "assignee": None,
        "assignees": None,
        "requested_reviewers": [user(server, r) for r in pull.reviewers],
        "requested_reviewers_teams": None,
        "state": "open" if pull.state == "open" else "closed",
        "draft": pull.draft("gitea"),
        "is_locked": False,
        "comments": 0,
        "review_comments": 0,
        "additions": 1,
        "deletions": 0,
        "changed_files": 1,
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "mergeable": pull.state == "open",
        "merged": merged,
        "merged_at": iso(pull.merged),
        "merge_commit_sha": None,
        "merged_by": user(server, "alice") if merged else None,
        "allow_maintainer_edit": False,
        "base": branch(pull.base, pull.base_sha),
        "head": branch(pull.head, pull.head_sha),
        "merge_base": pull.base_sha,
        "due_date": None,
        "created_at": iso(pull.created),
        "updated_at": iso(pull.updated),
        "closed_at": iso(pull.closed),
        "pin_order": 0,
    }


def _review(server: ForgeServer, pull: Pull, review_id: int, login: str, state: str, at: dt.datetime) -> dict[str, Any]:
    html = server.html_url(pull)
    return {
        "id": review_id,
        "user": user(server, login),
        "team": None,
        "state": state,
        "body": "",
        "commit_id": pull.head_sha,
        "stale": False,
        "official": state == "APPROVED",
        "dismissed": False,
        "comments_count": 0,
        "submitted_at": iso(at),
        "updated_at": iso(at),
        "html_url": f"{html}#issuecomment-{review_id}",
        "pull_request_url": html,
    }


# -- bodies, as Gitea's binding checks them --------------------------------------------------------------------


def _bind(body: Any, struct: str, fields: dict[str, tuple[type, bool]]) -> dict[str, Any]:
    """`fields`: json name -> (type, required); a list type's items are checked as `int` when named in _INTS.
    Gitea answers 422 with the binding's list of errors."""
    if not isinstance(body, dict):
        raise ApiError(422, [{"fieldNames": [], "classification": "DeserializationError", "message": "invalid JSON"}])
    for name, value in body.items():
        if name not in fields or value is None:
            continue
        kind = fields[name][0]
        items = value if kind is list else [value]
        want = int if kind is list and name in _INTS else str if kind is list else kind
        for item in items:
            if not isinstance(item, want) or (want is int and isinstance(item, bool)):
                go = "int64" if want is int else _GO_TYPES[want]
                got = _GO_TYPES.get(type(item), "value")
                message = f"json: cannot unmarshal {got} into Go struct field {struct}.{name} of type {go}"
                raise ApiError(422, [{"fieldNames": [], "classification": "DeserializationError", "message": message}])
    missing = [name.capitalize() for name, (_, required) in fields.items() if required and not body.get(name)]
    if missing:
        raise ApiError(422, [{"fieldNames": missing, "classification": "RequiredError", "message": "Required"}])
    unknown = {k for k, v in body.items() if k not in fields and v is not None}
    if unknown:
        raise Unsupported(f"fields {sorted(unknown)}")
    return body


_INTS = {"labels"}


def _repo(server: ForgeServer, call: Call) -> Repo:
    path = f"{call.match['owner']}/{call.match['repo']}"
    if path not in server.repos:
        raise _not_found(server)
    return server.repos[path]


def _pull(server: ForgeServer, call: Call) -> Pull:
    repo = _repo(server, call)
    try:
        return server.pull(repo.path, int(call.match["number"]))
    except KeyError:
        raise _not_found(server) from None


def _may_write(server: ForgeServer, call: Call, repo: Repo) -> None:
    assert call.who is not None
    if not call.who.may_write(repo.path):
        raise _error(server, 403, "user should have a permission to write to a repo")


def _query(call: Call, allowed: set[str]) -> None:
    unknown = set(call.query) - allowed
    if unknown:
        raise Unsupported(f"query parameters {sorted(unknown)}")


def _page(call: Call, items: list[Any], default_limit: int = 30) -> web.Response:
    try:
        limit = min(max(int(call.query.get("limit", str(default_limit))), 1), 50)
        page = max(int(call.query.get("page", "1")), 1)
    except ValueError:
        raise ApiError(422, [{"fieldNames": ["page"], "classification": "Error", "message": "invalid"}]) from None
    headers = {"X-Total-Count": str(len(items))}
    if page * limit < len(items):
        url = call.request.url.update_query(page=str(page + 1), limit=str(limit))
        headers["Link"] = f'<{url}>; rel="next"'
    return web.json_response(items[(page - 1) * limit : page * limit], headers=headers)


# -- handlers --------------------------------------------------------------------------------------------------


async def get_repo(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    return web.json_response(repository(server, _repo(server, call)))


async def list_pulls(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"state", "page", "limit", "sort"})
    if call.query.get("sort", "recentupdate") not in ("recentupdate", "newest"):
        raise Unsupported("sorts other than recentupdate/newest")
    repo = _repo(server, call)
    state = call.query.get("state", "open")
    if state not in ("open", "closed", "all"):
        raise ApiError(422, [{"fieldNames": ["State"], "classification": "InError", "message": "In"}])
    heads = await server.heads(repo)
    with server._lock:
        pulls = [
            p
            for p in reversed(server.pulls_by_repo[repo.path])
            if state == "all" or (p.state == "open") == (state == "open")
        ]
        for p in pulls:
            server.refresh(p, heads)
        return _page(call, [pull_request(server, p) for p in pulls])


async def create_pull(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    repo = _repo(server, call)
    body = _bind(
        call.body,
        "CreatePullRequestOption",
        {
            "head": (str, True),
            "base": (str, True),
            "title": (str, True),
            "body": (str, False),
            "labels": (list, False),
            "assignees": (list, False),
            "assignee": (str, False),
            "milestone": (int, False),
        },
    )
    if body.get("assignee") or body.get("assignees") or body.get("milestone"):
        raise Unsupported("assignees or a milestone")
    _may_write(server, call, repo)
    owner, _, head = body["head"].rpartition(":")
    base = body["base"]
    heads = await server.heads(repo)
    if (owner and owner != repo.owner) or head not in heads or base not in heads:
        raise _not_found(server)
    if head == base or heads[head] == heads[base]:
        raise _error(server, 422, "Invalid PullRequest: There are no changes between the head and the base")
    if base in repo.protected:
        raise _error(server, 403, repo.protected[base] or f"Not allowed to push to protected branch {base}")
    by_id = {lid: name for name, lid in repo.labels.items()}
    with server._lock:
        for p in server.pulls_by_repo[repo.path]:
            if p.state == "open" and p.head == head and p.base == base:
                raise _error(
                    server,
                    409,
                    f"pull request already exists for these targets [id: {p.id}, issue_id: {p.id}, "
                    f"head_repo_id: {repo.id}, base_repo_id: {repo.id}, head_branch: {head}, base_branch: {base}]",
                )
        assert call.who is not None
        pull = Pull(
            repo,
            len(server.pulls_by_repo[repo.path]) + 1,
            server.next_id(),
            body["title"],
            body.get("body") or "",
            head,
            base,
            call.who.login,
            heads[head],
            heads[base],
            labels=[by_id[i] for i in body.get("labels") or [] if i in by_id],  # Gitea skips unknown label ids
        )
        server.pulls_by_repo[repo.path].append(pull)
        return web.json_response(pull_request(server, pull), status=201)


async def get_pull(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _pull(server, call)
    heads = await server.heads(pull.repo)
    with server._lock:
        server.refresh(pull, heads)
        return web.json_response(pull_request(server, pull))


async def pull_by_base_head(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    repo = _repo(server, call)
    heads = await server.heads(repo)
    with server._lock:
        for p in reversed(server.pulls_by_repo[repo.path]):
            if p.base == call.match["base"] and p.head == call.match["head"]:
                server.refresh(p, heads)
                return web.json_response(pull_request(server, p))
    raise _not_found(server)


async def edit_pull(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _pull(server, call)
    body = _bind(
        call.body,
        "EditPullRequestOption",
        {
            "title": (str, False),
            "body": (str, False),
            "state": (str, False),
            "labels": (list, False),
            "base": (str, False),
            "allow_maintainer_edit": (bool, False),
        },
    )
    if "base" in body:
        raise Unsupported("changing a pull request's base")
    _may_write(server, call, pull.repo)
    heads = await server.heads(pull.repo)
    by_id = {lid: name for name, lid in pull.repo.labels.items()}
    with server._lock:
        if body.get("state") == "closed" and pull.state == "open":
            pull.state, pull.closed = "closed", now()
        elif body.get("state") == "open" and pull.state == "closed":
            pull.state, pull.closed = "open", None
        if body.get("title"):
            pull.title = body["title"]
        if body.get("body") is not None:
            pull.body = body["body"]
        if body.get("labels") is not None:
            pull.labels = [by_id[i] for i in body["labels"] if i in by_id]
        pull.updated = now()
        server.refresh(pull, heads)
        return web.json_response(pull_request(server, pull), status=201)


async def list_labels(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"page", "limit"})
    repo = _repo(server, call)
    return _page(call, [_label(server, repo, n) for n in repo.labels])


async def request_reviewers(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _pull(server, call)
    body = _bind(call.body, "PullReviewRequestOptions", {"reviewers": (list, False), "team_reviewers": (list, False)})
    if body.get("team_reviewers"):
        raise Unsupported("team reviewers")
    _may_write(server, call, pull.repo)
    names = body.get("reviewers") or []
    for name in names:
        if name not in server.users:
            raise _error(server, 422, f"user does not exist [uid: 0, name: {name}]")
    made = []
    with server._lock:
        for name in names:
            if name == pull.author:
                continue  # Gitea skips the poster
            if name not in pull.reviewers:
                pull.reviewers.append(name)
            made.append(_review(server, pull, server.next_id(), name, "REQUEST_REVIEW", now()))
    return web.json_response(made, status=201)


async def list_reviews(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"page", "limit"})
    pull = _pull(server, call)
    states = {"approved": "APPROVED", "changes_requested": "REQUEST_CHANGES"}
    items = [_review(server, pull, r.id, r.user, states[r.state], r.at) for r in pull.reviews if r.state in states]
    return _page(call, items)


async def combined_status(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"page", "limit"})
    repo = _repo(server, call)
    sha = forge_git.commit_exists(repo.git_dir, server.git_env, call.match["ref"])
    if sha is None:
        raise _not_found(server)
    when = iso(repo.created)
    api = f"{server.base}{PREFIX}/repos/{repo.path}"
    statuses = [
        {
            "id": repo.id * 1000 + i,
            "status": _STATE[state],
            "target_url": "",
            "description": "",
            "url": f"{api}/statuses/{sha}",
            "context": name,
            "creator": user(server, "alice"),
            "created_at": when,
            "updated_at": when,
        }
        for i, (name, state) in enumerate(server.checks.get((repo.path, sha), []), 1)
    ]
    present = {s["status"] for s in statuses}
    combined = next((s for s in _WORST if s in present), "")  # Gitea: empty when there are none
    return web.json_response(
        {
            "state": combined,
            "sha": sha,
            "total_count": len(statuses),
            "statuses": statuses,
            "repository": repository(server, repo),
            "commit_url": f"{api}/commits/{sha}",
            "url": f"{api}/commits/{sha}/status",
        }
    )


ROUTES: list[Route] = [
    ("GET", re.compile(_R), get_repo),
    ("GET", re.compile(_R + "/pulls"), list_pulls),
    ("POST", re.compile(_R + "/pulls"), create_pull),
    ("GET", re.compile(_R + r"/pulls/(?P<number>\d+)"), get_pull),
    ("PATCH", re.compile(_R + r"/pulls/(?P<number>\d+)"), edit_pull),
    ("GET", re.compile(_R + r"/pulls/(?P<number>\d+)/reviews"), list_reviews),
    ("POST", re.compile(_R + r"/pulls/(?P<number>\d+)/requested_reviewers"), request_reviewers),
    ("GET", re.compile(_R + r"/pulls/(?P<base>[^/]+)/(?P<head>[^/]+)"), pull_by_base_head),
    ("GET", re.compile(_R + "/labels"), list_labels),
    ("GET", re.compile(_R + r"/commits/(?P<ref>.+)/status"), combined_status),
]
