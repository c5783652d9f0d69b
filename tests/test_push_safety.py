"""A push goes where the worker says, whatever the workspace's config says: the model can write `.git/config`,
and git takes a URL given to push for the name of a remote when a section is so named."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from threads_support import repositories
from workers.push import push_workspace


def git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        # safe.directory: a root worker hands a workspace to the sandbox's user; this test acts as the model there.
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "safe.directory=*", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_remote_named_like_the_push_url_in_the_workspace_config_does_not_redirect_the_push(tmp_path: Path) -> None:
    _, target = repositories(tmp_path)
    evil = tmp_path / "evil.git"
    git("init", "-q", "--bare", "-b", "main", str(evil))
    workspace = tmp_path / "ws"
    git("clone", "-q", str(target), str(workspace))
    (workspace / "change.txt").write_text("changed\n")
    # What the model could write: a remote named exactly as the URL the worker will push to.
    url = f"file://{target}"
    with (workspace / ".git" / "config").open("a") as config:
        config.write(f'[remote "{url}"]\n\turl = {evil}\n[remote "origin"]\n\tpushurl = {evil}\n')

    pushed = push_workspace(workspace, url, "mm/safe", "the change", None)
    assert pushed.branch == "mm/safe" and pushed.files == 1
    assert git("--git-dir", str(target), "show", "mm/safe:change.txt") == "changed\n"
    assert git("--git-dir", str(evil), "branch", "--list") == ""  # nothing went there


def test_the_model_s_own_commits_are_changes_and_are_pushed_with_what_it_left_uncommitted(tmp_path: Path) -> None:
    seed, target = repositories(tmp_path)
    top = Path(tempfile.mkdtemp(prefix="mm-workspaces-"))  # where the sandbox's user can reach its workspace
    os.chmod(top, 0o711)
    try:
        model_commits_and_edits(top / "workspaces", target, seed)
    finally:
        shutil.rmtree(top)


def model_commits_and_edits(root: Path, target: Path, seed: Path) -> None:
    from workers.push import NothingToPush, changed_files
    from workers.workspaces import prepare, start_commit

    session = "0" * 32
    workspace = prepare(root, session, str(target), "main").path
    start = start_commit(root, session)
    assert start == git("rev-parse", "HEAD", cwd=seed).strip()
    assert changed_files(workspace, start) == 0
    try:
        push_workspace(workspace, str(target), "mm/nothing", "nothing", None, start=start)
        raise AssertionError("an unchanged workspace was pushed")
    except NothingToPush:
        pass

    # What a model does with bash: it commits one change, then edits another file without committing.
    (workspace / "committed.txt").write_text("the model committed this\n")
    git("add", "committed.txt", cwd=workspace)
    git("commit", "-q", "-m", "the model's commit", cwd=workspace)
    assert git("status", "--porcelain", cwd=workspace) == ""  # git status alone would say nothing changed
    assert changed_files(workspace, start) == 1
    (workspace / "README.md").write_text("edited after\n")
    assert changed_files(workspace, start) == 2

    pushed = push_workspace(workspace, str(target), "mm/both", "the rest", None, start=start)
    assert pushed.files == 2
    assert git("--git-dir", str(target), "show", "mm/both:committed.txt") == "the model committed this\n"
    assert git("--git-dir", str(target), "show", "mm/both:README.md") == "edited after\n"
    assert git("--git-dir", str(target), "log", "--format=%s", "mm/both") == "the rest\nthe model's commit\nstart\n"
    # Only commits: nothing left to commit, and the branch is still pushed.
    (workspace / "later.txt").write_text("x\n")
    git("add", "later.txt", cwd=workspace)
    git("commit", "-q", "-m", "only a commit", cwd=workspace)
    pushed = push_workspace(workspace, str(target), "mm/commits-only", "unused", None, start=start)
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
