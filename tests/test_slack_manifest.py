"""bot/slack-app-manifest.yaml against the bolt app the bot really builds (bot.app.create_app).

The manifest must ask for exactly what the code uses: every event it subscribes to reaches a listener, and
every listener is reached by something it subscribes to; its bot scopes are exactly those of the events, the
slash command and the Web API methods the code calls (found in the source, so that a new call without its
scope fails here); App Home, interactivity and the slash command match the listeners. The listeners are
probed the way bolt itself routes a request: each listener's matchers, on a minimal request body.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from slack_bolt.async_app import AsyncApp, AsyncAssistant
from slack_bolt.listener.async_listener import AsyncListener
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "bot" / "slack-app-manifest.yaml"
# Where the code that talks to Slack lives (the bot, the workers, and what both import).
SOURCES = ("bot", "workers", "slackio", "chatops", "commands")

# Every Web API method the code calls (found in SOURCES by `source_calls`, or called by bolt for a listener),
# with the bot scopes it needs, from Slack's method reference (docs.slack.dev/reference/methods/<method>).
# A call the code makes that is not here fails the test: look its scope up, add both, and the scope to the
# manifest. A method here that nothing calls any more fails too, so that its scope goes.
HISTORY = frozenset({"channels:history", "groups:history", "im:history"})
METHOD_SCOPES: dict[str, frozenset[str]] = {
    "auth.test": frozenset(),  # who the bot is, at start-up (bot.app.Identity); `mm-bot doctor`
    "chat.postMessage": frozenset({"chat:write"}),
    "chat.update": frozenset({"chat:write"}),
    "chat.delete": frozenset({"chat:write"}),
    "chat.postEphemeral": frozenset({"chat:write"}),
    "chat.getPermalink": frozenset(),
    "chat.startStream": frozenset({"chat:write"}),
    "chat.appendStream": frozenset({"chat:write"}),
    "chat.stopStream": frozenset({"chat:write"}),
    # Slack accepts assistant:write here too, for now; chat:write is the scope it keeps.
    "assistant.threads.setStatus": frozenset({"chat:write"}),
    "assistant.threads.setSuggestedPrompts": frozenset({"assistant:write"}),
    # The history scope of each kind of conversation the bot works in (the message.* events it subscribes to).
    "conversations.replies": HISTORY,
    "conversations.history": HISTORY,  # a replayed request finds its post in a channel (bot.steps.find_posted)
    "usergroups.users.list": frozenset({"usergroups:read"}),
    "users.info": frozenset({"users:read"}),  # the names of who asked and approved, in a pull request's body
    "views.publish": frozenset(),
    "files.getUploadURLExternal": frozenset({"files:write"}),
    "files.completeUploadExternal": frozenset({"files:write"}),
    # The DM an admin's audit export is uploaded into (bot.admin); im:write is the scope of a 1:1 DM.
    "conversations.open": frozenset({"im:write"}),
}
# Not a method: the download of a file a person shared (its `url_private_download`, with the bot token) needs
# files:read; needed when the source reads that field (workers.uploads).
DOWNLOAD_FIELD, DOWNLOAD_SCOPE = "url_private_download", "files:read"
# Called with the app-level token (xapp-…, connections:write), which the manifest does not grant.
APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
# slack_sdk helpers whose name is not the method's.
SDK_HELPERS = {
    "files_upload_v2": ("files.getUploadURLExternal", "files.completeUploadExternal"),
    "chat_stream": ("chat.startStream", "chat.appendStream", "chat.stopStream"),
}
# What the utilities bolt hands to a listener call, by the listener's parameter name.
BOLT_UTILITIES: dict[str, tuple[str, ...]] = {
    "say": ("chat.postMessage", "conversations.replies"),  # in an assistant thread it reads the thread context
    "set_suggested_prompts": ("assistant.threads.setSuggestedPrompts",),
    "set_status": ("assistant.threads.setStatus",),
    "set_title": ("assistant.threads.setTitle",),
    "get_thread_context": ("conversations.replies",),
    "save_thread_context": ("conversations.replies", "chat.update"),
    "say_stream": ("chat.startStream", "chat.appendStream", "chat.stopStream"),
    "respond": (),  # the response_url of a command or a click: no token
}
# Listener parameters that call nothing by themselves (the `client` is found in the source).
PLAIN_ARGUMENTS = frozenset(
    {"ack", "body", "event", "payload", "context", "client", "action", "command", "message", "view", "shortcut"}
    | {"options", "logger", "request", "response", "next", "args"}
)

# The bot scopes each event needs (docs.slack.dev/reference/events/<event>).
EVENT_SCOPES: dict[str, frozenset[str]] = {
    "app_mention": frozenset({"app_mentions:read"}),
    "message.channels": frozenset({"channels:history"}),
    "message.groups": frozenset({"groups:history"}),
    "message.im": frozenset({"im:history"}),
    "message.mpim": frozenset({"mpim:history"}),
    "assistant_thread_started": frozenset({"assistant:write"}),
    "assistant_thread_context_changed": frozenset({"assistant:write"}),
    "app_home_opened": frozenset(),
    # Slack sends these to every app, whatever its scopes.
    "app_uninstalled": frozenset(),
    "tokens_revoked": frozenset(),
}
# Events a listener would take that the manifest leaves out on purpose, and why.
LEFT_OUT = {
    # The `message` listener would follow a group DM's threads like a channel's, but the bot's settings
    # (repository, approvers, yolo) are per channel, and a group DM has none of its own: the bot works in
    # channels and in direct messages. Subscribing takes message.mpim and mpim:history, nothing else.
    "message.mpim": "group DMs are not a place the bot works in",
}

TEAM, PERSON, BOT = "T0TEST", "U0PERSON", "U0BOT"
PLACEHOLDERS = {
    "AGENT": "reviewer",
    "PROMPT": "look at the last commit",
    "URL": "https://example.com/o/r.git",
    "NAME": "nightly",
    "LINK": "https://acme.slack.com/archives/C0123ABCD/p1700000000123456",
}


# --- the app and the manifest -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncApp]:
    """The bot's bolt app, as `mm-bot serve` builds it (nothing is sent: listeners are only matched)."""
    from bot.app import create_app
    from chatops import db
    from chatops.config import load_config

    tmp = tmp_path_factory.mktemp("manifest")
    (tmp / "mm.yaml").write_text("# the defaults\n")
    config = load_config(
        environ={
            "MM_CONFIG": str(tmp / "mm.yaml"),
            "SLACK_BOT_TOKEN": "xoxb-test",
            "SLACK_SIGNING_SECRET": "test-signing-secret",
            "DATABASE_URL": f"sqlite:///{tmp / 'mm.sqlite3'}",
            "SLACK_API_URL": "http://127.0.0.1:9/api/",  # never called
        }
    )
    engine = db.engine_for(config.database_url)
    try:
        yield create_app(config, engine).bolt
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))


