"""GitLab's REST API (/api/v4) for ForgeServer("gitlab"): projects, merge requests, their approvals, reviewers,
pipelines and commit statuses, and users (a reviewer's id).

Shapes follow GitLab's API documentation (what python-gitlab's objects expose as attributes); refusals are
GitLab's: `{"message": ...}` (a string like "404 Project Not Found", a list of reasons, or a field -> reasons
object) and Grape's `{"error": "title is missing"}` for a parameter that is missing or of the wrong type.
"""

from __future__ import annotations

import datetime as dt
import email.utils
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

PREFIX = "/api/v4"
_P = r"/projects/(?P<id>[^/]+)"
_MR = _P + r"/merge_requests/(?P<iid>\d+)"
# A commit status as GitLab names it, from the kit's four states.
_STATUS: dict[CheckState, str] = {"pending": "pending", "success": "success", "failure": "failed", "neutral": "skipped"}


def _message(status: int, message: Any) -> ApiError:
    return ApiError(status, {"message": message})


def token_of(request: web.Request) -> str | None:
    if token := request.headers.get("PRIVATE-TOKEN"):
        return token
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return (value.strip() or None) if scheme.lower() == "bearer" else None


def unauthorized(server: ForgeServer, token: str | None) -> ApiError:
    # GitLab hides a private project from an anonymous caller (404) and refuses a bad token (401).
    if token is None:
        return _message(404, "404 Project Not Found")
    return _message(401, "401 Unauthorized")


