"""The worker never follows a link the model made (issue 21): its git on a workspace, sanitising, the setuid walk
and removing a workspace, on real git, bubblewrap and file systems.

The model, in its sandbox, can leave a symlink wherever git will later write, read or unlink: `.git/logs/HEAD`
to a shell start-up file (git appends a line that carries the previous branch name, which the model chose), to
the shared mirror's config; `.git/logs/refs`, `.git/refs/heads/<x>` and `.git/objects/<xx>` to directories
outside; `.git/objects/info` to the mirror's or to a directory holding an `alternates` file; `.git/packed-refs`
to a file holding a secret. Then the worker sanitises the workspace, an approver pushes the thread's changes and
a job run ends with its summary and push: none of them may write outside the workspace or touch the mirror
(bytes and mtimes compared), nor show or push the secret; each pushes the right commit where the repository is
otherwise usable, or fails with git's own words. The worker's side runs in a child process (tests/worker_child.py)
as a root worker does (the workspace its sandbox user's) and as the chart's uid-10001 worker does (everything
under the workspaces root its own, like the sandbox's user: only the sandbox keeps a thread in its workspace).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_core.config import AgentConfig
from mm_core.tools.sandbox import SANDBOX_UID
from mm_testkit.fixtures_kit import needs_bwrap, path_without
from threads_support import git
from workers.git import GitError
from workers.push import push_workspace
from workers.workspaces import hand_over, prepare, start_commit

CHILD = Path(__file__).with_name("worker_child.py")
SECRET = "TOPSECRET-4f1c9a77"
# The previous branch's name, which git writes into the reflog line it appends to logs/HEAD.
PREVIOUS = "prev-$(id>pwned)"
BRANCH = "mm/pushed"

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs a root worker and a uid-10001 one (CI runs as root)"),
]


def snapshot(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under `top` (and `top`): its type, mode, owner, size, mtime and content (a link's target)."""
    found = {}
    for path in [top, *(Path(d, n) for d, dirs, files in os.walk(top) for n in [*dirs, *files])]:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            content: str | None = os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            content = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            content = None
        found[str(path.relative_to(top))] = (
            stat.S_IFMT(st.st_mode),
            stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_size,
            st.st_mtime_ns,
            content,
        )
    return found


def python_for(uid: int) -> tuple[str, dict[str, str]]:
    """An interpreter `uid` can run with the code under test and this project's packages, and the environment it
    needs: the test's own, or, where that one lies out of the user's reach (a root's pyenv), the system's of the
    same version given the virtualenv's packages."""
    here = str(Path(__file__).parents[1])  # the checkout these tests belong to, before any installed copy
    try:
        subprocess.run(
            [sys.executable, "-c", ""], user=uid, group=uid, extra_groups=[], capture_output=True, check=True
        )
        return sys.executable, {"PYTHONPATH": here}
    except (PermissionError, subprocess.CalledProcessError):
        system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
        return system, {"PYTHONPATH": ":".join([here, *site.getsitepackages()])}


def chown_all(top: Path, uid: int) -> None:
    for path in [top, *top.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)


