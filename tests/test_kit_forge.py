"""The forge emulator (playground/forge_server.py) is only as good as it is strict: these tests drive it with the
forges' official clients (githubkit, python-gitlab, pyforgejo) and real git over HTTPS, and prove that its answers
parse into the clients' own models and that it refuses what the forges refuse, in their words."""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gitlab
import gitlab.exceptions
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from githubkit import AppAuthStrategy, AppInstallationAuthStrategy, GitHub, TokenAuthStrategy
from githubkit.exception import PrimaryRateLimitExceeded, RequestFailed
from githubkit_schemas.latest import models as gh_models
from pyforgejo import PyforgejoApi
from pyforgejo import types as fj_types
from pyforgejo.core.api_error import ApiError as ForgejoError

from mm_testkit.fixtures_forge import FORGE_TOKEN, git_env
from playground.forge_server import ForgeServer

# Every test here starts git (the emulator's repositories, git http-backend): not in `make check`.
pytestmark = pytest.mark.process

Make = Callable[..., ForgeServer]
READER = "forge-token-ro"  # a valid token that may write no repository
TOKENS = {FORGE_TOKEN: None, READER: []}


def git(
    env: dict[str, str], *args: str, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["git", *args], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"git {args} failed: {done.stderr}")
    return done


def basic(token: str, user: str = "x-access-token") -> str:
    """git's `http.extraHeader` carrying a token as forges take it: HTTP Basic, the token as password."""
    return "http.extraHeader=Authorization: Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def push_branch(
    server: ForgeServer, tmp: Path, path: str, branch: str, token: str = FORGE_TOKEN, user: str = "x-access-token"
) -> str:
    """Clones `path`, commits a file on a new `branch` and pushes it; returns the new head's sha."""
    env = git_env(server, tmp / "home")
    work = tmp / f"clone-{path.replace('/', '-')}-{branch}"
    git(env, "-c", basic(token, user), "clone", "--quiet", f"{server.base}/{path}.git", str(work))
    git(env, "checkout", "--quiet", "-b", branch, cwd=work)
    (work / f"{branch}.txt").write_text(f"{branch}\n")
    git(env, "add", ".", cwd=work)
    git(env, "commit", "--quiet", "-m", f"work on {branch}", cwd=work)
    git(env, "-c", basic(token, user), "push", "--quiet", "origin", branch, cwd=work)
    return git(env, "rev-parse", "HEAD", cwd=work).stdout.strip()


def github(server: ForgeServer, auth: Any) -> GitHub[Any]:
    return GitHub(auth, base_url=server.api_url, ssl_verify=server.client_ssl_context(), auto_retry=False)


def forgejo(server: ForgeServer, token: str = FORGE_TOKEN) -> PyforgejoApi:
    client = httpx.Client(verify=server.client_ssl_context())
    return PyforgejoApi(base_url=server.api_url, api_key=f"token {token}", httpx_client=client)


def gitlab_client(server: ForgeServer, token: str = FORGE_TOKEN) -> gitlab.Gitlab:
    assert server.ca_file is not None
    return gitlab.Gitlab(server.api_url, private_token=token, ssl_verify=str(server.ca_file))


# -- GitHub ----------------------------------------------------------------------------------------------------


