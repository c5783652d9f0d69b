"""What the forge tests share: a config naming the emulator's repository as a forge of its kind, with its token
in the kind's variable, and a branch pushed to the emulator's repository as the worker's push would have."""

from __future__ import annotations

import subprocess
import textwrap
import uuid
from pathlib import Path

from chatops.config import Config, load_config
from playground.forge_server import ForgeServer

TOKEN = "tok-3f9c2e71a5"  # the emulator's token, nothing real
PATH = "acme/app"
TOKEN_ENVS = {"github": "MM_GITHUB_TOKEN", "gitlab": "MM_GITLAB_TOKEN", "gitea": "MM_GITEA_TOKEN"}


def config(tmp_path: Path, text: str, env: dict[str, str]) -> Config:
    path = tmp_path / "mm.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return load_config(path, env)


def configured(forge: ForgeServer, tmp_path: Path, token: str = TOKEN, extra: str = "") -> Config:
    """A config whose channel names the emulator's repository, with the emulator as a forge of its kind (its
    API where the kind's default puts it) and its token in the kind's variable."""
    text = f"""
        channels:
          default: {{repo: "{forge.base}/{PATH}.git"}}
        forges:
          "{forge.host}": {{kind: {forge.kind}{extra}}}
        """
    return config(tmp_path, text, {TOKEN_ENVS[forge.kind]: token})


def new_branch(forge: ForgeServer, branch: str, path: str = PATH) -> str:
    """A new commit on `branch` of the emulator's repository `path` (what the worker's push would have made, or a
    person's push), whatever the branch held."""
    git_dir, env = forge.repos[path].git_dir, {**forge.git_env, "GIT_AUTHOR_NAME": "mm", "GIT_AUTHOR_EMAIL": "mm@x"}
    env |= {"GIT_COMMITTER_NAME": "mm", "GIT_COMMITTER_EMAIL": "mm@x"}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(git_dir), *args], env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    sha = git("commit-tree", "main^{tree}", "-p", "main", "-m", f"work on {branch} ({uuid.uuid4()})")
    git("update-ref", f"refs/heads/{branch}", sha)
    return sha
