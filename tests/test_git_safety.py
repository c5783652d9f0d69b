"""The worker's git on a model-writable workspace (workers/git.py), with real git on local repositories only.

The workspace's `.git/config` (directly and through include.path / includeIf), its hooks and its
`.gitattributes` name programs that leave a marker file when run, and the worker's own environment is polluted
too. Every command the worker uses (clone, status, diff, log, fetch, push, credential) must run none of them,
still do its work, and leave no credential anywhere in the workspace.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from workers import git
from workers.git import Credentials, GitError

TOKEN = "tok-5ecret-9a7b"
HOOKS = (
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-checkout",
    "pre-push",
    "post-index-change",
    "reference-transaction",
    "fsmonitor-watchman",
    "pre-auto-gc",
    "post-merge",
    "pre-receive",
    "update",
    "post-update",
    "push-to-checkout",
)


def sh(*args: str, cwd: Path | None = None) -> str:
    """Plain git for the test's own setup, with no config but the repository's."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


class World:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.markers = tmp / "markers"
        self.markers.mkdir()
        self.origin = tmp / "origin"
        self.mirror = tmp / "mirror.git"
        self.bare = tmp / "pushed.git"
        self.elsewhere = tmp / "elsewhere.git"
        self.ws = tmp / "ws"
        self.origin.mkdir()
        sh("init", "-q", "-b", "main", cwd=self.origin)
        (self.origin / "a.txt").write_text("one\n")
        # Every path of the tree asks for the `evil` filter and diff driver: only config can define them.
        (self.origin / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
        sh("add", ".", cwd=self.origin)
        sh("commit", "-q", "-m", "first", cwd=self.origin)
        sh("clone", "-q", "--mirror", str(self.origin), str(self.mirror))
        sh("init", "-q", "--bare", "-b", "main", str(self.bare))
        sh("init", "-q", "--bare", "-b", "main", str(self.elsewhere))

    def program(self, name: str) -> str:
        """A script that leaves markers/<name> and passes its input through (so a filter still 'works')."""
        path = self.tmp / "programs" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(f'#!/bin/sh\ntouch "{self.markers}/{name}"\ncat\n')
        path.chmod(0o755)
        return str(path)

    def ran(self) -> list[str]:
        return sorted(os.listdir(self.markers))

    def hostile_settings(self) -> list[tuple[str, str]]:
        hooks = self.tmp / "evil-hooks"
        hooks.mkdir(exist_ok=True)
        for hook in HOOKS:
            os.symlink(self.program(f"hooksPath-{hook}"), hooks / hook)
        return [
            ("core.hooksPath", str(hooks)),
            ("core.fsmonitor", self.program("fsmonitor")),
            ("core.pager", self.program("pager")),
            ("pager.log", self.program("pager.log")),
            ("core.editor", self.program("editor")),
            ("core.askPass", self.program("askpass")),
            ("core.sshCommand", self.program("sshCommand")),
            ("diff.external", self.program("diff.external")),
            ("diff.evil.textconv", self.program("textconv")),
            ("diff.evil.command", self.program("diff.command")),
            ("filter.evil.clean", self.program("clean")),
            ("filter.evil.smudge", self.program("smudge")),
            ("filter.evil.process", self.program("process")),
            ("filter.evil.required", "true"),
            ("merge.evil.driver", self.program("merge")),
            ("credential.helper", self.program("credential.helper")),
            (f"credential.{'https://127.0.0.1'}.helper", self.program("credential.url.helper")),
            (f"url.{self.elsewhere}.insteadOf", str(self.mirror)),
            (f"url.{self.elsewhere}.pushInsteadOf", str(self.bare)),
            ("remote.origin.uploadpack", self.program("uploadpack")),
            ("remote.origin.receivepack", self.program("receivepack")),
            ("gpg.program", self.program("gpg")),
            ("commit.gpgSign", "true"),
            ("core.worktree", str(self.tmp)),
            ("core.bare", "true"),
        ]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    w = World(tmp_path)
    # The worker's own environment is no safer: a hostile global config and git variables must be ignored.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        f"[core]\n\thooksPath = {tmp_path / 'evil-hooks'}\n"
        f'[filter "evil"]\n\tsmudge = {w.program("global-smudge")}\n'
        f"\tclean = {w.program('global-clean')}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", w.program("env-external-diff"))
    monkeypatch.setenv("GIT_SSH_COMMAND", w.program("env-ssh"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor={w.program('env-fsmonitor')}'")
    monkeypatch.setenv("GIT_PAGER", w.program("env-pager"))
    return w


def make_hostile(w: World, key_values: list[tuple[str, str]], hooks: bool = True) -> None:
    """The workspace as the model can leave it: hooks in .git/hooks, settings in .git/config and in a file it
    includes (both ways), a change in the work tree."""
    gd = w.ws / ".git"
    (gd / "hooks").mkdir(exist_ok=True)
    for hook in HOOKS if hooks else ():
        hook_path = gd / "hooks" / hook
        hook_path.unlink(missing_ok=True)
        os.symlink(w.program(f"hook-{hook}"), hook_path)
    included = w.tmp / "included.cfg"
    for key, value in key_values:
        sh("config", "--file", str(gd / "config"), "--add", key, value)
        sh("config", "--file", str(included), "--add", key.replace("evil", "evil2"), value)
    sh("config", "--file", str(gd / "config"), "include.path", str(included))
    sh("config", "--file", str(gd / "config"), f"includeIf.gitdir:{w.ws}/.path", str(included))
    (w.ws / "a.txt").write_text("one\ntwo\n")


def test_every_worker_command_ignores_a_hostile_workspace_and_still_works(world: World) -> None:
    w = world
    git.clone(w.mirror, w.ws, timeout=30)
    assert (w.ws / "a.txt").read_text() == "one\n"
    assert w.ran() == []  # no smudge from the global config or the environment
    make_hostile(w, w.hostile_settings())

    out = git.status(w.ws).stdout
    assert " M a.txt" in out
    d = git.diff(w.ws).stdout
    assert "+two" in d and "diff --git a/a.txt b/a.txt" in d
    assert "+two" in git.diff(w.ws, "HEAD").stdout
    assert "first" in git.log(w.ws, "-p", "-1").stdout

    # A new commit upstream reaches the workspace from the mirror named by the worker.
    (w.origin / "b.txt").write_text("b\n")
    sh("add", "b.txt", cwd=w.origin)
    sh("commit", "-q", "-m", "second", cwd=w.origin)
    sh("fetch", "-q", str(w.origin), "+refs/heads/*:refs/heads/*", cwd=w.mirror)
    git.fetch(w.ws, w.mirror, "+refs/heads/main:refs/remotes/origin/main")
    assert "second" in git.log(w.ws, "-1", "refs/remotes/origin/main").stdout

    # Commit the change with plain git outside the test's hostile config (the model would, in the sandbox),
    # then push it where the worker says: not where pushInsteadOf points.
    git.run_git(w.ws, "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "-am", "work")
    git.push(w.ws, w.bare, "HEAD:refs/heads/work", credentials=Credentials("bot", TOKEN))
    assert "work" in sh("log", "--format=%s", "-1", "refs/heads/work", cwd=w.bare)
    assert sh("for-each-ref", cwd=w.elsewhere) == ""

    assert w.ran() == []
    assert TOKEN not in _everything_in(w.ws)
    assert TOKEN not in _everything_in(w.tmp / "home")


@pytest.mark.parametrize("index", range(25))  # one per World.hostile_settings() entry
def test_each_hostile_setting_alone_runs_nothing(world: World, index: int) -> None:
    """One setting at a time (so that one neutralised key cannot hide another that still runs)."""
    w = world
    git.clone(w.mirror, w.ws, timeout=30)
    settings = w.hostile_settings()
    key, value = settings[index]
    make_hostile(w, [(key, value)], hooks=index == 0)
    (w.origin / "b.txt").write_text("b\n")
    sh("add", "b.txt", cwd=w.origin)
    sh("commit", "-q", "-m", "second", cwd=w.origin)
    sh("fetch", "-q", str(w.origin), "+refs/heads/*:refs/heads/*", cwd=w.mirror)
    git.status(w.ws)
    git.diff(w.ws)
    git.log(w.ws, "-p", "-1")
    git.fetch(w.ws, w.mirror, "+refs/heads/main:refs/remotes/origin/main")  # a ref changes: transaction hooks
    git.run_git(w.ws, "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "-am", "work")
    git.push(w.ws, w.bare, "HEAD:refs/heads/main")
    assert "work" in sh("log", "--format=%s", "-1", "main", cwd=w.bare)
    assert sh("for-each-ref", cwd=w.elsewhere) == ""
    assert w.ran() == [], key


def test_sanitize_keeps_the_harmless_config_and_drops_the_rest(world: World) -> None:
    w = world
    git.clone(w.mirror, w.ws, timeout=30)
    make_hostile(w, [("user.name", "Model"), ("filter.evil.clean", w.program("clean"))])
    (w.ws / ".git" / "objects" / "info").mkdir(exist_ok=True)
    (w.ws / ".git" / "objects" / "info" / "alternates").write_text(str(w.elsewhere / "objects") + "\n")
    dropped = git.sanitize(w.ws)
    assert "filter.evil.clean" in dropped and "include.path" in dropped and "objects/info/alternates" in dropped
    config = sh("config", "--file", str(w.ws / ".git" / "config"), "--list")
    assert "user.name=Model" in config and f"remote.origin.url={w.mirror}" in config
    assert "filter" not in config and "include" not in config
    assert git.sanitize(w.ws) == []  # clean now: nothing rewritten


def test_credentials_reach_git_through_the_environment_only(world: World) -> None:
    w = world
    git.clone(w.mirror, w.ws, timeout=30)
    make_hostile(
        w,
        [
            ("credential.helper", w.program("credential.helper")),
            ("credential.helper", f"store --file={w.ws / 'stolen'}"),
        ],
    )
    asked = git.run_git(
        w.ws, "credential", "fill", stdin="protocol=https\nhost=127.0.0.1\n\n", credentials=Credentials("bot", TOKEN)
    )
    # git got the token from the worker's askpass (its own output is masked on the way out)...
    assert "username=bot" in asked.stdout and f"password={git.MASK}" in asked.stdout
    git.run_git(
        w.ws,
        "credential",
        "approve",
        stdin=f"protocol=https\nhost=127.0.0.1\nusername=bot\npassword={TOKEN}\n\n",
        credentials=Credentials("bot", TOKEN),
    )
    # ...and no helper of the workspace's ran or stored it.
    assert w.ran() == []
    assert not (w.ws / "stolen").exists()
    assert TOKEN not in _everything_in(w.ws)


def test_a_failure_carries_gits_words_with_the_credentials_masked(world: World) -> None:
    w = world
    git.clone(w.mirror, w.ws, timeout=30)
    url = f"https://bot:{TOKEN}@127.0.0.1:9/team/repo.git"  # loopback; nothing listens on port 9
    with pytest.raises(GitError) as failed:
        git.push(w.ws, url, "HEAD:refs/heads/x", credentials=Credentials("bot", TOKEN), timeout=30)
    text = failed.value.text
    assert text.startswith("[git: git push --no-verify failed (exit 128): ")
    assert "127.0.0.1" in text and TOKEN not in text and TOKEN not in repr(failed.value.result)
    with pytest.raises(GitError, match=r"protocol 'ext' is not supported|transport 'ext' not allowed"):
        git.fetch(w.ws, f"ext::sh -c touch% {w.markers}/ext")
    assert w.ran() == []


def test_a_git_dir_that_leads_elsewhere_is_refused(world: World) -> None:
    w = world
    w.ws.mkdir()
    (w.ws / ".git").symlink_to(w.mirror)
    with pytest.raises(GitError, match=r"\[git: \.git is a symlink"):
        git.status(w.ws)
    (w.ws / ".git").unlink()
    (w.ws / ".git").write_text(f"gitdir: {w.mirror}\n")
    with pytest.raises(GitError, match=r"\[git: \.git is not a directory"):
        git.status(w.ws)


def test_a_command_past_its_timeout_is_stopped(world: World) -> None:
    # The model can make git hang: an index that is a named pipe blocks git's open() for ever.
    w = world
    git.clone(w.mirror, w.ws, timeout=30)
    (w.ws / ".git" / "index").unlink()
    os.mkfifo(w.ws / ".git" / "index")
    with pytest.raises(GitError, match=r"\[git: git status --porcelain=v1 took more than 1s — stopped\]"):
        git.status(w.ws, timeout=1)


def _everything_in(top: Path) -> str:
    chunks = []
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            p = Path(dirpath, name)
            if p.is_file() and not p.is_symlink():
                chunks.append(p.read_bytes().decode("latin-1"))
    return "\n".join(chunks)
