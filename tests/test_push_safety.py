"""A push goes where the worker says, whatever the workspace's config says: the model can write `.git/config`,
and git takes a URL given to push for the name of a remote when a section is so named."""

from __future__ import annotations

import subprocess
from pathlib import Path

from workers.push import push_workspace


def git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_remote_named_like_the_push_url_in_the_workspace_config_does_not_redirect_the_push(tmp_path: Path) -> None:
    target, evil = tmp_path / "target.git", tmp_path / "evil.git"
    for bare in (target, evil):
        git("init", "-q", "--bare", "-b", "main", str(bare))
    seed = tmp_path / "seed"
    git("init", "-q", "-b", "main", str(seed))
    (seed / "README.md").write_text("a repository\n")
    git("add", "README.md", cwd=seed)
    git("commit", "-q", "-m", "start", cwd=seed)
    git("push", "-q", str(target), "main", cwd=seed)
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