class World:
    """A workspaces root with one thread's workspace (its repository's mirror beside it), the repository pushed
    to, and a directory `outside` that stands for everything else on the worker: a shell start-up file, a
    secret, directories. With `worker` 10001 everything is that uid's, as on the chart's worker."""

    def __init__(self, top: Path, worker: int):
        self.top, self.worker = top, worker
        self.outside = top / "outside"
        self.outside.mkdir()
        (self.outside / ".bashrc").write_text("# the worker's shell start-up file\n")
        (self.outside / "secret").write_text(f"{SECRET}\n")
        (self.outside / "secret").chmod(0o600)
        for name in ("logs", "refs", "info", *(f"objects/{n:02x}" for n in range(256))):
            (self.outside / name).mkdir(parents=True)
        (self.outside / "info" / "alternates").write_text(f"{self.outside / 'objects'}\n")
        seed = top / "seed"
        seed.mkdir()
        git("init", "-q", "-b", "main", cwd=seed)
        (seed / "README.md").write_text("a repository\n")
        git("add", ".", cwd=seed)
        git("commit", "-q", "-m", "start", cwd=seed)
        self.target = top / "target.git"
        git("clone", "-q", "--bare", str(seed), str(self.target))
        self.root = top / "workspaces"
        self.session = uuid.uuid4().hex
        self.ws = prepare(self.root, self.session, str(self.target), "main").path
        self.start = start_commit(self.root, self.session)
        (self.mirror,) = (self.root / ".mirrors").glob("*.git")
        self.git = self.ws / ".git"
        # What the model did in its sandbox: a change, a new file, and a branch whose name is a command.
        git("checkout", "-q", "-b", PREVIOUS, cwd=self.ws)  # as its owner
        (self.ws / "README.md").write_text("changed by the model\n")
        (self.ws / "new.txt").write_text("new\n")
        for name in ("db", "home"):
            (top / name).mkdir()
        if worker != 0:
            for path in (self.root, self.outside, self.target, top / "db", top / "home"):
                chown_all(path, worker)
        else:
            chown_all(top / "db", 0)

    def give_to_model(self) -> None:
        """What the model made in its workspace is the workspace owner's."""
        hand_over(self.ws)
        chown_all(self.ws, SANDBOX_UID)

    @contextlib.contextmanager
    def worker_process(self) -> Iterator[Callable[..., dict[str, Any]]]:
        python, env = python_for(self.worker)
        proc = subprocess.Popen(
            [python, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=self.top / "home",
            env={"PATH": os.environ["PATH"], "HOME": str(self.top / "home"), "PYTHONDONTWRITEBYTECODE": "1", **env},
            user=self.worker,
            group=self.worker,
            extra_groups=[],
        )
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None

        def ask(**request: Any) -> dict[str, Any]:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
            line = stdout.readline()
            assert line, f"the worker's process ended (exit {proc.wait()})"
            return json.loads(line)

        try:
            yield ask
        finally:
            stdin.close()
            proc.wait(timeout=60)

    def pushed(self) -> str:
        """Everything the repository pushed to holds: its refs and every commit's message and patch."""
        refs = git("--git-dir", str(self.target), "for-each-ref")
        return refs + git("--git-dir", str(self.target), "log", "--all", "-p", "--format=%H %an %s%n%b")


@pytest.fixture
def top() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="mm-git-links-"))
    top.chmod(0o711)  # the sandbox's user reaches its workspace through it
    yield top
    shutil.rmtree(top)


# --- the links: each makes the workspace's .git as the model can leave it ------------------------------------------


def logs_head_to_a_shell_start_up_file(w: World) -> None:
    (w.git / "logs" / "HEAD").unlink()
    (w.git / "logs" / "HEAD").symlink_to(w.outside / ".bashrc")


def logs_head_to_the_mirror_s_config(w: World) -> None:
    (w.git / "logs" / "HEAD").unlink()
    (w.git / "logs" / "HEAD").symlink_to(w.mirror / "config")


def logs_refs_to_a_directory(w: World) -> None:
    shutil.rmtree(w.git / "logs" / "refs")
    (w.git / "logs" / "refs").symlink_to(w.outside / "logs")


def a_branch_directory_to_a_directory(w: World) -> None:
    (w.git / "refs" / "heads" / "mm").symlink_to(w.outside / "refs")  # the pushed branches are mm/…


def object_directories_to_directories(w: World) -> None:
    for n in range(256):
        name = f"{n:02x}"
        if not (w.git / "objects" / name).exists():  # where the objects of the model's changes will go
            (w.git / "objects" / name).symlink_to(w.outside / "objects" / name)


def objects_info_to_the_mirror_s(w: World) -> None:
    shutil.rmtree(w.git / "objects" / "info")
    (w.git / "objects" / "info").symlink_to(w.mirror / "objects" / "info")


def objects_info_to_a_directory_with_alternates(w: World) -> None:
    shutil.rmtree(w.git / "objects" / "info")
    (w.git / "objects" / "info").symlink_to(w.outside / "info")


def packed_refs_to_a_secret(w: World) -> None:
    (w.git / "packed-refs").unlink()
    (w.git / "packed-refs").symlink_to(w.outside / "secret")


# The link, and whether the repository stays usable in the model's own view (then a push must succeed).
LINKS: dict[str, tuple[Callable[[World], None], bool]] = {
    "logs/HEAD to a shell start-up file": (logs_head_to_a_shell_start_up_file, True),
    "logs/HEAD to the mirror's config": (logs_head_to_the_mirror_s_config, True),
    "logs/refs to a directory": (logs_refs_to_a_directory, True),
    "refs/heads/mm to a directory": (a_branch_directory_to_a_directory, False),
    "objects/<xx> to directories": (object_directories_to_directories, False),
    "objects/info to the mirror's": (objects_info_to_the_mirror_s, True),
    "objects/info to a directory with alternates": (objects_info_to_a_directory_with_alternates, True),
    "packed-refs to a secret": (packed_refs_to_a_secret, True),
}
WORKERS = {
    "root worker, sandboxed": (0, "auto"),
    "root worker, sandbox none": (0, "none"),
    "uid-10001 worker, sandboxed": (10001, "auto"),
}


