"""The worker's git on a model-writable workspace (workers/git.py), with real git on local repositories only.

The workspace's `.git/config` (directly and through include.path / includeIf), its hooks and its
`.gitattributes` name programs that leave a marker file when run, and the worker's own environment is polluted
too. Every command the worker runs on a workspace (status, diff, log, what a summary and a push run) must run
none of them, still do its work, and leave no credential anywhere in the workspace. The workspace's git runs
with `sandbox: none` here, as the workspace's owner: the overrides must hold without the sandbox to hide
behind (the sandbox would not even see the programs; tests/test_git_links.py is about what it does see).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_core.config import AgentConfig
from workers import git
from workers.git import Credentials, GitError
from workers.push import changed_files, diff_stat, push_workspace
from workers.workspaces import hand_over, prepare, start_commit

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

AGENT = AgentConfig(sandbox="none")
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
        self.markers.chmod(0o777)  # the programs would run as the workspace's owner
        self.origin = tmp / "origin"
        self.bare = tmp / "pushed.git"
        self.elsewhere = tmp / "elsewhere.git"
        self.origin.mkdir()
        sh("init", "-q", "-b", "main", cwd=self.origin)
        (self.origin / "a.txt").write_text("one\n")
        # Every path of the tree asks for the `evil` filter and diff driver: only config can define them.
        (self.origin / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
        sh("add", ".", cwd=self.origin)
        sh("commit", "-q", "-m", "first", cwd=self.origin)
        sh("init", "-q", "--bare", "-b", "main", str(self.bare))
        sh("init", "-q", "--bare", "-b", "main", str(self.elsewhere))
        self.root = tmp / "workspaces"
        self.session = "5" * 32
        self.ws = prepare(self.root, self.session, str(self.origin), "main").path
        (self.mirror,) = (self.root / ".mirrors").glob("*.git")

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
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # Where the workspace's owner can reach its workspace and the programs (pytest's tmp_path is root's alone).
    top = Path(tempfile.mkdtemp(prefix="mm-git-safety-"))
    top.chmod(0o711)
    w = World(top)
    # The worker's own environment is no safer: a hostile global config and git variables must be ignored.
    home = top / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        f"[core]\n\thooksPath = {top / 'evil-hooks'}\n"
        f'[filter "evil"]\n\tsmudge = {w.program("global-smudge")}\n'
        f"\tclean = {w.program('global-clean')}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", w.program("env-external-diff"))
    monkeypatch.setenv("GIT_SSH_COMMAND", w.program("env-ssh"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor={w.program('env-fsmonitor')}'")
    monkeypatch.setenv("GIT_PAGER", w.program("env-pager"))
    yield w
    shutil.rmtree(top)


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
    hand_over(w.ws)  # the model wrote all this as the workspace's owner


def push(w: World, branch: str, credentials: Credentials | None = None) -> str:
    """The worker's push of the workspace to w.bare, as an approver's Push branch runs it; the commit pushed."""
    start = start_commit(w.root, w.session)
    return push_workspace(w.ws, AGENT, str(w.bare), branch, "work", credentials, start=start).commit


def test_every_worker_command_ignores_a_hostile_workspace_and_still_works(world: World) -> None:
    w = world
    assert (w.ws / "a.txt").read_text() == "one\n"
    assert w.ran() == []  # no smudge from the global config or the environment
    make_hostile(w, w.hostile_settings())

    out = git.status(w.ws, AGENT).stdout
    assert " M a.txt" in out
    d = git.diff(w.ws, AGENT).stdout
    assert "+two" in d and "diff --git a/a.txt b/a.txt" in d
    assert "+two" in git.diff(w.ws, AGENT, "HEAD").stdout
    assert "first" in git.log(w.ws, AGENT, "-p", "-1").stdout
    start = start_commit(w.root, w.session)
    assert changed_files(w.ws, AGENT, start) == 1
    assert "a.txt | 1 +" in diff_stat(w.ws, AGENT, start, 20)

    # The push commits the change in the workspace and pushes it where the worker says: not where the
    # workspace's pushInsteadOf points, and the token never reaches the workspace's git.
    commit = push(w, "work", Credentials("bot", TOKEN))
    assert sh("rev-parse", "refs/heads/work", cwd=w.bare).strip() == commit
    assert sh("show", "work:a.txt", cwd=w.bare) == "one\ntwo\n"
    assert sh("for-each-ref", cwd=w.elsewhere) == ""

    assert w.ran() == []
    assert TOKEN not in _everything_in(w.ws)
    assert TOKEN not in _everything_in(w.tmp / "home")


@pytest.mark.parametrize("index", range(25))  # one per World.hostile_settings() entry
def test_each_hostile_setting_alone_runs_nothing(world: World, index: int) -> None:
    """One setting at a time (so that one neutralised key cannot hide another that still runs)."""
    w = world
    settings = w.hostile_settings()
    key, value = settings[index]
    make_hostile(w, [(key, value)], hooks=index == 0)
    git.status(w.ws, AGENT)
    git.diff(w.ws, AGENT)
    git.log(w.ws, AGENT, "-p", "-1")
    start = start_commit(w.root, w.session)
    diff_stat(w.ws, AGENT, start, 20)
    # A checkout, an add, a commit (refs change: transaction hooks), a pack of the commit, a push.
    commit = push(w, "work")
    assert sh("rev-parse", "work", cwd=w.bare).strip() == commit
    assert sh("for-each-ref", cwd=w.elsewhere) == ""
    assert w.ran() == [], key


def test_sanitize_keeps_the_harmless_config_and_drops_the_rest(world: World) -> None:
    w = world
    make_hostile(w, [("user.name", "Model"), ("filter.evil.clean", w.program("clean"))])
    (w.ws / ".git" / "objects" / "info").mkdir(exist_ok=True)
    (w.ws / ".git" / "objects" / "info" / "alternates").write_text(str(w.elsewhere / "objects") + "\n")
    dropped = git.sanitize(w.ws)
    assert "filter.evil.clean" in dropped and "include.path" in dropped and "objects/info/alternates" in dropped
    config = sh("config", "--file", str(w.ws / ".git" / "config"), "--list")
    assert "user.name=Model" in config and f"remote.origin.url={w.origin}" in config
    assert "filter" not in config and "include" not in config
    assert git.sanitize(w.ws) == []  # clean now: nothing rewritten


def test_credentials_reach_git_through_the_environment_only(world: World) -> None:
    # Only the worker's own repositories ever get credentials (a push's private repository): its askpass
    # answers git from the environment, and nothing is written anywhere.
    w = world
    asked = git.run_git(
        w.bare, "credential", "fill", stdin="protocol=https\nhost=127.0.0.1\n\n", credentials=Credentials("bot", TOKEN)
    )
    # git got the token from the worker's askpass (its own output is masked on the way out)...
    assert "username=bot" in asked.stdout and f"password={git.MASK}" in asked.stdout
    git.run_git(
        w.bare,
        "credential",
        "approve",
        stdin=f"protocol=https\nhost=127.0.0.1\nusername=bot\npassword={TOKEN}\n\n",
        credentials=Credentials("bot", TOKEN),
    )
    # ...and no helper of the environment's ran or stored it.
    assert w.ran() == []
    assert TOKEN not in _everything_in(w.tmp)


def test_a_failure_carries_gits_words_with_the_credentials_masked(world: World) -> None:
    w = world
    url = f"https://bot:{TOKEN}@127.0.0.1:9/team/repo.git"  # loopback; nothing listens on port 9
    with pytest.raises(GitError) as failed:
        git.push(w.mirror, url, "HEAD:refs/heads/x", credentials=Credentials("bot", TOKEN), timeout=30)
    text = failed.value.text
    assert text.startswith("[git: git push --no-verify failed (exit 128): ")
    assert "127.0.0.1" in text and TOKEN not in text and TOKEN not in repr(failed.value.result)
    with pytest.raises(GitError, match=r"protocol 'ext' is not supported|transport 'ext' not allowed"):
        git.run_git(w.bare, "fetch", "--", f"ext::sh -c touch% {w.markers}/ext")
    assert w.ran() == []


def test_a_git_dir_that_leads_elsewhere_is_refused(world: World) -> None:
    w = world
    shutil.rmtree(w.ws / ".git")
    (w.ws / ".git").symlink_to(w.mirror)
    with pytest.raises(GitError, match=r"\[git: \.git is a symlink"):
        git.status(w.ws, AGENT)
    (w.ws / ".git").unlink()
    (w.ws / ".git").write_text(f"gitdir: {w.mirror}\n")
    with pytest.raises(GitError, match=r"\[git: \.git is not a directory"):
        git.status(w.ws, AGENT)


def test_a_command_past_its_timeout_is_stopped(world: World) -> None:
    # The model can make git hang: an index that is a named pipe blocks git's open() for ever.
    w = world
    (w.ws / ".git" / "index").unlink()
    os.mkfifo(w.ws / ".git" / "index")
    with pytest.raises(GitError, match=r"\[git: git status --porcelain=v1 took more than 1s — stopped\]"):
        git.status(w.ws, AGENT, timeout=1)


def _everything_in(top: Path) -> str:
    chunks = []
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            p = Path(dirpath, name)
            if p.is_file() and not p.is_symlink():
                chunks.append(p.read_bytes().decode("latin-1"))
    return "\n".join(chunks)


def test_what_git_prints_is_kept_up_to_a_bound_and_a_large_input_goes_in_whole(world: World) -> None:
    # A file the model made 40 MB of one line: `git show` prints it all, the worker keeps OUTPUT_MOST (16 MiB).
    w = world
    with open(w.ws / "huge.txt", "wb") as f:
        f.write(b"y" * (40 << 20))
    hand_over(w.ws)
    shown = git.in_workspace(w.ws, AGENT, "hash-object", "-w", "huge.txt").stdout.strip()
    printed = git.in_workspace(w.ws, AGENT, "cat-file", "-p", shown)
    assert printed.ok and printed.stdout == "y" * git.OUTPUT_MOST
    # stdin is written while stdout is read: a 5 MB input with its 5 MB echo does not block either side.
    text = "z" * (5 << 20)
    echoed = git.run_git(None, "-c", "core.pager=cat", "stripspace", stdin=text)
    assert echoed.stdout == text + "\n"


def test_a_config_larger_than_a_mib_is_replaced_not_read_in_part(world: World) -> None:
    # Harmless entries fill the first MiB; what follows is a program git would run. Read in part, the first
    # MiB parsed cleanly, nothing was dropped, and the file stayed as the model left it.
    w = world
    config = w.ws / ".git" / "config"
    harmless = "".join(f'[branch "b{i}"]\n\tmerge = refs/heads/b{i}\n' for i in range(40_000))
    config.write_text(config.read_text() + harmless + f"[core]\n\tfsmonitor = {w.program('fsmonitor')}\n")
    assert config.stat().st_size > git.CONFIG_MOST
    assert "config (unreadable)" in git.sanitize(w.ws)
    assert "fsmonitor" not in config.read_text() and config.stat().st_size < 1000


def test_a_failure_says_git_s_words_within_a_bound(world: World) -> None:
    # git names each bad argument; the model chose them. The error keeps the head and the tail of what it said.
    w = world
    many = [f"no-such-{i:06d}-{'x' * 50}" for i in range(3000)]
    with pytest.raises(GitError) as failed:
        git.in_workspace(w.ws, AGENT, "rev-parse", "--verify", "--end-of-options", *many)
    assert len(failed.value.text) < git.WORDS_MOST + 500, len(failed.value.text)


def _delta_bomb(result_size: int) -> bytes:
    """A pack of two objects, under 200 bytes: a 64 KiB blob, and a delta on it that claims `result_size` bytes,
    each byte of it (0x80: copy 64 KiB from the base's start) worth 64 KiB of the result."""

    def delta_size(n: int) -> bytes:
        out = bytearray()
        while True:
            low, n = n & 0x7F, n >> 7
            out.append(low | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def header(kind: int, size: int) -> bytes:
        out, first, size = bytearray(), (kind << 4) | (size & 0x0F), size >> 4
        while size:
            out.append(first | 0x80)
            first, size = size & 0x7F, size >> 7
        return bytes([*out, first])

    base = b"a" * 0x10000
    base_id = hashlib.sha1(b"blob %d\0" % len(base) + base).digest()
    delta = delta_size(len(base)) + delta_size(result_size) + b"\x80" * (result_size // 0x10000)
    body = b"PACK" + struct.pack(">II", 2, 2) + header(3, len(base)) + zlib.compress(base)
    body += header(7, len(delta)) + base_id + zlib.compress(delta, 9)
    return body + hashlib.sha1(body).digest()


def test_a_delta_bomb_fails_the_worker_s_index_pack_within_its_memory(tmp_path: Path) -> None:
    # What the workspace's pack-objects sends, the worker's index-pack reads (copy_objects): a pack can claim an
    # object of 3 GiB in 190 bytes. Unbounded, index-pack built it whole (3 GiB of the worker's memory) and
    # succeeded; bounded, it fails at once in git's own words.
    repository = tmp_path / "push.git"
    sh("init", "-q", "--bare", str(repository))
    launch = git.index_pack(repository, tmp_path, ("index-pack", "--stdin", "--strict"))
    receiver = subprocess.Popen(
        launch.argv,
        cwd=launch.cwd,
        env=launch.env,
        preexec_fn=launch.preexec,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = receiver.communicate(_delta_bomb(3 << 30), timeout=60)
    assert receiver.returncode != 0 and b"Out of memory" in err, err
