"""Pull requests on the forges: each client against the forge emulator (playground/forge_server.py) over HTTPS,
trusting its CA the way a worker is configured to (SSL_CERT_FILE, REQUESTS_CA_BUNDLE), and the refusals each
forge answers, as the thread is told them."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from forge_support import PATH, TOKEN
from forge_support import config as _config
from forge_support import configured as _configured
from forge_support import new_branch as _branch
from playground.forge_server import KINDS, ForgeServer
from workers.forges import (
    CheckState,
    NoForge,
    NotAllowed,
    PullState,
    RateLimited,
    Refused,
    Unreachable,
    failed,
    forge_for,
)

PAGES = {"github": "pull", "gitlab": "-/merge_requests", "gitea": "pulls"}  # where each forge shows one


@pytest.fixture(params=KINDS)
def forge(
    request: pytest.FixtureRequest, forge_server: Callable[..., ForgeServer], monkeypatch: pytest.MonkeyPatch
) -> ForgeServer:
    """A forge of each kind (mm_testkit/fixtures_forge.py: a call it does not emulate fails the test), trusted
    as a worker trusts an operator's CA: through the environment."""
    server = forge_server(request.param, tokens={TOKEN: None})
    for name, value in server.ca_env().items():
        monkeypatch.setenv(name, value)
    server.add_repo(PATH)
    return server


# --- finding the forge ---------------------------------------------------------------------------------------


def test_a_host_without_a_forge_is_told_which_key_to_set(tmp_path: Path) -> None:
    config = _config(tmp_path, 'channels:\n  default: {repo: "https://git.example.com/acme/app.git"}\n', {})
    with pytest.raises(NoForge) as caught:
        forge_for(config, "https://git.example.com/acme/app.git")
    assert caught.value.text == (
        "No forge is configured for `git.example.com`: set `forges.git.example.com.kind` (github, gitlab or gitea) "
        "and its token's variable (`tokenEnv`)"
    )


def test_only_a_repository_the_config_names_gets_the_token(tmp_path: Path) -> None:
    text = 'channels:\n  default: {repo: "https://github.com/acme/app.git", repos: ["https://gitlab.com/team/*"]}\n'
    config = _config(tmp_path, text, {"MM_GITHUB_TOKEN": "ghp-1", "MM_GITLAB_TOKEN": "glpat-2"})
    forge, repo = forge_for(config, "https://bot@github.com/acme/app.git")
    assert (forge.kind, repo.host, repo.path) == ("github", "github.com", "acme/app")
    assert forge_for(config, "https://gitlab.com/team/sub/tool")[1].path == "team/sub/tool"  # under the owner
    with pytest.raises(NotAllowed) as caught:
        forge_for(config, "https://github.com/other/app.git")
    assert caught.value.text == (
        "The config does not name `https://github.com/other/app`: pull requests are opened only for the "
        "repositories it names (a channel's or a job's `repo`, a job's `push.remote`, or under an owner a channel's "
        "`repos` spells out)"
    )
    with pytest.raises(NoForge, match="is no https URL"):
        forge_for(config, "git@github.com:acme/app.git")


def test_a_forge_without_its_token_names_the_variable(tmp_path: Path) -> None:
    config = _config(tmp_path, 'channels:\n  default: {repo: "https://gitlab.com/acme/app.git"}\n', {})
    with pytest.raises(NotAllowed) as caught:
        forge_for(config, "https://gitlab.com/acme/app.git")
    assert caught.value.text == (
        "No token for `gitlab.com`: set MM_GITLAB_TOKEN (or MM_GIT_TOKEN) in the worker's environment "
        "(`forges.gitlab.com.tokenEnv`)"
    )


