"""A push goes where the worker says, whatever the workspace's config says: the model can write `.git/config`,
and git takes a URL given to push for the name of a remote when a section is so named."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_core.config import AgentConfig
from threads_support import git, repositories
from workers.push import push_workspace
from workers.workspaces import prepare

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

AGENT = AgentConfig()  # sandbox: auto, as a session's agent config is by default


def test_a_remote_named_like_the_push_url_in_the_workspace_config_does_not_redirect_the_push(tmp_path: Path) -> None:
    _, target = repositories(tmp_path)
    evil = tmp_path / "evil.git"
    git("init", "-q", "--bare", "-b", "main", str(evil))
    with workspaces() as root:
        workspace = prepare(root, "0" * 32, str(target), "main").path
        (workspace / "change.txt").write_text("changed\n")
        # What the model could write: a remote named exactly as the URL the worker will push to.
        url = f"file://{target}"
        with (workspace / ".git" / "config").open("a") as config:
            config.write(f'[remote "{url}"]\n\turl = {evil}\n[remote "origin"]\n\tpushurl = {evil}\n')

        pushed = push_workspace(workspace, AGENT, url, "mm/safe", "the change", None)
    assert pushed.branch == "mm/safe" and pushed.files == 1
    assert git("--git-dir", str(target), "show", "mm/safe:change.txt") == "changed\n"
    assert git("--git-dir", str(evil), "branch", "--list") == ""  # nothing went there


@contextlib.contextmanager
def workspaces() -> Iterator[Path]:
    """A workspaces root where the sandbox's user can reach its workspace (pytest's tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="mm-workspaces-"))
    os.chmod(top, 0o711)
    try:
        yield top / "workspaces"
    finally:
        shutil.rmtree(top)


def test_the_model_s_own_commits_are_changes_and_are_pushed_with_what_it_left_uncommitted(tmp_path: Path) -> None:
    seed, target = repositories(tmp_path)
    with workspaces() as root:
        model_commits_and_edits(root, target, seed)


def model_commits_and_edits(root: Path, target: Path, seed: Path) -> None:
    from workers.push import NothingToPush, changed_files
    from workers.workspaces import start_commit

    session = "0" * 32
    workspace = prepare(root, session, str(target), "main").path
    start = start_commit(root, session)
    assert start == git("rev-parse", "HEAD", cwd=seed).strip()
    assert changed_files(workspace, AGENT, start) == 0
    try:
        push_workspace(workspace, AGENT, str(target), "mm/nothing", "nothing", None, start=start)
        raise AssertionError("an unchanged workspace was pushed")
    except NothingToPush:
        pass

    # What a model does with bash: it commits one change, then edits another file without committing.
    (workspace / "committed.txt").write_text("the model committed this\n")
    git("add", "committed.txt", cwd=workspace)
    git("commit", "-q", "-m", "the model's commit", cwd=workspace)
    assert git("status", "--porcelain", cwd=workspace) == ""  # git status alone would say nothing changed
    assert changed_files(workspace, AGENT, start) == 1
    (workspace / "README.md").write_text("edited after\n")
    assert changed_files(workspace, AGENT, start) == 2

    pushed = push_workspace(workspace, AGENT, str(target), "mm/both", "the rest", None, start=start)
    assert pushed.files == 2
    assert git("--git-dir", str(target), "show", "mm/both:committed.txt") == "the model committed this\n"
    assert git("--git-dir", str(target), "show", "mm/both:README.md") == "edited after\n"
    assert git("--git-dir", str(target), "log", "--format=%s", "mm/both") == "the rest\nthe model's commit\nstart\n"
    # Only commits: nothing left to commit, and the branch is still pushed.
    (workspace / "later.txt").write_text("x\n")
    git("add", "later.txt", cwd=workspace)
    git("commit", "-q", "-m", "only a commit", cwd=workspace)
    pushed = push_workspace(workspace, AGENT, str(target), "mm/commits-only", "unused", None, start=start)
    assert git("--git-dir", str(target), "log", "-1", "--format=%s", "mm/commits-only") == "only a commit\n"


def test_a_pushed_branch_links_to_its_forge_s_pull_request_page_and_only_for_a_plain_path() -> None:
    from workers.push import Pushed, pull_request_page

    assert pull_request_page("https://github.com/acme/app.git", "mm/fix-1") == (
        "https://github.com/acme/app/pull/new/mm/fix-1"
    )
    assert pull_request_page("https://gitlab.com/group/sub/app", "mm/a b") == (
        "https://gitlab.com/group/sub/app/-/merge_requests/new?merge_request%5Bsource_branch%5D=mm/a%20b"
    )
    for remote in (
        "https://github.com/acme",  # no repository
        "https://github.com/acme/../../elsewhere",
        "http://github.com/acme/app",
        "git@github.com:acme/app.git",
        "https://github.com.evil.example/acme/app",
        "file:///srv/git/app.git",
        "https://github.com/acme/app|Click here>",
    ):
        assert pull_request_page(remote, "mm/x") is None, remote
    assert Pushed("mm/x", "c" * 40, "https://github.com/a/b", 1).said == (
        " <https://github.com/a/b/pull/new/mm/x|Open a pull request>."
    )
    assert Pushed("mm/x", "c" * 40, "file:///srv/b.git", 1).said == ""


