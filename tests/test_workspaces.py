"""Per-thread workspaces (workers/workspaces.py) with real git: local repositories in temporary directories.

Also the bash tool's walk after a command, which depends on who owns the workspace these prepare.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

from mm_core.config import AgentConfig
from mm_core.tools import bash as bash_module
from mm_core.tools.bash import BashTool, walk_needed
from mm_core.tools.sandbox import SANDBOX_UID, Usage
from mm_testkit.fixtures_kit import REQUIRE_SYSTEM, needs_bwrap
from tool_helpers import make_ctx
from workers.git import Credentials, in_workspace, status
from workers.workspaces import (
    MIRRORS,
    STAGING,
    Workspace,
    WorkspaceError,
    prepare,
    public_url,
    sweep,
    touch,
)

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="a root worker's behaviour (the tests run as root in CI)")
DAY = 24 * 3600
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
}


def git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=True)
    return done.stdout


class Origin:
    """The team's repository: a bare one (served by its path) and a work tree to commit to it from."""

    def __init__(self, base: Path, payload: bytes = b""):
        self.work = base / "work"
        self.bare = base / "origin.git"
        git("init", "-q", "-b", "main", str(self.work))
        (self.work / "README").write_text("hello\n")
        (self.work / "src").mkdir()
        (self.work / "src" / "app.py").write_text("print('app')\n")
        if payload:
            (self.work / "payload.bin").write_bytes(payload)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", "first", cwd=self.work)
        git("branch", "dev", cwd=self.work)
        git("clone", "-q", "--bare", str(self.work), str(self.bare))
        git("remote", "add", "origin", str(self.bare), cwd=self.work)

    @property
    def url(self) -> str:
        return str(self.bare)

    def commit(self, name: str, text: str) -> str:
        (self.work / name).write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", name, cwd=self.work)
        git("push", "-q", "origin", "main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).strip()


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    return Origin(tmp_path / "team")


@pytest.fixture
def root() -> Iterator[Path]:
    """MM_WORKSPACES, where the sandbox's user can reach its workspace (pytest's tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="mm-workspaces-"))
    os.chmod(top, 0o711)
    yield top / "workspaces"
    shutil.rmtree(top)


def inodes(top: Path) -> set[tuple[int, int]]:
    found = set()
    for base, _dirs, files in os.walk(top):
        for name in files:
            st = os.lstat(os.path.join(base, name))
            found.add((st.st_dev, st.st_ino))
    return found


def objects(git_dir: Path) -> int:
    counts = dict(line.split(": ") for line in git("--git-dir", str(git_dir), "count-objects", "-v").splitlines())
    return int(counts["count"]) + int(counts["in-pack"])


def mirror_of(root: Path) -> Path:
    (mirror,) = (root / MIRRORS).glob("*.git")
    return mirror


# --- preparing --------------------------------------------------------------------------------------------------


def test_a_first_turn_gets_a_complete_checkout_of_its_own(root: Path, origin: Origin) -> None:
    ws = prepare(root, "s1", origin.url, None)
    assert ws == Workspace(root / "s1", fresh=True)
    assert (ws.path / "README").read_text() == "hello\n"
    assert git("--git-dir", str(ws.path / ".git"), "symbolic-ref", "HEAD") == "refs/heads/main\n"
    # Complete: no alternates into the mirror (the sandbox cannot see it), no inode shared with it (a command
    # could write through one into every later thread's checkout), and still whole once the mirror is gone.
    assert not (ws.path / ".git" / "objects" / "info" / "alternates").exists()
    assert inodes(ws.path).isdisjoint(inodes(root / MIRRORS))
    shutil.rmtree(root / MIRRORS)
    # The worker's git on the workspace (with the model's power: as mm when the worker is root): no "dubious
    # ownership".
    agent = AgentConfig()
    assert in_workspace(ws.path, agent, "fsck", "--full", "--strict").ok
    assert status(ws.path, agent).stdout == ""
    # origin is the repository, not a mirror path the sandbox cannot see.
    assert in_workspace(ws.path, agent, "remote", "get-url", "origin").stdout.strip() == origin.url
    assert list((root / STAGING).iterdir()) == []


@as_root
def test_a_root_worker_gives_the_workspace_to_mm_and_keeps_the_rest(root: Path, origin: Origin) -> None:
    ws = prepare(root, "s1", origin.url, None)
    owners = {(os.lstat(p).st_uid, os.lstat(p).st_gid) for p in [ws.path, *ws.path.rglob("*")]}
    assert owners == {(SANDBOX_UID, SANDBOX_UID)}
    for path in [root / ".meta", root / MIRRORS, mirror_of(root), *mirror_of(root).rglob("*")]:
        assert os.lstat(path).st_uid == 0, path
    assert stat.S_IMODE(os.stat(root / MIRRORS).st_mode) == 0o700
    # The sandbox's user can reach its workspace through the root, and only list its own.
    reach = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
    assert subprocess.run([*reach, "ls", str(ws.path)], capture_output=True, text=True).stdout.split() == [
        "README",
        "src",
    ]
    assert subprocess.run([*reach, "ls", str(root / MIRRORS)], capture_output=True).returncode != 0


def test_no_repository_is_an_empty_directory(root: Path) -> None:
    ws = prepare(root, "s1", None, None)
    assert ws.fresh and list(ws.path.iterdir()) == []
    assert os.stat(ws.path).st_uid == (SANDBOX_UID if ROOT else os.geteuid())


def test_a_later_turn_keeps_its_files_and_a_gone_workspace_is_prepared_again(root: Path, origin: Origin) -> None:
    first = prepare(root, "s1", origin.url, "dev")
    (first.path / "notes.txt").write_text("mine\n")
    again = prepare(root, "s1", origin.url, "dev")
    assert again == Workspace(first.path, fresh=False)
    assert (again.path / "notes.txt").read_text() == "mine\n"
    assert git("--git-dir", str(again.path / ".git"), "symbolic-ref", "HEAD") == "refs/heads/dev\n"
    shutil.rmtree(first.path)  # removed by a sweep, or the thread moved to a worker without it
    back = prepare(root, "s1", origin.url, "dev")
    assert back.fresh and (back.path / "README").exists() and not (back.path / "notes.txt").exists()


def test_another_repository_or_branch_replaces_the_checkout_and_says_so(root: Path, origin: Origin) -> None:
    first = prepare(root, "s1", origin.url, None)
    (first.path / "notes.txt").write_text("mine\n")
    switched = prepare(root, "s1", origin.url, "dev")
    assert switched.fresh and not (switched.path / "notes.txt").exists()
    assert switched.note == (
        f"This thread's workspace was a checkout of {origin.url}; it was replaced by a fresh checkout of "
        f"{origin.url} (branch dev)."
    )
    emptied = prepare(root, "s1", None, None)
    assert emptied.fresh and list(emptied.path.iterdir()) == []
    assert list((root / STAGING).iterdir()) == []


def test_a_second_thread_is_cloned_from_the_mirror(root: Path, origin: Origin) -> None:
    prepare(root, "s1", origin.url, None)
    mirror = mirror_of(root)
    held = objects(mirror)
    prepare(root, "s2", origin.url, None)
    assert objects(mirror) == held  # nothing new upstream: nothing fetched
    head = origin.commit("CHANGES", "one more\n")
    third = prepare(root, "s3", origin.url, None)
    assert objects(mirror) == held + 3  # the new commit, its tree and its blob: not the repository again
    assert git("--git-dir", str(third.path / ".git"), "rev-parse", "HEAD").strip() == head
    # With the repository unreachable, a thread still gets the mirror's copy, and is told so.
    origin.bare.rename(origin.bare.with_name("moved.git"))
    fourth = prepare(root, "s4", origin.url, None)
    assert fourth.fresh and (fourth.path / "CHANGES").read_text() == "one more\n"
    assert fourth.note is not None and fourth.note.startswith(f"Could not update {origin.url} (fatal: ")
    assert "so this workspace is a checkout of the copy fetched at " in fourth.note


def test_concurrent_prepares_of_one_repository_share_one_mirror(root: Path, origin: Origin) -> None:
    sessions = [f"s{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        threads = list(pool.map(lambda s: prepare(root, s, origin.url, None), sessions))
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(3, mp_context=spawn) as pool:
        others = [f"p{i}" for i in range(3)]
        processes = list(pool.map(prepare, [root] * 3, others, [origin.url] * 3, [None] * 3))
    assert all(w.fresh and (w.path / "README").exists() for w in threads + processes)
    assert len(list((root / MIRRORS).glob("*.git"))) == 1
    assert list((root / STAGING).iterdir()) == []


def test_touch_marks_the_workspace_used(root: Path) -> None:
    ws = prepare(root, "s1", None, None)
    meta = root / ".meta" / "s1.json"
    os.utime(meta, (1000, 1000))
    touch(root, "s1")
    assert meta.stat().st_mtime > time.time() - 60
    assert ws.path.is_dir()


@pytest.mark.parametrize(
    "session", ["..", "../escape", "/etc", "a/b", ".meta", ".mirrors", "-rf", "", "a\x00b", "a b", "x" * 200]
)
def test_a_hostile_session_id_is_refused(root: Path, session: str) -> None:
    with pytest.raises(ValueError, match="not a session id"):
        prepare(root, session, None, None)
    with pytest.raises(ValueError, match="not a session id"):
        touch(root, session)
    assert not root.exists() or all(p.name.startswith(".") for p in root.iterdir())


# --- failing, in words the thread can read ------------------------------------------------------------------------


def test_a_failing_clone_says_why_in_gits_words_with_credentials_masked(root: Path) -> None:
    url = "https://ghp_tokenuser@127.0.0.1:1/team/repo.git"
    with pytest.raises(WorkspaceError) as failed:
        prepare(
            root,
            "s1",
            url.replace("ghp_tokenuser", "bot:s3cr3t-password"),
            "dev",
            credentials=Credentials("u", "tok-98765"),
        )
    text = failed.value.text
    assert text.startswith(
        "Could not prepare this thread's workspace from https://127.0.0.1:1/team/repo.git (branch dev): fatal: "
    )
    assert "Failed to connect to 127.0.0.1 port 1" in text
    assert "s3cr3t" not in text and "tok-98765" not in text and "\n" not in text
    with pytest.raises(WorkspaceError) as failed:
        prepare(root, "s1", url, None)
    assert "ghp_tokenuser" not in failed.value.text
    assert not (root / "s1").exists() and list((root / STAGING).iterdir()) == []


def test_a_missing_branch_is_named(root: Path, origin: Origin) -> None:
    with pytest.raises(WorkspaceError) as failed:
        prepare(root, "s1", origin.url, "nope")
    assert failed.value.text == (
        f"Could not prepare this thread's workspace from {origin.url} (branch nope): "
        "fatal: Remote branch nope not found in upstream origin"
    )


def test_public_url_drops_the_user_part() -> None:
    assert public_url("https://bot:pw@git.example/team/repo.git") == "https://git.example/team/repo.git"
    assert public_url("https://ghp_x@github.com/team/repo") == "https://github.com/team/repo"
    assert public_url("/srv/git/repo.git") == "/srv/git/repo.git"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, mounted for the test (root only). Skipped where it cannot be had (a laptop's `make test` as
    a user); CI runs as root with mount allowed (MM_TEST_REQUIRE_SYSTEM), so there a skip is a failure."""

    def cannot(reason: str) -> None:
        if os.environ.get(REQUIRE_SYSTEM):
            pytest.fail(f"{reason} ({REQUIRE_SYSTEM} is set: CI must run this test)")
        pytest.skip(reason)

    if not ROOT:
        cannot("mounting a small tmpfs to fill needs root")
    top = Path(tempfile.mkdtemp(prefix="mm-small-disk-"))
    os.chmod(top, 0o711)  # the sandbox's user must reach the workspaces below it
    mount = top / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0711", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        cannot(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="only a root worker hands workspaces to another user")
def test_a_workspaces_directory_the_sandboxs_user_cannot_reach_is_refused_in_words(tmp_path: Path) -> None:
    # pytest's tmp_path is root's alone (mode 700): a command run as uid 10001 could not open its own files.
    with pytest.raises(WorkspaceError) as refused:
        prepare(tmp_path / "workspaces", "s1", None, None)
    assert "cannot be reached by the unprivileged user that runs the commands (uid 10001)" in refused.value.text
    assert "chmod o+x" in refused.value.text


def test_a_full_disk_is_named_as_such(small_disk: Path, tmp_path: Path) -> None:
    # 700 KB that do not compress: the mirror fits in 1 MiB, the mirror and a checkout do not.
    origin = Origin(tmp_path / "team", payload=os.urandom(700_000))
    with pytest.raises(WorkspaceError) as failed:
        prepare(small_disk / "workspaces", "s1", origin.url, None)
    text = failed.value.text
    assert text.startswith("Could not prepare this thread's workspace: the disk that holds the workspaces is full (")
    assert "No space left on device" in text and "workspaces.maxTotalMB" in text
    assert not (small_disk / "workspaces" / "s1").exists()


# --- sweeping -----------------------------------------------------------------------------------------------------


def used(root: Path, session: str, when: float) -> None:
    os.utime(root / ".meta" / f"{session}.json", (when, when))


def test_sweep_removes_what_is_older_than_max_age_but_not_sessions_in_use(root: Path, origin: Origin) -> None:
    now = time.time()
    for session in ("old", "recent", "busy"):
        prepare(root, session, origin.url, None)
    used(root, "old", now - 20 * DAY)
    used(root, "busy", now - 20 * DAY)
    (root / "lost+found").mkdir()  # a volume's own directory: never a workspace
    removed = sweep(root, max_age_days=14, max_total_mb=None, protected={"busy"}, now=now)
    assert removed == [root / "old"]
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["busy", "lost+found", "recent"]
    assert not (root / ".meta" / "old.json").exists()
    # A mirror nobody prepared from for as long goes too; the next prepare makes it again.
    mirror = mirror_of(root)
    os.utime(mirror.with_suffix(".lock"), (now - 20 * DAY, now - 20 * DAY))
    assert sweep(root, max_age_days=14, max_total_mb=None, protected={"busy"}, now=now) == [mirror]
    assert prepare(root, "later", origin.url, None).fresh and mirror.is_dir()


def test_sweep_keeps_the_total_under_max_total_mb_least_recently_used_first(root: Path) -> None:
    now = time.time()
    for age, session in enumerate(("c", "b", "a"), start=1):  # a: used longest ago
        ws = prepare(root, session, None, None)
        (ws.path / "data").write_bytes(os.urandom(3 * 1024 * 1024))
        used(root, session, now - age * 3600)
    # 9 MiB held, 7 allowed: "a" is in use, so "b", the next least recently used, goes, and that is enough.
    assert sweep(root, max_age_days=14, max_total_mb=7, protected={"a"}, now=now) == [root / "b"]
    assert sweep(root, max_age_days=14, max_total_mb=7, protected={"a"}, now=now) == []
    # When only what is in use is left, it stays, over the total or not.
    assert sweep(root, max_age_days=14, max_total_mb=1, protected={"a", "c"}, now=now) == []


def test_sweep_adopts_an_unknown_workspace_and_clears_old_builds(root: Path) -> None:
    prepare(root, "known", None, None)
    stray = root / "unknown"
    stray.mkdir()
    os.utime(stray, (1000, 1000))  # its own mtime is the model's to set: not a sign of age
    leftover = root / STAGING / "s9-crashed"
    leftover.mkdir()
    os.utime(leftover, (1000, 1000))
    assert sweep(root, max_age_days=1, max_total_mb=None, protected=set()) == []
    assert stray.is_dir() and (root / ".meta" / "unknown.json").exists()
    assert not leftover.exists()


def test_sweep_of_a_missing_root_is_nothing(tmp_path: Path) -> None:
    assert sweep(tmp_path / "none", max_age_days=1, max_total_mb=1, protected=set()) == []


# --- the bash tool's walk after a command -------------------------------------------------------------------------


def test_the_walk_is_needed_for_a_size_limit_or_a_root_owned_workspace(root: Path, tmp_path: Path) -> None:
    mm_owned = prepare(root, "s1", None, None).path
    assert walk_needed(mm_owned, 2048) and walk_needed(tmp_path, 2048)
    assert not walk_needed(mm_owned, None)
    # A root worker's root-owned workspace: the sandbox's files are root's outside it.
    assert walk_needed(tmp_path, None) is ROOT


def _run_bash(workspace: Path, monkeypatch: pytest.MonkeyPatch, **config: object) -> tuple[str, int]:
    """One command that makes a setuid file; returns its output and how many walks followed it."""
    walks = []
    real = bash_module.measure_workspace

    def counted(top: str, budget: float = 2.0) -> Usage:
        walks.append(top)
        return real(top, budget)

    monkeypatch.setattr(bash_module, "measure_workspace", counted)
    ctx = make_ctx(workspace, **config)

    async def run() -> str:
        try:
            return await BashTool().run({"command": "cp /usr/bin/id made; chmod u+s made; echo done"}, ctx)
        finally:
            await ctx.resources.aclose()

    return asyncio.run(run()), len(walks)


@as_root
def test_an_mm_owned_workspace_is_not_walked_without_a_size_limit(root: Path, monkeypatch) -> None:
    ws = prepare(root, "s1", None, None).path
    out, walks = _run_bash(ws, monkeypatch, sandbox="none", bash={"limits": {"workspaceMB": None}})
    assert (out, walks) == ("done\n", 0)
    made = os.stat(ws / "made")
    # Left as made: it is mm's, and grants nothing beyond what the command already was.
    assert made.st_uid == SANDBOX_UID and made.st_mode & stat.S_ISUID
    out, walks = _run_bash(ws, monkeypatch, sandbox="none", bash={"limits": {"workspaceMB": 2048}})
    assert (out, walks) == ("done\n", 1)
    assert not os.stat(ws / "made").st_mode & stat.S_ISUID


@as_root
@needs_bwrap
def test_a_root_owned_workspace_is_walked_and_its_setuid_bits_cleared(tmp_path: Path, monkeypatch) -> None:
    out, walks = _run_bash(tmp_path, monkeypatch, sandbox="bwrap", bash={"limits": {"workspaceMB": None}})
    assert (out, walks) == ("done\n", 1)
    made = os.stat(tmp_path / "made")
    assert made.st_uid == 0 and not made.st_mode & stat.S_ISUID
