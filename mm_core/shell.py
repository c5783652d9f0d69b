r"""What a bash command line runs: its simple commands, as the shell would see them, for the approval policies
(mm_core/policy.py). Read with tree-sitter's bash grammar; nothing is run.

read() finds every simple command, wherever it stands: lists, pipelines, `( )`, `{ }`, `if`, `for`, `while`,
`case`, function bodies, `$( )`, backticks and `<( )`. Besides, what a command runs is a command too: the command
of a wrapper (`sudo`, `env`, `timeout`, `xargs`, `find -exec`..., options read from a table, an unknown option both
ways), the string of `bash -c`, `sh -c`, `eval` and `trap`, and a here-document or here-string a shell reads (up to
MAX_DEPTH shells deep). A name the line makes an alias is an unknown command name.

A command's words are their values, unquoted (`g"i"t`, `g'i't`, `g\it` and `$'git'` are `git`), without its
variable assignments and redirections; its text is its words joined by single spaces. Text the shell computes when
it runs (`$X`, `${X}`, `$(...)`, arithmetic, an unquoted glob, braces or `~`) is unknown: a None piece, which a
policy matches as any text; a word wholly unknown may expand to no word at all, so the blanks beside it are its
own. A here-document given to anything but a shell is data.

Fail closed: text the grammar cannot parse, and a reading of it that is not the shell's (tree-sitter-bash runs
some lines together and glues some words across blanks, found by comparing with bash itself), make the command
line one wholly unknown command. So does going past the bounds (MAX_CHARS, MAX_COMMANDS, MAX_WORK): hostile text
costs a bounded amount of work.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from mm_core.errors import CoreError

# Bounds on one command line, past which it is one unknown command: hostile text must not stall the worker.
MAX_CHARS = 100_000
MAX_COMMANDS = 2_000
MAX_DEPTH = 8  # `bash -c` inside `bash -c`...
# Characters parsed and made into commands, nested scripts and wrapped commands included (`sudo sudo ... x`).
MAX_WORK = 4 * MAX_CHARS
# What a command says when the parser's reading of the line cannot be trusted (see _Misread).
MISREAD = "the command could not be parsed (the parser misreads it)"


@dataclass(frozen=True)
class SimpleCommand:
    text: str  # for a person: its words joined by spaces, unknown ones as written
    # The text patterns match, in pieces: None is a part only known when it runs (any text).
    pieces: tuple[str | None, ...]
    words: tuple[str | None, ...]  # None: a word the shell computes


REDEFINED = "the command line changes what command names mean (PATH, BASH_CMDS, BASH_ALIASES, hash, enable)"
# Text that makes a later command name run another program than the one it names: every command of such a line
# is unknown. PATH is matched only where it is assigned (`echo $PATH` is fine).
# The builtins are matched where a command starts, so that a commit message saying "enable" or "read" is not one.
_AT_COMMAND = r"(?:^|[;&|\n(){}]|\b(?:then|do|else)\b)\s*"
_REDEFINES = re.compile(
    r"\bBASH_(?:CMDS|ALIASES)\b|\bPOSIXLY_CORRECT\b|(?:^|[\s;&|(){}])PATH\+?=|-v\s*PATH\b"
    rf"|{_AT_COMMAND}(?:enable\b|hash\s+-p\b)"
    rf"|{_AT_COMMAND}(?:export|declare|typeset|local|readonly|read|mapfile|readarray)\b[^\n;|&]*\bPATH\b"
)
# Commands that run another command or a script in a way this reading does not follow, whatever their options.
_OPAQUE = frozenset(
    {
        "setsid",
        "chroot",
        "su",
        "runuser",
        "ssh",
        "watch",
        "unshare",
        "nsenter",
        "chpst",
        "ionice",
        "taskset",
        "chrt",
        "strace",
        "ltrace",
        "valgrind",
        "firejail",
        "systemd-run",
        "parallel",
        "script",
        "expect",
        "tclsh",
        "perl",
        "python",
        "python3",
        "ruby",
        "node",
        "php",
        "awk",
        "gawk",
        "mawk",
        "lua",
    }
)
# Commands that run a command given to one of their options.
_RUNS_OPTION = {"flock": ("-c", "--command"), "mapfile": ("-C",), "readarray": ("-C",)}


def _own_input(word: Word) -> bool:
    """A file argument that is the command line's own input, or a substitution: what it holds is not known here."""
    text = _text(word)
    return text is None or re.match(r"/dev/(stdin|fd/\d+)$|/proc/self/fd/\d+$|/dev/tcp/", text) is not None


