"""The diff that write_file and edit_file show: unified hunks, every line with its number.

The numbers matter more than the format: a small model's next edit quotes lines it has just seen, and a
person approving a change reads where it lands. Removed lines carry their old number, the others their new one.
"""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass

NO_NEWLINE = "\\ no newline at end of file"
CONTEXT = 3
# Regions this small go to difflib as they are. Its matcher is cubic on lines that repeat (blank lines, `}`)
# between lines that all changed: a 2,000-line rewrite took 40 s there, on the event loop, before approval.
SMALL = 64
# Steps Myers' algorithm may take on a region without anchors before it is shown as replaced.
WORK = 200_000


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
    matcher = _BoundedMatcher(sa, sb)
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


class _BoundedMatcher(difflib.SequenceMatcher[str]):
    """difflib's grouping and opcodes over matching blocks found in bounded time (patience diff, as
    `git diff --patience`): lines that occur once on each side anchor the match, the regions between anchors
    are matched the same way, and only small regions go to difflib itself. A large region with no such
    anchor is shown as replaced: a correct diff, if not the shortest one."""

    def __init__(self, a: list[str], b: list[str]):
        super().__init__(None, a, b, autojunk=False)
        self.lines = a, b
        self.blocks: list[difflib.Match] | None = None

    def get_matching_blocks(self) -> list[difflib.Match]:
        if self.blocks is None:
            a, b = self.lines
            self.blocks = [*_blocks(a, b), difflib.Match(len(a), len(b), 0)]
        return self.blocks


def _blocks(a: list[str], b: list[str]) -> list[difflib.Match]:
    found: list[difflib.Match] = []
    todo = [(0, len(a), 0, len(b))]
    while todo:
        alo, ahi, blo, bhi = todo.pop()
        # Equal lines at both ends match as they are.
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            found.append(difflib.Match(alo, blo, 1))
            alo, blo = alo + 1, blo + 1
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi, bhi = ahi - 1, bhi - 1
            found.append(difflib.Match(ahi, bhi, 1))
        if alo == ahi or blo == bhi:
            continue
        if ahi - alo <= SMALL and bhi - blo <= SMALL:
            matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
            found += [difflib.Match(alo + i, blo + j, n) for i, j, n in matcher.get_matching_blocks() if n]
            continue
        anchors = _unique_common(a, alo, ahi, b, blo, bhi)
        if not anchors:
            # A region with no anchor: exact when it differs in few lines, else shown as replaced.
            found += _myers(a, alo, ahi, b, blo, bhi) or []
            continue
        prev_a, prev_b = alo, blo
        for i, j in anchors:
            found.append(difflib.Match(i, j, 1))
            todo.append((prev_a, i, prev_b, j))
            prev_a, prev_b = i + 1, j + 1
        todo.append((prev_a, ahi, prev_b, bhi))
    # Adjacent single-line matches become one block, as difflib's own matcher returns them.
    merged: list[difflib.Match] = []
    for m in sorted(found):
        last = merged[-1] if merged else None
        if last and last.a + last.size == m.a and last.b + last.size == m.b:
            merged[-1] = difflib.Match(last.a, last.b, last.size + m.size)
        else:
            merged.append(m)
    return merged


def _unique_common(a: list[str], alo: int, ahi: int, b: list[str], blo: int, bhi: int) -> list[tuple[int, int]]:
    """The longest run of lines that occur once in each region, in the same order on both sides."""
    count_a: dict[str, int] = {}
    for i in range(alo, ahi):
        count_a[a[i]] = count_a.get(a[i], 0) + 1
    where_b: dict[str, int] = {}
    count_b: dict[str, int] = {}
    for j in range(blo, bhi):
        count_b[b[j]] = count_b.get(b[j], 0) + 1
        where_b[b[j]] = j
    pairs = [(i, where_b[a[i]]) for i in range(alo, ahi) if count_a[a[i]] == 1 and count_b.get(a[i]) == 1]
    # Longest increasing subsequence of the b positions (patience sorting), O(n log n).
    tails: list[int] = []  # index into pairs of the smallest tail of each length
    tail_b: list[int] = []  # the b position of each of those tails, for bisect
    back: list[int] = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect.bisect_left(tail_b, j)
        if pos:
            back[k] = tails[pos - 1]
        if pos == len(tails):
            tails.append(k)
            tail_b.append(j)
        else:
            tails[pos], tail_b[pos] = k, j
    run: list[tuple[int, int]] = []
    k = tails[-1] if tails else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    return run[::-1]


def _myers(a: list[str], alo: int, ahi: int, b: list[str], blo: int, bhi: int) -> list[difflib.Match] | None:
    """The shortest edit (Myers' O((N+M)·D) algorithm) when it needs few edits, as matches; None when it
    needs more than the work budget allows."""
    n, m = ahi - alo, bhi - blo
    max_d = min(n + m, WORK // max(1, n + m))
    v = [0] * (2 * max_d + 3)  # v[k + offset]: furthest x on diagonal k
    offset = max_d + 1
    trace: list[list[int]] = []
    for d in range(max_d + 1):
        trace.append(v.copy())
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[k - 1 + offset] < v[k + 1 + offset]):
                x = v[k + 1 + offset]
            else:
                x = v[k - 1 + offset] + 1
            y = x - k
            while x < n and y < m and a[alo + x] == b[blo + y]:
                x, y = x + 1, y + 1
            v[k + offset] = x
            if x >= n and y >= m:
                return _snakes(trace, n, m, offset, alo, blo)
    return None


def _snakes(trace: list[list[int]], x: int, y: int, offset: int, alo: int, blo: int) -> list[difflib.Match]:
    matches: list[difflib.Match] = []
    for d in range(len(trace) - 1, -1, -1):
        v, k = trace[d], x - y
        prev_k = k + 1 if k == -d or (k != d and v[k - 1 + offset] < v[k + 1 + offset]) else k - 1
        prev_x = v[prev_k + offset]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y and x > 0 and y > 0:
            x, y = x - 1, y - 1
            matches.append(difflib.Match(alo + x, blo + y, 1))
        x, y = prev_x, prev_y
    return matches
