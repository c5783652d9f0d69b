"""Issue 9, item 1: every path a language server sends back is confined to the workspace before a line is read.

The attack: a workspace file that is a symlink (a sandboxed `ln -s` makes one) to /etc/shadow, or to a file of
another thread's workspace, is imported by a module; definition, references and hover on a name from it printed
the target's lines, with no approval. Here a temp file stands for /etc/shadow and a sibling directory for the
other thread's workspace; both hold MARKER, which no answer may ever contain. A real pylsp from the venv answers.

(a) definition / references / hover on names from the linked modules: the location is a path only, the hover
    is withheld; (b) a rename whose edits reach the outside file is refused and the file is unchanged, also when
    a file of the rename is swapped for a link between its resolution and its read; (c) the named file swapped
    for a link during the call (at the worst moment, and by a process that keeps swapping), a module swapped
    between calls: the target never leaks.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import mm_core.tools.lsp.tool as lsp_tool
from mm_core.config import AgentConfig
from mm_core.tools.base import ToolContext
from mm_core.tools.lsp import LspTool, find_servers
from mm_core.tools.lsp.manager import LspManager
from mm_core.tools.sandbox import Launch
from mm_testkit.fixtures_kit import needs_bwrap

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)

BIN = Path(sys.executable).parent
# Letters and digits only: a Markdown hover escapes `_` and `*`, which would hide a leak from `in`.
MARKER = "Secret9f3cMarker"

SHADOW = f'''SHADOW = "root:{MARKER}:19000:0:99999:7:::"


def shadow_fn():
    """{MARKER} in a docstring."""
    return SHADOW
'''
THEIRS = f'''def their_fn():
    """{MARKER} of the other thread."""
    return "{MARKER}"
'''
APP = """from shadow import SHADOW, shadow_fn
from theirs import their_fn
from vendor.theirs import their_fn as vendored
from lib import helper

shadow_fn()
their_fn()
vendored()
print(SHADOW, helper())
"""
LIB = """def helper():
    return 1
"""
OTHER_LIB = f"def helper(): return '{MARKER}'\n"  # the other thread's lib.py: its first line holds the marker


@dataclass
class Attack:
    runner: asyncio.Runner
    tool: LspTool
    ctx: ToolContext
    shadow: Path  # stands for /etc/shadow
    other: Path  # another thread's workspace, a sibling of this one

    @property
    def ws(self) -> Path:
        return self.ctx.workspace

    def run(self, **args: Any) -> str:
        return self.runner.run(self.tool.run(args, self.ctx))

    def preview(self, **args: Any) -> str:
        return self.runner.run(self.tool.preview(args, self.ctx))


def unsandboxed(config: AgentConfig, workspace: Path, argv: list[str]) -> Launch:
    """The server started as the worker's own process, reading whatever the worker can: the tool's own
    confinement is what these tests prove, so it must hold even when the server's sandbox is missing."""
    return Launch(argv=argv, env=dict(os.environ), cwd=str(workspace), pass_fds=())


@pytest.fixture
def attack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Attack]:
    monkeypatch.setattr(lsp_tool, "server_launch", unsandboxed)
    yield from make_attack(tmp_path)


def make_attack(tmp_path: Path) -> Generator[Attack]:
    ws, other, etc = tmp_path / "ws", tmp_path / "other-thread", tmp_path / "etc"
    for directory in (ws, other, etc):
        directory.mkdir()
    shadow = etc / "shadow"
    shadow.write_text(SHADOW)
    (other / "theirs.py").write_text(THEIRS)
    (ws / "shadow.py").symlink_to(shadow)  # ln -s /etc/shadow shadow.py
    (ws / "theirs.py").symlink_to(other / "theirs.py")  # ln -s ../other-thread/theirs.py theirs.py
    (ws / "vendor").symlink_to("../other-thread")  # a directory link, relative
    (ws / "app.py").write_text(APP)
    (ws / "lib.py").write_text(LIB)
    server = {"command": str(BIN / "pylsp"), "args": [], "extensions": [".py"]}
    config = AgentConfig.model_validate({"lsp": {"servers": {"pylsp": server}}})
    available, warnings = find_servers(config)
    assert warnings == []
    with asyncio.Runner() as runner:
        env = Attack(runner, LspTool(config, available), ToolContext(workspace=ws, config=config), shadow, other)
        try:
            yield env
        finally:
            runner.run(env.ctx.resources.aclose())


