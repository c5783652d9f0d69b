"""The lsp tool against real language servers installed from PyPI, on a small two-file project.

pylsp (python-lsp-server, with pyflakes for diagnostics), jedi-language-server and basedpyright (pyright's
language server, which counts columns in UTF-16 as the protocol says). One server per module fixture is reused
across the tests that do not need a fresh one.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mm_core.config import AgentConfig
from mm_core.policy import Action, Rule, judge
from mm_core.tools.base import Plan, ToolContext
from mm_core.tools.lsp import LspTool, find_servers
from mm_testkit.fixtures_kit import needs_bwrap_when_root

# A root worker starts a language server only in the sandbox (its workspace here belongs to root).
pytestmark = needs_bwrap_when_root

BIN = Path(sys.executable).parent
FIXTURE = Path(__file__).parent / "fixtures" / "lsp"


def server(command: str, *args: str) -> dict[str, Any]:
    return {"command": str(BIN / command), "args": list(args), "extensions": [".py"]}


@dataclass
class Project:
    runner: asyncio.Runner
    tool: LspTool
    ctx: ToolContext

    @property
    def root(self) -> Path:
        return self.ctx.workspace

    def run(self, **args: Any) -> str:
        return self.runner.run(self.tool.run(args, self.ctx))

    def preview(self, **args: Any) -> str:
        return self.runner.run(self.tool.preview(args, self.ctx))

    def plan(self, **args: Any) -> Plan:
        return self.runner.run(self.tool.plan(args, self.ctx))


def project(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, Any]) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    config = AgentConfig.model_validate({"lsp": {"servers": servers}})
    available, warnings = find_servers(config)
    assert warnings == []
    with asyncio.Runner() as runner:
        env = Project(runner, LspTool(config, available), ToolContext(workspace=root, config=config))
        try:
            yield env
        finally:
            runner.run(env.ctx.resources.aclose())


@pytest.fixture(scope="module")
def pylsp(tmp_path_factory):
    yield from project(tmp_path_factory, {"pylsp": server("pylsp")})


@pytest.fixture(scope="module")
def pyright(tmp_path_factory):
    yield from project(tmp_path_factory, {"basedpyright": server("basedpyright-langserver", "--stdio")})


@pytest.fixture(scope="module")
def jedi(tmp_path_factory):
    yield from project(tmp_path_factory, {"jedi": server("jedi-language-server")})


# ---- the declaration ---------------------------------------------------------------------------------------


def test_schema_names_the_servers_actions_and_workflow(pylsp):
    schema = pylsp.tool.schema()
    assert schema["name"] == "lsp"
    assert "Servers available: pylsp (.py)." in schema["description"]
    assert "references before you change a shared symbol, diagnostics after you edit" in schema["description"]
    props = schema["parameters"]["properties"]
    assert props["action"]["enum"] == ["definition", "references", "hover", "symbols", "diagnostics", "rename"]
    assert set(props) == {"action", "path", "symbol", "line", "column", "new_name"}
    assert (pylsp.tool.emoji, pylsp.tool.counter) == ("🔎", "lsp")


def test_titles_and_approval(pylsp):
    tool = pylsp.tool
    assert tool.title({"action": "definition", "path": "main.go", "symbol": "greet"}) == "lsp: definition main.go greet"
    assert tool.title({"action": "hover", "path": "main.go", "line": 9, "column": 14}) == "lsp: hover main.go:9:14"
    assert tool.title({"action": "rename", "path": "main.go", "symbol": "greet", "new_name": "hello"}) == (
        "lsp: rename main.go greet → hello"
    )
    assert tool.title({"action": "rename", "path": "main.go", "symbol": "person.Greet 1 12 Hello"}) == (
        "lsp: rename main.go Greet → Hello"
    )
    assert tool.needs_approval({"action": "rename"}) is True
    reads = ("definition", "references", "hover", "symbols", "diagnostics")
    assert not any(tool.needs_approval({"action": a}) for a in reads)
    assert tool.refusal({"action": "rename"}) == "[rename rejected by the user]"


# ---- navigation (pylsp) --------------------------------------------------------------------------------------


def test_definition_from_the_importing_file(pylsp):
    assert pylsp.run(action="definition", path="app.py", symbol="make_greeting") == (
        "greetings.py:16:5  def make_greeting(name: str) -> str:"
    )


def test_symbol_on_a_comment_line_is_tried_last(pylsp):
    # greetings.py mentions make_greeting in a comment on line 3, before any code: the code lines answer.
    assert pylsp.run(action="definition", path="greetings.py", symbol="'make_greeting',") == (
        "greetings.py:16:5  def make_greeting(name: str) -> str:"
    )


def test_definition_by_line_and_column(pylsp):
    assert pylsp.run(action="definition", path="app.py", line=8, column=21) == "greetings.py:6:7  class Person:"
    assert pylsp.run(action="definition", path="app.py", symbol="Person", line=8) == "greetings.py:6:7  class Person:"


def test_references_sorted_with_the_declaration(pylsp):
    assert pylsp.run(action="references", path="greetings.py", symbol="Person") == (
        "4 reference(s):\n"
        "app.py:3:23  from greetings import Person, make_greeting\n"
        'app.py:8:20  for person in [Person("Ada"), Person("Linus")]:\n'
        'app.py:8:35  for person in [Person("Ada"), Person("Linus")]:\n'
        "greetings.py:6:7  class Person:"
    )


def test_hover(pylsp):
    text = pylsp.run(action="hover", path="app.py", symbol="make_greeting")
    assert "make_greeting(name: str) -> str" in text
    assert "Return the greeting for name." in text


def test_symbols_indented(pylsp):
    # pylsp answers with flat SymbolInformation; the tree comes from the ranges.
    assert pylsp.run(action="symbols", path="greetings.py") == (
        "class Person  line 6\n"
        "  method __init__  line 9\n"
        "    field name  line 10\n"
        "  method greet  line 12\n"
        "function make_greeting  line 16"
    )


def test_no_definition_for_a_word_only_in_a_comment(pylsp):
    assert pylsp.run(action="definition", path="greetings.py", symbol="builds") == (
        "[lsp: no definition found for the symbol at greetings.py:3:17]"
    )


def test_failures_are_bracketed_texts(pylsp):
    assert pylsp.run(action="definition", path="notes.md", symbol="x") == (
        '[lsp: no language server for "notes.md" — configured: pylsp (.py)]'
    )
    assert pylsp.run(action="definition", path="app.py", symbol="foo") == '[lsp: "foo" not found in app.py]'
    assert pylsp.run(action="hover", path="app.py", line=3, column=60) == (
        "[lsp: column 60 is past the end of line 3 (43 characters)]"
    )
    assert pylsp.run(action="hover", path="missing.py", symbol="x") == "[lsp: missing.py does not exist]"
    for outside in ("../outside.py", "/etc/passwd.py"):
        assert pylsp.run(action="hover", path=outside, symbol="x") == f"[lsp: {outside} is outside the workspace]"
    long_name = "x" * 300 + ".py"
    assert pylsp.run(action="hover", path=long_name, symbol="x") == f"[lsp: {long_name}: File name too long]"
    assert pylsp.run(action="rename", path="app.py", symbol="main") == (
        '[lsp: rename needs new_name — call lsp again with {"action": "rename", "path": …, "symbol": …, '
        '"new_name": "<the new identifier>"}; do not use edit_file for a rename]'
    )


# ---- diagnostics and rename (pylsp) ----------------------------------------------------------------------------


def test_diagnostics_after_an_edit_on_disk(pylsp):
    path = pylsp.root / "greetings.py"
    original = path.read_text()
    path.write_text(original + "\n\nprint(undefined_thing)\n")
    try:
        assert pylsp.run(action="diagnostics", path="greetings.py") == (
            "1 diagnostic(s) in greetings.py:\nerror greetings.py:21:7 undefined name 'undefined_thing' [pyflakes]"
        )
    finally:
        path.write_text(original)
    assert pylsp.run(action="diagnostics", path="greetings.py") == "no diagnostics: greetings.py is clean"
    # Nothing moved since the server last spoke: its last publication is the answer, at once.
    assert pylsp.run(action="diagnostics", path="greetings.py") == (
        "no diagnostics: greetings.py is clean (as last published)"
    )


def test_rename_across_two_files(pylsp):
    greetings, app = pylsp.root / "greetings.py", pylsp.root / "app.py"
    before = greetings.read_text(), app.read_text()

    preview = pylsp.preview(action="rename", path="greetings.py", symbol="make_greeting", new_name="build_greeting")
    assert preview.startswith(
        "rename make_greeting → build_greeting: 2 edit(s) in 2 file(s)\n--- a/app.py\n+++ b/app.py"
    )
    assert "-def make_greeting(name: str) -> str:\n+def build_greeting(name: str) -> str:" in preview
    assert (greetings.read_text(), app.read_text()) == before  # a preview writes nothing

    # A small model's one-string form: symbol, line, column and new name.
    assert pylsp.run(action="rename", path="greetings.py", symbol="make_greeting 16 5 build_greeting") == (
        "renamed to build_greeting: 2 edit(s) in 2 file(s)\napp.py: 1 edit(s)\ngreetings.py: 1 edit(s)"
    )
    assert greetings.read_text() == before[0].replace("make_greeting(", "build_greeting(")
    assert "make_greeting builds the text" in greetings.read_text()  # jedi renames code, not comments
    assert app.read_text() == before[1].replace("make_greeting", "build_greeting")
    # The server was told: the next question is answered on the renamed code.
    assert pylsp.run(action="definition", path="app.py", symbol="build_greeting") == (
        "greetings.py:16:5  def build_greeting(name: str) -> str:"
    )
    assert pylsp.run(action="rename", path="app.py", symbol="build_greeting", new_name="make_greeting").startswith(
        "renamed to make_greeting: 2 edit(s) in 2 file(s)"
    )
    assert (greetings.read_text(), app.read_text()) == before


def test_a_rename_is_judged_by_every_file_it_would_write(pylsp):
    """The rename is asked on greetings.py, and also edits app.py: a path rule on app.py judges it through the
    plan's files (the loop passes them to mm_core.policy.judge), not only through the file it names."""
    args = {"action": "rename", "path": "greetings.py", "symbol": "make_greeting", "new_name": "build_greeting"}
    plan = pylsp.plan(**args)
    assert sorted(plan.paths) == ["app.py", "greetings.py"]
    rules = [Rule(name="entry point", paths=["app.py"], ask=2)]
    assert judge(rules, "lsp", args, pylsp.root).action == Action.DEFAULT
    verdict = judge(rules, "lsp", args, pylsp.root, plan.paths)
    assert (verdict.action, verdict.approvals, verdict.rule) == (Action.ASK, 2, "entry point")
    assert verdict.matched == "app.py"


