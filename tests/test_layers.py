"""The shape of the house, checked on the source rather than by eye.

- Imports run one way: commands → playground → bot → workers → slackio (the Slack side both share) → migrations →
  chatops (the foundation) → mm_core.
  The agent core never knows the service, the foundation never knows Slack's or Celery's side, and nothing in the
  product imports the test kit.
- No import cycle between modules, counting imports made inside functions (a lazy import is still an arrow).
- No module reaches into another's private names (`from x import _y`, `x._y`).

Each rule is also run on a small tree made to break it, so a rule that stopped seeing anything would fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A package may import packages of its own rank or lower, never higher; equal ranks may not import each other.
# The playground (a local stand-in for Slack and a model) is a front end: it may use everything below it.
RANK = {
    "mm_core": 0,
    "chatops": 1,
    "migrations": 2,
    "slackio": 3,
    "workers": 4,
    "bot": 5,
    "playground": 6,
    "commands": 7,
}
PRODUCT = tuple(RANK)
# The test kit stands beside the product: it may import the product, the product may never import it.
KIT = "mm_testkit"


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # the module imported (a submodule when `from package import submodule`)
    names: tuple[str, ...]  # the names taken from it (`from target import a, b`); () for `import target`
    line: int
    type_only: bool  # inside `if TYPE_CHECKING:`


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    yield from visit_stmt(stmt, True)
                for stmt in child.orelse:
                    yield from visit_stmt(stmt, type_only)
            else:
                yield from visit_stmt(child, type_only)

    def visit_stmt(node: ast.AST, type_only: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, (), node.lineno, type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:  # `from package import submodule`
                    yield Import(name, sub, (), node.lineno, type_only)
                else:
                    yield Import(name, base, (alias.name,), node.lineno, type_only)
        yield from visit(node, type_only)

    yield from visit(tree, False)


def project_target(target: str, known: set[str]) -> str | None:
    """The project module an import names (itself, or the package it is an attribute of), else None."""
    while target:
        if target in known:
            return target
        target = target.rpartition(".")[0]
    return None


def top(module: str) -> str:
    return module.split(".")[0]


def layer_violations(root: Path) -> list[str]:
    found = modules(root, (*PRODUCT, KIT))
    known = set(found)
    problems = []
    for name, path in found.items():
        for imp in imports_of(name, path, known):
            target = project_target(imp.target, known)
            if target is None or top(target) == top(name):
                continue
            src, dst = top(name), top(target)
            if dst == KIT:
                problems.append(f"{path.relative_to(root)}:{imp.line}: {name} imports the test kit ({target})")
            elif src in RANK and RANK[dst] >= RANK[src]:
                problems.append(f"{path.relative_to(root)}:{imp.line}: {name} → {target} runs against the layers")
    return problems


def cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    found = modules(root, packages)
    known = set(found)
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for imp in imports_of(name, path, known):
            target = project_target(imp.target, known)
            if target is not None and target != name and not imp.type_only:
                graph[name].add(target)
    return [sorted(c) for c in _strongly_connected(graph) if len(c) > 1]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (a deep package must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def private_reaches(root: Path, packages: tuple[str, ...]) -> list[str]:
    """`from m import _x`, `import m._x` from outside m's package, and `m._x` on an imported module."""
    found = modules(root, packages)
    known = set(found)
    problems = []
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_aliases: dict[str, str] = {}
        for imp in imports_of(name, path, known):
            target = project_target(imp.target, known)
            if target is None or target == name:
                continue
            where = f"{path.relative_to(root)}:{imp.line}"
            for n in imp.names:
                if _private(n):
                    problems.append(f"{where}: {name} imports {target}.{n}")
            leaf = target.rpartition(".")[2]
            parent = target.rpartition(".")[0]
            # A package's own modules, and the package itself (which re-exports them, as httpx does), may.
            if _private(leaf) and name != parent and not name.startswith(parent + "."):
                problems.append(f"{where}: {name} imports the private module {target}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in known:
                        module_aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.asname:
                        module_aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
                and _private(node.attr)
            ):
                target = module_aliases[node.value.id]
                problems.append(f"{path.relative_to(root)}:{node.lineno}: {name} uses {target}.{node.attr}")
    return problems


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# --- the rules, on this repository ----------------------------------------------------------------------------


def test_imports_run_one_way():
    assert layer_violations(ROOT) == []


def test_no_import_cycles_in_the_product():
    assert cycles(ROOT, (*PRODUCT, KIT)) == []


def test_no_module_reaches_into_another_ones_private_names():
    assert private_reaches(ROOT, (*PRODUCT, KIT, "tests", "bench")) == []


# --- the rules can fail ---------------------------------------------------------------------------------------


@pytest.fixture
def broken_tree(tmp_path: Path) -> Path:
    files = {
        "mm_core/__init__.py": "",
        "mm_core/agent.py": "from mm_core import tools\n",
        "mm_core/tools/__init__.py": "def build():\n    from mm_core.tools import ask\n",
        "mm_core/tools/ask.py": "def run():\n    from mm_core.agent import Agent\n",
        "chatops/__init__.py": "",
        "chatops/db.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from commands.doctor import x\n",
        "chatops/store.py": "from chatops import db\nfrom mm_core.agent import _parse\nx = db._run\n",
        "commands/__init__.py": "",
        "commands/doctor.py": "from chatops.db import engine\n",
        "bot/__init__.py": "",
        "bot/app.py": "import mm_testkit.fixtures_kit\n",
        "workers/__init__.py": "",
        "workers/tasks.py": "from bot import app\n",
        "mm_testkit/__init__.py": "",
        "mm_testkit/fixtures_kit.py": "",
        "migrations/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_a_back_arrow_a_cycle_and_a_private_reach_are_each_found(broken_tree: Path):
    layers = layer_violations(broken_tree)
    assert any("chatops.db → commands.doctor" in p for p in layers)  # type-only imports count for layers
    assert any("bot.app imports the test kit" in p for p in layers)
    assert any("workers.tasks → bot.app" in p for p in layers)
    assert not any("commands.doctor" in p and p.startswith("commands") for p in layers)
    assert cycles(broken_tree, PRODUCT) == [["mm_core.agent", "mm_core.tools", "mm_core.tools.ask"]]
    private = private_reaches(broken_tree, PRODUCT)
    assert any("imports mm_core.agent._parse" in p for p in private)
    assert any("uses chatops.db._run" in p for p in private)
