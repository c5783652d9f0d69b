"""Changes leave the worker: a workspace's changes committed to a new branch and pushed to a remote.

Two halves, so that credentials and the network never enter a workspace and the worker's git never follows a
link the model made (workers/git.py):

1. **In the workspace, with the model's power** (`git.in_workspace`: the session's sandbox, or the workspace's
   owner): `checkout -B <branch>`, `add --all`, a commit under the bot's own identity (given on the command
   line, never written into the workspace's config), and a pack of the new commit's objects written to a pipe.
2. **In a private repository of the worker's** (`workspaces.private_repository`, in the root's .staging,
   borrowing the mirror's objects read only): the pack is checked object by object (`index-pack --strict`) as
   it arrives, and the commit is pushed from there to a remote the operator named (the job's `push.remote`,
   else its repository): never a remote of the workspace's config, which the model can write. Credentials come
   from the worker's environment (`MM_GIT_TOKEN`, and `MM_GIT_USERNAME`, default `x-access-token`), reach git
   through its askpass only, and are masked in every text git's words end up in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from chatops.config import Config, forge_host
from mm_core.config import AgentConfig
from mm_core.tools.ask_agent import load_agent_file
from slackio.mrkdwn import Mrkdwn
from workers import git
from workers.errors import WorkerError
from workers.scope import normal_url, token_scope
from workers.workspaces import private_repository, public_url

AUTHOR = ("mm", "mm@localhost")  # the bot's identity for its commit: on that command's line, never in a config


class NothingToPush(WorkerError):
    """The workspace has no change to commit."""


class BranchRefused(WorkerError):
    """The branch is the repository's own (its base, main, master): a push makes a new branch, never moves it."""


OWN_BRANCHES = ("main", "master")


def check_branch(branch: str, *bases: str | None) -> None:
    """A push makes or updates a branch of its own: never the branch the workspace was cloned from (the
    repository's default, or the configured one), main or master. Git refuses a push that is no fast-forward
    (nothing is forced), so an existing branch is never rewritten either."""
    if branch in {*OWN_BRANCHES, *(b for b in bases if b)}:
        raise BranchRefused(f"`{branch}` is the repository's own branch: push to a new one, such as `mm/{branch}-fix`")


@dataclass(frozen=True)
class Pushed:
    branch: str
    commit: str
    remote: str  # as the thread may show it: without credentials
    files: int

    @property
    def said(self) -> Mrkdwn:
        """The link to open a pull request, as a thread's text ends with it ("" where the forge is unknown)."""
        page = pull_request_page(self.remote, self.branch)
        return Mrkdwn(" <{page}|Open a pull request>.").format(page=page) if page else Mrkdwn()


# The page where a forge opens a pull request for a pushed branch (no API call, no token: the person clicks it).
PULL_REQUEST_PAGES = {
    "github.com": "https://github.com/{path}/pull/new/{branch}",
    "gitlab.com": "https://gitlab.com/{path}/-/merge_requests/new?merge_request%5Bsource_branch%5D={branch}",
    "bitbucket.org": "https://bitbucket.org/{path}/pull-requests/new?source={branch}",
}


def pull_request_page(remote: str, branch: str) -> str | None:
    """Where to open a pull request of `branch` pushed to `remote`, for the forges whose page is known."""
    try:
        parts = urlsplit(remote)
    except ValueError:
        return None
    if parts.scheme != "https" or parts.hostname not in PULL_REQUEST_PAGES:
        return None
    path = parts.path.strip("/").removesuffix(".git")
    if not re.fullmatch(r"[\w.-]+(?:/[\w.-]+)+", path) or {".", ".."} & set(path.split("/")):
        return None
    if parts.hostname != "gitlab.com" and path.count("/") != 1:  # owner/repository there; GitLab nests groups
        return None
    return PULL_REQUEST_PAGES[parts.hostname].format(path=path, branch=quote(branch, safe="/"))


def credentials(config: Config, remote: str) -> git.Credentials | None:
    """The HTTPS credentials of the worker's environment (`MM_GIT_TOKEN`, `MM_GIT_USERNAME`) for `remote`, when
    the operator's config names it (token_scope): a repository a Slack user picked elsewhere never gets the
    token, nor one of another owner on the same forge."""
    exact, owners = token_scope(config)
    url = normal_url(remote)
    if url is None or not (url in exact or url.startswith(owners)):
        return None
    if (forged := _forge_credentials(config, remote, url)) is not None:
        return forged
    if not config.git_token:
        return None
    host = urlsplit(url).hostname or ""
    host = f"[{host}]" if ":" in host else host  # as git writes an IPv6 host in its prompt
    return git.Credentials(config.git_username or "x-access-token", config.git_token, host=host)


def _forge_credentials(config: Config, remote: str, url: str) -> git.Credentials | None:
    """The credentials of the remote's forge, when it has its own (`forges.<host>.tokenEnv`, a kind's variable,
    a GitHub App's installation token): None leaves MM_GIT_TOKEN's to apply."""
    from workers.forges import ForgeError, forge_for  # the forges read the token's scope from here

    host = forge_host(urlsplit(url).netloc)
    settings = config.service.forge(host)
    own_token = config.forge_tokens.get(host) not in (None, config.git_token)
    if settings is None or not (own_token or settings.app is not None):
        return None
    try:
        forge, repo = forge_for(config, remote)
        return forge.git_credentials(repo)
    except ForgeError as e:
        raise git.GitError(e.text) from None