def test_rename_moves_past_an_occurrence_the_server_proposes_nothing_for(pylsp):
    # The first whole-word occurrence is inside a string: pylsp answers it with an empty edit, which is no
    # answer, so the next occurrence (the definition) is tried.
    path = pylsp.root / "labels.py"
    path.write_text('LABEL = "shout"\n\n\ndef shout():\n    return LABEL\n\n\nshout()\n')
    try:
        assert pylsp.run(action="rename", path="labels.py", symbol="shout", new_name="yell") == (
            "renamed to yell: 1 edit(s) in 1 file(s)\nlabels.py: 1 edit(s)"  # pylsp: one edit, the whole file
        )
        assert path.read_text() == 'LABEL = "shout"\n\n\ndef yell():\n    return LABEL\n\n\nyell()\n'
    finally:
        path.unlink()


# ---- UTF-16 on the wire (basedpyright) -------------------------------------------------------------------------


def test_utf16_columns_after_emoji(pyright):
    # Line 7 is `party = "🎉🎉"; print(make_greeting(party))`: each 🎉 is two UTF-16 units on the wire and one
    # character at the tool's boundary.
    # pyright indexes the other files in the background, so which of them it already knows varies; the lines of
    # the file asked about are always there.
    lines = pyright.run(action="references", path="app.py", symbol="make_greeting").splitlines()
    assert lines[0] == f"{len(lines) - 1} reference(s):"
    assert lines[1:3] == [
        "app.py:3:31  from greetings import Person, make_greeting",
        'app.py:7:25  party = "🎉🎉"; print(make_greeting(party))',
    ]
    assert "greetings.py:16:5  def make_greeting(name: str) -> str:" in lines
    assert "def make_greeting(name: str) -> str" in pyright.run(action="hover", path="app.py", line=7, column=30)
    assert pyright.run(action="definition", path="app.py", line=7, column=40) == (
        'app.py:7:5  party = "🎉🎉"; print(make_greeting(party))'
    )


