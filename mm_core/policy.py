"""Approval policies: which tool calls run unasked, which ask one or more approvers, which are refused.

A team lists rules (`approvals.policies`) in order. A rule names tools (`tool`; none: every tool), patterns
(`commands` for bash, `paths` for the file tools, `hosts` for fetch_content; none: every call of its tools) and
one action: `allow`, `ask` (`ask: N`: N distinct approvers) or `deny`.

judge() splits a call into items and decides each one on its own:

- bash: each simple command the shell would run, wherever it stands, and what wrappers, `bash -c`, `eval` and
  here-documents fed to a shell run (mm_core/shell.py). Its text is its words, unquoted, joined by single spaces:
  `FOO=1 g"i"t push >log` is `git push`;
- write_file, edit_file, read_file: the path; fetch_content: the URL's host, and the `output` file when given;
  lsp: the files a rename edits. Paths are relative to the workspace, `.` and `..` resolved; a path through a
  symlink is judged as the link's target too;
- any other call (read_skill, ask_agent, an lsp question): the call itself, which only rules without patterns
  match.

An item is decided by the first rule whose tools fit and whose patterns match it; one no rule decides is
DEFAULT (the tool's own gating). The call takes the strictest of its items' verdicts: DENY, then ASK (more
approvers first; then the rule listed first), then DEFAULT, then ALLOW. So joining commands never weakens a rule,
and ALLOW needs every item allowed.

Patterns: commands are fnmatch globs on the whole text (`git push*` matches `git push -f`, and `git pushx` too:
write `git push` and `git push *` to be exact); hosts are fnmatch globs, case-insensitive (`*.example.com` is not
`example.com`); paths are gitignore patterns (`*.tf` and `Dockerfile` at any depth, `.github/**` all below it).

Fail closed. Text the shell computes when it runs (`$X`, `$(...)`, an unquoted `*.py`...) is unknown: an unknown
part matches any text for a deny or an ask rule, and an item with one matches no allow rule (an allow must be
proved). Such an item may stand for many texts, so rather than the first rule it takes the strictest of every
deny and ask rule it could match (up to a rule without patterns, which decides every text). A command line that
cannot be parsed, or read as the shell would, or is too large to read, is one wholly unknown item; so are a path
outside the workspace and a URL without a host. Out of reach, whatever the rules: the files a command writes
(`echo x > .github/ci.yml` is judged on its commands, not as a path), what a program runs by itself (a script file,
`make`, git aliases), a variable's value evaluated at run time (`(( $x ))`), and the hosts fetch_content is
redirected to (its own guard refuses internal addresses). A command rule is a tripwire against the model, not a
sandbox.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import ipaddress
import os
import posixpath
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import idna
import pathspec
from pydantic import Field, ValidationInfo, field_validator, model_validator

from mm_core import shell
from mm_core.config import Strict
from mm_core.errors import CoreError
from mm_core.tools.fetch.tool import normalize_url
from mm_core.tools.workspace import LINKED, SymlinkLoop, real_path

TOOLS = ("bash", "write_file", "edit_file", "lsp", "fetch_content", "read_file", "read_skill", "ask_agent")
PATH_TOOLS = ("write_file", "edit_file", "lsp", "fetch_content", "read_file")
# Which tools each kind of pattern applies to.
PATTERN_TOOLS = {"commands": ("bash",), "paths": PATH_TOOLS, "hosts": ("fetch_content",)}
MAX_APPROVALS = 10
# A pattern is run against every item: its length bounds that work, with the text's (their product).
MAX_PATTERN = 1_000

_APPROVER = re.compile(r"^[UWS][A-Z0-9]{2,}$")


class Action(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"
    DEFAULT = "default"  # no rule matched: the tool's own gating applies


class Rule(Strict):
    """One entry of `approvals.policies`."""

    name: str | None = None
    tool: str | list[str] | None = None
    commands: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=list)
    hosts: list[str] = Field(default_factory=list)
    allow: bool | None = None
    ask: bool | int | None = None
    deny: bool | None = None
    # Slack users (U…, W…) or user groups (S…) whose approval counts; empty: the channel's approvers.
    approvers: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or not value.isprintable()):
            raise ValueError(f"expected a name people can read, got {value!r}")
        return value

    @field_validator("tool")
    @classmethod
    def _tools(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value == []:
            raise ValueError("expected a tool or a list of tools, got an empty list (leave tool out for every tool)")
        for name in [value] if isinstance(value, str) else value or []:
            if name not in TOOLS:
                raise ValueError(f"expected one of the tools {', '.join(TOOLS)}, got {name!r}")
        return value

    @field_validator("commands", "paths", "hosts")
    @classmethod
    def _patterns(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for pattern in value:
            if not pattern or not pattern.isprintable() or len(pattern) > MAX_PATTERN:
                raise ValueError(
                    f"expected {info.field_name} patterns of 1 to {MAX_PATTERN:,} printable characters, "
                    f"got {pattern[:80]!r}"
                )
            if info.field_name == "paths":
                compiled = pathspec.PathSpec.from_lines("gitignore", [pattern]).patterns[0]
                if compiled.include is None:
                    raise ValueError(
                        f"the path pattern {pattern!r} is a comment in gitignore syntax: it matches nothing"
                    )
                if not compiled.include:
                    raise ValueError(
                        f"the path pattern {pattern!r} is a negation, which a rule cannot use: put a rule for the "
                        "exception before this one (the first rule that matches decides)"
                    )
        return value

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: list[str]) -> list[str]:
        for approver in value:
            if not _APPROVER.match(approver):
                raise ValueError(f"expected Slack user or group ids (U…, W… or S…) as approvers, got {approver!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Rule:
        given = [key for key in ("allow", "ask", "deny") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of allow, ask or deny, got {_and(given) or 'none'}")
        value = getattr(self, given[0])
        if value is False:
            raise ValueError(f"expected {given[0]}: true, got {given[0]}: false (a rule says what it does)")
        if not isinstance(value, bool) and not 1 <= value <= MAX_APPROVALS:
            raise ValueError(f"expected ask: true or a number of approvers from 1 to {MAX_APPROVALS}, got ask: {value}")
        if self.approvers and given != ["ask"]:
            raise ValueError(f"approvers apply only to a rule that asks, and this one says {given[0]}")
        for kind, takers in PATTERN_TOOLS.items():
            others = [name for name in self.tools or () if name not in takers]
            if getattr(self, kind) and others:
                raise ValueError(f"{kind} apply only to {_and(list(takers), 'or')}, not to {_and(others)}")
        return self

    @property
    def tools(self) -> tuple[str, ...] | None:
        """The tools this rule applies to; None: every tool."""
        return (self.tool,) if isinstance(self.tool, str) else None if self.tool is None else tuple(self.tool)

    @property
    def action(self) -> Action:
        return Action.ALLOW if self.allow else Action.DENY if self.deny else Action.ASK

    @property
    def approvals(self) -> int:
        """Distinct approvers needed: 0 for allow and deny."""
        return 0 if self.ask is None else int(self.ask)

    def label(self, index: int) -> str:
        """How people are shown this rule, `rules[index]` (counted from 0): its name, else "rule N" from 1."""
        return self.name or f"rule {index + 1}"


@dataclass(frozen=True)
class Verdict:
    action: Action
    approvals: int  # distinct approvers needed (ASK), else 0
    approvers: tuple[str, ...]  # ids the rule accepts; (): the channel's approvers
    rule: str | None  # the deciding rule's label; None when DEFAULT
    matched: str  # what it matched, for a person: a command, a path, a host; "" when DEFAULT


@dataclass(frozen=True)
class Item:
    """One thing a call does, judged on its own."""

    kind: Literal["command", "path", "host", "call"]
    text: str  # for a person
    # The text patterns match, in pieces: None is a part only known when the call runs (any text).
    pieces: tuple[str | None, ...]
    words: tuple[str | None, ...] = ()  # a command's words; None: one the shell computes

    @property
    def known(self) -> bool:
        return None not in self.pieces


def judge(
    rules: Sequence[Rule],
    tool: str,
    args: dict[str, Any],
    workspace: Path | None = None,
    extra_paths: Sequence[str] = (),
) -> Verdict:
    """The verdict of `rules` on a call of `tool` with `args`. `workspace` resolves paths and their symlinks;
    `extra_paths` are further files the call writes, known to the caller from its plan (an lsp rename's)."""
    verdicts = [_decide(rules, tool, item) for item in call_items(tool, args, workspace, extra_paths)]
    return max(verdicts, key=lambda decided: decided[0])[1]  # the first of the strictest


def _decide(rules: Sequence[Rule], tool: str, item: Item) -> tuple[tuple[int, int, int], Verdict]:
    """The item's verdict, with its strictness: DENY > ASK (more approvers, then the rule listed first) > DEFAULT
    > ALLOW. A known item is decided by the first rule that matches; an item with unknown parts stands for every
    text they may hold, and so takes the strictest of the rules any of those could meet, up to a rule without
    patterns (it meets them all)."""
    found = []
    for index, rule in enumerate(rules):
        if (rule.tools is None or tool in rule.tools) and _matches(rule, item):
            rank = {Action.ALLOW: 0, Action.ASK: 2, Action.DENY: 3}[rule.action]
            verdict = Verdict(rule.action, rule.approvals, tuple(rule.approvers), rule.label(index), item.text)
            found.append(((rank, rule.approvals, -index), verdict))
            if item.known or not (rule.commands or rule.paths or rule.hosts):
                return max(found, key=lambda decided: decided[0])
    return max([*found, ((1, 0, 0), Verdict(Action.DEFAULT, 0, (), None, ""))], key=lambda decided: decided[0])


def call_items(
    tool: str, args: dict[str, Any], workspace: Path | None = None, extra_paths: Sequence[str] = ()
) -> list[Item]:
    """What judge() decides one by one for this call."""
    args = args if isinstance(args, dict) else {}
    found: list[Item] = []
    paths: list[object] = []
    if tool == "bash":
        command = args.get("command")
        found += simple_commands(command) if isinstance(command, str) else [_unknown("command", repr(command))]
    elif tool == "fetch_content":
        found.append(_host(args.get("url")))
        output = args.get("output")
        paths += [output.strip()] if isinstance(output, str) and output.strip() else []
    elif tool == "lsp":
        # Only a rename writes; the files it edits besides its own come from its plan (extra_paths).
        if str(args.get("action") or "").strip().lower() == "rename":
            paths.append(str(args.get("path") or "").strip())
    elif tool in PATH_TOOLS:
        paths.append(args.get("path"))
    for path in [*paths, *extra_paths]:
        found += _paths(path, workspace)
    return found or [Item("call", tool, ())]


def _matches(rule: Rule, item: Item) -> bool:
    if not (rule.commands or rule.paths or rule.hosts):
        return True
    patterns = {"command": rule.commands, "path": rule.paths, "host": rule.hosts, "call": []}[item.kind]
    if not patterns or (rule.action is Action.ALLOW and not item.known):
        return False
    if item.kind == "path":
        # Unknown paths are whole (a path outside the workspace): they match every deny and ask rule.
        return not item.known or _path_spec(tuple(patterns)).match_file(str(item.pieces[0]))
    fold = item.kind == "host"
    return any(compile_glob(pattern.lower() if fold else pattern).matches(item.pieces) for pattern in patterns)


# ---- globs: fnmatch, with unknown parts -------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> Glob:
    return Glob(pattern)


@functools.lru_cache(maxsize=256)
def _path_spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    return pathspec.PathSpec.from_lines("gitignore", patterns)


class Glob:
    """An fnmatch pattern run as a bit-parallel automaton (shift-and): bit i of the state says "the first i
    tokens match the text so far". Its work is the pattern's length times the text's, whatever either holds
    (no backtracking blow-up), and it answers for a text with unknown parts: whether some text in their place
    makes the whole match."""

    def __init__(self, pattern: str):
        tokens: list[str] = []  # "*", "?", a class "[...]", or one character as "=c"
        i, n = 0, len(pattern)
        while i < n:
            c, i = pattern[i], i + 1
            token = "=" + c
            if c == "[":  # where the class ends, as fnmatch.translate finds it; none: a plain "["
                j = i + 1 if i < n and pattern[i] == "!" else i
                j = j + 1 if j < n and pattern[j] == "]" else j
                while j < n and pattern[j] != "]":
                    j += 1
                if j < n:
                    token, i = pattern[i - 1 : j + 1], j + 1
            elif c in "*?":
                token = c
            if not (token == "*" and tokens and tokens[-1] == "*"):
                tokens.append(token)
        self.tokens = tokens
        self.size = len(tokens)
        self.stars = sum(1 << i for i, token in enumerate(tokens) if token == "*")
        self.masks: dict[str, int] = {}

    def mask(self, char: str) -> int:
        """The tokens that consume `char` and move on (a star consumes it and stays)."""
        mask = self.masks.get(char)
        if mask is None:
            mask = 0
            for i, token in enumerate(self.tokens):
                if token == "?" or token == "=" + char or (token[0] == "[" and fnmatch.fnmatchcase(char, token)):
                    mask |= 1 << i
            if len(self.masks) < 4096:
                self.masks[char] = mask
        return mask

    def matches(self, pieces: Sequence[str | None]) -> bool:
        full = (1 << (self.size + 1)) - 1
        state = self._past_stars(1)
        for piece in pieces:
            if piece is None:
                # Some text stands here: it can match any run of tokens, so every token from the first one
                # reached on is reached (a class is taken to match some character).
                state = full & ~((state & -state) - 1)
            else:
                for char in piece:
                    state = self.step(state, char)
                    if not state:
                        return False
        return bool(state >> self.size & 1)

    def step(self, state: int, char: str) -> int:
        """The state after `char`: one step of the automaton, a few operations on integers of the pattern's size."""
        return self._past_stars(((state & self.mask(char)) << 1) | (state & self.stars))

    def _past_stars(self, state: int) -> int:
        return state | ((state & self.stars) << 1)  # a star may match nothing; stars are never adjacent


# ---- paths and hosts --------------------------------------------------------------------------------------


def _paths(given: object, workspace: Path | None) -> list[Item]:
    """The path, relative to the workspace; with the file it lands in when that goes through a symlink."""
    if not isinstance(given, str) or not given.strip() or "\x00" in given:
        return [_unknown("path", repr(given))]
    # bash runs with HOME set to the workspace, and the file tools read `~/x` as bash does.
    local = "." + given[1:] if given == "~" or given.startswith("~/") else given
    relative = _inside(local, workspace)
    if relative is None:
        return [_unknown("path", given)]
    found = [Item("path", relative, (relative,))]
    if workspace is not None:
        base = real_path(workspace)
        try:
            real = real_path(os.path.join(base, local))
        except SymlinkLoop:
            real = None
        if real != os.path.normpath(os.path.join(base, relative)):
            target = _inside(real, workspace) if real is not None else None
            shown = LINKED.format(path=relative, target=target or real or "a symlink loop")
            found.append(Item("path", shown, (target,)))
    return found


def _inside(path: str, workspace: Path | None) -> str | None:
    """`path` relative to the workspace, normalised; None when it is outside (or cannot be placed)."""
    if os.path.isabs(path):
        bases = (os.path.abspath(workspace), real_path(workspace)) if workspace is not None else ()
        base = next((b for b in bases if path == b or path.startswith(b.rstrip(os.sep) + os.sep)), None)
        if base is None:
            return None
        path = os.path.relpath(path, base)
    path = posixpath.normpath(path)
    return None if path == ".." or path.startswith("../") else path


def _host(url: object) -> Item:
    """The host fetch_content connects to: lowercase, IDNA-encoded, no trailing dot; an address as its text."""
    try:
        host = urlsplit(normalize_url(url)).hostname if isinstance(url, str) else None
    except (CoreError, ValueError):
        host = None
    host = (host or "").rstrip(".")
    try:
        address = ipaddress.ip_address(host)
        # An IPv4 address written as IPv6 (`[::ffff:1.2.3.4]`) reaches that IPv4 host: judged as it.
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        host = (mapped or address).compressed
    except ValueError:
        if re.fullmatch(r"[0-9a-fx.]+", host):
            # The resolver reads 2852039166, 0xa9.0xfe.0xa9.0xfe or 169.254.43518 as 169.254.169.254.
            with contextlib.suppress(OSError):
                host = socket.inet_ntoa(socket.inet_aton(host))
        try:
            host = idna.encode(host).decode("ascii") if not host.isascii() else host
        except UnicodeError:  # idna's errors among them
            host = ""
        host = host.rstrip(".")  # IDNA makes dots of `。` and its kin: `evil.com。` is `evil.com.`, that is evil.com
    if not re.fullmatch(r"[a-z0-9._:-]+", host):
        return _unknown("host", str(url))
    return Item("host", host, (host,))


def _unknown(kind: Literal["command", "path", "host"], text: str) -> Item:
    """An item known only when the call runs: it matches every deny and ask rule of its kind, and no allow."""
    return Item(kind, text, (None,), (None,) if kind == "command" else ())


def simple_commands(command: str) -> list[Item]:
    """The simple commands a bash command line runs (mm_core/shell.py), as items."""
    return [Item("command", c.text, c.pieces, c.words) for c in shell.read(command)]


def _and(names: list[str], conjunction: str = "and") -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {conjunction} {names[-1]}" if names else ""
