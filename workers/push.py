"""Changes leave the worker: a workspace's changes committed to a new branch and pushed to a remote.

The worker's git does it (workers/git.py: the repository's hooks, filters and helpers never run), under the
bot's own identity, to a remote the operator named (the job's `push.remote`, else its repository): never a
remote of the workspace's config, which the model can write. Credentials come from the worker's environment
(`MM_GIT_TOKEN`, and `MM_GIT_USERNAME`, default `x-access-token`), reach git through its askpass only, and are
masked in every text git's words end up in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from chatops.config import Config
from workers import git
from workers.workspaces import hand_over, public_url

AUTHOR = ("mm", "mm@localhost")


class NothingToPush(Exception):
    """The workspace has no change to commit."""


class BranchRefused(Exception):
    """The branch is the repository's own (its base, main, master): a push makes a new branch, never moves it."""


OWN_BRANCHES = ("main", "master")


def check_branch(branch: str, base: str | None) -> None:
    if branch in {*OWN_BRANCHES, *([base] if base else [])}:
        raise BranchRefused(f"`{branch}` is the repository's own branch: push to a new one, such as `mm/{branch}-fix`")


@dataclass(frozen=True)
class Pushed:
    branch: str
    commit: str
    remote: str  # as the thread may show it: without credentials
    files: int

    @property
    def said(self) -> str:
        """The link to open a pull request, as a thread's text ends with it ("" where the forge is unknown)."""
        page = pull_request_page(self.remote, self.branch)
        return f" <{page}|Open a pull request>." if page else ""


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
    return PULL_REQUEST_PAGES[parts.hostname].format(path=path, branch=quote(branch, safe="/"))


def credentials(config: Config) -> git.Credentials | None:
    """The HTTPS credentials of the worker's environment (`MM_GIT_TOKEN`, `MM_GIT_USERNAME`), if any."""
    if not config.git_token:
        return None
    return git.Credentials(config.git_username or "x-access-token", config.git_token)


def changed_files(workspace: Path, start: str | None) -> int:
    """How many files the workspace differs in from the commit it started from (`start`, workspaces'
    `start_commit`; HEAD when unknown): the model's commits and its uncommitted edits alike, new files included.
    0 for a workspace that is no repository."""
    try:
        tracked = git.run_git(workspace, "diff", "--name-only", "-z", "--no-renames", start or "HEAD", check=False)
        if not tracked.ok:  # the start commit is gone (the model can rewrite .git): what is not committed yet
            tracked = git.run_git(workspace, "diff", "--name-only", "-z", "--no-renames", "HEAD", check=False)
        new = git.run_git(workspace, "ls-files", "--others", "--exclude-standard", "-z", check=False)
    except git.GitError:
        return 0
    paths = {p for result in (tracked, new) if result.ok for p in result.stdout.split("\0") if p}
    return len(paths)


def push_workspace(
    workspace: Path,
    remote: str,
    branch: str,
    message: str,
    credentials: git.Credentials | None,
    base: str | None = None,
    start: str | None = None,
) -> Pushed:
    """Commit everything the workspace changed onto `branch` (after the model's own commits, if it made any) and
    push it to `remote`; raises BranchRefused (the repository's own branch, `base` among them), NothingToPush,
    or git.GitError with git's own (masked) words. `start`: the commit the workspace was cloned at."""
    check_branch(branch, base)
    changed = changed_files(workspace, start)
    if not changed:
        raise NothingToPush
    name, email = AUTHOR
    for key, value in (("user.name", name), ("user.email", email)):
        git.run_git(workspace, "config", key, value)  # the workspace's own identity, if any, is the model's
    try:
        git.run_git(workspace, "checkout", "-q", "-B", branch)
        git.run_git(workspace, "add", "--all")
        if not git.run_git(workspace, "diff", "--cached", "--quiet", check=False).ok:  # else: all committed
            git.run_git(workspace, "commit", "-q", "--no-verify", "-m", message)
        commit = git.run_git(workspace, "rev-parse", "HEAD").stdout.strip()
        git.push(workspace, remote, f"HEAD:refs/heads/{branch}", credentials=credentials)
    finally:
        # A root worker's git wrote into .git: the workspace's later commands (its own user's) must still write there.
        hand_over(workspace / ".git")
    return Pushed(branch, commit, public_url(remote), changed)
