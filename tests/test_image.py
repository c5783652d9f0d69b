"""The container image, checked without Docker: the Dockerfile against the repository, the CLI and the chart.

The Dockerfile is read by a small parser that follows Docker's rules for comments and continuation lines, and
.dockerignore by a matcher that follows Docker's (the last matching line wins, a pattern that matches a parent
directory matches what is inside it, `!` lets through again). Then: every file the image copies is in the build
context; the entrypoint is the `mm-bot` console script and the default arguments parse with the real CLI; the
image runs as the sandbox's uid; it installs the system programs the sandbox needs and the language servers the
example config names; no line names a registry; and every container of the rendered Helm chart starts a program
that the image has, with arguments the CLI accepts.
"""

from __future__ import annotations

import importlib.metadata
import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from chatops.config import load_config
from commands import cli
from mm_core.tools.sandbox import SANDBOX_UID
from mm_core.tools.sandbox_network import NETWORK_TOOLS

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART = ROOT / "charts" / "mm-chatops"

# The language servers a config may name, by command, and the PyPI package that provides each one. A command
# missing here fails the test: add it, and install its package in the Dockerfile.
LSP_PACKAGES = {
    "pylsp": "python-lsp-server",
    "jedi-language-server": "jedi-language-server",
}
# What the worker runs besides Python: git for the workspaces, bubblewrap for the sandbox, the sandbox's network
# (mm_core/tools/sandbox_network.py, added below from its own table), certificates for HTTPS, tini as PID 1.
SYSTEM_PACKAGES = {"git", "bubblewrap", "ca-certificates", "tini", *NETWORK_TOOLS.values()}
# What a container of the chart may start: the console script (the image's ENTRYPOINT, tini's or not) or a shell.
IMAGE_PROGRAMS = {"mm-bot", "sh", "/bin/sh"}
INIT = ["tini", "--"]
# Directories of a checkout that no build needs (bytecode and tool caches of local runs).
CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis"}


# --- the Dockerfile -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # the rest, continuation lines joined as Docker joins them
    line: int  # where it starts, for messages

    def words(self) -> list[str]:
        """The arguments of the exec form (a JSON array), else the shell form's words."""
        if self.args.startswith("["):
            try:
                value = json.loads(self.args)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        return shlex.split(self.args)


@dataclass
class Stage:
    image: str  # with the ARGs before the first FROM substituted
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"the stage {self.name or self.image} has no {keyword}"
        return found[-1]


def parse_dockerfile(text: str) -> list[Instruction]:
    """Docker's rules: a line ending in a backslash continues on the next one (the two joined without the
    backslash and the newline); a line starting with `#` is a comment, and inside a continued instruction
    comment and empty lines are dropped; the first word is the instruction."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
            raw = raw.lstrip()
        continued = re.search(r"\\[ \t]*$", raw)
        if continued:
            pending.append(raw[: continued.start()])
            continue
        pending.append(raw)
        keyword, *args = re.split(r"\s+", "".join(pending), maxsplit=1)
        instructions.append(Instruction(keyword.upper(), "".join(args).strip(), start))
        pending = []
    assert not pending, f"the instruction at line {start} continues past the end of the file"
    return instructions


def stages(instructions: list[Instruction]) -> list[Stage]:
    """The build's stages, each FROM with what follows it; ARGs declared before the first FROM are expanded
    in FROM lines (by their defaults), as Docker does."""
    global_args: dict[str, str] = {}
    result: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = instruction.words()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args.get(m[1] or m[2], ""), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(image, name, []))
        elif not result:
            assert instruction.keyword == "ARG", f"line {instruction.line}: only ARG may come before the first FROM"
            key, _, default = instruction.args.partition("=")
            global_args[key.strip()] = default.strip()
        else:
            result[-1].instructions.append(instruction)
    return result


def env(stage: Stage) -> dict[str, str]:
    """The stage's ENV, both forms (`ENV K=V K2=V2` and the legacy `ENV K V`); values left unexpanded."""
    values: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        words = shlex.split(instruction.args)
        if "=" not in words[0]:
            values[words[0]] = instruction.args.partition(" ")[2].strip()
            continue
        for word in words:
            key, _, value = word.partition("=")
            values[key] = value
    return values


SHELL_KEYWORDS = {"if", "then", "else", "elif", "fi", "while", "until", "do", "done", "!", "exec"}


def shell_commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a shell script (split at `&&`, `||`, `;` and `|`, leading keywords such as
    `until` or `exec` taken off), as words."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    command: list[str] = []
    for word in [*lexer, ";"]:
        if word in {"&&", "||", ";", "|"}:
            if command:
                yield command
            command = []
        elif command or word not in SHELL_KEYWORDS:
            command.append(word)