def test_a_forge_s_words_are_masked_and_its_rate_limit_read() -> None:
    said = failed("gitlab", 401, f"token {TOKEN} is revoked", {}, [TOKEN])
    assert isinstance(said, NotAllowed) and said.text == "GitLab refused the token (401): token *** is revoked"
    limited = failed(
        "github", 403, "API rate limit exceeded", {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1900000000"}, []
    )
    assert isinstance(limited, RateLimited) and limited.reset == dt.datetime.fromtimestamp(1_900_000_000, dt.UTC)
    assert limited.text == (
        "GitHub's rate limit is used up (it resets at 2030-03-17 17:46:40 UTC): API rate limit exceeded"
    )
    assert isinstance(failed("gitea", 502, "Bad Gateway", {}, []), Unreachable)


# --- each forge through the emulator -------------------------------------------------------------------------


def test_a_pull_request_is_opened_found_updated_and_followed(forge: ForgeServer, tmp_path: Path) -> None:
    client, repo = forge_for(_configured(forge, tmp_path), f"{forge.base}/{PATH}.git")
    sha = _branch(forge, "mm/deps")
    assert client.find_open(repo, "mm/deps") is None

    pull = client.open(
        repo,
        branch="mm/deps",
        base="main",
        title="Bump deps",
        body="Why",
        draft=True,
        labels=("bug", "unknown"),
        reviewers=("alice", "nobody-here"),
    )
    assert (pull.state, pull.draft, pull.branch, pull.base, pull.title, pull.body) == (
        PullState.OPEN,
        True,
        "mm/deps",
        "main",
        "Bump deps",
        "Why",
    )
    assert pull.head_sha == sha and pull.url == f"{forge.base}/{PATH}/{PAGES[forge.kind]}/{pull.number}"
    [seen] = forge.pulls(PATH)
    # GitHub and GitLab make a label they do not have; Gitea takes ids, and its unknown one is left out. The
    # reviewer the forge does not know is left out, the pull request open all the same.
    labels = ["bug"] if forge.kind == "gitea" else ["bug", "unknown"]
    assert (seen["draft"], seen["labels"], seen["reviewers"]) == (True, labels, ["alice"])
    assert client.find_open(repo, "mm/deps") == pull
    assert client.find_open(repo, "mm/other") is None

    updated = client.update(repo, pull.number, body="Why, again", title="Bump deps (2)")
    assert (updated.title, updated.body, updated.draft) == ("Bump deps (2)", "Why, again", True)
    assert client.get(repo, pull.number) == updated

    forge.set_checks(PATH, sha, [("tests", "success"), ("lint", "failure"), ("docs", "pending")])
    forge.set_review(PATH, pull.number, "alice", "approved")
    status = client.status(repo, pull)
    assert status.review == "approved"
    named = {c.name: c.state for c in status.checks}
    assert {k: named[k] for k in ("tests", "lint", "docs")} == {
        "tests": CheckState.SUCCESS,
        "lint": CheckState.FAILURE,
        "docs": CheckState.PENDING,
    }
    forge.set_review(PATH, pull.number, "bob", "changes_requested")
    assert client.status(repo, pull).review == "changes requested"

    forge.close(PATH, pull.number, merged=True)
    assert client.status(repo, pull).pull.state == PullState.MERGED
    assert client.find_open(repo, "mm/deps") is None

    credentials = client.git_credentials(repo)
    expected = {"github": "x-access-token", "gitlab": "oauth2", "gitea": "mm"}[forge.kind]
    assert (credentials.username, credentials.password, credentials.host) == (expected, TOKEN, "127.0.0.1")


def test_each_refusal_is_told_in_the_forge_s_words(forge: ForgeServer, tmp_path: Path) -> None:
    name = {"github": "GitHub", "gitlab": "GitLab", "gitea": "Gitea"}[forge.kind]
    url = f"{forge.base}/{PATH}.git"
    bad = "tok-wrong-81c2"
    client, repo = forge_for(_configured(forge, tmp_path, token=bad), url)
    with pytest.raises(NotAllowed) as caught:
        client.find_open(repo, "mm/x")
    assert caught.value.text.startswith(f"{name} refused the token (401): ") and bad not in caught.value.text

    client, repo = forge_for(_configured(forge, tmp_path), url)
    _branch(forge, "mm/x")
    client.open(repo, branch="mm/x", base="main", title="X", body="", draft=False)
    with pytest.raises(Refused) as duplicate:
        client.open(repo, branch="mm/x", base="main", title="X", body="", draft=False)
    assert duplicate.value.text.startswith(f"{name} refused it (4") and "already exists" in duplicate.value.text

    _branch(forge, "release")
    _branch(forge, "mm/y")
    forge.protect(PATH, "release")  # in the forge's own words (Gitea's is a 403: about the branch, not the token)
    with pytest.raises(Refused) as protected:
        client.open(repo, branch="mm/y", base="release", title="Y", body="", draft=False)
    assert (
        protected.value.text.startswith(f"{name} refused it (4") and "protected branch" in protected.value.text.lower()
    )

    until = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=7)
    forge.limit_rate(until)
    with pytest.raises(RateLimited) as limited:
        client.get(repo, 1)
    assert limited.value.reset is not None and abs(limited.value.reset - until) <= dt.timedelta(seconds=3)
    assert limited.value.text.startswith(f"{name}'s rate limit is used up (it resets at ")


def test_a_forge_that_does_not_answer_is_unreachable(tmp_path: Path) -> None:
    text = """
        channels:
          default: {repo: "https://127.0.0.1:9/acme/app.git"}
        forges:
          "127.0.0.1:9": {kind: gitea}
        """
    client, repo = forge_for(_config(tmp_path, text, {"MM_GITEA_TOKEN": TOKEN}), "https://127.0.0.1:9/acme/app")
    with pytest.raises(Unreachable) as caught:
        client.get(repo, 1)
    assert caught.value.text.startswith("Gitea at https://127.0.0.1:9 did not answer: ")


# --- a GitHub App ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("forge", ["github"], indirect=True)
def test_a_github_app_signs_in_as_its_installation_and_renews_its_tokens(
    forge: ForgeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_id, pem = forge.new_app()
    monkeypatch.setenv("MM_TEST_APP_KEY", pem)
    text = f"""
        channels:
          default: {{repo: "{forge.base}/{PATH}.git"}}
        forges:
          "{forge.host}": {{kind: github, app: {{id: {app_id}, privateKeyEnv: MM_TEST_APP_KEY}}}}
        """
    config = _config(tmp_path, text, {"MM_TEST_APP_KEY": pem, "MM_GITHUB_TOKEN": TOKEN})
    assert forge.host not in config.forge_tokens  # the App's tokens, never the plain one
    client, repo = forge_for(config, f"{forge.base}/{PATH}.git")
    forge.app_token_seconds = 2
    _branch(forge, "mm/app")
    pull = client.open(repo, branch="mm/app", base="main", title="From the App", body="", draft=True)
    assert forge.pulls(PATH)[0]["author"].endswith("[bot]")

    credentials = client.git_credentials(repo)
    assert credentials.username == "x-access-token" and credentials.password.startswith("ghs_")
    time.sleep(2.1)  # every token so far has expired: the next call gets a new one
    assert client.get(repo, pull.number).title == "From the App"

    # The repository's API, as the installation (its installation is looked up with the App's own JWT).
    api = [token for _, path, token in forge.requests if "/repos/" in path and not path.endswith("/installation")]
    assert api and all(token and token.startswith("ghs_") for token in api)
    assert api[-1] != api[0]  # renewed after it expired