@pytest.mark.parametrize("worker", WORKERS)
@pytest.mark.parametrize("link", LINKS)
def test_sanitising_a_push_and_a_job_s_push_follow_no_link_in_git(top: Path, link: str, worker: str) -> None:
    uid, sandbox = WORKERS[worker]
    make_link, usable = LINKS[link]
    w = World(top, uid)
    make_link(w)
    w.give_to_model()
    outside, mirrors = snapshot(w.outside), snapshot(w.root / ".mirrors")

    def unchanged(after: str) -> None:
        assert snapshot(w.outside) == outside, f"{after} wrote outside the workspace"
        assert snapshot(w.root / ".mirrors") == mirrors, f"{after} touched the mirror"

    ws = str(w.ws)
    with w.worker_process() as ask:
        sanitized = ask(op="sanitize", workspace=ws)
        unchanged("sanitising")
        pushed = ask(op="push", workspace=ws, sandbox=sandbox, remote=str(w.target), branch=BRANCH, start=w.start)
        unchanged("a push")
        job = ask(op="job", workspace=ws, sandbox=sandbox, remote=str(w.target), db=str(top / "db"))
        unchanged("a job's summary and push")

    said = json.dumps([sanitized, pushed, job])
    assert SECRET not in said and SECRET not in w.pushed()
    assert not (top / "home" / "pwned").exists() and not list(w.root.glob("**/pwned"))
    assert list((w.root / ".staging").iterdir()) == []
    summary = "\n".join(job["said"])
    if "commit" in pushed:
        # The right commit: the model's changes on the commit the workspace started from, on both branches.
        commit = pushed["commit"]
        assert git("--git-dir", str(w.target), "rev-parse", BRANCH, "mm/job-1").split() == [commit, commit]
        assert git("--git-dir", str(w.target), "show", f"{commit}:README.md") == "changed by the model\n"
        assert git("--git-dir", str(w.target), "show", f"{commit}:new.txt") == "new\n"
        assert git("--git-dir", str(w.target), "rev-parse", f"{commit}^").strip() == w.start
        assert "succeeded" in summary and "Pushed `mm/job-1`" in summary
    else:
        assert pushed["error"].startswith("[git: "), pushed
        assert "the push of `mm/job-1` failed: [git: " in summary, summary
        assert git("--git-dir", str(w.target), "for-each-ref", "refs/heads/mm") == ""
    if sandbox != "none":  # in the model's own view the repository is exactly as usable as the link leaves it
        assert ("commit" in pushed) == usable, pushed


