"""Pull requests on the forges: GitHub (and GitHub Enterprise), GitLab, Gitea and Forgejo, each through its API's
client library (githubkit, python-gitlab, pyforgejo).

The worker alone talks to a forge: its tokens (`forges.<host>.tokenEnv`, a GitHub App's installation tokens) live
in the worker's environment, never in a sandbox, and only for the repositories the config names
(workers.scope.token_scope). The rest of the service sees the small, forge-neutral surface below: a `Forge` for a
repository's host, the `PullRequest` it answers with, the `Status` of its review and checks, and one exception
hierarchy whose texts are what a thread is told.
"""

from __future__ import annotations

import functools
import os
from urllib.parse import urlsplit

from chatops.config import FORGE_TOKEN_ENVS, Config, forge_host
from workers.forges._types import (
    NAMES,
    Check,
    CheckState,
    Forge,
    ForgeError,
    NoForge,
    NotAllowed,
    PullRequest,
    PullState,
    RateLimited,
    Refused,
    Repo,
    Status,
    Unreachable,
    failed,
    git_host,
    reset_time,
    tls_verify,
    unexpected,
    unreachable,
)
from workers.scope import normal_url, token_scope
from workers.workspaces import public_url

__all__ = [
    "NAMES",
    "Check",
    "CheckState",
    "Forge",
    "ForgeError",
    "NoForge",
    "NotAllowed",
    "PullRequest",
    "PullState",
    "RateLimited",
    "Refused",
    "Repo",
    "Status",
    "Unreachable",
    "failed",
    "forge_for",
    "git_host",
    "reset_time",
    "tls_verify",
    "unexpected",
    "unreachable",
]


# --- finding a repository's forge ------------------------------------------------------------------------------


def forge_for(config: Config, remote: str) -> tuple[Forge, Repo]:
    """The forge of an https `remote` (its user part and `.git` dropped) and the repository it names there: the
    config's `forges` entry for its host, else a known forge's. Only for a repository the config names
    (workers.scope.token_scope), so that one a Slack user picked elsewhere never gets the forge's token."""
    url = normal_url(remote)
    if url is None:
        raise NoForge(f"`{public_url(remote)}` is no https URL: pull requests are opened for https remotes only")
    parts = urlsplit(url)
    host, path = forge_host(parts.netloc), parts.path.strip("/")
    settings = config.service.forge(host)
    if settings is None:
        raise NoForge(
            f"No forge is configured for `{host}`: set `forges.{host}.kind` (github, gitlab or gitea) and its "
            "token's variable (`tokenEnv`)"
        )
    segments = path.split("/")  # owner/name; GitLab nests groups: group/sub/name
    if "" in segments or len(segments) < 2 or (settings.kind != "gitlab" and len(segments) != 2):
        raise NoForge(f"`{url}` names no repository of {NAMES[settings.kind]} (expected https://{host}/owner/name)")
    exact, owners = token_scope(config)
    if url not in exact and not url.startswith(owners):
        raise NotAllowed(
            f"The config does not name `{url}`: pull requests are opened only for the repositories it names (a "
            "channel's or a job's `repo`, a job's `push.remote`, or under an owner a channel's `repos` spells out)"
        )
    app = None
    if settings.app is not None:
        key = config.forge_app_keys.get(host)
        if not key:
            where = settings.app.privateKeyEnv or settings.app.privateKeyFile
            raise NotAllowed(f"No private key for the GitHub App of `{host}`: set {where} in the worker's environment")
        app = (settings.app.id, key, settings.app.installationId)
    token = config.forge_tokens.get(host)
    if app is None and not token:
        names = settings.tokenEnv or f"{FORGE_TOKEN_ENVS[settings.kind]} (or MM_GIT_TOKEN)"
        raise NotAllowed(f"No token for `{host}`: set {names} in the worker's environment (`forges.{host}.tokenEnv`)")
    username = settings.username_for(config.git_username)
    try:
        client = _client(settings.kind, host, settings.api_url_for(host), username, token, app, _ca_files())
    except (OSError, ValueError) as e:  # an operator's CA bundle that cannot be read (ssl's own errors are OSErrors)
        why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        raise Unreachable(f"The client of `{host}` cannot be made: {why}") from None
    return client, Repo(host, path)


def _ca_files() -> tuple[str | None, str | None]:
    # Part of a client's cache key: an operator's CA bundle is read when the client is made.
    return os.environ.get("SSL_CERT_FILE") or None, os.environ.get("REQUESTS_CA_BUNDLE") or None


@functools.lru_cache(maxsize=64)
def _client(
    kind: str,
    host: str,
    api_url: str,
    username: str,
    token: str | None,
    app: tuple[int, str, int | None] | None,
    ca_files: tuple[str | None, str | None],
) -> Forge:
    """One client per host and settings, kept by the process (a reloaded config with another token makes
    another): the libraries keep their connections and a GitHub App's installation tokens in it. Each library
    reads the operator's CA bundle (`ca_files`, only a part of the key here) when its client is made."""
    del ca_files
    if kind == "github":
        from workers.forges.github import GitHubForge

        return GitHubForge(host, api_url, token=token, username=username, app=app)
    assert token is not None  # forge_for said so otherwise
    if kind == "gitlab":
        from workers.forges.gitlab import GitLabForge

        return GitLabForge(host, api_url, token, username)
    from workers.forges.gitea import GiteaForge

    return GiteaForge(host, api_url, token, username)
