"""Changes leave the worker: a workspace's changes committed to a new branch and pushed to a remote.

The worker's git does it (workers/git.py: the repository's hooks, filters and helpers never run), under the
bot's own identity, to a remote the operator named (the job's `push.remote`, else its repository): never a
remote of the workspace's config, which the model can write. Credentials come from the worker's environment
(`MM_GIT_TOKEN`, and `MM_GIT_USERNAME`, default `x-access-token`), reach git through its askpass only, and are
masked in every text git's words end up in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def credentials(config: Config) -> git.Credentials | None:
    """The HTTPS credentials of the worker's environment (`MM_GIT_TOKEN`, `MM_GIT_USERNAME`), if any."""
    if not config.git_token:
        return None
    return git.Credentials(config.git_username or "x-access-token", config.git_token)


def changed_files(workspace: Path) -> int:
    """How many files the workspace changed (0 for one that is no repository)."""
    try:
        return len([entry for entry in git.status(workspace).stdout.split("\0") if entry.strip()])
    except git.GitError:
        return 0


def push_workspace(
    workspace: Path,
    remote: str,
    branch: str,
    message: str,
    credentials: git.Credentials | None,
    base: str | None = None,
) -> Pushed:
    """Commit everything the workspace changed onto `branch` and push it to `remote`; raises BranchRefused (the
    repository's own branch, `base` among them), NothingToPush, or git.GitError with git's own (masked) words."""
    check_branch(branch, base)
    changed = changed_files(workspace)
    if not changed:
        raise NothingToPush
    name, email = AUTHOR
    for key, value in (("user.name", name), ("user.email", email)):
        git.run_git(workspace, "config", key, value)  # the workspace's own identity, if any, is the model's
    try:
        git.run_git(workspace, "checkout", "-q", "-B", branch)
        git.run_git(workspace, "add", "--all")
        git.run_git(workspace, "commit", "-q", "--no-verify", "-m", message)
        commit = git.run_git(workspace, "rev-parse", "HEAD").stdout.strip()
        git.push(workspace, remote, f"HEAD:refs/heads/{branch}", credentials=credentials)
    finally:
        # A root worker's git wrote into .git: the workspace's later commands (its own user's) must still write there.
        hand_over(workspace / ".git")
    return Pushed(branch, commit, public_url(remote), changed)
