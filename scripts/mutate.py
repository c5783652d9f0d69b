"""Mutation testing for the core modules: does some test fail when the code is subtly wrong?

    .venv/bin/python scripts/mutate.py [--module mm_core/loopdetect.py ...] [--max 40] [--seed 0] [--list]

For each target module a small AST mutator lists the mutants (below), a deterministic sample of at most `--max`
of them is kept, and each one runs against the module's covering tests (MODULES). A mutant is *killed* when a
test fails, *timeout* when the tests hang past the budget (counted as killed: a hang is noticed), and
*survived* when every test passes: a behaviour that no test pins, or an equivalent mutant (EQUIVALENT). The
covering tests first run unmutated and must pass (else every mutant would look killed); the exit status is 1
while a survivor is neither killed by a new test nor judged equivalent.

Mutants are spliced into the source text (the rest of the file stays byte for byte, line numbers included),
written into a COPY of the tree (one per job), never into the working tree that other people edit. pytest
runs there with cwd and PYTHONPATH set to the copy, so the `python` and `mm-bot` children the tests spawn
import the mutant too (the editable install's finder comes after PYTHONPATH on sys.path; the script checks).
No bytecode is written or copied: a mutant of the same size saved within the same second would otherwise be
shadowed by the original's stale .pyc.

Operators: comparison swapped (< ↔ <=, == ↔ !=, in ↔ not in, is ↔ is not), and ↔ or, `not` removed, + ↔ -,
constants changed (0 ↔ 1, n → n+1, True ↔ False, a string emptied), `return x` → `return None`, an `if` /
`while` / conditional-expression test forced True and False, continue ↔ break, a slice bound shifted by one,
a statement replaced by `pass`, an element dropped from a tuple (a key that forgets a part). Docstrings,
annotations and f-string internals are left alone.

Time: the test_agent_restart sweeps spawn and kill real processes (about 30 s a run); they are kept for
mm_core/state.py and mm_core/loopdetect.py, whose replay after a restart is what they check, and listed
last so a mutant killed by a fast test never reaches them. A full run of the five modules at the default cap
takes about twenty minutes on two cores. PostgreSQL tests create their own `mmtest_<pid>_<random>` databases
and Redis keys (mm_testkit/fixtures_services.py), so the two jobs never collide.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["mm_core", "chatops", "bot", "workers", "commands", "mm_testkit", "migrations", "tests"]
ROOT_FILES = ["pyproject.toml", "alembic.ini"]
MAX_JOBS = 2  # the machine has two cores; more jobs only slow each other down (and time out)

# Each module's covering tests, cheapest and most direct first: with -x the first failure ends the run.
MODULES: dict[str, list[str]] = {
    "mm_core/tools/edit.py": [
        "tests/test_pins_edit.py",
        "tests/test_tool_edit.py",
        "tests/test_workspace_security.py",
        "tests/test_agent_loop.py",
    ],
    "mm_core/tools/fetch/guard.py": ["tests/test_pins_guard.py", "tests/test_fetch_tool.py"],
    "mm_core/loopdetect.py": [
        "tests/test_pins_loopdetect.py",
        "tests/test_agent_loop.py",
        "tests/test_agent_restart.py",
    ],
    "mm_core/state.py": [
        "tests/test_pins_state.py",
        "tests/test_state_incremental.py",
        "tests/test_agent_loop.py",
        "tests/test_ask_agent.py",
        "tests/test_agent_restart.py",
    ],
    "chatops/store.py": ["tests/test_pins_store.py", "tests/test_store.py", "tests/test_inbox.py"],
}

# Survivors judged equivalent: no input tells them from the original. Keyed by (module, enclosing function,
# original → mutant) rather than by line, so the judgement outlives edits above it. One line of why each.
_UNREACHED_GLOBAL = (
    "a safety net no address reaches on this Python: is_global is `not is_private` (IPv4: and not 100.64/10), "
    "and private and carrier-grade NAT addresses are refused above it"
)
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("mm_core/tools/edit.py", "find", "core != old → True"): (
        "when core == old the edges pass searches what the exact pass already found nowhere: [] either way"
    ),
    ("mm_core/tools/edit.py", "_shift", "levels >= 0 → levels > 0"): (
        "at levels == 0 the other branch gives file_base[:len(file_base)] + rest, the same text"
    ),
    ("mm_core/tools/edit.py", "_shift", "levels >= 0 → levels >= 1"): (
        "at levels == 0 the other branch gives file_base[:len(file_base)] + rest, the same text"
    ),
    (
        "mm_core/tools/edit.py",
        "relaxed_replacement",
        "text[line_start:start] → text[line_start:start + 1] @col83",
    ): "mid-line, the text before the match holds a non-blank, so its leading blanks end before the added char",
    ("mm_core/state.py", "_Transcript.of", "i + 1 → i + 0"): (
        "the Compaction entry itself then stays in the list, and the transcript sends only user and assistant entries"
    ),
    ("mm_core/state.py", "_Transcript.of", "entries[e.keep_from:i] → entries[e.keep_from:i + 1]"): (
        "the Compaction entry itself then stays in the list, and the transcript sends only user and assistant entries"
    ),
    ("chatops/store.py", "_upsert_call", "values → True"): (
        "every caller passes a tool, a status or a decision, never all None: values is never empty"
    ),
    ("chatops/store.py", "ensure_session", "continue → pass"): "the continue is the last statement of the loop body",
    ("mm_core/tools/fetch/guard.py", "blocked_kind", 'if not ip.is_global: return "a reserved address" → pass'): (
        _UNREACHED_GLOBAL
    ),
    ("mm_core/tools/fetch/guard.py", "blocked_kind", "not ip.is_global → False"): _UNREACHED_GLOBAL,
    ("mm_core/tools/fetch/guard.py", "GuardedBackend.connect_tcp", "assert failure is not None → pass"): (
        "reached only with no address at all, which resolve never returns (a literal is one, getaddrinfo raises "
        "rather than answer nothing); both versions then raise"
    ),
}


# --------------------------------------------------------------------------------------------- mutants


@dataclass(frozen=True)
class Mutant:
    module: str
    line: int
    where: str  # the enclosing function, dotted
    original: str
    mutated: str
    source: str = field(repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.where, f"{self.original} → {self.mutated}")


_COMPARE_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
# Statements that replacing by `pass` says something about (imports and definitions only break loading).
_DELETABLE = (
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Expr,
    ast.Raise,
    ast.If,
    ast.For,
    ast.While,
    ast.With,
    ast.Try,
    ast.Assert,
    ast.Delete,
    ast.Continue,
    ast.Break,
)


class _Splicer:
    """Maps the AST's (line, UTF-8 byte column) positions to offsets in the text, and splices replacements."""

    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        text = self.lines[line - 1]
        return self.starts[line - 1] + len(text.encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return start, end

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end]

    def replace(self, node: ast.AST, text: str, *, expression: bool) -> str:
        """The source with `node` replaced by `text`, padded with newlines so that later lines keep their
        numbers (inside the parentheses of an expression; after a statement)."""
        start, end = self.span(node)
        spanned = self.source.count("\n", start, end)
        text = f"({text}{chr(10) * spanned})" if expression else text + "\n" * spanned
        return self.source[:start] + text + self.source[end:]


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Nodes not worth mutating: docstrings, annotations (strings under `from __future__ import annotations`)
    and everything inside an f-string (whose positions are unreliable before Python 3.12)."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            first = body[0].value
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                mark(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                mark(arg.annotation)
            for arg in (node.args.vararg, node.args.kwarg):
                mark(arg.annotation if arg else None)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
    return skip


def _scopes(tree: ast.AST) -> tuple[dict[int, str], dict[int, bool], dict[int, ast.AST]]:
    """For each node: its enclosing function or class, dotted (`<module>` at the top level); whether that
    scope is a function (statements are deleted only there: a class body or the module only break loading);
    and its parent node."""
    where: dict[int, str] = {}
    in_function: dict[int, bool] = {}
    parent: dict[int, ast.AST] = {}

    def visit(node: ast.AST, name: str, function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            where[id(child)], in_function[id(child)], parent[id(child)] = name, function, node
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if name == "<module>" else f"{name}.{child.name}"
                visit(child, inner, not isinstance(child, ast.ClassDef))
            else:
                visit(child, name, function)

    visit(tree, "<module>", False)
    return where, in_function, parent


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _unparse(node: ast.AST) -> str:
    return ast.unparse(node)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 70 else text[:67] + "..."


def mutants_of(module: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    splice = _Splicer(source)
    skip = _skipped_nodes(tree)
    where, in_function, parent = _scopes(tree)
    found: dict[str, Mutant] = {}
    keys: set[tuple[str, str, str]] = set()

    def add(node: ast.AST, replacement: str, *, expression: bool = True) -> None:
        mutated = splice.replace(node, replacement, expression=expression)
        if mutated == source or mutated in found:
            return
        try:
            compile(mutated, module, "exec")
        except SyntaxError:
            return
        original, shown = splice.segment(node), replacement
        context = parent.get(id(node))
        while isinstance(context, ast.Slice):
            context = parent.get(id(context))
        if isinstance(node, (ast.Constant, ast.Name)) and isinstance(context, ast.expr):
            # `1 → 0` says little: show the expression around it (`self.run + 1 → self.run + 0`) when it is short.
            (start, end), (outer_start, outer_end) = splice.span(node), splice.span(context)
            if len(_short(source[outer_start:outer_end])) <= 60:
                original = source[outer_start:outer_end]
                shown = source[outer_start:start] + replacement + source[end:outer_end]
        line = node.lineno  # type: ignore[attr-defined]
        mutant = Mutant(module, line, where.get(id(node), "<module>"), _short(original), _short(shown), mutated)
        if mutant.key in keys:  # the same text twice in one function: the column tells them apart
            mutant = replace(mutant, mutated=f"{mutant.mutated} @col{node.col_offset}")  # type: ignore[attr-defined]
        keys.add(mutant.key)
        found[mutated] = mutant

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                swap = _COMPARE_SWAP.get(type(op))
                if swap is not None:
                    ops = list(node.ops)
                    ops[i] = swap()
                    add(node, _unparse(ast.Compare(node.left, ops, node.comparators)))
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            add(node, _unparse(ast.BoolOp(other, node.values)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            add(node, _unparse(node.operand))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            other = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
            add(node, _unparse(ast.BinOp(node.left, other, node.right)))
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                add(node, repr(not value))
            elif isinstance(value, int):
                add(node, repr({0: 1, 1: 0}.get(value, value + 1)))
            elif isinstance(value, str):
                add(node, '""' if value else '"x"')
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            for bound in ("lower", "upper"):
                value = getattr(node.slice, bound)
                if value is not None:
                    add(value, f"{_unparse(value)} + 1")
        elif isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Load) and len(node.elts) > 1:
            for i in range(len(node.elts)):
                rest = node.elts[:i] + node.elts[i + 1 :]
                add(node, _unparse(ast.Tuple(rest, ast.Load())))
        elif isinstance(node, ast.IfExp):
            add(node.test, "True")
            add(node.test, "False")

        if isinstance(node, (ast.If, ast.While)):
            add(node.test, "True")
            add(node.test, "False")
        if isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
            add(node.value, "None")
        if isinstance(node, ast.Continue):
            add(node, "break", expression=False)
        elif isinstance(node, ast.Break):
            add(node, "continue", expression=False)
        if isinstance(node, _DELETABLE) and in_function.get(id(node), False):
            add(node, "pass", expression=False)
    return sorted(found.values(), key=lambda m: (m.line, m.original, m.mutated))


def sample(mutants: list[Mutant], cap: int, seed: int) -> list[Mutant]:
    """At most `cap` of them, the same ones on every run with the same seed and the same source."""
    if len(mutants) <= cap:
        return mutants
    chosen = random.Random(f"{seed}:{mutants[0].module}").sample(range(len(mutants)), cap)
    return [mutants[i] for i in sorted(chosen)]


# ---------------------------------------------------------------------------------------------- running


def make_copy(into: Path) -> Path:
    """The product packages and tests, without caches and bytecode, as a tree pytest can run in."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", "*.egg-info")
    for name in PACKAGES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, into / name, ignore=ignore, symlinks=True)
    for name in ROOT_FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, into / name)
    return into


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["VIRTUAL_ENV"] = str(ROOT / ".venv")
    env["PATH"] = os.pathsep.join([str(ROOT / ".venv" / "bin"), env.get("PATH", "")])
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_copy_is_imported(copy: Path) -> None:
    """A child `python` must import the copy's packages, or every mutant would run the original code."""
    out = subprocess.run(
        [sys.executable, "-c", "import mm_core, chatops; print(mm_core.__file__); print(chatops.__file__)"],
        cwd=copy,
        env=environment(copy),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not all(Path(p).is_relative_to(copy) for p in out):
        sys.exit(f"mutate: a child process imports {out}, not the copy in {copy}: mutants would not reach it")


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout', seconds, the output's tail)."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    started = time.monotonic()
    # A session of its own: on a timeout the whole group goes, the children the tests spawned included.
    process = subprocess.Popen(
        command,
        cwd=copy,
        env=environment(copy),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=timeout)
        status = "passed" if process.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        status = "timeout"
    return status, time.monotonic() - started, "\n".join(out.strip().splitlines()[-3:])


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | timeout | survived
    seconds: float


class Jobs:
    """Copies of the tree, one per job; a job takes a free copy, writes the mutant, runs, restores."""

    def __init__(self, base: Path, count: int):
        self.free = [make_copy(base / f"job{i}") for i in range(count)]
        self.lock = threading.Lock()
        check_copy_is_imported(self.free[0])

    def run(self, mutant: Mutant, tests: list[str], timeout: float) -> Outcome:
        with self.lock:
            copy = self.free.pop()
        target = copy / mutant.module
        original = target.read_text()
        try:
            target.write_text(mutant.source)
            status, seconds, _ = run_tests(copy, tests, timeout)
        finally:
            target.write_text(original)
            with self.lock:
                self.free.append(copy)
        return Outcome(mutant, {"passed": "survived", "failed": "killed"}.get(status, status), seconds)


def run_module(jobs: Jobs, module: str, mutants: list[Mutant], total: int) -> list[Outcome]:
    tests = MODULES[module]
    # The unmutated tests must pass in the copy, or every mutant would look killed.
    status, baseline, tail = run_tests(jobs.free[0], tests, timeout=1800)
    if status != "passed":
        sys.exit(f"mutate: {module}: the covering tests fail without any mutant:\n{tail}")
    timeout = baseline * 3 + 30
    print(
        f"\n{module}: {len(mutants)} of {total} mutants, tests {baseline:.0f}s unmutated, timeout {timeout:.0f}s",
        flush=True,
    )
    outcomes: list[Outcome] = []
    with concurrent.futures.ThreadPoolExecutor(len(jobs.free)) as pool:
        futures = [pool.submit(jobs.run, m, tests, timeout) for m in mutants]
        for future in concurrent.futures.as_completed(futures):
            outcome = future.result()
            outcomes.append(outcome)
            m = outcome.mutant
            print(
                f"  [{len(outcomes):>3}/{len(mutants)}] {outcome.status:<8} {outcome.seconds:5.1f}s "
                f"{m.module}:{m.line} {m.original} → {m.mutated}",
                flush=True,
            )
    return sorted(outcomes, key=lambda o: (o.mutant.line, o.mutant.original, o.mutant.mutated))


def report(results: dict[str, tuple[int, list[Outcome]]]) -> int:
    """Print the table and the survivors; the exit status is 1 while any survivor is not judged equivalent."""
    print("\nmodule                          mutants  killed  timeout  survived  equivalent  score")
    unjudged: list[Outcome] = []
    equivalent: list[Outcome] = []
    for module, (total, outcomes) in results.items():
        counts = Counter(o.status for o in outcomes)
        eq = [o for o in outcomes if o.status == "survived" and o.mutant.key in EQUIVALENT]
        equivalent += eq
        unjudged += [o for o in outcomes if o.status == "survived" and o.mutant.key not in EQUIVALENT]
        killed = counts["killed"] + counts["timeout"]
        scored = len(outcomes) - len(eq)
        score = f"{killed}/{scored} = {100 * killed / scored:.0f}%" if scored else "-"
        print(
            f"{module:<32}{len(outcomes):>4}/{total:<4}{counts['killed']:>6}{counts['timeout']:>9}"
            f"{counts['survived']:>10}{len(eq):>12}  {score}"
        )
    if equivalent:
        print("\nsurvivors judged equivalent:")
        for o in equivalent:
            m = o.mutant
            print(f"  {m.module}:{m.line} ({m.where}) {m.original} → {m.mutated}\n      {EQUIVALENT[m.key]}")
    if unjudged:
        print("\nsurvivors (pin each with a test, or judge it equivalent in EQUIVALENT):")
        for o in unjudged:
            m = o.mutant
            print(f"  {m.module}:{m.line} ({m.where}) {m.original} → {m.mutated}")
            print(f"      key: {m.key!r}")
    return 1 if unjudged else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(MODULES), help="repeatable; default: all")
    parser.add_argument("--max", type=int, default=40, help="mutants per module, sampled deterministically")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=MAX_JOBS, choices=range(1, MAX_JOBS + 1))
    parser.add_argument("--grep", help="only the mutants whose `original → mutant` text contains this")
    parser.add_argument("--list", action="store_true", help="list the sampled mutants, run nothing")
    args = parser.parse_args(argv)
    modules = args.module or list(MODULES)
    chosen: dict[str, tuple[int, list[Mutant]]] = {}
    for module in modules:
        everything = mutants_of(module, (ROOT / module).read_text())
        if args.grep:
            everything = [m for m in everything if args.grep in f"{m.original} → {m.mutated}"]
        chosen[module] = (len(everything), sample(everything, args.max, args.seed))
    if args.list:
        for module, (total, mutants) in chosen.items():
            print(f"{module}: {len(mutants)} of {total}")
            for m in mutants:
                print(f"  {m.line:>4} ({m.where}) {m.original} → {m.mutated}")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mm-mutate-") as base:
        jobs = Jobs(Path(base), args.jobs)
        results = {
            module: (total, run_module(jobs, module, mutants, total)) for module, (total, mutants) in chosen.items()
        }
    status = report(results)
    print(f"\n{time.monotonic() - started:.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