def unchanged(attack: Attack) -> None:
    assert attack.shadow.read_text() == SHADOW
    assert (attack.other / "theirs.py").read_text() == THEIRS


# ---- (a) locations and hovers from a linked module ---------------------------------------------------------------


def test_definition_into_a_linked_module_is_a_path_only(attack):
    ws = attack.ws
    assert attack.run(action="definition", path="app.py", symbol="SHADOW") == f"{ws}/shadow.py:1:1"
    assert attack.run(action="definition", path="app.py", symbol="shadow_fn") == f"{ws}/shadow.py:4:5"
    assert attack.run(action="definition", path="app.py", symbol="their_fn", line=2) == f"{ws}/theirs.py:1:5"
    assert attack.run(action="definition", path="app.py", symbol="their_fn", line=3) == (f"{ws}/vendor/theirs.py:1:5")
    # What stays inside keeps its source line.
    assert attack.run(action="definition", path="app.py", symbol="helper") == "lib.py:1:5  def helper():"
    unchanged(attack)


def test_references_show_the_linked_modules_as_paths_only(attack):
    out = attack.run(action="references", path="app.py", symbol="shadow_fn")
    assert MARKER not in out
    assert out == (
        "3 reference(s):\n"
        f"{attack.ws}/shadow.py:4:5\n"
        "app.py:1:28  from shadow import SHADOW, shadow_fn\n"
        "app.py:6:1  shadow_fn()"
    )
    out = attack.run(action="references", path="app.py", symbol="SHADOW", line=9)
    assert MARKER not in out
    assert f"{attack.ws}/shadow.py:1:1\n" in out or out.endswith(f"{attack.ws}/shadow.py:1:1")
    for line in (2, 3):
        out = attack.run(action="references", path="app.py", symbol="their_fn", line=line)
        assert MARKER not in out
        assert "theirs.py:1:5\n" in out
        assert "def their_fn" not in out


def test_hover_on_a_name_from_a_linked_module_is_withheld(attack):
    for symbol, line in (("shadow_fn", 0), ("shadow_fn", 6), ("SHADOW", 9), ("their_fn", 2), ("their_fn", 7)):
        out = attack.run(action="hover", path="app.py", symbol=symbol, line=line)
        assert MARKER not in out, (symbol, line, out)
    assert attack.run(action="hover", path="app.py", symbol="shadow_fn") == (
        f"[lsp: the symbol at app.py:1:28 is defined in {attack.ws}/shadow.py, outside the workspace — "
        "its hover is not shown]"
    )
    # A name defined inside keeps its hover.
    assert "helper()" in attack.run(action="hover", path="app.py", symbol="helper", line=4)


@pytest.mark.xfail(
    strict=True,
    reason="the server itself reads the linked file: a local alias of an outside name (v = shadow.shadow_fn) is "
    "defined inside, and its hover carries the outside docstring; only a server confined to its workspace closes it",
)
def test_hover_on_a_local_alias_of_a_linked_name(attack):
    (attack.ws / "alias.py").write_text("import shadow\n\nv = shadow.shadow_fn\n")
    assert MARKER not in attack.run(action="hover", path="alias.py", symbol="v")


# ---- (b) rename ------------------------------------------------------------------------------------------------------


def test_a_rename_reaching_a_linked_module_is_refused(attack):
    refused = f"[lsp: the rename would edit {attack.ws}/theirs.py, outside the project — nothing renamed]"
    args = {"action": "rename", "path": "app.py", "symbol": "their_fn", "line": 2, "new_name": "mine"}
    assert attack.preview(**args) == refused
    assert attack.run(**args) == refused
    unchanged(attack)
    assert (attack.ws / "app.py").read_text() == APP


