"""Mutation testing of the modules that decide: does some test fail when the code is subtly wrong?

    make mutate MUTATE_ARGS="--module chatops/inbox.py --max 20"
    .venv/bin/python scripts/mutate.py [--module chatops/inbox.py ...] [--max 40] [--seed 0] [--list] [--grep TEXT]

The modules (MODULES): the core's edit matcher, fetch guard, loop detector and session state, and the service's
store, inbox, session life cycle, lease keeper, approver checks, workspaces, repository policy, schedule,
secret masking and egress policy.

For each target module a small AST mutator lists the mutants (below), a deterministic sample of at most `--max`
of them is kept, and each one runs against the module's covering tests (MODULES). A mutant is *killed* when a
test fails, *timeout* when the tests hang past the budget (counted as killed: a hang is noticed), and
*survived* when every test passes: a behaviour that no test pins, or an equivalent mutant (EQUIVALENT). The
covering tests first run unmutated and must pass (else every mutant would look killed); the exit status is 1
while a survivor is neither killed by a new test nor judged equivalent.

Mutants are spliced into the source text (the rest of the file stays byte for byte, line numbers included),
written into a COPY of the tree as git sees it (one per job), never into the working tree that other people
edit. pytest
runs there with cwd and PYTHONPATH set to the copy, so the `python` and `mm-bot` children the tests spawn
import the mutant too (the editable install's finder comes after PYTHONPATH on sys.path; the script checks).
No bytecode is written or copied: a mutant of the same size saved within the same second would otherwise be
shadowed by the original's stale .pyc.

Operators: comparison swapped (< ↔ <=, == ↔ !=, in ↔ not in, is ↔ is not), and ↔ or, `not` removed, + ↔ -,
constants changed (0 ↔ 1, n → n+1, True ↔ False, a string emptied), `return x` → `return None`, an `if` /
`while` / conditional-expression test forced True and False, continue ↔ break, a slice bound shifted by one,
a statement replaced by `pass`, an element dropped from a tuple (a key that forgets a part). Docstrings,
annotations, `if TYPE_CHECKING:` imports and f-string internals are left alone.

Time: the test_agent_restart sweeps spawn and kill real processes (about 30 s a run); they are kept for
mm_core/state.py and mm_core/loopdetect.py, whose replay after a restart is what they check, and listed
last so a mutant killed by a fast test never reaches them. A full run of every module at the default cap
takes about 35 minutes on two cores, one module a few minutes. Two jobs run side by side, as xdist workers do:
PostgreSQL tests create their own `mmtest_<pid>_<random>` databases and Redis keys
(mm_testkit/fixtures_services.py), and tests find the processes they started by descent and pid
(mm_testkit/processes.py), never by looking at every process on the machine, so the two jobs never collide.
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
        "tests/test_images_to_model.py",
        "tests/test_state_incremental.py",
        "tests/test_agent_loop.py",
        "tests/test_ask_agent.py",
        "tests/test_agent_restart.py",
    ],
    "chatops/store.py": ["tests/test_pins_store.py", "tests/test_store.py", "tests/test_inbox.py"],
    # The service's modules that decide: what is queued and who owns a session, who may approve, which
    # repositories and workspaces a request reaches, when a job runs, what is masked, where a command connects.
    "chatops/inbox.py": [
        "tests/test_inbox.py",
        "tests/test_store.py",
        "tests/test_sessions.py",
        "tests/test_inbox_writer.py",
    ],
    "chatops/sessions.py": [
        "tests/test_sessions.py",
        "tests/test_inbox.py",
        "tests/test_store.py",
        "tests/test_push_waits.py",
    ],
    "workers/leases.py": ["tests/test_leases.py", "tests/test_inbox.py"],
    "bot/authorize.py": ["tests/test_authorize.py", "tests/test_workspace_clicks.py"],
    "chatops/teams.py": ["tests/test_teams.py", "tests/test_workspace_clicks.py"],
    "chatops/repos.py": ["tests/test_repo_policy.py"],
    "chatops/schedule.py": ["tests/test_schedule.py"],
    "chatops/secrets.py": ["tests/test_secrets.py", "tests/test_config.py", "tests/test_slack_out.py"],
    "mm_core/network/policy.py": ["tests/test_egress_policy.py"],
}

# Survivors judged equivalent: no input tells them from the original. Keyed by (module, enclosing function,
# original → mutant) rather than by line, so the judgement outlives edits above it. One line of why each.
_UNREACHED_GLOBAL = (
    "a safety net no address reaches on this Python: is_global is `not is_private` (IPv4: and not 100.64/10), "
    "and private and carrier-grade NAT addresses are refused above it"
)
_REASON_OF_A_NO = (
    "why a group could not be checked is read only when the answer is no (may_approve, may_reject, the budget's "
    "and the admin's checks): a reason beside a yes is never shown"
)
_MEMBERS = "the turn compares the reason with the enum's members and never reads its text: any two values differ"
_FROZEN = (
    "`@dataclass(frozen=True)` → `frozen=False`: no code assigns to a snapshot or a step, nor hashes one (a set, "
    "a dict key): frozen only guards against a change nobody makes"
)
_REBUILT = (
    "drops an index the state keeps up to date (the loop detector, the transcript) where it could keep it: the next "
    "question builds it again from the entries, the same answer (test_state_incremental compares the two on random "
    "logs); only the time differs, which bench/bench_loop.py measures"
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
    ("mm_core/state.py", "_Transcript.of", "entries[e.keep_from : i] → entries[e.keep_from : i + 1]"): (
        "the Compaction entry itself then stays in the list, and the transcript sends only user and assistant entries"
    ),
    ("mm_core/state.py", "SessionState.append", "call.id in self._results → True"): _REBUILT,
    ("mm_core/state.py", "SessionState.append", "isinstance(entry, Compaction) → True"): _REBUILT,
    ("mm_core/state.py", "user_content", "if not message.images: return message.text → pass"): (
        "a message without images is only asked for unshown (the shown form is made for messages with images), "
        "and its text joined with no image lines is its text"
    ),
    ("mm_core/tools/fetch/guard.py", "GuardedBackend.sleep", "await self.inner.sleep(seconds) → pass"): (
        "httpcore sleeps through its backend only between retries of a connection, and no pool here has retries "
        "(guarded_transport's callers pass none): never called"
    ),
    ("chatops/store.py", "ensure_session", "continue → pass"): "the continue is the last statement of the loop body",
    ("chatops/store.py", "_with_votes", "several → True"): (
        "with no call that needs several people the query asks for the votes of no call and finds none: the same "
        "rows, one query more"
    ),
    ("mm_core/tools/fetch/guard.py", "blocked_kind", 'if not ip.is_global: return "a reserved address" → pass'): (
        _UNREACHED_GLOBAL
    ),
    ("mm_core/tools/fetch/guard.py", "blocked_kind", "not ip.is_global → False"): _UNREACHED_GLOBAL,
    ("chatops/schedule.py", "instant_of", "(high - low) / 2 → (high - low) / 3"): (
        "bisecting by thirds narrows the same interval around the same boundary to a second, and the answer is "
        "that boundary's whole second either way (the jump's end is on a whole second, in (low, high])"
    ),
    ("chatops/schedule.py", "instant_of", "high - low > timedelta(seconds=1) → high - low >= timedelta(seconds=1)"): (
        "one more halving at exactly a second apart keeps `high` in [the jump's end, the jump's end + 1 s), and the "
        "answer is that whole second either way (the jump's end is on a whole second)"
    ),
    (
        "chatops/schedule.py",
        "instant_of",
        "middle.astimezone(tz).replace(tzinfo=None) >= wall → middle.astimezone(tz).replace(tzinfo=None) > wall",
    ): "instant_of bisects only for a skipped wall time, and no instant has a skipped wall time: never equal",
    ("bot/authorize.py", "Approvers._listed", 'True, "" → True, "x"'): _REASON_OF_A_NO,
    ("bot/authorize.py", "Approvers._listed", 'True, "" → True, "x" @col33'): _REASON_OF_A_NO,
    ("chatops/teams.py", "InWorkspace.slack_team_id", "... → pass"): "a Protocol's body is never run",
    ("chatops/teams.py", "InWorkspace.enterprise_id", "... → pass"): "a Protocol's body is never run",
    ("workers/leases.py", "Cancelled", '"stop" → ""'): _MEMBERS,
    ("workers/leases.py", "Cancelled", '"lost" → ""'): _MEMBERS,
    ("chatops/sessions.py", "Snapshot", "True → False"): _FROZEN,
    ("chatops/sessions.py", "Stop", "True → False"): _FROZEN,
    ("chatops/sessions.py", "Wait", "True → False"): _FROZEN,
    ("chatops/sessions.py", "Resume", "True → False"): _FROZEN,
    ("chatops/sessions.py", "Command", "True → False"): _FROZEN,
    ("chatops/sessions.py", "Start", "True → False"): _FROZEN,
    ("chatops/sessions.py", "Idle", "True → False"): _FROZEN,
    ("chatops/sessions.py", "_decisions", 'row.shown or "" → row.shown or "x"'): (
        "a row without its digest approves nothing either way: the loop runs an approved call only when the digest "
        'of what it would show equals `shown`, and a digest is neither empty nor "x" (the Decision kept in the log '
        "carries the other text, which nothing but that comparison reads)"
    ),
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
    """Nodes not worth mutating: docstrings, annotations (strings under `from __future__ import annotations`),
    `if TYPE_CHECKING:` blocks, and everything inside an f-string (whose positions are unreliable before Python
    3.12)."""
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
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            # Imports for the type checker alone: no test can tell them from none (an `else:` runs, and stays).
            skip.add(id(node))
            mark(node.test)
            for statement in node.body:
                mark(statement)
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
    unchanged = ast.dump(tree)
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
        if ast.dump(ast.parse(mutated)) == unchanged:  # `while True` forced True: the same program
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
    """The project's files as git sees them (tracked, and new ones not ignored: no caches, no bytecode, no
    virtualenv), as a tree pytest can run in: tests read the docs, the chart and the README too."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in (os.fsdecode(n) for n in listed.split(b"\0") if n):
        source = ROOT / name
        if source.is_file() or source.is_symlink():  # a file deleted in the working tree is left out
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name, follow_symlinks=False)
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


def warn_stale(module: str, mutants: list[Mutant]) -> None:
    """Say which judgements of the module no longer name any of its mutants (the code they judged changed):
    a stale entry would silently stop covering the mutant it was written for."""
    keys = {m.key for m in mutants}
    for key in EQUIVALENT:
        if key[0] == module and key not in keys:
            print(f"mutate: EQUIVALENT names no mutant of {module} any more (update or remove it): {key!r}")


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
        warn_stale(module, everything)
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
