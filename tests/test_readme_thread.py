"""The README's picture of a thread is what a yolo channel's thread shows: the scenario is played by real parts
(the worker, the scripted model, the emulator) and the thread, laid out as the README lays it out, must be the
README's block (token counts aside)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mm_testkit.redis_server import OwnRedis
from playground.model_server import Reply, ToolCall
from threads_support import CHANNEL, config, stack

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

README = Path(__file__).resolve().parent.parent / "README.md"
ASK = "@mm greet.py prints a typo, can you fix it?"
ANSWER = "The greeting said “wrold”; it now says “world”, and the script prints it."


def script(request: dict[str, Any]) -> Reply:
    tools = sum(1 for m in request["messages"] if m["role"] == "tool")
    steps = [
        Reply(tool_calls=[ToolCall("bash", {"command": "python3 greet.py"})]),
        Reply(tool_calls=[ToolCall("edit_file", {"path": "greet.py", "edits": [{"old": "wrold", "new": "world"}]})]),
        Reply(tool_calls=[ToolCall("bash", {"command": "python3 greet.py"})]),
        Reply(text=ANSWER),
    ]
    return steps[tools]


def as_readme(messages: list[dict[str, Any]]) -> str:
    """The thread laid out as the README shows it: who, then each line of what they posted; code blocks
    indented, the status line left out (it is removed at the end of the turn)."""
    lines = []
    for m in messages:
        who = "mm" if m.get("bot_id") else "alice"
        texts = []
        for block in m.get("blocks") or []:
            for element in [block.get("text") or {}, *block.get("elements", [])]:
                if isinstance(element, dict) and isinstance(element.get("text"), str):
                    texts.append(element["text"])
        body = "\n".join(texts) if texts else (m.get("text") or "")
        body = body.replace("<@U0BOT>", "@mm")
        first = True
        in_code = False
        for line in body.splitlines():
            if line.startswith("```"):
                in_code = not in_code
                continue
            shown = f"  {line}" if in_code else line
            lines.append(f"{who if first else '':<9}{shown}".rstrip())
            first = False
    return "\n".join(lines)


def readme_block() -> str:
    text = README.read_text()
    return re.search(r"## What a thread looks like.*?```\n(.*?)```", text, re.S).group(1).rstrip()  # type: ignore[union-attr]


@pytest.mark.timeout(180)
def test_the_readme_shows_a_yolo_channels_thread_as_it_is(tmp_path: Path, fresh_pg_url: str) -> None:
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "greet.py").write_text('print("hello, wrold")\n')
    for args in (["init", "-q", "-b", "main"], ["add", "greet.py"], ["commit", "-q", "-m", "greet"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=origin, check=True)
    redis = OwnRedis(tmp_path / "redis")
    redis.start()
    try:
        with stack(tmp_path, fresh_pg_url, redis.url, config=config(f"{{yolo: true, repo: {origin}}}")) as threads:
            threads.model.always(script)
            threads.start_worker()
            posted = threads.post(ASK.replace("@mm", "<@U0BOT>"))
            threads.wait(
                lambda: threads.turns_ended(posted.session_id) == 1 and threads.status(posted.session_id) == "idle"
            )
            threads.wait(lambda: threads.slack.calls_to("chat.delete"), message="the status removed")
            shown = as_readme(threads.slack.messages(CHANNEL, posted.thread_ts))
    finally:
        redis.stop()
    digits = re.compile(r"[\d,]+ tokens")
    assert digits.sub("N tokens", shown) == digits.sub("N tokens", readme_block()), shown