def test_the_token_goes_only_to_repositories_the_config_names_and_only_to_their_host_s_prompt(tmp_path: Path) -> None:
    from chatops.config import load_config
    from workers.git import ASKPASS
    from workers.push import credentials

    (tmp_path / "mm.yaml").write_text(
        "channels:\n"
        "  C0A: {repo: 'https://git.example.com/team/app.git', repos: ['https://Forge.example.org/team/*', "
        "'https://github.com/*/*', 'https://**/*']}\n"
        "jobs:\n"
        "  - {name: n, schedule: '0 3 * * *', channel: C0A, prompt: p, push: {remote: 'https://[::1]:8443/x'}}\n"
    )
    config = load_config(tmp_path / "mm.yaml", environ={"MM_GIT_TOKEN": "tok-123"})
    given = {
        "https://git.example.com/team/app": "git.example.com",  # the channel's, without .git
        "https://bot@GIT.example.com/team/app.git/": "git.example.com",
        "https://forge.example.org/team/other.git": "forge.example.org",  # under an owner a pattern names
        "https://[::1]:8443/x": "[::1]",
    }
    for remote, host in given.items():
        token = credentials(config, remote)
        assert token is not None and (token.password, token.host) == ("tok-123", host), remote
    for remote in (
        "https://git.example.com/team/other.git",  # same forge, a repository nobody named
        "https://github.com/someone/private.git",  # a wildcard owner names nobody
        "https://evil.example.com/team/app.git",  # a wildcard host names no host
        "http://git.example.com/team/app.git",
        "/srv/app.git",
    ):
        assert credentials(config, remote) is None, remote

    askpass = tmp_path / "askpass"
    askpass.write_text(ASKPASS)
    askpass.chmod(0o700)
    env = {
        "MM_GIT_USERNAME": "bot",
        "MM_GIT_PASSWORD": "tok-123",
        "MM_GIT_HOST": "git.example.com",
        "PATH": "/bin:/usr/bin",
    }

    def ask(prompt: str, host: str = "git.example.com") -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(askpass), prompt], env=env | {"MM_GIT_HOST": host}, capture_output=True, text=True)

    assert ask("Password for 'https://bot@git.example.com': ").stdout == "tok-123\n"
    assert ask("Password for 'https://bot@GIT.Example.com': ").stdout == "tok-123\n"  # git keeps the URL's case
    assert ask("Username for 'https://git.example.com:8443': ").stdout == "bot\n"
    assert ask("Password for 'https://bot@[::1]:8443': ", host="[::1]").stdout == "tok-123\n"
    for elsewhere in (
        "Password for 'https://u@evil.example.com': ",
        "Password for 'https://git.example.com.evil.io': ",
        "Password for 'https://git.example.com@evil.io': ",
        "Password for 'https://evil.io/?//git.example.com': x",
    ):
        refused = ask(elsewhere)
        assert refused.returncode == 1 and refused.stdout == "", elsewhere


def test_a_push_never_goes_to_the_branch_the_workspace_was_cloned_from(tmp_path: Path) -> None:
    from workers.push import BranchRefused, diff_stat, pull_request_page
    from workers.workspaces import cloned_branch, start_commit

    seed, target = repositories(tmp_path)
    git("push", "-q", str(target), "main:develop", cwd=seed)
    with workspaces() as root:
        session = "1" * 32
        workspace = prepare(root, session, str(target), "develop").path
        assert cloned_branch(root, session) == "develop"
        (workspace / "x.txt").write_text("x\n")
        git("add", "x.txt", cwd=workspace)
        git("commit", "-qm", "the model's", cwd=workspace)
        start = start_commit(root, session)
        try:
            push_workspace(workspace, AGENT, str(target), "develop", "m", None, start=start, cloned="develop")
            raise AssertionError("the cloned branch was pushed to")
        except BranchRefused as e:
            assert "`develop` is the repository's own branch" in str(e)
        assert "x.txt" in diff_stat(workspace, AGENT, start, 20)  # the summary counts the model's commit
        # A start commit the workspace no longer has (the model can rewrite .git): measured from HEAD, and said.
        assert "the commit the workspace was cloned at is gone" in diff_stat(workspace, AGENT, "0" * 40, 20)
    assert pull_request_page("https://github.com/acme/app/tree/x", "b") is None  # owner/repository only