def bot_events(manifest: dict[str, Any]) -> list[str]:
    return list(manifest["settings"]["event_subscriptions"]["bot_events"])


def slash_commands(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return list(manifest["features"].get("slash_commands") or [])


def listeners(app: AsyncApp) -> list[AsyncListener]:
    """Every listener the app routes requests to: its own, and those of its assistant (a middleware that runs
    its listeners itself). Bolt offers no public list of either, so this is the one place that reads its
    internals; when a bolt upgrade breaks it, it says so here."""
    own: list[AsyncListener] | None = getattr(app, "_async_listeners", None)
    middleware: list[Any] | None = getattr(app, "_async_middleware_list", None)
    assert own is not None and middleware is not None, "bolt no longer keeps _async_listeners: update listeners()"
    found = list(own)
    for assistant in (m for m in middleware if isinstance(m, AsyncAssistant)):
        if assistant._thread_context_changed_listeners is None:
            # What bolt does on the assistant's first request: a default that keeps the thread's context.
            assistant.thread_context_changed(assistant.default_thread_context_changed)
        found += assistant._thread_started_listeners or []
        found += assistant._thread_context_changed_listeners or []
        found += assistant._user_message_listeners or []
        found += assistant._bot_message_listeners or []
    return found


async def _matching(app: AsyncApp, body: dict[str, Any]) -> list[AsyncListener]:
    matched = []
    for listener in listeners(app):
        request = AsyncBoltRequest(body=body, mode="socket_mode")
        if await listener.async_matches(req=request, resp=BoltResponse(status=404)):
            matched.append(listener)
    return matched


def matching(app: AsyncApp, body: dict[str, Any]) -> list[AsyncListener]:
    """The listeners that would take a request with this body."""
    return asyncio.run(_matching(app, body))


def name_of(listener: AsyncListener) -> str:
    function = getattr(listener, "ack_function", None)
    return getattr(function, "__qualname__", repr(listener))


# --- minimal requests, as Slack sends them ------------------------------------------------------------------


def event_bodies(name: str) -> list[dict[str, Any]]:
    """Events API requests for the manifest's event `name`: for message.*, a message at the top level and one
    in a thread (message.im: a direct message, and a message of an assistant thread)."""
    thread = {"channel_id": "D0ASSIST", "thread_ts": "1700000000.000100", "user_id": PERSON, "context": {}}
    events: dict[str, dict[str, Any]] = {
        "app_mention": {"type": "app_mention", "channel": "C0TEST", "user": PERSON, "text": f"<@{BOT}> hi"},
        "message.channels": {"type": "message", "channel": "C0TEST", "channel_type": "channel", "user": PERSON},
        "message.groups": {"type": "message", "channel": "G0TEST", "channel_type": "group", "user": PERSON},
        "message.im": {"type": "message", "channel": "D0TEST", "channel_type": "im", "user": PERSON},
        "message.mpim": {"type": "message", "channel": "G0MPIM", "channel_type": "mpim", "user": PERSON},
        "assistant_thread_started": {"type": "assistant_thread_started", "assistant_thread": thread},
        "assistant_thread_context_changed": {"type": "assistant_thread_context_changed", "assistant_thread": thread},
        "app_home_opened": {"type": "app_home_opened", "user": PERSON, "channel": "D0HOME", "tab": "home"},
        "app_uninstalled": {"type": "app_uninstalled"},
        "tokens_revoked": {"type": "tokens_revoked", "tokens": {"bot": [BOT]}},
    }
    assert name in events, f"this test has no request for the event {name}: add one to event_bodies()"
    event = {"text": "hello", "ts": "1700000000.000200", "event_ts": "1700000000.000200"} | events[name]
    variants = [event, event | {"thread_ts": "1700000000.000100"}] if name.startswith("message.") else [event]
    return [
        {
            "type": "event_callback",
            "team_id": TEAM,
            "api_app_id": "A0TEST",
            "event": variant,
            "event_id": "Ev0TEST",
            "event_time": 1700000000,
            "authorizations": [{"team_id": TEAM, "user_id": BOT, "is_bot": True}],
        }
        for variant in variants
    ]


def event_takers(app: AsyncApp, name: str) -> list[AsyncListener]:
    """The listeners that take some request of the event `name`."""
    return [listener for body in event_bodies(name) for listener in matching(app, body)]


def click_body(action_id: str) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "team": {"id": TEAM},
        "user": {"id": PERSON},
        "api_app_id": "A0TEST",
        "container": {"type": "message", "channel_id": "C0TEST", "message_ts": "1700000000.000300"},
        "channel": {"id": "C0TEST"},
        "actions": [{"type": "button", "action_id": action_id, "block_id": "b", "value": "{}", "action_ts": "1"}],
    }


