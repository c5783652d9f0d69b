"""Every write to Slack leaves through workers/slack_out.py: the source of every package is read, and any Web API
write, bolt `respond` / `say`, or raw API call made elsewhere fails this test, naming the place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "workers", "commands", "chatops", "mm_core", "playground", "migrations")
GATEWAY = Path("workers/slack_out.py")
# The emulator is Slack's side: it answers the Web API, it does not call it.
NOT_CLIENTS = {Path("playground/slack_api.py")}
# slack_sdk's method names that write what people read (the snake_case of chat.postMessage and its kin).
WRITES = re.compile(
    r"^(chat_(?!getPermalink)|views_|files_upload|files_completeUploadExternal|assistant_threads_set|reactions_add"
    r"|pins_add|bookmarks_|canvases_|conversations_(setTopic|setPurpose|rename|create|invite)|dialog_open|api_call$"
    r"|users_profile_set)"
)
# Bolt's listener arguments that post (an answer through a response_url, a message, an assistant's status, title or
# prompts), by their annotations.
BOLT_WRITERS = re.compile(r"\b(Async)?(Respond|Say|SetStatus|SetSuggestedPrompts|SetTitle)\b")


def _calls(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
        writers = {a.arg for a in arguments if a.annotation and BOLT_WRITERS.search(ast.unparse(a.annotation))}
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in writers:
                found.append((node.lineno, node.func.id))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and WRITES.match(node.func.attr):
            found.append((node.lineno, node.func.attr))
    return sorted(set(found))


def test_every_write_to_slack_goes_through_the_gateway() -> None:
    bypasses = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative in (GATEWAY, *NOT_CLIENTS):
                continue
            bypasses += [f"{relative}:{line} calls {name}" for line, name in _calls(path)]
    assert not bypasses, "Slack writes outside workers/slack_out.py:\n" + "\n".join(bypasses)


def test_the_check_sees_a_bypass(tmp_path: Path) -> None:
    sample = tmp_path / "bypass.py"
    sample.write_text(
        "async def f(client, respond: AsyncRespond, say, out):\n"
        "    await client.chat_postMessage(channel='C', text='<!channel>')\n"
        "    await client.api_call('chat.update', json={})\n"
        "    await respond(text='x')\n"
        "    await client.chat_getPermalink(channel='C', message_ts='1')\n"
        "    await out.post('C', 'fine')\n"
        "    say('a terminal line')\n"
    )
    assert [name for _line, name in _calls(sample)] == ["chat_postMessage", "api_call", "respond"]