def test_the_workspace_s_git_never_runs_as_root_nor_without_the_sandbox_the_session_requires(
    top: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(top, 0)
    w.give_to_model()
    monkeypatch.setenv("PATH", path_without("bwrap", top / "bin"))
    with pytest.raises(GitError, match=r"^\[git: cannot run git .*: the configuration requires the bwrap sandbox"):
        push_workspace(w.ws, AgentConfig(sandbox="bwrap"), str(w.target), BRANCH, "m", None, start=w.start)
    # Without bubblewrap (`auto`), as the workspace's owner: every file git made is the owner's, as the model's.
    pushed = push_workspace(w.ws, AgentConfig(sandbox="auto"), str(w.target), BRANCH, "m", None, start=w.start)
    assert git("--git-dir", str(w.target), "rev-parse", BRANCH).strip() == pushed.commit
    assert {os.lstat(p).st_uid for p in [w.ws, *w.ws.rglob("*")]} == {SANDBOX_UID}
    # A workspace root owns: git would be root on the worker, so it does not run.
    chown_all(w.ws, 0)
    (w.ws / "more.txt").write_text("more\n")
    with pytest.raises(GitError, match=r"this worker runs as root and the workspace .* belongs to root"):
        push_workspace(w.ws, AgentConfig(sandbox="none"), str(w.target), "mm/more", "m", None, start=w.start)
    assert git("--git-dir", str(w.target), "for-each-ref", "refs/heads/mm/more") == ""


# --- the setuid walk and the removal of a workspace -----------------------------------------------------------------

# The swap a command's background job could make while the worker walks: run in a child process, from an audit
# hook at the moment the walk starts listing one of two directories (it has listed both names already), so the
# other one is a symlink by the time the walk gets to it. The walk itself is the real one.
SWAP = textwrap.dedent(
    """
    import json, os, shutil, sys
    from mm_core.tools.sandbox import measure_workspace

    ws, outside = sys.argv[1], sys.argv[2]
    swapped = []

    def where(arg):
        return os.readlink(f"/proc/self/fd/{arg}") if isinstance(arg, int) else os.path.abspath(arg)

    def hook(event, args):
        if event == "os.scandir" and not swapped and args and args[0] is not None:
            listing = where(args[0])
            for a, b in (("a", "b"), ("b", "a")):
                if listing == os.path.join(ws, a):
                    swapped.append(b)
                    shutil.rmtree(os.path.join(ws, b))
                    os.symlink(outside, os.path.join(ws, b))

    sys.addaudithook(hook)
    usage = measure_workspace(ws)
    print(json.dumps({"bytes": usage.bytes, "cleared": usage.setuid_cleared, "swapped": swapped}))
    """
)


def test_a_directory_swapped_for_a_link_during_the_walk_is_not_entered(top: Path) -> None:
    ws, outside = top / "ws", top / "outside"
    for name in ("a", "b"):
        (ws / name).mkdir(parents=True)
        (ws / name / "small.txt").write_text("x\n")
    outside.mkdir()
    (outside / "big.bin").write_bytes(os.urandom(4 << 20))
    (outside / "root-door").write_bytes(b"#!/bin/sh\n")
    (outside / "root-door").chmod(0o4755)
    done = subprocess.run([sys.executable, "-c", SWAP, str(ws), str(outside)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    walked = json.loads(done.stdout)
    assert walked["swapped"]  # the walk met the link where a directory was
    assert stat.S_IMODE(os.stat(outside / "root-door").st_mode) == 0o4755  # its setuid bit is not the walk's
    assert walked["cleared"] == 0
    assert walked["bytes"] < 1 << 20  # the 4 MiB outside are not counted


# The same race for the removal of a workspace (a sweep): a command left a directory the worker may not write
# (so its first unlink there is refused and it must give the directory u+rwx), and a background job swaps that
# directory for a link to one outside just before the worker changes its mode. Run as the chart's worker (uid
# 10001, whose own directories the link can name), from an audit hook at the worker's first chmod.
SWEEP = textwrap.dedent(
    """
    import json, os, sys
    from workers.workspaces import sweep

    root, outside = sys.argv[1], sys.argv[2]
    swapped = []

    def hook(event, args):
        if event == "os.chmod" and not swapped:
            path = os.readlink(f"/proc/self/fd/{args[0]}") if isinstance(args[0], int) else args[0]
            if os.path.basename(path) == "locked" and not os.path.islink(path):
                swapped.append(path)
                os.rename(path, path + "-moved")
                os.symlink(outside, path)

    sys.addaudithook(hook)
    removed = sweep(root, max_age_days=0, max_total_mb=None, protected=set(), now=4102444800)
    print(json.dumps({"removed": [str(p) for p in removed], "swapped": swapped}))
    """
)


def test_removing_a_workspace_changes_nothing_through_a_link_swapped_in(top: Path) -> None:
    root, outside = top / "workspaces", top / "outside"
    (root / ".meta").mkdir(parents=True)
    for name in (".mirrors", ".staging"):
        (root / name).mkdir()
    locked = root / ("7" * 32) / "locked"
    locked.mkdir(parents=True)
    (locked / "file.txt").write_text("x\n")
    (root / ".meta" / f"{'7' * 32}.json").write_text("{}")
    outside.mkdir()
    (outside / "keep.txt").write_text("the worker's own\n")
    outside.chmod(0o555)
    chown_all(root, 10001)
    chown_all(outside, 10001)
    locked.chmod(0o500)  # no write: the worker must give it u+w to empty it
    python, env = python_for(10001)
    done = subprocess.run(
        [python, "-c", SWEEP, str(root), str(outside)],
        capture_output=True,
        text=True,
        user=10001,
        group=10001,
        extra_groups=[],
        cwd=top,
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1", **env},
    )
    assert done.returncode == 0, done.stderr
    swept = json.loads(done.stdout)
    assert swept["swapped"] and swept["removed"] == [str(root / ("7" * 32))]
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o555  # not given u+w through the link
    assert (outside / "keep.txt").read_text() == "the worker's own\n"
