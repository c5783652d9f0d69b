"""Runs one agent action in a process of its own, so tests can resume in a new process or kill -9 one.

usage: agent_child.py STORE_DIR WORKSPACE MODEL_URL CONFIG_JSON ACTION [ARG]
ACTION: send TEXT | resume DECISIONS_JSON. Prints the turn's outcome and events as JSON lines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from mm_core import Agent, Decision
from mm_core.config import AgentConfig
from mm_core.log import FileStore


def main() -> None:
    store_dir, workspace, model_url, config_json, action = sys.argv[1:6]
    arg = sys.argv[6] if len(sys.argv) > 6 else ""
    data = json.loads(config_json)
    data["model"] = {"url": model_url, "name": "test-model"}
    config = AgentConfig.model_validate(data)

    def emit(event) -> None:
        print(json.dumps({"event": type(event).__name__, **dataclasses.asdict(event)}, default=str), flush=True)

    agent = Agent(config, FileStore(Path(store_dir)), "s1", Path(workspace), emit=emit)
    if action == "send":
        result = asyncio.run(agent.send(arg))
    else:
        result = asyncio.run(agent.resume([Decision(**d) for d in json.loads(arg or "[]")]))
    print(json.dumps({"outcome": result.outcome}), flush=True)


if __name__ == "__main__":
    main()
