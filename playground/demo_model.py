"""The playground's demo model: a scripted OpenAI-compatible server, so the bot can be seen working end to end
by someone who has no model to point it at.

    with start_demo_model() as model:          # MM_MODEL_URL=model.url, model name "demo"
        ...                                     # a workspace cloned from demo_repository(path)

Every turn plays the same short session on the demo repository (`greet.py` prints "hello, wrold"): run the
script with bash, fix the typo with edit_file, say what happened. Every message it writes starts with LABEL,
so nobody mistakes the script for a model's work.

`answer` decides from the request's messages alone, never from what the server saw before: the bot may
restart, resume a turn a person approved an hour later in another worker, or run many threads at once, and
the conversation it sends is the only state that is right in all those cases. It reads the tool results the
way a model would: a rejected call (the core's own refusal texts) or a result the script does not expect ends
the turn with a sentence saying so, rather than pressing on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from mm_core.agent import COMPACT_PROMPT
from mm_core.tools.bash import BashTool
from mm_core.tools.edit import EditFileTool
from playground.model_server import ModelServer, Reply, ToolCall

DEMO_MODEL_NAME = "demo"
LABEL = "🎭 *Demo model* (scripted, not a real model)"
DEMO_FILE = "greet.py"
DEMO_CONTENT = 'print("hello, wrold")\n'

# Slow enough that a person sees the answer stream into the thread, fast enough that the tests stay quick.
INTERVAL = 0.02
COMMAND = f"python3 {DEMO_FILE}"
EDIT = {"path": DEMO_FILE, "edits": [{"old": "wrold", "new": "world"}]}
BEFORE, AFTER = "hello, wrold", "hello, world"
TRY_YOUR_OWN = (
    "This was a scripted demo: start a model (Ollama, llama.cpp's server, vLLM, Docker Model Runner) and set "
    "MM_MODEL_URL to try your own prompts."
)

FIRST = f"{LABEL}: let me run the script first."
REPLAY = f"{LABEL}: replaying the demo; let me run the script first."
FIXING = f"{LABEL}: it prints “wrold”; fixing the typo."
FIXED = f"{LABEL}: {DEMO_FILE} printed “{BEFORE}”; it now says “{AFTER}”. {TRY_YOUR_OWN}"
ALREADY_FIXED = (
    f"{LABEL}: {DEMO_FILE} already prints “{AFTER}”: its typo was fixed earlier in this conversation, so there "
    f"is nothing left to fix. {TRY_YOUR_OWN}"
)
REJECTED = f"{LABEL}: you rejected {{what}}, so I stopped there. Ask again to replay the demo."
NOT_THE_DEMO = (
    f"{LABEL}: {{call}} did not go as the script expects ({{why}}). The demo needs its own repository, whose "
    f"{DEMO_FILE} prints “{BEFORE}”, so I stopped there."
)
# `compact` stores whatever the model answers as the summary that replaces the earlier messages, so the answer
# must read as one: a stand-in that says what it is, rather than "nothing was compacted", which would be false.
SUMMARY = (
    f"{LABEL}: a scripted model cannot summarise, so this stands in for a summary: the earlier conversation was "
    f"the scripted demo (run {DEMO_FILE}, fix its typo “wrold”)."
)

# The texts the core gives the model for a rejected call, from the tools themselves so that they cannot drift.
_GATED = {"bash": BashTool(), "edit_file": EditFileTool()}

# A fixed identity and dates make the demo's commit the same everywhere (and a git without a configured
# identity, as in a fresh container, can still commit); the user's git config must not sign or hook it.
_GIT_CONFIG = (
    *("-c", "user.name=mm playground", "-c", "user.email=playground@localhost"),
    *("-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null"),
)
_GIT_DATE = "2024-01-01T00:00:00+00:00"


# -- the repository -------------------------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A caller running inside git (a hook, GIT_DIR set) must not point these commands at another repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_DATE": _GIT_DATE,
        "GIT_COMMITTER_DATE": _GIT_DATE,
    }
    return subprocess.run(
        ["git", *_GIT_CONFIG, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=30
    )


def _is_repository(path: Path) -> bool:
    if not path.is_dir():
        return False
    found = _git(path, "rev-parse", "--show-toplevel")
    return found.returncode == 0 and Path(found.stdout.strip()).resolve() == path.resolve()


def demo_repository(path: Path) -> Path:
    """A git repository at `path` holding DEMO_FILE in one commit; one already there is left as it is.

    It is built beside `path` and renamed into place, so a crash halfway, or two playgrounds starting at once,
    never leave a repository without its commit. Raises FileExistsError when `path` holds something else.
    """
    path = Path(path)
    if _is_repository(path):
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path} exists and is not a git repository: the demo repository needs its own place")
    path.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        building.chmod(0o755)  # mkdtemp's 0700 would keep out a sandboxed command or a worker cloning it
        (building / DEMO_FILE).write_text(DEMO_CONTENT, encoding="utf-8")
        for args in (("init", "-q"), ("add", DEMO_FILE), ("commit", "-q", "-m", "greet: say hello")):
            done = _git(building, *args)
            if done.returncode != 0:
                raise RuntimeError(f"git {args[0]} failed for the demo repository: {done.stderr.strip()}")
        try:
            building.rename(path)  # over a missing or empty directory, atomically
        except OSError:
            if not _is_repository(path):  # another process won the race with its own demo repository
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(building)
    return path


# -- the model ------------------------------------------------------------------------------------------------


def start_demo_model() -> ModelServer:
    """The demo model, started on 127.0.0.1 (its `url` ends in /v1); `stop()` it, or use it in a `with`."""
    server = ModelServer(models=(DEMO_MODEL_NAME,), history=100)
    server.always(answer)
    return server.start()


def _say(text: str, *calls: ToolCall) -> Reply:
    # Nobody sees a call's arguments arrive (the thread shows the call once it is whole): they come in one
    # delta rather than paced like the text.
    return Reply(text=text, tool_calls=calls, interval=INTERVAL, fragment_size=4096)


def _text(content: Any) -> str:
    # OpenAI allows a list of content parts; the core sends strings, other clients may not.
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    try:
        parsed = json.loads(call.get("function", {}).get("arguments") or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def answer(request: dict[str, Any]) -> Reply:
    """The demo's next answer, from `request["messages"]` alone (see the module's docstring)."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    last_user = users[-1] if users else -1
    if last_user >= 0 and _text(messages[last_user].get("content")) == COMPACT_PROMPT:
        return _say(SUMMARY)
    turn = messages[last_user + 1 :]
    answers = [m for m in turn if m.get("role") == "assistant"]
    if not answers or not answers[-1].get("tool_calls"):
        # An answer of the demo before this turn's message: the thread has seen the script once already.
        replay = any(m.get("role") == "assistant" for m in messages[:last_user])
        return _say(REPLAY if replay else FIRST, ToolCall("bash", {"command": COMMAND}))

    # The loop calls the model only once every call has its result; the demo makes one call per answer.
    call = answers[-1]["tool_calls"][-1]
    name = str(call.get("function", {}).get("name", ""))
    arguments = _arguments(call)
    result = next(
        (_text(m.get("content")) for m in turn if m.get("role") == "tool" and m.get("tool_call_id") == call.get("id")),
        "",
    )
    gated = _GATED.get(name)
    if gated is not None and result == gated.refusal(arguments):
        what = f"the command `{COMMAND}`" if name == "bash" else f"the edit of {DEMO_FILE}"
        return _say(REJECTED.format(what=what))
    if name == "bash" and result.strip() == BEFORE:
        return _say(FIXING, ToolCall("edit_file", EDIT))
    if name == "bash" and result.strip() == AFTER:
        return _say(ALREADY_FIXED)
    if name == "edit_file" and result.startswith(f"edited {DEMO_FILE}:"):
        return _say(FIXED)
    first_line = next((line.strip() for line in result.splitlines() if line.strip()), "no output")
    why = first_line if len(first_line) <= 160 else first_line[:159] + "…"
    what = f"`{COMMAND}`" if name == "bash" else f"the {name or 'tool'} call"
    return _say(NOT_THE_DEMO.format(call=what, why=f"“{why}”"))