def command_body(command: str, text: str = "status") -> dict[str, Any]:
    return {
        "command": command,
        "text": text,
        "team_id": TEAM,
        "channel_id": "C0TEST",
        "user_id": PERSON,
        "trigger_id": "1.2.3",
        "response_url": "https://hooks.slack.com/commands/T0TEST/1/2",
    }


def subscribed_requests(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A request for everything the manifest lets Slack send: its events, our buttons, its slash commands."""
    from chatops.buttons import Action

    requests = [(name, body) for name in bot_events(manifest) for body in event_bodies(name)]
    if manifest["settings"]["interactivity"]["is_enabled"]:
        requests += [(f"the {a.value} button", click_body(a.value)) for a in Action]
    requests += [(c["command"], command_body(c["command"])) for c in slash_commands(manifest)]
    return requests


# --- the Web API methods the code calls ---------------------------------------------------------------------

CLIENT_METHOD = re.compile(r"\.([a-z]+_[A-Za-z0-9_]+)\(")
NAMED_CALL = re.compile(r"\b(?:api_call|_call|call)\(\s*[\"']([a-z]+(?:\.[A-Za-z]+)+)[\"']")
# Writes leave through the gateway (slackio/slack_out.py): `slack.post(…)`, `self.out.upload(…)`.
GATEWAY = ROOT / "slackio" / "slack_out.py"
GATEWAY_CALL = re.compile(r"\b(?:slack|out)\.([a-z_]+)\(")


def _methods_in(text: str) -> list[str]:
    """The Web API methods `text` names: in a call (`client.api_call("chat.startStream", …)`, `slack.call(…)`)
    and as slack_sdk's methods (`client.chat_postMessage(…)`)."""
    methods: list[str] = NAMED_CALL.findall(text)
    for name in CLIENT_METHOD.findall(text):
        if name != "api_call" and callable(getattr(AsyncWebClient, name, None)):
            methods += SDK_HELPERS.get(name, (name.replace("_", "."),))
    return methods


def gateway_methods() -> dict[str, list[str]]:
    """What each of the gateway's methods calls (`post` → chat.postMessage), read off its source."""
    tree = ast.parse(GATEWAY.read_text(encoding="utf-8"))
    gateway = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SlackOut")
    return {
        f.name: _methods_in(ast.get_source_segment(GATEWAY.read_text(encoding="utf-8"), f) or "")
        for f in gateway.body
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def source_calls() -> dict[str, set[str]]:
    """The Web API methods the source calls, each with the files that call it: slack_sdk's methods
    (`client.chat_postMessage(…)`), methods named in a call (`client.api_call("chat.startStream", …)`) and the
    gateway's writes (`slack.post(…)`)."""
    through_gateway = gateway_methods()
    found: dict[str, set[str]] = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == GATEWAY:
                continue
            text = path.read_text(encoding="utf-8")
            methods = _methods_in(text)
            for name in GATEWAY_CALL.findall(text):
                methods += through_gateway.get(name, [])
            for method in methods:
                found.setdefault(method, set()).add(str(path.relative_to(ROOT)))
    return found


def listener_calls(app: AsyncApp) -> dict[str, set[str]]:
    """What bolt calls for the listeners, through the utilities they take (`say`, `set_suggested_prompts`…)."""
    found: dict[str, set[str]] = {}
    for listener in listeners(app):
        functions = [getattr(listener, "ack_function", None), *getattr(listener, "lazy_functions", [])]
        for function in (f for f in functions if f is not None):
            for parameter in inspect.signature(function).parameters:
                assert parameter in BOLT_UTILITIES or parameter in PLAIN_ARGUMENTS, (
                    f"{name_of(listener)} takes `{parameter}` from bolt: add what it calls to BOLT_UTILITIES "
                    f"(or to PLAIN_ARGUMENTS if it calls nothing)"
                )
                for method in BOLT_UTILITIES.get(parameter, ()):
                    found.setdefault(method, set()).add(f"bolt's {parameter} for {name_of(listener)}")
    return found


# --- the tests ----------------------------------------------------------------------------------------------


def test_every_request_goes_to_the_bots_endpoint(manifest: dict[str, Any]) -> None:
    from bot.commands import SLASH_COMMAND
    from bot.server import EVENTS_PATH

    settings, features = manifest["settings"], manifest["features"]
    urls = [settings["event_subscriptions"]["request_url"], settings["interactivity"]["request_url"]]
    urls += [command["url"] for command in slash_commands(manifest)]
    assert all(url == f"https://YOUR-HOST{EVENTS_PATH}" for url in urls), urls
    assert [command["command"] for command in slash_commands(manifest)] == [SLASH_COMMAND]
    assert settings["socket_mode_enabled"] is False  # docs/slack-app.md says how to switch it on
    # assistant:write is only granted to apps with the assistant view.
    assert "assistant:write" in manifest["oauth_config"]["scopes"]["bot"] and "assistant_view" in features


def test_every_subscribed_event_reaches_a_listener(app: AsyncApp, manifest: dict[str, Any]) -> None:
    unheard = [
        (name, body["event"]) for name in bot_events(manifest) for body in event_bodies(name) if not matching(app, body)
    ]
    assert not unheard, f"the manifest subscribes to events no listener takes: {unheard}"


def test_every_listener_is_reached_by_what_the_manifest_subscribes_to(app: AsyncApp, manifest: dict[str, Any]) -> None:
    reached: set[int] = set()
    for _name, body in subscribed_requests(manifest):
        reached |= {id(listener) for listener in matching(app, body)}
    unreached = [name_of(listener) for listener in listeners(app) if id(listener) not in reached]
    assert not unreached, (
        f"listeners that nothing in the manifest reaches: {unreached}; subscribe to their event (or add their "
        f"command, or turn interactivity on) in {MANIFEST.name}, and give this test a request for it"
    )


def test_no_listener_takes_an_event_the_manifest_leaves_out_but_on_purpose(
    app: AsyncApp, manifest: dict[str, Any]
) -> None:
    subscribed = set(bot_events(manifest))
    for name in sorted(subscribed & LEFT_OUT.keys()):
        pytest.fail(f"the manifest subscribes to {name}, which LEFT_OUT leaves out ({LEFT_OUT[name]}): drop one")
    for name in sorted(EVENT_SCOPES.keys() - subscribed):
        takers = sorted({name_of(listener) for listener in event_takers(app, name)})
        assert not takers or name in LEFT_OUT, f"{takers} take {name}, which the manifest does not subscribe to"


def test_the_buttons_need_interactivity_and_reach_their_listener(app: AsyncApp, manifest: dict[str, Any]) -> None:
    from chatops.buttons import Action

    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    assert all(matching(app, click_body(a.value)) for a in Action), "a button of ours reaches no listener"
    assert not matching(app, click_body("not_one_of_ours"))


def test_the_slash_command_reaches_its_listener_and_its_hint_lists_real_commands(
    app: AsyncApp, manifest: dict[str, Any]
) -> None:
    from bot.admin import is_admin_command
    from bot.commands import SLASH_COMMAND, parse
    from bot.jobs import is_job_command

    (command,) = slash_commands(manifest)
    assert command["command"] == SLASH_COMMAND and matching(app, command_body(SLASH_COMMAND))
    assert not matching(app, command_body("/not-ours"))
    assert "commands" in manifest["oauth_config"]["scopes"]["bot"]

    hint = re.fullmatch(r"\[(?P<commands>.+)\] or a prompt", command["usage_hint"])
    assert hint, command["usage_hint"]
    for alternative in hint["commands"].split(" | "):
        for words in _spelled_out(alternative):
            parsed = parse(words)
            known = (
                (parsed is not None and parsed.name == words.split()[0])
                or is_job_command(words)
                or is_admin_command(words)
            )
            assert known, f"{words!r} is not a command"
    assert parse("look at the last commit") is None  # "or a prompt"


def _spelled_out(alternative: str) -> list[str]:
    """`yolo on|off` → `yolo on`, `yolo off`; `repo URL [BRANCH]` → `repo https://… main`; `audit [SINCE]` →
    `audit 7d`."""
    spelled = alternative.replace("[BRANCH]", "main").replace("[SINCE]", "7d")
    words = [PLACEHOLDERS.get(word, word) for word in spelled.split()]
    return [" ".join(choice) for choice in itertools.product(*(word.split("|") for word in words))]


def test_app_home_is_on_exactly_when_a_listener_publishes_it(app: AsyncApp, manifest: dict[str, Any]) -> None:
    home = manifest["features"]["app_home"]
    listened = bool(event_takers(app, "app_home_opened"))
    assert home["home_tab_enabled"] is listened is ("app_home_opened" in bot_events(manifest))
    # Direct messages (message.im) need the Messages tab, writable.
    assert home["messages_tab_enabled"] is ("message.im" in bot_events(manifest))
    assert home["messages_tab_read_only_enabled"] is False


def test_the_scopes_are_exactly_those_of_the_events_the_command_and_the_methods_called(
    app: AsyncApp, manifest: dict[str, Any]
) -> None:
    calls = source_calls()
    for method, where in listener_calls(app).items():
        calls.setdefault(method, set()).update(where)
    called = calls.keys() - APP_TOKEN_METHODS

    unknown = {m: sorted(calls[m]) for m in sorted(called - METHOD_SCOPES.keys())}
    assert not unknown, f"Web API methods with no scope in METHOD_SCOPES: {unknown} (see Slack's method reference)"
    stale = sorted(METHOD_SCOPES.keys() - called)
    assert not stale, f"METHOD_SCOPES lists methods nothing calls any more: {stale}; remove them (and their scopes)"

    needed: dict[str, list[str]] = {}
    for method in sorted(called):
        for scope in METHOD_SCOPES[method]:
            needed.setdefault(scope, []).append(method)
    for event in bot_events(manifest):
        for scope in EVENT_SCOPES[event]:
            needed.setdefault(scope, []).append(f"event {event}")
    if slash_commands(manifest):
        needed.setdefault("commands", []).append("the slash command")
    for source in (path for folder in SOURCES for path in sorted((ROOT / folder).rglob("*.py"))):
        if DOWNLOAD_FIELD in source.read_text():
            needed.setdefault(DOWNLOAD_SCOPE, []).append(f"{DOWNLOAD_FIELD} in {source.relative_to(ROOT)}")

    granted = manifest["oauth_config"]["scopes"]["bot"]
    assert len(granted) == len(set(granted)), granted
    missing = {scope: needed[scope] for scope in sorted(needed.keys() - set(granted))}
    unused = sorted(set(granted) - needed.keys())
    assert not missing and not unused, (
        f"the manifest lacks scopes the code needs: {missing}; and asks for scopes nothing uses: {unused}"
    )


def test_the_source_scan_finds_the_calls_it_is_there_to_find() -> None:
    """The scan itself: a sample of the calls it must see, each spelled one of the ways the code calls."""
    calls = source_calls()
    for method in ("chat.postMessage", "chat.startStream", "views.publish", "files.getUploadURLExternal"):
        assert method in calls, f"the scan of {SOURCES} no longer finds {method}"
    assert gateway_methods()["ephemeral"] == ["chat.postEphemeral"]
    assert "slackio/slack_out.py" not in {where for places in calls.values() for where in places}
    assert "files.upload" not in calls  # a label for a slack_sdk helper's error, not a call


DOC = ROOT / "docs" / "slack-app.md"
DOC_METHOD_ROW = re.compile(r"^\| `([a-z]+(?:\.[a-zA-Z]+)+)` \| (.*) \|$", re.MULTILINE)


def documented_methods() -> dict[str, frozenset[str]]:
    """docs/slack-app.md's table of the methods the app calls: each with the scopes its row names."""
    return {method: frozenset(re.findall(r"`([a-z_:]+)`", scopes)) for method, scopes in DOC_METHOD_ROW.findall(
        DOC.read_text(encoding="utf-8")
    )}  # fmt: skip


def test_the_docs_list_every_method_called_with_its_scopes_and_the_emulator_answers_each() -> None:
    from playground.slack_api import SlackEmulator

    documented = documented_methods()
    expected = dict(METHOD_SCOPES) | {method: frozenset({"connections:write"}) for method in APP_TOKEN_METHODS}
    differ = sorted(m for m in expected.keys() & documented.keys() if expected[m] != documented[m])
    assert documented == expected, (
        f"docs/slack-app.md's method table differs from METHOD_SCOPES: "
        f"missing {sorted(expected.keys() - documented.keys())}, "
        f"not called {sorted(documented.keys() - expected.keys())}, "
        f"scopes differ for {differ}"
    )
    # A method the app calls that the emulator does not answer would pass no test (unknown_method).
    assert not expected.keys() - set(SlackEmulator().methods)


def test_the_manifest_is_valid_by_slack_s_own_schema(manifest: dict[str, Any]) -> None:
    # Slack's manifest schema (tests/schemas/README.md says where it comes from): what Slack's app settings
    # would refuse on import (an unknown key, a wrong type, a command without a description) fails here.
    schema = json.loads((ROOT / "tests" / "schemas" / "slack-manifest.schema.2.0.0.json").read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(manifest), key=lambda e: list(e.path))
    assert [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors] == []
    # The schema is strict enough to fail: a key Slack does not know (`feature` for `features`) is refused.
    wrong = {**manifest, "feature": manifest.get("features", {})}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(wrong))