def test_a_renamed_file_swapped_for_a_link_after_its_resolution_is_not_read(attack, monkeypatch):
    """lib.py is resolved inside, then swapped for a link to the other thread's file (with a `helper` too)."""
    (attack.other / "lib.py").write_text(OTHER_LIB)
    swapped: list[str] = []
    resolve = lsp_tool.resolve

    def resolve_then_swap(workspace: Path, path: str) -> Path:
        real = resolve(workspace, path)
        if Path(path).name == "lib.py" and not swapped:
            link = attack.ws / "lib.py.swap"
            link.symlink_to(attack.other / "lib.py")
            os.replace(link, attack.ws / "lib.py")
            swapped.append(path)
        return real

    monkeypatch.setattr(lsp_tool, "resolve", resolve_then_swap)
    args = {"action": "rename", "path": "app.py", "symbol": "helper", "new_name": "assist"}
    refused = f"[lsp: the rename would edit {attack.ws}/lib.py, outside the project — nothing renamed]"
    assert attack.preview(**args) == refused
    assert swapped
    (attack.ws / "lib.py").unlink()
    (attack.ws / "lib.py").write_text(LIB)
    swapped.clear()
    assert attack.run(**args) == refused
    assert swapped
    assert (attack.other / "lib.py").read_text() == OTHER_LIB
    assert (attack.ws / "app.py").read_text() == APP  # nothing written: every file is read before any write


# ---- (c) the named file, or a module, swapped -------------------------------------------------------------------


CALLS = 400  # before the fix, 3 to 9 of 300 calls leaked
NAMED = 'value = "plain"\nalias = value\nprint(value)\n'
# The same names at the same places, and the marker on every line: whichever read follows the link, it shows.
TARGET = f'value = "{MARKER}"\nalias = value  # {MARKER}\nprint(value, undefined_{MARKER})\n{MARKER} = 1\n'


def swap_in_link(ws: Path, name: str, target: Path) -> None:
    link = ws / (name + ".link")
    link.symlink_to(target)
    os.replace(link, ws / name)


def put_back(ws: Path, name: str, text: str) -> None:
    fresh = ws / (name + ".fresh")
    fresh.write_text(text)
    os.replace(fresh, ws / name)


def test_the_named_file_swapped_for_a_link_after_its_resolution_is_never_followed(attack, monkeypatch):
    target = attack.other / "named.py"
    target.write_text(TARGET)
    put_back(attack.ws, "named.py", NAMED)
    swapped: list[str] = []
    resolve = lsp_tool.resolve

    def resolve_then_swap(workspace: Path, path: str) -> Path:
        real = resolve(workspace, path)
        if path == "named.py":
            swap_in_link(attack.ws, "named.py", target)
            swapped.append(path)
        return real

    monkeypatch.setattr(lsp_tool, "resolve", resolve_then_swap)
    calls: list[dict[str, Any]] = [
        {"action": "definition", "symbol": "value", "line": 2},
        {"action": "references", "symbol": "value"},
        {"action": "hover", "symbol": "value", "line": 2},
        {"action": "symbols"},
        {"action": "diagnostics"},
    ]
    for args in calls:
        put_back(attack.ws, "named.py", NAMED)
        out = attack.run(path="named.py", **args)
        assert out == "[lsp: named.py is outside the workspace]", (args, out)
    assert len(swapped) == len(calls)
    assert target.read_text() == TARGET


SWAPPER = """
import os, sys, time
ws, target, text = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
named, link, fresh = (os.path.join(ws, n) for n in ("named.py", "named.py.link", "named.py.fresh"))
while True:
    os.symlink(target, link)
    os.replace(link, named)
    time.sleep(0.002)
    with open(fresh, "w") as f:
        f.write(text)
    os.replace(fresh, named)
    time.sleep(0.002)
"""


def test_the_named_file_swapped_back_and_forth_by_another_process_never_leaks(attack, tmp_path):
    """A race, run as a sandboxed `while true; do ln -sf …; done` would run it (another process, so no GIL
    paces it): before the fix a few calls in a hundred printed a line of the target, read through the link."""
    # Long files: the server takes a while on each (reparsed as the content alternates), which widens the
    # window between the resolution and the reads that follow the answer.
    filler = "".join(f"x{i} = {i}\n" for i in range(3000))
    target = attack.other / "named.py"
    target.write_text(TARGET + filler)
    put_back(attack.ws, "named.py", NAMED + filler)
    (tmp_path / "named.txt").write_text(NAMED + filler)
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(attack.ws), str(target), str(tmp_path / "named.txt")]
    )
    answers: list[str] = []
    try:
        for _ in range(CALLS):
            answers.append(attack.run(action="definition", path="named.py", symbol="value", line=2))
    finally:
        swapper.kill()
        swapper.wait()
    assert [a for a in answers if MARKER in a] == []
    assert target.read_text() == TARGET + filler