def simple_commands(stage: Stage) -> Iterator[list[str]]:
    """The simple commands of the stage's RUN lines."""
    for instruction in stage.all("RUN"):
        yield from shell_commands(instruction.args)


def copies(stage: Stage) -> Iterator[tuple[dict[str, str], list[str], str]]:
    """The stage's COPY and ADD: their flags (`--from=build`), sources and destination."""
    for instruction in stage.all("COPY") + stage.all("ADD"):
        words = instruction.words()
        flags = {}
        while words and words[0].startswith("--"):
            key, _, value = words.pop(0)[2:].partition("=")
            flags[key] = value
        assert len(words) >= 2, f"line {instruction.line}: {instruction.keyword} needs a source and a destination"
        yield flags, words[:-1], words[-1]


def option(command: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in a command's words."""
    for i, word in enumerate(command):
        if word == name and i + 1 < len(command):
            return command[i + 1]
        if word.startswith(f"{name}="):
            return word.partition("=")[2]
    return None


def apt_packages(stage: Stage) -> set[str]:
    packages: set[str] = set()
    for words in simple_commands(stage):
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # DEBIAN_FRONTEND=noninteractive apt-get …
        if words[:2] == ["apt-get", "install"]:
            packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


def pip_installs(stage: Stage) -> dict[str, tuple[str, Requirement]]:
    """What the stage's `pip install` commands install from PyPI, by canonical name: (which pip, requirement).
    Local files (the project's wheel: a path) are not requirements."""
    found: dict[str, tuple[str, Requirement]] = {}
    for words in simple_commands(stage):
        if len(words) > 2 and posixpath.basename(words[0]) in {"pip", "pip3"} and words[1] == "install":
            for word in words[2:]:
                if not word.startswith("-") and "/" not in word:
                    requirement = Requirement(word)
                    found[canonicalize_name(requirement.name)] = (words[0], requirement)
    return found


@pytest.fixture(scope="module")
def dockerfile() -> list[Stage]:
    return stages(parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def builder(dockerfile: list[Stage]) -> Stage:
    """The stage that builds the wheel and the virtualenv."""
    (stage,) = [s for s in dockerfile if s.name == "build"]
    return stage


@pytest.fixture(scope="module")
def runtime(dockerfile: list[Stage]) -> Stage:
    """The image: the last stage."""
    return dockerfile[-1]


# --- .dockerignore ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    exclusion: bool  # a `!` line: lets through what an earlier line left out
    regex: re.Pattern[str]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Docker's translation of a .dockerignore pattern: `*` and `?` within one path segment, `**` across any
    number of them (none included), `[…]` a class, `\\` escapes."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out.append(".*" if i == len(pattern) else "(?:.*/)?")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        elif c in "[]^-":
            out.append(c)
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def ignore_rules(text: str) -> list[IgnoreRule]:
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if exclusion else line).lstrip("/")
        rules.append(IgnoreRule(pattern, exclusion, _glob_regex(pattern)))
    return rules


def in_context(path: str, rules: list[IgnoreRule]) -> bool:
    """Whether the build context holds `path` (relative to the repository, with /)."""
    parts = posixpath.normpath(path).split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # the path's parents, then the path
    excluded = False
    for rule in rules:
        if any(rule.regex.fullmatch(c) for c in candidates):
            excluded = not rule.exclusion
    return not excluded


@pytest.fixture(scope="module")
def rules() -> list[IgnoreRule]:
    return ignore_rules(DOCKERIGNORE.read_text(encoding="utf-8"))


def context_files(source: Path) -> Iterator[Path]:
    """The files a COPY of `source` takes, caches of local runs aside."""
    if source.is_file():
        yield source
        return
    for path in sorted(source.rglob("*")):
        if path.is_file() and not CACHES & set(path.relative_to(ROOT).parts) and path.suffix not in {".pyc", ".pyo"}:
            yield path


# --- the image's files ------------------------------------------------------------------------------------------


def test_stages_on_the_same_slim_bookworm_python(dockerfile: list[Stage], runtime: Stage) -> None:
    assert len(dockerfile) >= 2 and runtime.name != "build", "a build stage, then the image"
    images = {s.image for s in dockerfile}
    assert len(images) == 1, f"the virtualenv built in one stage runs in the other: one base, not {images}"
    (image,) = images
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-bookworm", image), image


def test_every_copied_file_is_in_the_build_context(dockerfile: list[Stage], rules: list[IgnoreRule]) -> None:
    names = {s.name for s in dockerfile}
    for stage in dockerfile:
        for flags, sources, _ in copies(stage):
            if "from" in flags:
                assert flags["from"] in names, f"COPY --from={flags['from']}: no such stage"
                continue
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: not in the repository"
                files = list(context_files(path))
                assert files, f"COPY {source}: nothing to copy"
                left_out = [str(f.relative_to(ROOT)) for f in files if not in_context(str(f.relative_to(ROOT)), rules)]
                assert not left_out, f".dockerignore leaves out what COPY {source} needs: {left_out[:5]}"


def test_the_wheel_is_built_from_every_package_of_the_distribution(builder: Stage) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    copied = {posixpath.normpath(s) for _, sources, _ in copies(builder) for s in sources}
    packages = {p.rstrip("*").rstrip(".") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages - copied == set(), "packages that pyproject.toml ships but the build does not copy"
    assert {"pyproject.toml", project["project"]["readme"]} <= copied
    assert not {"tests", "docs", ".venv", "var"} & copied


def test_the_context_leaves_out_local_state_and_what_the_image_does_not_need(rules: list[IgnoreRule]) -> None:
    for path in [".git/HEAD", ".venv/bin/python", "var/mm.sqlite3", "mm.yaml", "tests/conftest.py"]:
        assert not in_context(path, rules), path
    for path in ["docs/playground.png", "charts/mm-chatops/values.yaml", "mm_core/__pycache__/agent.cpython-311.pyc"]:
        assert not in_context(path, rules), path
    for path in ["pyproject.toml", "README.md", "mm_core/agent.py", "migrations/script.py.mako"]:
        assert in_context(path, rules), path


# --- what it runs ----------------------------------------------------------------------------------------------


def test_the_entrypoint_is_the_console_script_under_tini(builder: Stage, runtime: Stage) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["mm-bot"] == "commands.cli:main"
    entrypoint = runtime.last("ENTRYPOINT").words()
    assert entrypoint == [*INIT, "mm-bot"]
    # mm-bot is the virtualenv's, first on the PATH: the venv is made at /opt/mm and copied whole.
    assert env(runtime)["PATH"].startswith("/opt/mm/bin:")
    assert ["python", "-m", "venv", "/opt/mm"] in list(simple_commands(builder))
    assert ({"from": "build"}, ["/opt/mm"], "/opt/mm") in list(copies(runtime))
    assert env(runtime)["PYTHONUNBUFFERED"] == "1"


def test_the_default_arguments_parse_with_the_cli(runtime: Stage) -> None:
    argv = runtime.last("CMD").words()
    args = cli.parse(argv)
    assert args.command == "serve"
    assert args.host == "0.0.0.0", "the bot must listen beyond the container's loopback"
    assert str(args.port) in runtime.last("EXPOSE").words()


def test_the_image_runs_as_the_sandbox_user(runtime: Stage) -> None:
    uid, _, gid = runtime.last("USER").args.partition(":")
    assert uid == str(SANDBOX_UID) and gid in {"", str(SANDBOX_UID)}
    # Nothing after USER runs as root: the last RUN comes before it.
    order = [i.keyword for i in runtime.instructions]
    assert max(n for n, k in enumerate(order) if k == "RUN") < max(n for n, k in enumerate(order) if k == "USER")
    commands = list(simple_commands(runtime))
    assert any(c[0] == "groupadd" and option(c, "--gid") == str(SANDBOX_UID) for c in commands)
    assert any(c[0] == "useradd" and option(c, "--uid") == str(SANDBOX_UID) for c in commands)


def test_the_writable_paths(runtime: Stage) -> None:
    variables = env(runtime)
    assert variables["HOME"] == "/tmp", "the chart's only writable place besides the volumes is /tmp"
    workspaces = variables["MM_WORKSPACES"]
    commands = list(simple_commands(runtime))
    assert ["mkdir", "-p", workspaces] in commands
    workdir = runtime.last("WORKDIR").args
    owned = [c[-1] for c in commands if c[:3] == ["chown", "-R", f"{SANDBOX_UID}:{SANDBOX_UID}"]]
    assert any(Path(workspaces).is_relative_to(o) for o in owned), f"{workspaces} is not mm's"
    assert any(Path(workdir).is_relative_to(o) for o in owned), f"the WORKDIR {workdir} is not mm's"


def test_the_system_packages_the_worker_needs(runtime: Stage) -> None:
    missing = SYSTEM_PACKAGES - apt_packages(runtime)
    assert not missing, f"the runtime stage does not apt-get install {sorted(missing)}"


def test_the_example_configs_language_servers_are_installed(builder: Stage) -> None:
    config = load_config(ROOT / "chatops" / "example.yaml", environ={})
    servers = config.agent.lsp.servers
    assert servers, "the example config names no language server"
    installed = pip_installs(builder)
    dev = {
        canonicalize_name(Requirement(r).name): Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "optional-dependencies"
        ]["dev"]
    }
    for name, server in servers.items():
        package = LSP_PACKAGES.get(server.command)
        assert package is not None, f"lsp.servers.{name}: which package provides {server.command}? (LSP_PACKAGES)"
        # The mapping is the package's own word: its distribution declares the command as a console script.
        scripts = {
            e.name for e in importlib.metadata.distribution(package).entry_points if e.group == "console_scripts"
        }
        assert server.command in scripts, f"{package} does not provide {server.command}"
        key = canonicalize_name(package)
        assert key in installed, f"the image does not install {package} ({server.command})"
        pip, requirement = installed[key]
        assert pip == "/opt/mm/bin/pip", f"{package} goes into the virtualenv on the PATH, not {pip}"
        # The same requirement as the dev extra that the LSP tests ran against.
        assert str(requirement) == str(dev[key]), f"{package}: the image says {requirement}, the dev extra {dev[key]}"
    for key, (_, requirement) in installed.items():
        assert key in {canonicalize_name(p) for p in LSP_PACKAGES.values()}, f"{requirement}: not a language server"


def test_no_line_names_a_registry(dockerfile: list[Stage]) -> None:
    for stage in dockerfile:
        first = stage.image.split("/")[0]
        assert "/" not in stage.image or not re.search(r"[.:]|^localhost$", first), stage.image
        assert "@" not in stage.image, f"{stage.image}: a digest pins the image to one registry's copy"
    host_then_path = re.compile(r"\b[a-z0-9-]+(?:\.[a-z0-9-]+)+(?::\d+)?/", re.IGNORECASE)
    for path in (DOCKERFILE, DOCKERIGNORE):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not host_then_path.search(line), f"{path.name}:{number} names a host: {line.strip()}"


# --- the chart's containers ---------------------------------------------------------------------------------


def pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod spec inside a rendered object (a Deployment's, a Job's, a CronJob's …)."""
    if isinstance(node, dict):
        if "containers" in node:
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_specs(value)


def started(container: dict[str, Any], entrypoint: list[str], cmd: list[str]) -> list[str]:
    """What a container runs, by Kubernetes' rules: `command` replaces the image's ENTRYPOINT (and drops its
    CMD), `args` replace the CMD."""
    if container.get("command"):
        return [*container["command"], *container.get("args", [])]
    return [*entrypoint, *container.get("args", cmd)]


def assert_runs_in_the_image(argv: list[str], where: str) -> None:
    if argv[: len(INIT)] == INIT:
        argv = argv[len(INIT) :]
    assert argv and argv[0] in IMAGE_PROGRAMS, f"{where} starts {argv[:1]}, which the image does not provide"
    if argv[0] in {"sh", "/bin/sh"} and argv[1:2] == ["-c"]:
        # A shell's script: the mm-bot commands in it must parse too (`until mm-bot migrate --check; …`).
        for command in shell_commands(argv[2]):
            if command[0] == "mm-bot":
                assert_runs_in_the_image(command, f"{where}, in its script")
    elif argv[0] == "mm-bot":
        try:
            cli.parse(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{where}: mm-bot refuses {argv[1:]} (exit {exc.code})")


def test_the_charts_containers_start_what_the_image_has(runtime: Stage) -> None:
    import helm_python as helm

    helm.disable_logging()
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values={"existingSecret": "mm"}, name="rel", namespace="mm", is_install=True)
    objects = [
        doc for name, text in rendered.items() if name.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc
    ]
    entrypoint, cmd = runtime.last("ENTRYPOINT").words(), runtime.last("CMD").words()
    seen = 0
    for obj in objects:
        for pod in pod_specs(obj):
            run_as = pod.get("securityContext", {}).get("runAsUser")
            assert run_as in {None, SANDBOX_UID}, f"{obj['kind']} {obj['metadata']['name']} runs as {run_as}"
            for container in pod.get("initContainers", []) + pod["containers"]:
                where = f"{obj['kind']} {obj['metadata']['name']}, container {container['name']}"
                assert_runs_in_the_image(started(container, entrypoint, cmd), where)
                seen += 1
                # Exec probes and hooks run without the ENTRYPOINT: their command is all there is.
                for key in ("livenessProbe", "readinessProbe", "startupProbe"):
                    if "exec" in container.get(key, {}):
                        assert_runs_in_the_image(container[key]["exec"]["command"], f"{where}, {key}")
                for key, hook in container.get("lifecycle", {}).items():
                    if "exec" in hook:
                        assert_runs_in_the_image(hook["exec"]["command"], f"{where}, {key}")
    assert seen >= 3, "the chart renders fewer containers than bot, worker and scheduler"