def test_utf16_rename_after_emoji(pyright):
    app = pyright.root / "app.py"
    before = app.read_text()
    assert pyright.run(action="rename", path="app.py", symbol="party", new_name="fête") == (
        "renamed to fête: 2 edit(s) in 1 file(s)\napp.py: 2 edit(s)"
    )
    assert app.read_text() == before.replace("party", "fête")
    assert pyright.run(action="rename", path="app.py", symbol="fête", new_name="party").startswith("renamed to party")
    assert app.read_text() == before


# ---- a second Python server (jedi-language-server) -------------------------------------------------------------


def test_jedi_language_server(jedi):
    assert jedi.run(action="definition", path="app.py", symbol="make_greeting") == (
        "greetings.py:16:5  def make_greeting(name: str) -> str:"
    )
    # jedi-language-server negotiates UTF-32 (it counts code points): the column after the emoji is right too.
    assert jedi.run(action="references", path="app.py", symbol="party") == (
        "2 reference(s):\n"
        'app.py:7:5  party = "🎉🎉"; print(make_greeting(party))\n'
        'app.py:7:39  party = "🎉🎉"; print(make_greeting(party))'
    )
    assert jedi.run(action="symbols", path="greetings.py").splitlines()[:2] == [
        "class Person  [class Person]  line 6",
        "  method __init__  [def __init__]  line 9",
    ]
    path = jedi.root / "app.py"
    original = path.read_text()
    path.write_text(original + "def (:\n")
    try:
        text = jedi.run(action="diagnostics", path="app.py")
    finally:
        path.write_text(original)
    assert text.startswith("1 diagnostic(s) in app.py:\nerror app.py:14:5 ")
    assert jedi.run(action="diagnostics", path="app.py") == "no diagnostics: app.py is clean"