def _reads_own_input(name: str, args: list[Word]) -> bool:
    """`source`/`.` or a shell given a script file that is the command line's own input or a substitution (a
    shell with `-c` runs its string, which shell() reads; its later words are its arguments)."""
    for word in args:
        text = _text(word)
        if name in _SHELLS and text is not None and text.startswith("-") and text not in ("-", "--"):
            if "c" in text and not text.startswith("--"):
                return False
            continue
        return _own_input(word)
    return False


def _openers(text: str) -> int:
    """How many command and process substitutions `text` would open if none of it were quoted (a backslash before
    `$(` or a backtick makes it text, as in a commit message's `"the \\`x\\` bug"`)."""
    dollars = text.count("$(") - text.count("$((") - text.count("\\$(")
    backticks = text.count("`") - text.count("\\`")
    return dollars + text.count("<(") + text.count(">(") + (backticks + 1) // 2


def _quoted_heredoc(node: Node, src: bytes) -> bool:
    """A here-document whose delimiter is quoted: its body is data, never expanded."""
    start = next((c for c in node.children if c.type == "heredoc_start"), None)
    return start is not None and any(q in _source(src, start.start_byte, start.end_byte) for q in "'\"\\")


def _unknown(text: str) -> SimpleCommand:
    """A command known only when it runs."""
    return SimpleCommand(text, (None,), (None,))


