"""The worker's side of tests/test_git_links.py, in a process of its own: started as root (a root worker) or as
uid 10001 (the chart's worker, which shares its uid with the sandbox), it runs what the worker runs on a
workspace when asked, one JSON line in, one JSON line out:

    {"op": "sanitize", "workspace": W}
    {"op": "push", "workspace": W, "sandbox": S, "remote": R, "branch": B, "start": C}   an approver's Push branch
    {"op": "job", "workspace": W, "sandbox": S, "remote": R, "db": DIR}                  a job run's end: summary, push

Each answer holds what the worker would post or record (the texts), or the error's text.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from chatops import db
from chatops.config import load_config
from chatops.schema import JobRun, Session, SessionKind
from mm_core.config import AgentConfig
from workers import git
from workers.jobs import finish_run
from workers.push import NothingToPush, push_workspace


def sanitize(workspace: str) -> dict[str, Any]:
    try:
        return {"dropped": git.sanitize(Path(workspace))}
    except git.GitError as e:
        return {"error": e.text}


def push(workspace: str, sandbox: str, remote: str, branch: str, start: str) -> dict[str, Any]:
    try:
        pushed = push_workspace(
            Path(workspace),
            AgentConfig.model_validate({"sandbox": sandbox}),
            remote,
            branch,
            "pushed",
            None,
            start=start,
        )
    except git.GitError as e:
        return {"error": e.text}
    except NothingToPush:
        return {"error": "nothing to push"}
    return {"commit": pushed.commit, "files": pushed.files}


def job(workspace: str, sandbox: str, remote: str, directory: str) -> dict[str, Any]:
    """The end of a job run whose thread worked in `workspace`: its summary and push, as the worker posts them."""
    ws = Path(workspace)
    config_file = Path(directory) / "mm.yaml"
    config_file.write_text(
        f"sandbox: {sandbox}\n"
        "channels:\n"
        f"  C0LINKS: {{repo: '{remote}'}}\n"
        "jobs:\n"
        "  - {name: links, schedule: '0 3 * * *', channel: C0LINKS, prompt: tidy, push: {branch: 'mm/job-{run}'}}\n"
    )
    config = load_config(config_file, environ={"MM_WORKSPACES": str(ws.parent)})
    url = f"sqlite:///{Path(directory) / 'mm.sqlite3'}"
    db.migrate(url)
    engine = db.engine_for(url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(insert(Session).values(id=ws.name, kind=SessionKind.JOB))
        conn.execute(
            insert(JobRun).values(
                job_name="links", scheduled_for=now, started_at=now, status="running", session_id=ws.name
            )
        )
    said: list[str] = []

    async def post(text: str, in_channel: bool = False) -> None:
        said.append(text)

    asyncio.run(finish_run(engine, config, ws.name, None, None, ws, post, []))
    engine.dispose()
    return {"said": said}


def main() -> None:
    for line in sys.stdin:
        asked = json.loads(line)
        op = asked.pop("op")
        if op == "sanitize":
            answer = sanitize(**asked)
        elif op == "push":
            answer = push(**asked)
        else:
            answer = job(asked["workspace"], asked["sandbox"], asked["remote"], asked["db"])
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