def rate_limited(server: ForgeServer, until: dt.datetime, who: Identity | None) -> ApiError:
    wait = max(1, int((until - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    return ApiError(
        429,
        "Retry later\n",
        {
            "RateLimit-Name": "throttle_authenticated_api",
            "RateLimit-Limit": "2000",
            "RateLimit-Observed": "2001",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(int(until.timestamp())),
            "RateLimit-ResetTime": email.utils.format_datetime(until.astimezone(dt.UTC), usegmt=True),
            "Retry-After": str(wait),
        },
    )


def bad_json(server: ForgeServer) -> ApiError:
    return _message(400, "400 Bad request - Invalid JSON")


def decorate(server: ForgeServer, request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("X-Request-Id", f"01J{server.next_id():023d}")
    response.headers.setdefault("X-Gitlab-Meta", '{"correlation_id":"emulated","version":"1"}')


# -- shapes ----------------------------------------------------------------------------------------------------


def user(server: ForgeServer, login: str) -> dict[str, Any]:
    uid = user_id(server, login)
    return {
        "id": uid,
        "username": login,
        "public_email": None,
        "name": login.capitalize(),
        "state": "active",
        "locked": False,
        "avatar_url": f"{server.base}/uploads/-/system/user/avatar/{uid}/avatar.png",
        "web_url": f"{server.base}/{login}",
    }


def project(server: ForgeServer, repo: Repo) -> dict[str, Any]:
    web_url = f"{server.base}/{repo.path}"
    when = iso(repo.created)
    namespace = repo.owner
    return {
        "id": repo.id,
        "description": None,
        "name": repo.name,
        "name_with_namespace": f"{namespace.replace('/', ' / ')} / {repo.name}",
        "path": repo.name,
        "path_with_namespace": repo.path,
        "created_at": when,
        "updated_at": when,
        "default_branch": repo.default_branch,
        "tag_list": [],
        "topics": [],
        "ssh_url_to_repo": f"git@{server.host.split(':')[0]}:{repo.path}.git",
        "http_url_to_repo": f"{web_url}.git",
        "web_url": web_url,
        "readme_url": f"{web_url}/-/blob/{repo.default_branch}/README.md",
        "forks_count": 0,
        "avatar_url": None,
        "star_count": 0,
        "last_activity_at": when,
        "namespace": {
            "id": repo.id - 1,
            "name": namespace.rpartition("/")[2],
            "path": namespace.rpartition("/")[2],
            "kind": "group",
            "full_path": namespace,
            "parent_id": None,
            "avatar_url": None,
            "web_url": f"{server.base}/groups/{namespace}",
        },
        "visibility": "private",
        "archived": False,
        "empty_repo": False,
        "issues_enabled": True,
        "merge_requests_enabled": True,
        "merge_method": "merge",
        "squash_option": "default_off",
        "only_allow_merge_if_pipeline_succeeds": False,
        "remove_source_branch_after_merge": True,
        "permissions": {"project_access": {"access_level": 30, "notification_level": 3}, "group_access": None},
    }


def _pipeline(server: ForgeServer, repo: Repo, pull: Pull) -> dict[str, Any] | None:
    checks = server.checks.get((repo.path, pull.head_sha))
    if not checks:
        return None
    states = {_STATUS[s] for _, s in checks}
    status = "failed" if "failed" in states else "running" if "pending" in states else "success"
    pid = repo.id * 1000 + len(pull.head_sha) + pull.number
    when = iso(repo.created)
    return {
        "id": pid,
        "iid": pull.number,
        "project_id": repo.id,
        "sha": pull.head_sha,
        "ref": pull.head,
        "status": status,
        "source": "push",
        "created_at": when,
        "updated_at": when,
        "web_url": f"{server.base}/{repo.path}/-/pipelines/{pid}",
    }


def _merge_status(server: ForgeServer, pull: Pull, pipeline: dict[str, Any] | None) -> str:
    if pull.state != "open":
        return "not_open"
    if pull.draft("gitlab"):
        return "draft_status"
    if any(r.state == "changes_requested" for r in pull.reviews):
        return "requested_changes"
    if pipeline is not None and pipeline["status"] == "running":
        return "ci_still_running"
    if not any(r.state == "approved" for r in pull.reviews):
        return "not_approved"
    return "mergeable"


def merge_request(server: ForgeServer, pull: Pull, *, single: bool) -> dict[str, Any]:
    """A merge request: `single` for GET/POST/PUT of one (with head_pipeline, diff_refs), else a list's item."""
    repo = pull.repo
    state = {"open": "opened", "closed": "closed", "merged": "merged"}[pull.state]
    pipeline = _pipeline(server, repo, pull)
    draft = pull.draft("gitlab")
    shape: dict[str, Any] = {
        "id": pull.id,
        "iid": pull.number,
        "project_id": repo.id,
        "title": pull.title,
        "description": pull.body,
        "state": state,
        "created_at": iso(pull.created),
        "updated_at": iso(pull.updated),
        "merged_by": user(server, "alice") if pull.state == "merged" else None,
        "merge_user": user(server, "alice") if pull.state == "merged" else None,
        "merged_at": iso(pull.merged),
        "closed_by": user(server, "alice") if pull.state == "closed" else None,
        "closed_at": iso(pull.closed) if pull.state == "closed" else None,
        "target_branch": pull.base,
        "source_branch": pull.head,
        "user_notes_count": 0,
        "upvotes": 0,
        "downvotes": 0,
        "author": user(server, pull.author),
        "assignees": [],
        "assignee": None,
        "reviewers": [user(server, r) for r in pull.reviewers],
        "source_project_id": repo.id,
        "target_project_id": repo.id,
        "labels": list(pull.labels),
        "draft": draft,
        "work_in_progress": draft,
        "milestone": None,
        "merge_when_pipeline_succeeds": False,
        "merge_status": "can_be_merged" if pull.state == "open" else "unchecked",
        "detailed_merge_status": _merge_status(server, pull, pipeline),
        "sha": pull.head_sha,
        "merge_commit_sha": None,
        "squash_commit_sha": None,
        "discussion_locked": None,
        "should_remove_source_branch": None,
        "force_remove_source_branch": True,
        "prepared_at": iso(pull.created),
        "reference": f"!{pull.number}",
        "references": {
            "short": f"!{pull.number}",
            "relative": f"!{pull.number}",
            "full": f"{repo.path}!{pull.number}",
        },
        "web_url": server.html_url(pull),
        "time_stats": {
            "time_estimate": 0,
            "total_time_spent": 0,
            "human_time_estimate": None,
            "human_total_time_spent": None,
        },
        "squash": False,
        "squash_on_merge": False,
        "task_completion_status": {"count": 0, "completed_count": 0},
        "has_conflicts": False,
        "blocking_discussions_resolved": True,
        "approvals_before_merge": None,
    }
    if single:
        shape |= {
            "subscribed": True,
            "changes_count": "1",
            "latest_build_started_at": None,
            "latest_build_finished_at": None,
            "first_deployed_to_production_at": None,
            "pipeline": pipeline,
            "head_pipeline": pipeline,
            "diff_refs": {"base_sha": pull.base_sha, "head_sha": pull.head_sha, "start_sha": pull.base_sha},
            "merge_error": None,
            "first_contribution": False,
            "user": {"can_merge": True},
        }
    return shape


# -- parameters, as Grape checks them --------------------------------------------------------------------------


def _params(body: Any, fields: dict[str, tuple[str, bool]], echoed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`fields`: name -> (kind, required), kind one of str, bool, int, ints (a list of integers), labels (a comma
    string or a list of strings). Grape answers 400 `{"error": "a is missing, b is invalid"}`.

    Grape drops parameters it does not declare. Those named in `echoed` (the object's own attributes, which
    python-gitlab sends back when a list attribute was read) are dropped likewise; any other is a call the
    emulator does not know, loudly."""
    body = body if isinstance(body, dict) else {}
    problems = [f"{name} is missing" for name, (_, required) in fields.items() if required and name not in body]
    for name, value in body.items():
        if name not in fields:
            continue
        if not _fits(fields[name][0], value):
            problems.append(f"{name} is invalid")
    if problems:
        raise ApiError(400, {"error": ", ".join(problems)})
    unknown = set(body) - set(fields) - echoed
    if unknown:
        raise Unsupported(f"parameters {sorted(unknown)}")
    return {k: v for k, v in body.items() if k in fields}


def _fits(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str | int) and not isinstance(value, bool)  # Grape coerces numbers to strings
    if kind == "bool":
        return isinstance(value, bool) or value in ("true", "false")
    if kind == "int":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit())
    if kind == "ints":
        return isinstance(value, list) and all(_fits("int", v) for v in value)
    if kind == "labels":
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    raise AssertionError(kind)


def _labels(value: str | list[str]) -> list[str]:
    names = value.split(",") if isinstance(value, str) else value
    return [n.strip() for n in names if n.strip()]


def _project(server: ForgeServer, call: Call) -> Repo:
    ident = call.match["id"]
    for repo in server.repos.values():
        if ident in (repo.path, str(repo.id)):
            return repo
    raise _message(404, "404 Project Not Found")


def _mr(server: ForgeServer, call: Call) -> Pull:
    repo = _project(server, call)
    try:
        return server.pull(repo.path, int(call.match["iid"]))
    except KeyError:
        raise _message(404, "404 Not found") from None


def _may_write(call: Call, repo: Repo) -> None:
    assert call.who is not None
    if not call.who.may_write(repo.path):
        raise _message(403, "403 Forbidden")


def _query(call: Call, allowed: set[str]) -> None:
    unknown = set(call.query) - allowed
    if unknown:
        raise Unsupported(f"query parameters {sorted(unknown)}")


def _page(call: Call, items: list[Any]) -> web.Response:
    """One page of `items`, with GitLab's pagination headers (python-gitlab follows x-next-page)."""
    try:
        per_page = min(max(int(call.query.get("per_page", "20")), 1), 100)
        page = max(int(call.query.get("page", "1")), 1)
    except ValueError:
        raise ApiError(400, {"error": "page is invalid"}) from None
    pages = max(1, -(-len(items) // per_page))
    headers = {
        "x-page": str(page),
        "x-per-page": str(per_page),
        "x-total": str(len(items)),
        "x-total-pages": str(pages),
        "x-next-page": str(page + 1) if page < pages else "",
        "x-prev-page": str(page - 1) if page > 1 else "",
    }
    if page < pages:
        url = call.request.url.update_query(page=str(page + 1), per_page=str(per_page))
        headers["Link"] = f'<{url}>; rel="next"'
    return web.json_response(items[(page - 1) * per_page : page * per_page], headers=headers)


# -- handlers --------------------------------------------------------------------------------------------------


async def get_project(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"statistics", "license", "with_custom_attributes"})
    return web.json_response(project(server, _project(server, call)))


async def list_mrs(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"state", "source_branch", "target_branch", "per_page", "page", "order_by", "sort", "view"})
    q = call.query
    if q.get("order_by", "created_at") != "created_at" or q.get("sort", "desc") != "desc" or "view" in q:
        raise Unsupported("order_by/sort other than created_at/desc, or a view")
    repo = _project(server, call)
    state = q.get("state", "all")
    if state not in ("opened", "closed", "merged", "locked", "all"):
        raise ApiError(400, {"error": "state does not have a valid value"})
    wanted = {"opened": "open", "closed": "closed", "merged": "merged", "locked": "locked"}.get(state)
    heads = await server.heads(repo)
    with server._lock:
        pulls = [
            p
            for p in reversed(server.pulls_by_repo[repo.path])
            if (wanted is None or p.state == wanted)
            and q.get("source_branch", p.head) == p.head
            and q.get("target_branch", p.base) == p.base
        ]
        for p in pulls:
            server.refresh(p, heads)
        return _page(call, [merge_request(server, p, single=False) for p in pulls])


async def create_mr(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    repo = _project(server, call)
    body = _params(
        call.body,
        {
            "source_branch": ("str", True),
            "target_branch": ("str", True),
            "title": ("str", True),
            "description": ("str", False),
            "labels": ("labels", False),
            "reviewer_ids": ("ints", False),
            "assignee_ids": ("ints", False),
            "remove_source_branch": ("bool", False),
            "squash": ("bool", False),
            "allow_collaboration": ("bool", False),
        },
    )
    if body.get("assignee_ids"):
        raise Unsupported("assignees")
    _may_write(call, repo)
    head, base = str(body["source_branch"]), str(body["target_branch"])
    heads = await server.heads(repo)
    if head == base:
        raise _message(422, ["You can't use same project/branch for source and target"])
    if head not in heads:
        raise _message(400, {"source_branch": ["does not exist"]})
    if base not in heads:
        raise _message(400, {"target_branch": ["does not exist"]})
    if base in repo.protected:
        words = repo.protected[base] or "You are not allowed to push code to protected branches on this project."
        raise _message(422, [words])
    with server._lock:
        for p in server.pulls_by_repo[repo.path]:
            if p.state == "open" and p.head == head:
                raise _message(409, [f"Another open merge request already exists for this source branch: !{p.number}"])
        by_id = {user_id(server, u): u for u in server.users}
        assert call.who is not None
        pull = Pull(
            repo,
            len(server.pulls_by_repo[repo.path]) + 1,
            server.next_id(),
            str(body["title"]),
            str(body.get("description") or ""),
            head,
            base,
            call.who.login,
            heads[head],
            heads[base],
            labels=_labels(body.get("labels") or []),
            # GitLab leaves out reviewer ids it does not know
            reviewers=[by_id[int(i)] for i in body.get("reviewer_ids") or [] if int(i) in by_id],
        )
        server.pulls_by_repo[repo.path].append(pull)
        return web.json_response(merge_request(server, pull, single=True), status=201)


async def get_mr(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"render_html", "include_diverged_commits_count", "include_rebase_in_progress"})
    pull = _mr(server, call)
    heads = await server.heads(pull.repo)
    with server._lock:
        server.refresh(pull, heads)
        return web.json_response(merge_request(server, pull, single=True))


async def update_mr(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _mr(server, call)
    fields = {
        "title": ("str", False),
        "description": ("str", False),
        "state_event": ("str", False),
        "labels": ("labels", False),
        "add_labels": ("labels", False),
        "remove_labels": ("labels", False),
        "reviewer_ids": ("ints", False),
        "remove_source_branch": ("bool", False),
        "squash": ("bool", False),
    }
    body = _params(call.body, fields, frozenset(merge_request(server, pull, single=True)))
    if not body:
        raise ApiError(400, {"error": f"{', '.join(fields)} are missing, at least one parameter must be provided"})
    if body.get("state_event") not in (None, "close", "reopen"):
        raise ApiError(400, {"error": "state_event does not have a valid value"})
    _may_write(call, pull.repo)
    heads = await server.heads(pull.repo)
    with server._lock:
        if body.get("state_event") == "close" and pull.state == "open":
            pull.state, pull.closed = "closed", now()
        elif body.get("state_event") == "reopen" and pull.state == "closed":
            for p in server.pulls_by_repo[pull.repo.path]:
                if p.state == "open" and p.head == pull.head:
                    raise _message(
                        409, [f"Another open merge request already exists for this source branch: !{p.number}"]
                    )
            pull.state, pull.closed = "open", None
        if "title" in body:
            pull.title = str(body["title"])
        if "description" in body:
            pull.body = str(body["description"])
        if "labels" in body:
            pull.labels = _labels(body["labels"])
        pull.labels += [n for n in _labels(body.get("add_labels") or []) if n not in pull.labels]
        gone = _labels(body.get("remove_labels") or [])
        pull.labels = [n for n in pull.labels if n not in gone]
        if "reviewer_ids" in body:
            by_id = {user_id(server, u): u for u in server.users}
            pull.reviewers = [by_id[int(i)] for i in body["reviewer_ids"] if int(i) in by_id]
        pull.updated = now()
        server.refresh(pull, heads)
        return web.json_response(merge_request(server, pull, single=True))


async def approvals(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _mr(server, call)
    approved = [r.user for r in pull.reviews if r.state == "approved"]
    state = {"open": "opened", "closed": "closed", "merged": "merged"}[pull.state]
    return web.json_response(
        {
            "id": pull.id,
            "iid": pull.number,
            "project_id": pull.repo.id,
            "title": pull.title,
            "description": pull.body,
            "state": state,
            "created_at": iso(pull.created),
            "updated_at": iso(pull.updated),
            "merge_status": "can_be_merged",
            "approved": bool(approved),
            "approvals_required": 1,
            "approvals_left": 0 if approved else 1,
            "require_password_to_approve": False,
            "approved_by": [{"user": user(server, u)} for u in approved],
            "suggested_approvers": [],
            "approvers": [],
            "approver_groups": [],
            "user_has_approved": False,
            "user_can_approve": True,
            "approval_rules_left": [],
            "has_approval_rules": False,
            "merge_request_approvers_available": True,
            "multiple_approval_rules_available": True,
            "invalid_approvers_rules": [],
        }
    )


async def reviewers(server: ForgeServer, call: Call) -> web.Response:
    _query(call, set())
    pull = _mr(server, call)
    latest = {r.user: r for r in pull.reviews}
    states = {"approved": "approved", "changes_requested": "requested_changes"}
    people = list(dict.fromkeys([*pull.reviewers, *latest]))
    return web.json_response(
        [
            {
                "user": user(server, u),
                "state": states[latest[u].state] if u in latest and latest[u].state in states else "unreviewed",
                "created_at": iso(pull.created),
            }
            for u in people
        ]
    )


async def mr_pipelines(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"per_page", "page"})
    pull = _mr(server, call)
    heads = await server.heads(pull.repo)
    with server._lock:
        server.refresh(pull, heads)
        pipeline = _pipeline(server, pull.repo, pull)
    return _page(call, [] if pipeline is None else [pipeline])


def _sha(server: ForgeServer, repo: Repo, ref: str) -> str:
    sha = forge_git.commit_exists(repo.git_dir, server.git_env, ref)
    if sha is None:
        raise _message(404, "404 Commit Not Found")
    return sha


async def get_commit(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"stats"})
    repo = _project(server, call)
    sha = _sha(server, repo, call.match["sha"])
    info = forge_git.commit_info(repo.git_dir, server.git_env, sha)
    return web.json_response(
        {
            "id": sha,
            "short_id": sha[:8],
            "title": info["subject"],
            "message": info["message"],
            "author_name": info["author_name"],
            "author_email": info["author_email"],
            "authored_date": info["authored"],
            "committer_name": info["author_name"],
            "committer_email": info["author_email"],
            "committed_date": info["committed"],
            "created_at": info["committed"],
            "parent_ids": info["parents"],
            "trailers": {},
            "extended_trailers": {},
            "web_url": f"{server.base}/{repo.path}/-/commit/{sha}",
            "last_pipeline": None,
            "status": None,
        }
    )


async def commit_statuses(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"per_page", "page", "ref", "stage", "name", "all", "pipeline_id", "order_by", "sort"})
    if set(call.query) - {"per_page", "page", "all"}:
        raise Unsupported("commit status filters")
    repo = _project(server, call)
    sha = _sha(server, repo, call.match["sha"])
    when = iso(repo.created)
    items = [
        {
            "id": repo.id * 1000 + i,
            "sha": sha,
            "ref": None,
            "status": _STATUS[state],
            "name": name,
            "target_url": None,
            "description": None,
            "created_at": when,
            "started_at": when,
            "finished_at": None if state == "pending" else when,
            "allow_failure": False,
            "coverage": None,
            "pipeline_id": repo.id * 1000,
            "author": user(server, "alice"),
        }
        for i, (name, state) in enumerate(server.checks.get((repo.path, sha), []), 1)
    ]
    return _page(call, items)


async def list_users(server: ForgeServer, call: Call) -> web.Response:
    _query(call, {"username", "per_page", "page"})
    if "username" not in call.query:
        raise Unsupported("listing users without a username")
    name = call.query["username"]
    return _page(call, [user(server, u) for u in server.users if u.lower() == name.lower()])


ROUTES: list[Route] = [
    ("GET", re.compile(_P), get_project),
    ("GET", re.compile(_P + "/merge_requests"), list_mrs),
    ("POST", re.compile(_P + "/merge_requests"), create_mr),
    ("GET", re.compile(_MR), get_mr),
    ("PUT", re.compile(_MR), update_mr),
    ("GET", re.compile(_MR + "/approvals"), approvals),
    ("GET", re.compile(_MR + "/reviewers"), reviewers),
    ("GET", re.compile(_MR + "/pipelines"), mr_pipelines),
    ("GET", re.compile(_P + r"/repository/commits/(?P<sha>[^/]+)"), get_commit),
    ("GET", re.compile(_P + r"/repository/commits/(?P<sha>[^/]+)/statuses"), commit_statuses),
    ("GET", re.compile(r"/users"), list_users),
]