_BASH = Language(tree_sitter_bash.language())
# The nodes that are one simple command: tree-sitter names `export`, `declare`, `local`... and `unset` apart.
_SIMPLE = frozenset({"command", "declaration_command", "unset_command"})
_KEYWORDS = frozenset({"export", "declare", "local", "readonly", "typeset", "unset"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"})
# The nodes that make a word (alone or joined with their neighbours).
_WORDS = frozenset(
    {"word", "number", "string", "raw_string", "ansi_c_string", "translated_string", "concatenation"}
    | {"simple_expansion", "expansion", "command_substitution", "process_substitution", "arithmetic_expansion"}
    | {"brace_expression"}
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Unquoted, the shell expands these: a glob (`*`, `?`, `[...]`), braces with a comma or a range.
_EXPANDS = re.compile(r"[*?]|\[.*\]|\{.*(,|\.\.).*\}", re.S)
_ANSI_C = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_ANSI_C_CHARS = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_ANSI_C_CHARS |= {"v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}

# Part of a word as the parser gives it: (value, shown, unquoted). The value is None for text the shell
# computes, which is shown as written; unquoted text is where globs, braces and `~` expand.
Part = tuple[str | None, str, bool]
# A word: its pieces as (value, shown).
Word = tuple[tuple[str | None, str], ...]
_MORE: Word = ((None, "…"),)  # arguments xargs reads from its input


def _hole(word: Word) -> Word:
    return ((None, _shown([word])),)


@dataclass(frozen=True)
class _Wrapper:
    """A command that runs another one after its options: which options take an argument, which do not."""

    takes: str = ""  # short options with an argument (`-u root`, `-uroot`)
    flags: str = ""  # short options without
    long_takes: frozenset[str] = frozenset()
    long_flags: frozenset[str] = frozenset()
    operands: int = 0  # words before the command (timeout's duration)
    assignments: bool = False  # NAME=value words before the command
    opaque: str = ""  # a short option after which the command cannot be known (env -S: a string it splits)

    def steps(self, option: str) -> tuple[int, ...]:
        """How many words `option` takes up with its argument: both readings when it is not known."""
        if option.startswith("--"):
            name, equals, _ = option[2:].partition("=")
            return (1,) if equals or name in self.long_flags else (2,) if name in self.long_takes else (1, 2)
        for i, letter in enumerate(option[1:], 2):
            if letter in self.takes:
                return (1,) if option[i:] else (2,)
            if letter not in self.flags:
                return (1, 2)
        return (1,)

    def hides(self, option: str) -> bool:
        if option.startswith("--"):
            # GNU takes any unambiguous abbreviation of a long option: `--sp`, `--split-str=…` are --split-string.
            name = option[2:].partition("=")[0]
            return bool(self.opaque) and len(name) >= 2 and "split-string".startswith(name)
        return any(letter in self.opaque for letter in option[1:])


def _long(names: str) -> frozenset[str]:
    return frozenset(names.split())


# The commands that run the command after their options. An option not listed here is read both ways (with an
# argument and without), each reading's command one more: the tables make the common case exact, not safe.
_WRAPPERS = {
    "sudo": _Wrapper(
        "CDghpRrTtUu",
        "AbEeHiKklnPSsVv",
        _long("chdir close-from group host prompt chroot role type command-timeout other-user user"),
        _long("askpass background preserve-env edit set-home login non-interactive preserve-groups stdin shell"),
        assignments=True,
    ),
    "doas": _Wrapper("Cu", "Lns"),
    "env": _Wrapper("uC", "i0v", _long("unset chdir"), _long("ignore-environment null debug"), 0, True, opaque="S"),
    "nice": _Wrapper("n", "0123456789", _long("adjustment")),
    "nohup": _Wrapper(),
    "timeout": _Wrapper("sk", "v", _long("signal kill-after"), _long("foreground preserve-status verbose"), 1),
    "time": _Wrapper("fo", "apqv", _long("format output"), _long("append portability quiet verbose")),
    "command": _Wrapper(flags="pvV"),
    "exec": _Wrapper("a", "cl"),
    "xargs": _Wrapper(
        "adEILnPs",
        "0eilprtx",
        _long("arg-file delimiter eof max-lines max-args max-procs max-chars process-slot-var"),
        _long("null interactive no-run-if-empty verbose exit open-tty show-limits replace"),
    ),
    "stdbuf": _Wrapper("ioe", "", _long("input output error")),
    "coproc": _Wrapper(),
    "busybox": _Wrapper(),
    "builtin": _Wrapper(),
}


# A node's parent, and whether the node is its parent's last named child, by the node's id, within one parsed
# script: tree-sitter's own `parent` and `next_named_sibling` walk down from the root each time, and a list of
# thousands of commands nests as deep, which made a long `a && b && …` quadratic.
Parents = dict[int, tuple[Node, bool]]


class _TooMuch(CoreError):
    """A command line past the bounds: read as one unknown command."""


class _Misread(CoreError):
    """tree-sitter's reading of a script is not the shell's: two of its lines run together (_check_lines, _split),
    blanks inside one word (a concatenation whose pieces are apart), commands after a here-document inside `$( )`
    (which bash itself reads otherwise). The script is then one unknown command: a command hidden in another's
    words would escape its rule."""


def read(command: str) -> list[SimpleCommand]:
    """The simple commands a bash command line runs; one unknown command when it cannot be read whole."""
    reader = _Reader()
    try:
        reader.script(command, 0)
    except _TooMuch as e:
        return [_unknown(f"the command could not be parsed: {e}")]
    return reader.items


class _Reader:
    """Reads a command line, and the scripts it runs, into simple commands within the bounds."""

    def __init__(self) -> None:
        self.items: list[SimpleCommand] = []
        self.commands = 0
        self.work = 0
        self.aliases: set[str] = set()  # names the command line defines as aliases, in the order it runs

    def script(self, text: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.items.append(_unknown(f"a script nested more than {MAX_DEPTH} shells deep"))
            return
        if len(text) > MAX_CHARS:
            raise _TooMuch(f"it is longer than {MAX_CHARS:,} characters")
        self._spend(len(text))
        src = text.encode("utf-8", "surrogatepass")
        root = Parser(_BASH).parse(src).root_node
        if root.has_error or "\x00" in text:
            self.items.append(_unknown(f"the command could not be parsed: {_clip(text)}"))
            return
        start = len(self.items)
        if _REDEFINES.search(text):
            self.items.append(_unknown(f"{REDEFINED}: {_clip(text)}"))
            return
        # Openers of command and process substitutions in the text, less those the walk finds as nodes or as data
        # (single quotes, comments, here-documents with a quoted delimiter): tree-sitter leaves some as plain text
        # (`${x#$(git push)}`, backticks in `${y:-…}` or in a here-document), and bash runs them.
        unread = _openers(text)
        stack: list[tuple[Node, Node | None]] = [(root, None)]  # a node, and the substitution it is in
        parents: Parents = {}  # filled as the walk meets each node
        try:
            while stack:  # no recursion: the tree may be as deep as the text is long
                node, substitution = stack.pop()
                if node.type == "concatenation" and any(a.end_byte != b.start_byte for a, b in _pairs(node)):
                    raise _Misread  # blanks inside one word (`x=1 \`\` ls`): its reading is not the shell's
                # bash reads a substitution's text again, and after a here-document in it, `a ; b` runs as `a b`
                # (bash 5.2): only a here-document that ends its substitution is read as tree-sitter reads it.
                if node.type == "heredoc_redirect" and substitution is not None:
                    after = _source(src, node.end_byte, substitution.end_byte).strip()
                    if after not in (")", "`"):
                        raise _Misread
                if node.type in _SIMPLE or (node.type == "redirected_statement" and _owner(node) is None):
                    words, parts = _nodes(node, parents)
                    _check_lines(parts, src)
                    self.command(node, _words(words, src), src, depth, parents)
                if node.type in ("command_substitution", "process_substitution"):
                    substitution = node
                    unread -= 1
                elif node.type in ("raw_string", "comment", "ansi_c_string"):
                    unread -= _openers(_source(src, node.start_byte, node.end_byte))
                elif node.type == "heredoc_redirect" and _quoted_heredoc(node, src):
                    unread -= sum(_openers(_source(src, c.start_byte, c.end_byte)) for c in node.children)
                children = node.children
                last = next((c.id for c in reversed(children) if c.is_named), None)
                for child in reversed(children):
                    parents[child.id] = (node, child.id == last)
                    stack.append((child, substitution))
            if unread > 0:
                raise _Misread
        except _Misread:
            self.items[start:] = [_unknown(f"{MISREAD}: {_clip(text)}")]

    def command(self, node: Node, words: list[Word], src: bytes, depth: int, parents: Parents) -> None:
        stdin = _stdin(node, src, parents)
        todo = [words] if words else []
        while todo:  # the command, then what it runs (a wrapper's command, find's -exec)
            words = todo.pop()
            self._add(words)
            name = _text(words[0])
            name = posixpath.basename(name) if name else None
            args = words[2:] if len(words) > 1 and _text(words[1]) == "--" else words[1:]
            if name is not None and (name in self.aliases or "" in self.aliases):
                # An alias runs text of its own: a name it may stand for is an unknown command name.
                self._add([((None, f"{name} (an alias)"),), *words[1:]])
            if name != _text(words[0]) and name is not None:
                # `/usr/bin/git push` is `git push` to a rule: judged by the program's name too.
                self._add([((name, name),), *words[1:]])
            if name in _OPAQUE or (name in _RUNS_OPTION and any(_text(w) in _RUNS_OPTION[name] for w in args)):
                # It runs a command or a script this reading cannot see (`setsid git push`, `flock -c 'git push'`,
                # `mapfile -C 'git push'`): an unknown command, which meets every deny and ask rule.
                self._add([((None, f"what {name} runs"),)])
            elif (name in ("source", ".") or name in _SHELLS) and _reads_own_input(name, args):
                # `source /dev/stdin <<<…`, `. <(echo …)`, `bash /dev/stdin`: it runs the line's own text, or a
                # substitution's, which this reading does not follow.
                self._add([((None, f"what {name} reads"),)])
            if name in _WRAPPERS:
                todo += _unwrap(name, words[1:])
            elif name in _SHELLS:
                self.shell(words, stdin, depth)
            elif name == "eval" or (name == "trap" and args and _text(args[0]) not in ("-l", "-p")):
                # eval runs its words joined; trap runs its first word when the signal comes.
                texts = [_text(w) for w in (args if name == "eval" else args[:1])]
                self._nested(None if None in texts else " ".join(map(str, texts)), words, depth)
            elif name == "find":
                todo += _find_exec(words[1:])
            elif name == "alias":  # "" when a definition is computed: any name may be one
                self.aliases |= {(_text(w) or "=").partition("=")[0] for w in args if "=" in (_text(w) or "=")}

    def shell(self, words: list[Word], stdin: str | None, depth: int) -> None:
        """What `bash -c STR` runs, or a shell given no script file: its input, when it is in the command line."""
        command = reads_input = False
        args = words[1:]
        i = 0
        while i < len(args):
            option = _text(args[i])
            if option is None:  # an option computed when it runs: what the shell runs is unknown
                return self._nested(None, words, depth)
            if option in ("-", "--"):
                i += 1
                break
            if option.startswith("--"):
                i += 2 if option in ("--rcfile", "--init-file") else 1
                continue
            if len(option) < 2 or option[0] not in "-+":
                break
            command |= option[0] == "-" and "c" in option
            reads_input |= "s" in option
            i += 2 if "o" in option[1:] or "O" in option[1:] else 1
        if command:
            self._nested(_text(args[i]) if i < len(args) else None, words, depth)
        elif reads_input or i >= len(args):
            self._nested(stdin, words, depth)
        # else it runs a script file: the command's own item is all that is known

    def _nested(self, script: str | None, words: list[Word], depth: int) -> None:
        if script is None:
            self.items.append(_unknown(f"what {_shown(words)} runs, known only when it runs"))
        else:
            self.script(script, depth + 1)

    def _add(self, words: list[Word]) -> None:
        self.commands += 1
        if self.commands > MAX_COMMANDS:
            raise _TooMuch(f"it runs more than {MAX_COMMANDS:,} simple commands")
        pieces: list[str | None] = []
        for i, word in enumerate(words):
            # A word wholly computed may expand to no word at all (`$(true) git push` runs `git push`): the blanks
            # beside it are its own to give or not (it matches any text, blanks too).
            blank = i and not _vanishes(word) and not _vanishes(words[i - 1])
            for value in [" "] * blank + [value for value, _ in word]:
                if value is not None and pieces and pieces[-1] is not None:
                    pieces[-1] += value
                elif value != "":
                    pieces.append(value)
        text = _shown(words)
        self._spend(len(text))
        self.items.append(SimpleCommand(text, tuple(pieces), tuple(_text(w) for w in words)))

    def _spend(self, chars: int) -> None:
        self.work += chars
        if self.work > MAX_WORK:
            raise _TooMuch(f"reading it takes more than {MAX_WORK:,} characters")


def _nodes(node: Node, parents: Parents) -> tuple[list[Node], list[Node]]:
    """A simple command's word nodes, and all its parts (its words, assignments and redirections' targets), each
    in order. tree-sitter files some words under a redirection: `git >/dev/null push` is `git push` to the shell,
    but to the grammar `push` is a second target of `>` (and `cat <<EOF x` makes x part of the here-document)."""
    if node.type == "command":
        words = [c for i, c in enumerate(node.children) if node.field_name_for_child(i) in ("name", "argument")]
        parts = [c for c in node.children if c.type == "variable_assignment"]
    elif node.type == "redirected_statement":  # no command of its own: the words in its redirections are one
        words, parts = [], []
    else:  # export, declare, local, readonly, typeset, unset: the keyword, then its arguments
        words = [c for c in node.children if c.type != "comment" and not c.type.endswith("_redirect")]
        parts = []
    redirects = _redirects(node, parents)
    while redirects:
        redirect = redirects.pop()
        target = redirect.type != "heredoc_redirect"  # the first word is the target, but for a here-document's
        for child in redirect.children:
            if child.type.endswith("_redirect"):
                redirects.append(child)
            elif child.type == "heredoc_start" or (child.type in _WORDS and target):
                parts.append(child)
                target = False
            elif child.type in _WORDS:
                words.append(child)
    words.sort(key=lambda n: n.start_byte)
    return words, sorted(words + parts, key=lambda n: n.start_byte)


def _owner(statement: Node) -> Node | None:
    """The simple command a redirected statement's redirections belong to, as _redirects() finds them: the last
    one of the `!`, pipeline or list it redirects. None when there is none (`! x= <f rm`: to tree-sitter an
    assignment, with `rm` filed under `<`)."""
    node = statement
    while node.type in ("redirected_statement", "list", "pipeline", "negated_command"):
        below = node.child_by_field_name("body") if node.type == "redirected_statement" else None
        count = node.named_child_count
        node = below or (node.named_child(count - 1) if count else None) or node
        if node.type in _SIMPLE:
            return node
        if not node.named_child_count:
            break
    return None


def _redirects(node: Node, parents: Parents) -> list[Node]:
    """The redirections of a simple command: its own, and those the grammar gives the statement it ends (`a || b
    >f` is `a || (b >f)` to the shell, a redirected list to tree-sitter), as `!`, a pipeline or a list ends with it."""
    redirects = [c for c in node.children if c.type.endswith("_redirect")]
    while (up := parents.get(node.id)) is not None:
        parent, last = up
        if parent.type == "redirected_statement" and parent.child_by_field_name("body") == node:
            redirects += [c for c in parent.children if c.type.endswith("_redirect")]
        elif parent.type not in ("list", "pipeline", "negated_command") or not last:
            break
        node = parent
    return redirects


def _check_lines(parts: list[Node], src: bytes) -> None:
    """Raises _Misread when tree-sitter read two lines as one simple command, which the shell never does: a newline
    between its parts (not a line continuation, not inside a quoted target) ends a command. The grammar does it
    (`''|''|''`, a newline, then `''&&''`: the last `''` of the first line takes the first of the second as its
    argument), and a command hidden among another's arguments would escape its rule: such a reading is not
    trusted. (A newline inside a word's unquoted text is caught by _split.)"""
    gaps = (_source(src, a.end_byte, b.start_byte) for a, b in _pairs(parts))
    if any(re.search(r"(?<!\\)\n", gap) for gap in gaps):
        raise _Misread


def _words(nodes: list[Node], src: bytes) -> list[Word]:
    """The words the nodes make: without the command's variable assignments and redirections."""
    words: list[list[Part]] = []
    end = -1
    for child in nodes:
        # Nodes with nothing between them are one word to the shell, and so are nodes with only escaped characters
        # between them, which tree-sitter leaves out after a quote (`'a'\ b` is `a b`; `\<newline>` is nothing).
        gap = _source(src, end, child.start_byte) if words else " "
        pieces = _split(_parts(child, src))
        if re.fullmatch(r"(\\.)*", gap, re.S):
            words[-1] += [(c, c, False) for c in gap[1::2] if c != "\n"] + pieces[0]
            pieces = pieces[1:]
        words += pieces
        end = child.end_byte
    return [_word(parts) for parts in words]


def _split(parts: list[Part]) -> list[list[Part]]:
    """The parts of one node, cut where it holds an unquoted blank: tree-sitter makes one word of `{ {`. An unquoted
    newline there is two lines run together (`rm`, a newline, `\\git x` is one command to the grammar): _Misread."""
    words: list[list[Part]] = [[]]
    for value, shown, bare in parts:
        if not (bare and value is not None and re.search(r"\s", value)):
            words[-1].append((value, shown, bare))
            continue
        if "\n" in value:
            raise _Misread
        for i, piece in enumerate(re.split(r"\s+", value)):
            words += [[]] if i else []
            words[-1] += [(piece, piece, True)] if piece else []
    return [w for w in words if w] or [[]]


def _parts(node: Node, src: bytes) -> list[Part]:
    text = _source(src, node.start_byte, node.end_byte)
    kind = node.type
    parts: list[Part] = []
    if kind in ("word", "number", "variable_name") or kind in _KEYWORDS:
        # A backslash quotes the next character; before a newline it continues the line.
        for i, piece in enumerate(re.split(r"(\\.)", text, flags=re.S)):
            if i % 2 == 0 and piece:
                parts.append((piece, piece, True))
            elif i % 2 == 1 and piece != "\\\n":
                parts.append((piece[1], piece[1], False))
        return parts
    if kind == "raw_string":
        return [(text[1:-1], text[1:-1], False)]
    if kind == "ansi_c_string":
        value = _ansi_c(text[2:-1])
        return [(value, value, False) if value is not None else (None, text, False)]
    if kind == "string":
        return _double_quoted(node, src)
    if kind == "=":
        return [("=", "=", False)]
    if kind in ("concatenation", "command_name", "variable_assignment"):
        return [part for child in node.children for part in _parts(child, src)]
    return [(None, _clip(text, 100), False)]  # an expansion, a substitution, arithmetic: computed when it runs


def _double_quoted(node: Node, src: bytes) -> list[Part]:
    """A "..." string's parts: its text with \\-escapes taken out, and the expansions in it (unknown)."""
    parts: list[Part] = []
    start = node.start_byte + 1
    for child in node.children:
        if child.type in ('"', "string_content"):
            continue
        literal = _unescape_double(_source(src, start, child.start_byte))
        parts += [(literal, literal, False), (None, _source(src, child.start_byte, child.end_byte), False)]
        start = child.end_byte
    literal = _unescape_double(_source(src, start, max(start, node.end_byte - 1)))
    return [*parts, (literal, literal, False)]


def _word(parts: Sequence[Part]) -> Word:
    """The word the parts make: wholly unknown when its unquoted text expands (a glob, braces, `~`)."""
    unquoted = "".join(value if bare and value is not None else "\x00" for value, _, bare in parts)
    if _EXPANDS.search(unquoted) or unquoted.startswith("~"):
        return ((None, "".join(shown for _, shown, _ in parts)),)
    word: list[tuple[str | None, str]] = []
    for value, shown, _ in parts:
        last = word[-1][0] if word else None
        if value is not None and last is not None:
            word[-1] = (last + value, word[-1][1] + shown)
        else:
            word.append((value, shown))
    return tuple(word) or (("", ""),)


def _stdin(node: Node, src: bytes, parents: Parents) -> str | None:
    """The text a command reads on its standard input when the command line holds it (a here-document, or a
    here-string with nothing computed); None when it comes from elsewhere (a pipe, a file, the tool)."""
    text = None
    for redirect in sorted(_redirects(node, parents), key=lambda r: r.start_byte):
        if redirect.type == "heredoc_redirect":
            body = next((c for c in redirect.children if c.type == "heredoc_body"), None)
            text = _source(src, body.start_byte, body.end_byte) if body is not None else ""
        elif redirect.type == "herestring_redirect":
            text = _text(_word(_parts(redirect.named_children[-1], src))) if redirect.named_children else None
        elif any(c.type.startswith("<") for c in redirect.children):
            text = None
    return text


def _unwrap(name: str, args: list[Word]) -> list[list[Word]]:
    """The commands a wrapper may run: one when its options are known, one for each reading when they are not."""
    spec = _WRAPPERS[name]
    starts: set[int] = set()  # -1: a command that cannot be known
    todo, seen = [(0, spec.operands, True)], set()
    while todo:
        state = todo.pop()
        i, operands, options = state
        if state in seen or i >= len(args):
            continue
        seen.add(state)
        word = _text(args[i])
        if word is None:  # computed: the command may start here, unknown
            starts.add(i)
        elif options and word == "--":
            todo.append((i + 1, operands, False))
        elif options and word.startswith("-") and word != "-":
            starts |= {-1} if spec.hides(word) else set()
            todo += [(i + step, operands, True) for step in spec.steps(word)]
        elif spec.assignments and _ASSIGNMENT.match(word):
            todo.append((i + 1, operands, options))
        elif operands:
            todo.append((i + 1, operands - 1, options))
        else:
            starts.add(i)
    found = []
    for start in sorted(starts):
        if start < 0:
            found.append([((None, f"what {name} runs"),)])
        else:
            found.append(_xargs(args[:start], args[start:]) if name == "xargs" else args[start:])
    return found


def _xargs(options: list[Word], command: list[Word]) -> list[Word]:
    """What xargs runs: the command, then arguments it reads (unknown); with -I, -i or --replace, every word
    holding the string it replaces is unknown too."""
    texts = [_text(w) or "" for w in options]
    replace = ""
    for i, option in enumerate(texts):
        if option.startswith("-I"):
            replace = option[2:] or (texts[i + 1] if i + 1 < len(texts) else "")
        elif option.startswith(("-i", "--replace")):
            replace = (option.partition("=")[2] if option.startswith("--") else option[2:]) or "{}"
    if replace:
        command = [_hole(w) if replace in (_text(w) or replace) else w for w in command]
    return [*command, _MORE]


def _find_exec(args: list[Word]) -> list[list[Word]]:
    """The commands `find -exec CMD ... ;` (and -execdir, -ok, -okdir) runs, `{}` unknown."""
    found: list[list[Word]] = []
    current: list[Word] | None = None
    for word in args:
        text = _text(word)
        if current is None:
            current = [] if text in ("-exec", "-execdir", "-ok", "-okdir") else None
        elif text in (";", "+"):
            found.append(current)
            current = None
        else:
            current.append(_hole(word) if text is None or "{}" in text else word)
    return [c for c in [*found, current or []] if c]


def _pairs(nodes: Node | list[Node]) -> itertools.pairwise[tuple[Node, Node]]:
    """Each node with the next: of a list, or a node's children."""
    return itertools.pairwise(nodes if isinstance(nodes, list) else nodes.children)


def _vanishes(word: Word) -> bool:
    return len(word) == 1 and word[0][0] is None


def _text(word: Word) -> str | None:
    """The word's value; None when part of it is computed."""
    values = [value for value, _ in word]
    return None if None in values else "".join(map(str, values))


def _shown(words: Sequence[Word]) -> str:
    return " ".join("".join(shown for _, shown in word) for word in words)


def _source(src: bytes, start: int, end: int) -> str:
    return src[start:end].decode("utf-8", "surrogatepass")


def _unescape_double(text: str) -> str:
    """Inside double quotes a backslash escapes only $ ` " \\ and a newline (a line continuation)."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m[1] == "\n" else m[1], text)


def _ansi_c(text: str) -> str | None:
    """The value of $'...'; None when it holds a NUL (where the shell cuts it) or a character that cannot be."""

    def char(m: re.Match[str]) -> str:
        escape = m[1]
        if escape[0] in "xuU" and len(escape) > 1:
            return chr(int(escape[1:], 16))
        if escape[0] in "01234567":
            return chr(int(escape, 8) & 0xFF)
        if escape[0] == "c" and len(escape) == 2:
            return chr(ord(escape[1]) & 0x1F)
        return _ANSI_C_CHARS.get(escape, "\\" + escape)

    try:
        value = _ANSI_C.sub(char, text)
    except (ValueError, OverflowError):
        return None
    return None if "\x00" in value else value


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