def test_a_module_swapped_for_a_link_between_calls_is_a_path_only(attack):
    assert attack.run(action="definition", path="app.py", symbol="helper") == "lib.py:1:5  def helper():"
    (attack.other / "lib.py").write_text(OTHER_LIB)
    swap_in_link(attack.ws, "lib.py", attack.other / "lib.py")
    out = attack.run(action="definition", path="app.py", symbol="helper")
    assert MARKER not in out
    assert out == f"{attack.ws}/lib.py:1:5"
    out = attack.run(action="references", path="app.py", symbol="helper")
    assert MARKER not in out
    assert "lib.py:1:5\n" in out and "def helper" not in out


# ---- the second wall: the server itself in the sandbox ----------------------------------------------------------


@needs_bwrap
def test_a_sandboxed_server_cannot_read_what_the_workspace_links_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Started through the sandbox (the tool's default), the server sees the workspace and its own installation
    only: a link out of the workspace leads nowhere, so the server itself never reads the linked files, and a
    hover on a local alias of a linked name, which the tool alone cannot withhold, holds nothing of them."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-worker-secret")
    attack = next(gen := make_attack(tmp_path))
    try:
        (attack.ws / "alias.py").write_text("from shadow import shadow_fn\nv = shadow_fn\n")
        answers = [
            attack.run(action="definition", path="app.py", symbol="shadow_fn"),
            attack.run(action="references", path="app.py", symbol="shadow_fn"),
            attack.run(action="hover", path="alias.py", symbol="v"),
            attack.run(action="hover", path="app.py", symbol="their_fn", line=2),
        ]
        assert [a for a in answers if MARKER in a] == []
        assert answers[0] == "[lsp: no definition found for the symbol at app.py:1:28]"
        assert "helper()" in attack.run(action="hover", path="app.py", symbol="helper", line=4)  # it still works
        manager: LspManager | None = attack.ctx.resources.peek("lsp")
        assert manager is not None
        pids = manager.pids()
        assert pids and all(Path(f"/proc/{pid}/exe").resolve().name == "bwrap" for pid in pids)
        # Its environment is scrubbed like a command's: the worker's secrets are not in it.
        assert all(b"xoxb-worker-secret" not in Path(f"/proc/{pid}/environ").read_bytes() for pid in pids)
        unchanged(attack)
    finally:
        gen.close()


# ---- issue 21, second round: a rename is approved whole, and written as approved ------------------------------------


def rename_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int) -> tuple[Path, AgentConfig, LspTool]:
    """A module `lib` whose `helper` `files` modules use, and the lsp tool on it (maxOutput small: what the model
    reads is cut, what the approver reads must not be)."""
    monkeypatch.setattr(lsp_tool, "server_launch", unsandboxed)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "lib.py").write_text(LIB)
    for i in range(files):
        (ws / f"m{i:02}.py").write_text(f"from lib import helper\n\nprint(helper())  # module {i}\n")
    server = {"command": str(BIN / "pylsp"), "args": [], "extensions": [".py"]}
    config = AgentConfig.model_validate(
        {"lsp": {"servers": {"pylsp": server}}, "maxOutput": 300, "yolo": False, "model": {"url": "http://x"}}
    )
    available, _ = find_servers(config)
    return ws, config, LspTool(config, available)


RENAME = {"action": "rename", "path": "lib.py", "symbol": "helper", "new_name": "assist"}


def test_a_rename_is_shown_whole_and_a_change_in_any_file_of_it_stops_it(tmp_path, monkeypatch, model_server):
    """The reviewer's attack: the preview was cut at maxOutput, so the approver (and the digest) saw part of a
    13-file rename; a file changed in the unseen part after the approval was renamed all the same. Now the
    preview is the whole plan, and a change anywhere in it is caught before anything is written."""
    from agent_support import make_agent
    from mm_core.agent import CHANGED
    from mm_core.events import PermissionRequested
    from mm_core.log import Decision, MemoryStore, ToolResult
    from playground.model_server import Reply, ToolCall

    ws, config, tool = rename_workspace(tmp_path, monkeypatch, 13)
    config = config.model_copy(update={"model": config.model.model_copy(update={"url": model_server.url})})
    model_server.script(Reply(tool_calls=[ToolCall("lsp", RENAME)]), Reply(text="renamed"))
    store, events = MemoryStore(), []
    agent = make_agent(config, store, ws, tools=[tool], events=events)
    try:
        assert asyncio.run(agent.send("rename helper to assist")).outcome == "suspended"
        [asked] = [e for e in events if isinstance(e, PermissionRequested)][-1].calls
        assert len(asked.preview) > config.maxOutput and "output truncated" not in asked.preview
        assert asked.preview.startswith("rename helper → assist: 14 edit(s) in 14 file(s)\n")
        assert all(f"+++ b/m{i:02}.py" in asked.preview for i in range(13))
        # After the approval, the last file (where a cut preview ended long before) changes.
        (ws / "m12.py").write_text("from lib import helper\n\nprint(helper())  # changed behind your back\n")
        decision = Decision(asked.call_id, True, "U0GRACE", shown=asked.shown)
        assert asyncio.run(agent.resume([decision])).outcome == "answered"
        [result] = [e for e in asyncio.run(store.load("s1")) if isinstance(e, ToolResult)]
        assert result.output == CHANGED
        assert "helper" in (ws / "lib.py").read_text() and "assist" not in (ws / "m00.py").read_text()
    finally:
        asyncio.run(agent.resources.aclose())