def has_forge(config: Config, remote: str) -> bool:
    """Whether pull requests can be opened for `remote`: an https URL whose host is a forge the config names or
    one known without it (its token may still be missing: opening one then says which to set)."""
    url = normal_url(remote)
    return url is not None and config.service.forge(urlsplit(url).netloc) is not None


def agent_of(config: Config, agent_name: str | None) -> AgentConfig:
    """The agent config a session's commands run under (a job's own `mmConfigs` agent, else the config's): the
    worker's git on its workspace gets the same sandbox and limits."""
    agent = config.agent
    if agent_name and agent_name in agent.mmConfigs:
        try:
            return load_agent_file(agent.mmConfigs[agent_name])
        except (OSError, ValueError):
            # Its turn could not start either (and said why): the strictest sandbox, never more than commands had.
            return AgentConfig(sandbox="bwrap")
    return agent


def changed_files(workspace: Path, agent: AgentConfig, start: str | None) -> int:
    """How many files the workspace differs in from the commit it started from (`start`, workspaces'
    `start_commit`): the model's commits and its uncommitted edits alike, new files included. 0 for a workspace
    that is no repository, or whose git cannot run. Git runs with the model's power (`agent`: the session's
    agent config)."""
    try:
        return _changed(workspace, agent, start)
    except git.GitError:
        return 0


def _changed(workspace: Path, agent: AgentConfig, start: str | None) -> int:
    base = _base(workspace, agent, start)
    tracked = git.in_workspace(workspace, agent, "diff", "--name-only", "-z", "--no-renames", base, check=False)
    new = git.in_workspace(workspace, agent, "ls-files", "--others", "--exclude-standard", "-z", check=False)
    paths = {p for result in (tracked, new) if result.ok for p in result.stdout.split("\0") if p}
    return len(paths)


def diff_stat(workspace: Path, agent: AgentConfig, start: str | None, most: int) -> str:
    """What changed since `start`, as a summary shows it: `git diff --stat` and the new files, `most` lines at
    most ("" for a workspace that is no repository)."""
    try:
        base = _base(workspace, agent, start)
        stat = git.in_workspace(workspace, agent, "diff", "--stat", base, check=False)
        added = git.in_workspace(workspace, agent, "ls-files", "--others", "--exclude-standard", check=False)
    except git.GitError:
        return ""
    lines = stat.stdout.rstrip().splitlines() if stat.ok else []
    lines += [f" {path} (new)" for path in added.stdout.splitlines()] if added.ok else []
    if start and base != start:
        lines.append(" (measured from HEAD: the commit the workspace was cloned at is gone)")
    if len(lines) > most:
        lines = [*lines[: most - 1], f" … and {len(lines) - most + 1} more"]
    return "\n".join(lines)


def _base(workspace: Path, agent: AgentConfig, start: str | None) -> str:
    """`start` while the workspace still has it (the model can rewrite .git), else HEAD."""
    if start and git.in_workspace(workspace, agent, "cat-file", "-e", f"{start}^{{commit}}", check=False).ok:
        return start
    return "HEAD"


def push_workspace(
    workspace: Path,
    agent: AgentConfig,
    remote: str,
    branch: str,
    message: str,
    credentials: git.Credentials | None,
    base: str | None = None,
    start: str | None = None,
    cloned: str | None = None,
    lease: str | None = None,
    before_push: Callable[[str], None] | None = None,
) -> Pushed:
    """Commit everything the workspace changed onto `branch` (after the model's own commits, if it made any) and
    push it to `remote`; raises BranchRefused (the repository's own branch, `base` among them), NothingToPush,
    or git.GitError with git's own (masked) words. `agent`: the session's agent config, whose sandbox the
    workspace's git runs in. `start` and `cloned`: the commit and the branch the workspace was cloned at.
    `lease`: the commit `branch` must still be at on the remote ("" for no branch), which the push then replaces
    (a job's pull request branch, rebuilt by each run from its base); None: a fast-forward only. `before_push`
    is told the commit before it leaves: the record of what is being pushed, should the worker stop during it."""
    check_branch(branch, base, cloned)
    if not os.path.lexists(workspace / ".git"):
        raise NothingToPush  # no repository: nothing it could have changed
    # Raises what keeps git from running (the sandbox the session requires is missing): said, not "nothing".
    changed = _changed(workspace, agent, start)
    if not changed:
        raise NothingToPush
    commit = git.commit_all(workspace, agent, branch, message, AUTHOR)
    if before_push is not None:
        before_push(commit)
    with private_repository(workspace) as repository:
        git.copy_objects(workspace, agent, repository, commit, start)
        ref = f"refs/heads/{branch}"
        if lease is None:
            git.push(repository, remote, f"{commit}:{ref}", credentials=credentials)
        else:
            # No `+` on the refspec: git forces a `+` refspec whatever the lease says.
            git.push(repository, remote, f"{commit}:{ref}", credentials=credentials, lease=(ref, lease))
    return Pushed(branch, commit, public_url(remote), changed)
