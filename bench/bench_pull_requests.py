"""Figures for pull requests (not a test): what opening and keeping one costs beside the push it follows.

Against the forge emulator (playground/forge_server.py, GitHub's API over HTTPS, git's http-backend behind it),
side by side in one run, medians of N: a thread's push of one changed file to its branch (`push_workspace`, the
worker's git over HTTPS with the token), the record and the forge's update that follow it (`record_and_sync`:
the first opens the pull request, the others refresh its body), one look at its checks (`follow`: GitHub's pull
request, reviews, check runs and combined status), and `@mm pr`'s status read (`status_text`). The ratio says
how much a pull request adds to a push.

Run: .venv/bin/python bench/bench_pull_requests.py [runs, default 15]  (as root, as CI runs)
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench_git import median_ms

from chatops import db
from chatops import pull_requests as records
from chatops.config import load_config
from mm_core.config import AgentConfig
from playground.forge_server import ForgeServer
from workers.forges import forge_for
from workers.pull_requests import Delivered, follow, record_and_sync, status_text
from workers.push import credentials, push_workspace
from workers.workspaces import hand_over, prepare, start_commit

TOKEN = "bench-forge-token"
PATH = "acme/app"
BRANCH = "mm/thread-bench"


def main(runs: int) -> None:
    top = Path(tempfile.mkdtemp(prefix="mm-bench-pr-"))
    top.chmod(0o711)  # the sandbox's user reaches its workspace through it
    forge = ForgeServer("github", top / "forge", {TOKEN: None}).start()
    try:
        os.environ.update(forge.ca_env())
        clone = forge.add_repo(PATH, {f"d{d}/f{f}.txt": f"{d} {f}\n" for d in range(20) for f in range(50)})
        (top / "mm.yaml").write_text(
            f"channels:\n  default: {{repo: '{clone}'}}\nforges:\n  '{forge.host}': {{kind: github}}\n"
        )
        config = load_config(top / "mm.yaml", {"MM_GITHUB_TOKEN": TOKEN})
        url = f"sqlite:///{top / 'mm.sqlite3'}"
        db.migrate(url)
        engine = db.engine_for(url)
        agent = AgentConfig.model_validate({"sandbox": "none"})
        token = credentials(config, clone)
        root, session = top / "workspaces", "b" * 32
        ws = prepare(root, session, clone, "main", credentials=token).path
        start = start_commit(root, session)
        _forge, repo = forge_for(config, clone)
        commits: list[str] = []

        def push(i: int) -> None:
            (ws / "d9" / "f1.txt").write_text(f"run {i}\n")
            hand_over(ws)
            commits.append(push_workspace(ws, agent, clone, BRANCH, f"run {i}", token, start=start).commit)

        pushed, pushed_cpu = median_ms(runs, push)
        owner = records.thread_owner(session)

        def sync(i: int) -> None:
            delivered = Delivered(owner, None, repo, BRANCH, "main", commits[i], "Bench", f"body {i}", "U0BENCH")
            record_and_sync(engine, config, delivered)

        synced, synced_cpu = median_ms(runs, sync)
        record = records.current(engine, owner)
        assert record is not None and record.number is not None and len(forge.pulls(PATH)) == 1
        forge.set_checks(PATH, commits[-1], [("test", "pending"), ("lint", "success")])
        looked, looked_cpu = median_ms(runs, lambda _: follow(engine, config, record.id))
        status, status_cpu = median_ms(runs, lambda _: status_text(engine, config, session))
        print(
            f"push {pushed:.0f} ms ({pushed_cpu:.0f} ms CPU); record and sync {synced:.0f} ms "
            f"({synced_cpu:.0f} ms CPU), {synced / pushed:.2f} of a push; a look at the checks {looked:.0f} ms "
            f"({looked_cpu:.0f} ms CPU); "
            f"`pr` status {status:.0f} ms ({status_cpu:.0f} ms CPU); medians of {runs}, forge on loopback"
        )
        engine.dispose()
    finally:
        forge.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run as root: a root worker's workspace belongs to the sandbox's user")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
