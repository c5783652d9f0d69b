"""The diff that write_file and edit_file show: unified hunks, every line with its number.

The numbers matter more than the format: a small model's next edit quotes lines it has just seen, and a
person approving a change reads where it lands. Removed lines carry their old number, the others their new one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

NO_NEWLINE = "\\ no newline at end of file"
CONTEXT = 3


@dataclass(frozen=True)
class Diff:
    text: str  # the rendered hunks, "" when nothing changed
    added: int
    deleted: int
    first_line: int  # first changed line in the new text (1-based), 0 when nothing changed


def split_lines(text: str) -> list[str]:
    """Lines with their "\\n" kept; a line ends at "\\n" only (a "\\r" stays part of the line, as in Go)."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def diff(old: str, new: str, context: int = CONTEXT) -> Diff:
    a, b = split_lines(old), split_lines(new)
    # Trim the common head and tail first: SequenceMatcher is quadratic in the worst case, and an edit to a
    # large file changes a few lines in the middle.
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    start_a, start_b = max(0, head - context), max(0, head - context)
    end_a, end_b = len(a) - max(0, tail - context), len(b) - max(0, tail - context)
    sa, sb = a[start_a:end_a], b[start_b:end_b]
    matcher = difflib.SequenceMatcher(None, sa, sb, autojunk=False)
    out: list[str] = []
    added = deleted = 0
    first = 0
    width = len(str(max(len(a), len(b), 1)))
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        # As in unified diffs, an empty side names the line before it (`@@ -0,0 +1,3 @@` for a new file).
        out.append(f"@@ -{start_a + i1 + (i2 > i1)},{i2 - i1} +{start_b + j1 + (j2 > j1)},{j2 - j1} @@")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                for k in range(y1, y2):
                    out.extend(_line(" ", start_b + k + 1, sb[k], width))
                continue
            if not first:
                first = start_b + y1 + 1
            for k in range(x1, x2):
                out.extend(_line("-", start_a + k + 1, sa[k], width))
                deleted += 1
            for k in range(y1, y2):
                out.extend(_line("+", start_b + k + 1, sb[k], width))
                added += 1
    if first:
        first = min(first, len(b)) or 1
    return Diff("\n".join(out), added, deleted, first)


def _line(sign: str, number: int, line: str, width: int) -> list[str]:
    text = line[:-1] if line.endswith("\n") else line
    rendered = [f"{sign}{number:>{width}} │ {text}"]
    if not line.endswith("\n"):
        rendered.append(NO_NEWLINE)
    return rendered
