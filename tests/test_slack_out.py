"""Every write to Slack leaves through slackio/slack_out.py: the source of every package is read, and any Web API
write, bolt `respond` / `say`, webhook or raw API call made elsewhere fails this test, naming the place.

What counts as a write is read off slack_sdk itself: every method of its Web API client but a short list of
reads. A write is caught however it is reached: called, kept in a variable, handed to `functools.partial`, or
named in a string to `getattr`.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path

from slack_sdk.web.async_client import AsyncWebClient

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "workers", "slackio", "commands", "chatops", "mm_core", "playground", "migrations")
GATEWAY = Path("slackio/slack_out.py")
# The emulator is Slack's side: it answers the Web API, it does not call it.
NOT_CLIENTS = {Path("playground/slack_api.py")}
# A client's own override that every call passes through unchanged (slackio.slack_client.TeamClient sets the
# workspace's token, then calls slack_sdk's api_call): not a write of its own.
PASS_THROUGH = {(Path("slackio/slack_client.py"), "api_call")}
# What the service reads from Slack (nobody reads what they return but the service).
READS = {
    "auth_test",
    "apps_connections_open",
    "chat_getPermalink",
    "conversations_replies",
    "conversations_history",
    "conversations_info",
    "usergroups_users_list",
    "users_info",
}
CLIENT_METHODS = {
    name
    for name, member in inspect.getmembers(AsyncWebClient, inspect.isfunction)
    if not name.startswith("_") and ("_" in name or name == "api_call")
}
WRITES = CLIENT_METHODS - READS
# Bolt's listener arguments that post (an answer through a response_url, a message, an assistant's status, title or
# prompts): bolt hands them over by parameter name, whatever the annotation.
BOLT_WRITERS = {"respond", "say", "set_status", "set_suggested_prompts", "set_title"}
BOLT_TYPES = re.compile(r"\b(Async)?(Respond|Say|SetStatus|SetSuggestedPrompts|SetTitle)\b")
# Clients that post outside the Web API client (an incoming webhook, a response_url).
OTHER_CLIENTS = re.compile(r"^(Async)?(WebhookClient|Respond|Say)$")


def _bypasses(path: Path, listeners: bool = True) -> list[tuple[int, str]]:
    """The Slack writes in `path`; `listeners`: it holds bolt listeners, whose arguments bolt hands over by name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in WRITES:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and OTHER_CLIENTS.match(node.id):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.ImportFrom) and any(OTHER_CLIENTS.match(a.name) for a in node.names):
            found.append((node.lineno, f"import of {', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            named = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            # A name built at run time could be any method of a client.
            on_client = bool(node.args) and re.search(r"client|slack", ast.unparse(node.args[0]), re.IGNORECASE)
            if any(n in WRITES for n in named) or (not named and on_client):
                found.append((node.lineno, f"getattr({', '.join(map(str, named)) or '…'})"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for a in arguments:
                annotated = a.annotation is not None and BOLT_TYPES.search(ast.unparse(a.annotation))
                if (listeners and a.arg in BOLT_WRITERS) or annotated:
                    found.append((node.lineno, f"a listener taking {a.arg}"))
    return sorted(set(found))


def test_every_write_to_slack_goes_through_the_gateway() -> None:
    bypasses = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative in (GATEWAY, *NOT_CLIENTS):
                continue
            found = _bypasses(path, listeners=package == "bot")
            bypasses += [f"{relative}:{line} {what}" for line, what in found if (relative, what) not in PASS_THROUGH]
    assert not bypasses, "Slack writes outside slackio/slack_out.py:\n" + "\n".join(bypasses)


def test_what_counts_as_a_write_comes_from_slack_sdk() -> None:
    assert {"chat_postMessage", "chat_update", "views_publish", "files_upload_v2", "api_call"} <= WRITES
    assert {"usergroups_update", "reactions_add", "chat_postEphemeral", "assistant_threads_setStatus"} <= WRITES
    assert READS <= CLIENT_METHODS  # a read that slack_sdk renamed would otherwise be a silent hole


def test_the_check_sees_every_way_around_it(tmp_path: Path) -> None:
    sample = tmp_path / "bypass.py"
    sample.write_text(
        "import functools\n"
        "from slack_sdk.webhook.async_client import AsyncWebhookClient\n"
        "async def f(client, out, say, respond):\n"
        "    await client.chat_postMessage(channel='C', text='<!channel>')\n"
        "    post = client.chat_update\n"
        "    later = functools.partial(client.usergroups_update, usergroup='S1')\n"
        "    await getattr(client, 'chat_' + 'postEphemeral')()\n"
        "    await client.api_call('chat.update', json={})\n"
        "    await client.chat_getPermalink(channel='C', message_ts='1')\n"
        "    await out.post('C', 'fine')\n"
    )
    found = [what for _line, what in _bypasses(sample)]
    assert found == [
        "import of AsyncWebhookClient",
        "a listener taking respond",
        "a listener taking say",
        "chat_postMessage",
        "chat_update",
        "usergroups_update",
        "getattr(…)",
        "api_call",
    ], found


def test_the_gateway_asks_a_function_of_secrets_at_each_write() -> None:
    # The bot hands its LiveSecrets (a function: the config as it stands) to every text it says, the ack's own
    # "could not take" sentence included; taken for a list of secrets, that sentence raised and the ack was a 500.
    from slackio.slack_out import outgoing

    known = ["hunter2-old"]
    said = outgoing({"text": "the key hunter2-new and hunter2-old"}, lambda: known)
    assert said["text"] == "the key hunter2-new and ***"
    known.append("hunter2-new")  # a reload brings a new secret: the next write hides it too
    assert outgoing({"text": "the key hunter2-new"}, lambda: known)["text"] == "the key ***"


def test_a_failed_call_is_recorded_under_the_method_slack_answered_for(slack) -> None:
    """`slack:<method>` everywhere (slackio.slack_client.failed_where): the method of Slack's own answer when the
    error carries one, else the caller's name for what it did."""
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    from slackio.slack_client import failed_where

    async def refused() -> SlackApiError:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.url)
        try:
            await client.conversations_replies(channel="C0NOWHERE", ts="1.2")
        except SlackApiError as e:
            return e
        raise AssertionError("the emulator answered a channel it does not know")

    error = asyncio.run(refused())
    assert failed_where(error, "files_upload_v2") == "slack:conversations.replies"
    assert failed_where(ConnectionResetError("gone"), "chat.postMessage") == "slack:chat.postMessage"
