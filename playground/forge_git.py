"""Git's side of the forge emulator: bare repositories, their branches, a pre-receive hook that refuses pushes to
protected branches in the forge's words, and git's smart HTTP protocol served by the real `git http-backend`
(run as a CGI program, as a forge's web server would).

Every git command here runs without the machine's or the user's configuration (GIT_CONFIG_NOSYSTEM, an empty
global config), so what a test sees does not depend on the machine it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger("mm.playground.forge.git")

PROTECTED_FILE = "mm-protected.json"  # in the bare repository: protected ref -> the lines the hook prints
# git's own defaults for a request's buffered body (http-backend refuses bigger unless told): generous, as forges.
MAX_REQUEST_BUFFER = str(100 * 1024 * 1024)
# The hook, run by receive-pack in the bare repository (its working directory). Its stderr reaches the pusher as
# `remote: ...` lines; a non-zero exit refuses the whole push, as the forges' pre-receive checks do.
PRE_RECEIVE = """#!{python}
import json, os, sys
rules = json.load(open({file!r})) if os.path.exists({file!r}) else {{}}
refused = False
for line in sys.stdin:
    old, new, ref = line.split()
    if ref in rules:
        print("\\n".join(rules[ref]), file=sys.stderr)
        refused = True
sys.exit(1 if refused else 0)
"""


def git_env(home: Path) -> dict[str, str]:
    """The environment of the emulator's own git commands: no system or global configuration, a fixed author."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "Forge Emulator",
        "GIT_AUTHOR_EMAIL": "forge@example.invalid",
        "GIT_COMMITTER_NAME": "Forge Emulator",
        "GIT_COMMITTER_EMAIL": "forge@example.invalid",
        "LC_ALL": "C",
    }


def _git(env: Mapping[str, str], *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], env=dict(env), cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def create_bare(git_dir: Path, files: Mapping[str, str], default_branch: str, env: Mapping[str, str]) -> str:
    """A bare repository at `git_dir` whose `default_branch` has one commit of `files`; returns its sha."""
    git_dir.parent.mkdir(parents=True, exist_ok=True)
    _git(env, "init", "--quiet", "--bare", f"--initial-branch={default_branch}", str(git_dir))
    with tempfile.TemporaryDirectory(prefix="mm-forge-seed-") as tmp:
        work = Path(tmp, "work")
        for name, text in files.items():
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        seed = dict(env) | {"GIT_INDEX_FILE": str(Path(tmp, "index")), "GIT_DIR": str(git_dir)}
        _git(seed, "--work-tree", str(work), "add", "--all")
        _git(seed, "--work-tree", str(work), "commit", "--quiet", "-m", "Initial commit")
    hook = git_dir / "hooks" / "pre-receive"
    hook.write_text(PRE_RECEIVE.format(python=sys.executable, file=PROTECTED_FILE))
    hook.chmod(0o755)
    return branches(git_dir, env)[default_branch]


def branches(git_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Branch name -> head sha, as the repository has them now (read with git, never cached: pushes move them)."""
    out = _git(env, "--git-dir", str(git_dir), "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/")
    refs = (line.split(" ", 1) for line in out.splitlines())
    return {ref.removeprefix("refs/heads/"): sha for sha, ref in refs}


def commit_exists(git_dir: Path, env: Mapping[str, str], rev: str) -> str | None:
    """The full sha `rev` names in the repository (a branch, a sha or its prefix), or None."""
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def commit_info(git_dir: Path, env: Mapping[str, str], sha: str) -> dict[str, Any]:
    """What the forges show of a commit: its subject, message, author, date and parents."""
    out = _git(env, "--git-dir", str(git_dir), "show", "-s", "--format=%s%x00%B%x00%an%x00%ae%x00%aI%x00%cI%x00%P", sha)
    subject, message, name, email, authored, committed, parents = out.rstrip("\n").split("\0")
    return {
        "subject": subject,
        "message": message,
        "author_name": name,
        "author_email": email,
        "authored": authored,
        "committed": committed,
        "parents": parents.split(),
    }


def set_protected(git_dir: Path, rules: Mapping[str, list[str]]) -> None:
    """What the pre-receive hook refuses: full ref name -> the lines it prints (atomically replaced)."""
    tmp = git_dir / f"{PROTECTED_FILE}.tmp"
    tmp.write_text(json.dumps(dict(rules)))
    tmp.replace(git_dir / PROTECTED_FILE)


async def http_backend(
    request: web.Request, root: Path, path_info: str, remote_user: str, env: Mapping[str, str]
) -> web.StreamResponse:
    """Answers one smart-HTTP request with `git http-backend` as a CGI: the request's body streamed to its stdin,
    its output's CGI headers (`Status:` and the rest) turned into the response's, its body streamed back."""
    cgi = dict(env) | {
        "GIT_PROJECT_ROOT": str(root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "GIT_HTTP_MAX_REQUEST_BUFFER": MAX_REQUEST_BUFFER,
        "REQUEST_METHOD": request.method,
        "PATH_INFO": path_info,
        "QUERY_STRING": request.query_string,
        "CONTENT_TYPE": request.headers.get("Content-Type", ""),
        "REMOTE_USER": remote_user,  # http-backend enables receive-pack only for an authenticated user
        "REMOTE_ADDR": request.remote or "127.0.0.1",
    }
    # Absent when git streams a big push chunked: http-backend then reads to the end of its stdin.
    if request.content_length is not None:
        cgi["CONTENT_LENGTH"] = str(request.content_length)
    for header, name in (("Content-Encoding", "HTTP_CONTENT_ENCODING"), ("Git-Protocol", "GIT_PROTOCOL")):
        if header in request.headers:
            cgi[name] = request.headers[header]
    proc = await asyncio.create_subprocess_exec(
        "git",
        "http-backend",
        env=cgi,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin, stderr = proc.stdin, proc.stderr

    async def feed() -> None:
        try:
            async for chunk in request.content.iter_chunked(1 << 16):
                stdin.write(chunk)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # http-backend answered without reading it all (an error): its answer says why
        finally:
            stdin.close()

    feeding = asyncio.create_task(feed())
    errors = asyncio.create_task(stderr.read())
    finished = False
    try:
        status, headers = 200, {}
        while (line := await proc.stdout.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            else:
                headers[name.strip()] = value.strip()
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        while chunk := await proc.stdout.read(1 << 16):
            await response.write(chunk)
        await response.write_eof()
        finished = True
        return response
    finally:
        if not finished and proc.returncode is None:
            proc.kill()  # the client hung up (or the server stops): the CGI has no one to answer
        await feeding
        with contextlib.suppress(ProcessLookupError):
            if proc.returncode is None:
                await asyncio.wait_for(proc.wait(), 30)
        if text := (await errors).decode(errors="replace").strip():
            log.info("git http-backend: %s", text)