def test_an_approved_rename_writes_the_plan_it_showed_and_the_model_reads_the_short_report(tmp_path, monkeypatch):
    ws, config, tool = rename_workspace(tmp_path, monkeypatch, 3)
    ctx = ToolContext(workspace=ws, config=config)

    async def approve_and_run() -> tuple[str, str]:
        try:
            plan = await tool.plan(RENAME, ctx)
            assert plan.carry_out is not None
            return plan.preview, await plan.carry_out()
        finally:
            await ctx.resources.aclose()

    shown, answer = asyncio.run(approve_and_run())
    assert answer == (
        "renamed to assist: 4 edit(s) in 4 file(s)\nlib.py: 1 edit(s)\nm00.py: 1 edit(s)\nm01.py: 1 edit(s)\n"
        "m02.py: 1 edit(s)"
    )
    assert "-print(helper())  # module 2\n+print(assist())  # module 2" in shown
    assert (ws / "m02.py").read_text() == "from lib import assist\n\nprint(assist())  # module 2\n"


def test_a_rename_too_large_to_show_is_refused_whole(tmp_path, monkeypatch):
    """A plan whose diff is more than a person can check is not shown in part: it is refused, and nothing is
    written, approved or not."""
    ws, config, tool = rename_workspace(tmp_path, monkeypatch, 13)
    monkeypatch.setattr(lsp_tool, "MAX_RENAME_CHARS", 1000)
    ctx = ToolContext(workspace=ws, config=config)

    async def both() -> tuple[str, str]:
        try:
            return await tool.preview(RENAME, ctx), await tool.run(RENAME, ctx)
        finally:
            await ctx.resources.aclose()

    shown, answer = asyncio.run(both())
    refused = (
        "[lsp: the rename helper → assist would make 14 edit(s) in 14 file(s), a diff longer than 1,000 characters: "
        "more than a person can check before approving it — nothing renamed; rename it in parts with edit_file, a "
        "few files at a time]"
    )
    assert shown == answer == refused
    assert all("assist" not in path.read_text() for path in ws.glob("*.py"))


def test_a_rename_through_a_symlink_names_the_file_it_writes(tmp_path, monkeypatch):
    """Issue 21, second round: a module reached through a linked directory (`pkg -> real_pkg`) is shown as the
    link and the file written."""
    monkeypatch.setattr(lsp_tool, "server_launch", unsandboxed)
    ws = tmp_path / "ws"
    (ws / "real_pkg").mkdir(parents=True)
    (ws / "real_pkg" / "__init__.py").write_text("")
    (ws / "real_pkg" / "mod.py").write_text(LIB)
    (ws / "pkg").symlink_to("real_pkg")
    (ws / "app.py").write_text("from pkg.mod import helper\n\nprint(helper())\n")
    server = {"command": str(BIN / "pylsp"), "args": [], "extensions": [".py"]}
    config = AgentConfig.model_validate({"lsp": {"servers": {"pylsp": server}}})
    available, _ = find_servers(config)
    tool, ctx = LspTool(config, available), ToolContext(workspace=ws, config=config)

    async def shown() -> str:
        try:
            return await tool.preview({**RENAME, "path": "app.py"}, ctx)
        finally:
            await ctx.resources.aclose()

    assert "+++ b/pkg/mod.py → real_pkg/mod.py (symlink)\n" in asyncio.run(shown())