def test_github_pull_requests_parse_with_githubkit_models(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("github", TOKENS)
    server.add_repo("acme/app")
    sha = push_branch(server, tmp_path, "acme/app", "topic")
    gh = github(server, TokenAuthStrategy(FORGE_TOKEN))

    repo = gh.rest.repos.get("acme", "app").parsed_data
    assert isinstance(repo, gh_models.FullRepository)
    assert (repo.full_name, repo.default_branch, repo.private) == ("acme/app", "main", True)

    made = gh.rest.pulls.create("acme", "app", head="topic", base="main", title="Fix it", body="Why", draft=True)
    pull = made.parsed_data
    assert made.status_code == 201 and isinstance(pull, gh_models.PullRequest)
    assert (pull.number, pull.state, pull.draft, pull.head.ref, pull.head.sha, pull.base.ref) == (
        1,
        "open",
        True,
        "topic",
        sha,
        "main",
    )
    assert pull.html_url == f"{server.base}/acme/app/pull/1"

    listed = gh.rest.pulls.list("acme", "app", state="open", head="acme:topic", base="main").parsed_data
    assert [type(p) for p in listed] == [gh_models.PullRequestSimple] and listed[0].number == 1
    assert gh.rest.pulls.list("acme", "app", head="acme:other").parsed_data == []

    labels = gh.rest.issues.add_labels("acme", "app", 1, data={"labels": ["bug", "mm"]}).parsed_data
    assert [(type(label), label.name) for label in labels] == [(gh_models.Label, "bug"), (gh_models.Label, "mm")]
    asked = gh.rest.pulls.request_reviewers("acme", "app", 1, reviewers=["alice"]).parsed_data
    assert [u.login for u in asked.requested_reviewers or []] == ["alice"]

    edited = gh.rest.pulls.update("acme", "app", 1, title="Fix it well", body="Because").parsed_data
    assert (edited.title, edited.body) == ("Fix it well", "Because")
    assert server.pulls("acme/app")[0] | {"url": ""} == {
        "number": 1,
        "state": "open",
        "draft": True,
        "title": "Fix it well",
        "body": "Because",
        "head": "topic",
        "head_sha": sha,
        "base": "main",
        "labels": ["bug", "mm"],
        "reviewers": ["alice"],
        "author": "mm-bot",
        "url": "",
    }

    # The head moves with the branch.
    moved = push_again(server, tmp_path, "acme/app", "topic")
    assert gh.rest.pulls.get("acme", "app", 1).parsed_data.head.sha == moved != sha

    closed = gh.rest.pulls.update("acme", "app", 1, state="closed").parsed_data
    assert closed.state == "closed" and closed.closed_at is not None
    server.close("acme/app", 1, merged=True)
    merged = gh.rest.pulls.get("acme", "app", 1).parsed_data
    assert (merged.state, merged.merged) == ("closed", True)
    assert gh.rest.pulls.list("acme", "app").parsed_data == []
    assert [p.number for p in gh.rest.pulls.list("acme", "app", state="closed").parsed_data] == [1]


def push_again(server: ForgeServer, tmp: Path, path: str, branch: str) -> str:
    env = git_env(server, tmp / "home")
    work = tmp / f"clone-{path.replace('/', '-')}-{branch}"
    (work / "more.txt").write_text("more\n")
    git(env, "add", ".", cwd=work)
    git(env, "commit", "--quiet", "-m", "more", cwd=work)
    git(env, "-c", basic(FORGE_TOKEN), "push", "--quiet", "origin", branch, cwd=work)
    return git(env, "rev-parse", "HEAD", cwd=work).stdout.strip()


def test_github_checks_reviews_and_rate_limit_headers(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("github")
    server.add_repo("acme/app")
    sha = push_branch(server, tmp_path, "acme/app", "topic")
    gh = github(server, TokenAuthStrategy(FORGE_TOKEN))
    gh.rest.pulls.create("acme", "app", head="topic", base="main", title="T")
    server.set_checks("acme/app", sha, [("lint", "success"), ("tests", "pending"), ("docs", "neutral")])
    server.set_checks("acme/app", sha, [("ci/legacy", "failure")], github_as="statuses")
    server.set_review("acme/app", 1, "alice", "changes_requested")
    server.set_review("acme/app", 1, "bob", "approved")

    runs = gh.rest.checks.list_for_ref("acme", "app", "topic")
    assert isinstance(runs.parsed_data, gh_models.ReposOwnerRepoCommitsRefCheckRunsGetResponse200)
    assert [(r.name, r.status, r.conclusion) for r in runs.parsed_data.check_runs] == [
        ("lint", "completed", "success"),
        ("tests", "in_progress", None),
        ("docs", "completed", "neutral"),
    ]
    combined = gh.rest.repos.get_combined_status_for_ref("acme", "app", sha).parsed_data
    assert isinstance(combined, gh_models.CombinedCommitStatus)
    assert (combined.state, [(s.context, s.state) for s in combined.statuses]) == (
        "failure",
        [("ci/legacy", "failure")],
    )
    reviews = gh.rest.pulls.list_reviews("acme", "app", 1).parsed_data
    assert [(type(r), r.user and r.user.login, r.state) for r in reviews] == [
        (gh_models.PullRequestReview, "alice", "CHANGES_REQUESTED"),
        (gh_models.PullRequestReview, "bob", "APPROVED"),
    ]
    assert runs.headers["x-ratelimit-limit"] == "5000" and "x-ratelimit-reset" in runs.headers
    assert runs.headers["x-github-api-version-selected"]


def test_github_refusals_are_githubs(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("github", TOKENS)
    server.add_repo("acme/app")
    push_branch(server, tmp_path, "acme/app", "topic")
    gh = github(server, TokenAuthStrategy(FORGE_TOKEN))
    gh.rest.pulls.create("acme", "app", head="topic", base="main", title="T")

    def refused(call: Callable[[], object]) -> tuple[int, dict[str, Any]]:
        with pytest.raises(RequestFailed) as caught:
            call()
        return caught.value.response.status_code, caught.value.response.json()

    status, body = refused(lambda: gh.rest.pulls.create("acme", "app", head="topic", base="main", title="again"))
    assert (status, body["message"], body["errors"][0]["message"]) == (
        422,
        "Validation Failed",
        "A pull request already exists for acme:topic.",
    )
    status, body = refused(lambda: gh.rest.pulls.create("acme", "app", head="nope", base="main", title="T"))
    assert (status, body["errors"]) == (422, [{"resource": "PullRequest", "field": "head", "code": "invalid"}])
    assert body["documentation_url"].startswith("https://docs.github.com/")
    status, body = refused(lambda: gh.rest.pulls.request_reviewers("acme", "app", 1, reviewers=["mallory"]))
    assert status == 422 and body["message"].startswith("Reviews may only be requested from collaborators.")
    status, body = refused(lambda: gh.rest.pulls.get("acme", "app", 99))
    assert (status, body["message"]) == (404, "Not Found")

    stranger = github(server, TokenAuthStrategy("wrong"))
    status, body = refused(lambda: stranger.rest.repos.get("acme", "app"))
    assert (status, body["message"]) == (401, "Bad credentials")
    reader = github(server, TokenAuthStrategy(READER))
    assert reader.rest.repos.get("acme", "app").parsed_data.name == "app"  # reading is allowed
    status, body = refused(lambda: reader.rest.pulls.update("acme", "app", 1, title="mine"))
    assert (status, body["message"]) == (403, "Resource not accessible by personal access token")

    # A body of the wrong shape, past githubkit's own check of it.
    raw = httpx.Client(verify=server.client_ssl_context(), headers={"Authorization": f"token {FORGE_TOKEN}"})
    answer = raw.post(f"{server.api_url}/repos/acme/app/pulls", json={"head": "topic", "base": "main", "title": 5})
    assert answer.status_code == 422 and answer.json()["message"].startswith("Invalid request.")
    answer = raw.post(f"{server.api_url}/repos/acme/app/pulls", json={"head": "topic", "title": "T"})
    assert (answer.status_code, answer.json()["message"]) == (422, 'Invalid request.\n\n"base" wasn\'t supplied.')
    answer = raw.post(
        f"{server.api_url}/repos/acme/app/pulls", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert (answer.status_code, answer.json()["message"]) == (400, "Problems parsing JSON")

    # What the emulator does not know is loud, not a quiet 404.
    assert raw.get(f"{server.api_url}/repos/acme/app/pulls", params={"head": "topic"}).status_code == 501
    assert raw.get(f"{server.api_url}/repos/acme/app/forks").status_code == 501
    assert len(server.take_unsupported()) == 2


def test_github_rate_limit_is_refused_with_the_reset(forge_server: Make) -> None:
    server = forge_server("github")
    server.add_repo("acme/app")
    gh = github(server, TokenAuthStrategy(FORGE_TOKEN))
    until = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=5)
    server.limit_rate(until)
    with pytest.raises(PrimaryRateLimitExceeded) as caught:
        gh.rest.repos.get("acme", "app")
    response = caught.value.response
    assert response.status_code == 403 and response.json()["message"].startswith("API rate limit exceeded for")
    assert (response.headers["x-ratelimit-remaining"], response.headers["x-ratelimit-reset"]) == (
        "0",
        str(int(until.timestamp())),
    )
    assert dt.timedelta(minutes=4) < caught.value.retry_after <= dt.timedelta(minutes=5)
    server.limit_rate(until, status=429)
    with pytest.raises(PrimaryRateLimitExceeded) as caught:
        gh.rest.repos.get("acme", "app")
    assert caught.value.response.status_code == 429
    server.limit_rate(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    assert gh.rest.repos.get("acme", "app").status_code == 200


def test_github_protected_base_refused_by_api_and_by_push(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("github")
    server.add_repo("acme/app")
    push_branch(server, tmp_path, "acme/app", "topic")
    server.protect("acme/app", "main")
    gh = github(server, TokenAuthStrategy(FORGE_TOKEN))
    with pytest.raises(RequestFailed) as caught:
        gh.rest.pulls.create("acme", "app", head="topic", base="main", title="T")
    assert caught.value.response.json()["errors"][0]["message"] == "Protected branch update failed for refs/heads/main."

    env = git_env(server, tmp_path / "home")
    work = tmp_path / "clone-acme-app-topic"
    pushed = git(env, "-c", basic(FORGE_TOKEN), "push", "origin", "topic:main", cwd=work, check=False)
    assert pushed.returncode != 0
    assert "remote: error: GH006: Protected branch update failed for refs/heads/main." in pushed.stderr
    assert "pre-receive hook declined" in pushed.stderr
    assert git(env, "-c", basic(FORGE_TOKEN), "push", "--quiet", "origin", "topic:other", cwd=work).returncode == 0


def test_github_app_installation_tokens_work_and_are_refreshed(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("github", {})
    server.add_repo("acme/app")
    app_id, key = server.new_app()
    app = github(server, AppAuthStrategy(app_id, key))
    installation = app.rest.apps.get_repo_installation("acme", "app").parsed_data
    assert isinstance(installation, gh_models.Installation) and installation.app_id == app_id

    server.app_token_seconds = 2  # githubkit keeps a token until a minute before it expires: here, not at all
    bot = github(server, AppInstallationAuthStrategy(app_id, key, installation.id))
    assert bot.rest.repos.get("acme", "app").parsed_data.name == "app"
    first = server.requests[-1][2]
    assert first is not None and first.startswith("ghs_")
    # The installation token also opens git, as GitHub's do.
    sha = push_branch(server, tmp_path, "acme/app", "topic", token=first)
    made = bot.rest.pulls.create("acme", "app", head="topic", base="main", title="From the app").parsed_data
    assert (made.user and made.user.login, made.head.sha) == (f"mm-app-{app_id}[bot]", sha)
    time.sleep(2.1)
    plain = github(server, TokenAuthStrategy(first))
    with pytest.raises(RequestFailed) as caught:
        plain.rest.repos.get("acme", "app")
    assert caught.value.response.status_code == 401  # expired
    assert bot.rest.pulls.get("acme", "app", 1).status_code == 200
    tokens = {token for method, path, token in server.requests if path.endswith("/pulls/1")}
    assert len(tokens) == 1 and first not in tokens  # a fresh one

    # A JWT not signed by the app's key, or expired, is refused as GitHub does.
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other_pem = other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    now = int(time.time())
    for signer, claims in (
        (other_pem, {"iss": str(app_id), "iat": now - 60, "exp": now + 500}),
        (key, {"iss": str(app_id), "iat": now - 900, "exp": now - 300}),
        (key, {"iss": str(app_id), "iat": now - 60, "exp": now + 3600}),
    ):
        forged = jwt.encode(claims, signer, algorithm="RS256")
        answer = httpx.get(
            f"{server.api_url}/repos/acme/app/installation",
            headers={"Authorization": f"Bearer {forged}"},
            verify=server.client_ssl_context(),
        )
        assert answer.status_code == 401, claims


# -- GitLab ----------------------------------------------------------------------------------------------------


def test_gitlab_merge_requests_with_python_gitlab(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("gitlab", TOKENS)
    server.add_repo("group/sub/app")
    sha = push_branch(server, tmp_path, "group/sub/app", "topic", user="oauth2")
    gl = gitlab_client(server)
    project = gl.projects.get("group/sub/app")
    assert (project.path_with_namespace, project.default_branch) == ("group/sub/app", "main")
    alice = gl.users.list(username="alice")
    assert [u.username for u in alice] == ["alice"] and gl.users.list(username="nobody") == []

    mr = project.mergerequests.create(
        {
            "source_branch": "topic",
            "target_branch": "main",
            "title": "Draft: Fix it",
            "description": "Why",
            "labels": "bug,mm",
            "reviewer_ids": [alice[0].id],
        }
    )
    assert (mr.iid, mr.state, mr.draft, mr.sha, mr.labels, mr.detailed_merge_status) == (
        1,
        "opened",
        True,
        sha,
        ["bug", "mm"],
        "draft_status",
    )
    assert [r["username"] for r in mr.reviewers] == ["alice"]
    assert mr.web_url == f"{server.base}/group/sub/app/-/merge_requests/1"
    listed = project.mergerequests.list(source_branch="topic", state="opened", get_all=False)
    assert [m.iid for m in listed] == [1]
    assert project.mergerequests.list(source_branch="other", state="opened", get_all=False) == []

    mr.title, mr.description = "Fix it", "Because"
    mr.save()
    again = project.mergerequests.get(1)
    assert (again.title, again.description, again.draft) == ("Fix it", "Because", False)

    server.set_checks("group/sub/app", sha, [("lint", "success"), ("tests", "pending")])
    server.set_review("group/sub/app", 1, "bob", "approved")
    again = project.mergerequests.get(1)
    assert again.head_pipeline["status"] == "running" and again.detailed_merge_status == "ci_still_running"
    assert [p.status for p in again.pipelines.list(get_all=False)] == ["running"]
    statuses = project.commits.get(sha).statuses.list(get_all=False)
    assert [(s.name, s.status) for s in statuses] == [("lint", "success"), ("tests", "pending")]
    approvals = again.approvals.get()
    assert approvals.approved and [a["user"]["username"] for a in approvals.approved_by] == ["bob"]

    again.state_event = "close"
    again.save()
    assert project.mergerequests.get(1).state == "closed"
    assert server.pulls("group/sub/app")[0]["state"] == "closed"
    assert {token for _, _, token in server.requests} == {FORGE_TOKEN}


def test_gitlab_refusals_are_gitlabs(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("gitlab", TOKENS)
    server.add_repo("group/app")
    push_branch(server, tmp_path, "group/app", "topic", user="oauth2")
    gl = gitlab_client(server)
    project = gl.projects.get("group/app", lazy=True)
    project.mergerequests.create({"source_branch": "topic", "target_branch": "main", "title": "T"})

    def refused(call: Callable[[], object]) -> tuple[int | None, str]:
        with pytest.raises(gitlab.exceptions.GitlabError) as caught:
            call()
        return caught.value.response_code, (caught.value.response_body or b"").decode()

    again = {"source_branch": "topic", "target_branch": "main", "title": "again"}
    assert refused(lambda: project.mergerequests.create(again)) == (
        409,
        '{"message": ["Another open merge request already exists for this source branch: !1"]}',
    )
    missing = {"source_branch": "nope", "target_branch": "main", "title": "T"}
    assert refused(lambda: project.mergerequests.create(missing)) == (
        400,
        '{"message": {"source_branch": ["does not exist"]}}',
    )
    assert refused(
        lambda: gl.http_post("/projects/group%2Fapp/merge_requests", post_data={"source_branch": "topic"})
    ) == (
        400,
        '{"error": "target_branch is missing, title is missing"}',
    )
    assert refused(lambda: gitlab_client(server, "wrong").projects.get("group/app")) == (
        401,
        '{"message": "401 Unauthorized"}',
    )
    reader = gitlab_client(server, READER).projects.get("group/app", lazy=True)
    assert refused(lambda: reader.mergerequests.create({**again, "source_branch": "main2"})) == (
        403,
        '{"message": "403 Forbidden"}',
    )
    assert refused(lambda: gl.projects.get("group/none")) == (404, '{"message": "404 Project Not Found"}')

    until = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    server.limit_rate(until)
    with pytest.raises(gitlab.exceptions.GitlabError) as caught:
        gl.projects.get("group/app", obey_rate_limit=False)
    assert caught.value.response_code == 429
    answer = httpx.get(
        f"{server.api_url}/api/v4/projects/group%2Fapp",
        headers={"PRIVATE-TOKEN": FORGE_TOKEN},
        verify=server.client_ssl_context(),
    )
    assert (answer.status_code, answer.headers["RateLimit-Reset"]) == (429, str(int(until.timestamp())))
    assert 0 < int(answer.headers["Retry-After"]) <= 61


def test_gitlab_protected_branch_push_refused(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("gitlab")
    server.add_repo("group/app")
    push_branch(server, tmp_path, "group/app", "topic", user="oauth2")
    server.protect("group/app", "main")
    env = git_env(server, tmp_path / "home")
    pushed = git(
        env,
        "-c",
        basic(FORGE_TOKEN, "oauth2"),
        "push",
        "origin",
        "topic:main",
        cwd=tmp_path / "clone-group-app-topic",
        check=False,
    )
    assert pushed.returncode != 0
    assert "remote: GitLab: You are not allowed to push code to protected branches on this project." in pushed.stderr
    gl = gitlab_client(server)
    with pytest.raises(gitlab.exceptions.GitlabCreateError) as caught:
        gl.projects.get("group/app", lazy=True).mergerequests.create(
            {"source_branch": "topic", "target_branch": "main", "title": "T"}
        )
    assert caught.value.response_code == 422


# -- Gitea / Forgejo -------------------------------------------------------------------------------------------


def test_gitea_pull_requests_with_pyforgejo(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("gitea", TOKENS)
    server.add_repo("acme/app")
    sha = push_branch(server, tmp_path, "acme/app", "topic", user="mm-bot")
    fj = forgejo(server)
    repo = fj.repository.repo_get("acme", "app")
    assert isinstance(repo, fj_types.Repository) and (repo.full_name, repo.default_branch) == ("acme/app", "main")
    labels = {label.name: label.id or 0 for label in fj.issue.list_labels("acme", "app")}
    assert set(labels) == {"bug", "enhancement"}

    made = fj.repository.repo_create_pull_request(
        "acme", "app", head="topic", base="main", title="WIP: Fix it", body="Why", labels=[labels["bug"]]
    )
    assert isinstance(made, fj_types.PullRequest)
    assert made.head is not None and made.base is not None
    assert (made.number, made.state, made.draft, made.head.ref, made.head.sha, made.base.ref) == (
        1,
        "open",
        True,
        "topic",
        sha,
        "main",
    )
    assert [label.name for label in made.labels or []] == ["bug"]
    assert made.html_url == f"{server.base}/acme/app/pulls/1"
    assert [p.number for p in fj.repository.repo_list_pull_requests("acme", "app", state="open")] == [1]
    found = fj.repository.repo_get_pull_request_by_base_head("acme", "app", "main", "topic")
    assert found.number == 1

    edited = fj.repository.repo_edit_pull_request("acme", "app", 1, title="Fix it", body="Because")
    assert (edited.title, edited.body, edited.draft) == ("Fix it", "Because", False)
    asked = fj.repository.repo_create_pull_review_requests("acme", "app", 1, reviewers=["alice"])
    assert [(type(r), r.state) for r in asked] == [(fj_types.PullReview, "REQUEST_REVIEW")]
    server.set_review("acme/app", 1, "alice", "approved")
    reviews = fj.repository.repo_list_pull_reviews("acme", "app", 1)
    assert [(r.user and r.user.login, r.state) for r in reviews] == [("alice", "APPROVED")]
    server.set_checks("acme/app", sha, [("ci", "success"), ("lint", "failure")])
    status = fj.repository.repo_get_combined_status_by_ref("acme", "app", "topic")
    assert isinstance(status, fj_types.CombinedStatus)
    assert (status.state, [(s.context, s.status) for s in status.statuses or []]) == (
        "failure",
        [("ci", "success"), ("lint", "failure")],
    )
    closed = fj.repository.repo_edit_pull_request("acme", "app", 1, state="closed")
    assert closed.state == "closed" and fj.repository.repo_list_pull_requests("acme", "app") == []


def test_gitea_refusals_are_giteas(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("gitea", TOKENS)
    server.add_repo("acme/app")
    push_branch(server, tmp_path, "acme/app", "topic", user="mm-bot")
    fj = forgejo(server)
    fj.repository.repo_create_pull_request("acme", "app", head="topic", base="main", title="T")

    def refused(call: Callable[[], object]) -> tuple[int | None, Any]:
        with pytest.raises(ForgejoError) as caught:
            call()
        return caught.value.status_code, caught.value.body

    status, body = refused(
        lambda: fj.repository.repo_create_pull_request("acme", "app", head="topic", base="main", title="again")
    )
    assert status == 409 and body["message"].startswith("pull request already exists for these targets")
    status, body = refused(
        lambda: fj.repository.repo_create_pull_request("acme", "app", head="nope", base="main", title="T")
    )
    assert (status, body["message"]) == (404, "The target couldn't be found.")
    # Labels are ids on Gitea: names are refused by its JSON binding.
    names: Any = ["bug"]
    status, body = refused(
        lambda: fj.repository.repo_create_pull_request(
            "acme", "app", head="topic", base="main", title="T", labels=names
        )
    )
    assert status == 422 and body[0]["classification"] == "DeserializationError"
    status, body = refused(lambda: fj.repository.repo_create_pull_request("acme", "app", head="topic", base="main"))
    assert (status, body) == (
        422,
        [{"fieldNames": ["Title"], "classification": "RequiredError", "message": "Required"}],
    )
    status, body = refused(lambda: fj.repository.repo_create_pull_review_requests("acme", "app", 1, reviewers=["eve"]))
    assert status == 422 and "user does not exist" in body["message"]
    assert refused(lambda: forgejo(server, "wrong").repository.repo_get("acme", "app"))[0] == 401
    status, body = refused(
        lambda: forgejo(server, READER).repository.repo_edit_pull_request("acme", "app", 1, title="x")
    )
    assert status == 403 and set(body) == {"message", "url"}


# -- git over HTTPS, and the pages -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
def test_git_over_https_asks_for_and_checks_the_token(forge_server: Make, tmp_path: Path, kind: str) -> None:
    server = forge_server(kind, TOKENS)
    url = server.add_repo("acme/app", {"a.txt": "a\n"})
    env = git_env(server, tmp_path / "home")
    # No credentials: a 401 challenge, so git asks its askpass; here it has none and may not prompt.
    anonymous = git(env, "clone", url, str(tmp_path / "anon"), check=False)
    assert anonymous.returncode != 0 and "could not read Username" in anonymous.stderr
    askpass = tmp_path / "askpass"
    askpass.write_text('#!/bin/sh\ncase "$1" in Username*) echo oauth2;; *) echo "$MM_TOKEN";; esac\n')
    askpass.chmod(0o700)
    with_askpass = env | {"GIT_ASKPASS": str(askpass)}
    bad = git(with_askpass | {"MM_TOKEN": "wrong"}, "clone", url, str(tmp_path / "bad"), check=False)
    assert bad.returncode != 0 and "Authentication failed" in bad.stderr
    work = tmp_path / "work"
    git(with_askpass | {"MM_TOKEN": READER}, "clone", "--quiet", url, str(work))
    assert (work / "a.txt").read_text() == "a\n"
    git(env, "checkout", "--quiet", "-b", "topic", cwd=work)
    git(env, "commit", "--quiet", "--allow-empty", "-m", "x", cwd=work)
    denied = git(with_askpass | {"MM_TOKEN": READER}, "push", "origin", "topic", cwd=work, check=False)
    assert denied.returncode != 0 and "403" in denied.stderr
    git(with_askpass | {"MM_TOKEN": FORGE_TOKEN}, "push", "--quiet", "origin", "topic", cwd=work)
    # The challenge (no token), then each token git was given.
    assert {token for _, path, token in server.requests if ".git/" in path} == {None, "wrong", READER, FORGE_TOKEN}


def test_the_page_lists_pull_requests_and_escapes_them(forge_server: Make, tmp_path: Path) -> None:
    server = forge_server("gitea")
    server.add_repo("acme/app")
    push_branch(server, tmp_path, "acme/app", "topic", user="mm-bot")
    fj = forgejo(server)
    fj.repository.repo_create_pull_request(
        "acme", "app", head="topic", base="main", title="<script>alert(1)</script>", body="<b>bold</b> & co"
    )
    client = httpx.Client(verify=server.client_ssl_context())
    index = client.get(f"{server.base}/").text
    assert f'href="{server.base}/acme/app/pulls/1"' in index
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in index and "<script>" not in index
    page = client.get(f"{server.base}/acme/app/pulls/1")
    assert page.status_code == 200 and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in page.text and "<b>bold" not in page.text
    assert client.get(f"{server.base}/acme/app/pull/1").status_code == 404  # GitHub's shape, not Gitea's
