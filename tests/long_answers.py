"""Long answers for the tests, and what a thread showing one must hold: messages within the limit, each code
block whole in one message (or, cut because it could not fit, closed and reopened), the answer given back."""

from __future__ import annotations

import re

# An opening or closing fence, as the test reads one (independently of the module): a line of 3+ ` or ~.
FENCE_LINE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
ADDED_CLOSES = (re.compile(r"(`{3,}|~{3,})\Z"), re.compile(r"\n(`{3,}|~{3,})\Z"))
ADDED_REOPEN = re.compile(r"\A(`{3,}|~{3,})[^\n`]*\n")


def open_fence_at_end(text: str) -> str | None:
    """The fence a text leaves open, if any."""
    fence: str | None = None
    for line in text.split("\n"):
        m = FENCE_LINE.fullmatch(line)
        if m is None:
            continue
        marks, info = m.group(1), m.group(2)
        if fence is None:
            if not (marks[0] == "`" and "`" in info):
                fence = marks
        elif marks[0] == fence[0] and len(marks) >= len(fence) and not info.strip():
            fence = None
    return fence


def rejoined(parts: list[str], text: str) -> str:
    """The pieces joined back, without the closes and reopens the cuts added: a piece may end with an added
    fence only if the next one starts with an added fence of the same character, and the other way round."""
    out, closed = "", None
    for i, part in enumerate(parts):
        reopen = ADDED_REOPEN.match(part) if closed is not None else None
        if closed is not None:
            assert reopen is not None and reopen.group(1)[0] == closed, (i, part[:80])
        lead = reopen.end() if reopen is not None else 0
        closes = [None] + ([c.search(part) for c in ADDED_CLOSES] if i + 1 < len(parts) else [])
        fits = [c for c in closes if text.startswith(part[lead : c.start() if c else len(part)], len(out))]
        assert fits, (i, part[:80], part[-80:])
        out += part[lead : fits[0].start() if fits[0] else len(part)]
        closed = fits[0].group(1)[0] if fits[0] is not None else None
    assert closed is None
    return out


LANGUAGES = ("python", "sh", "json", "")


def long_answer(size: int = 30_000) -> str:
    """An answer of at least `size` characters: numbered paragraphs and code blocks of several languages and
    sizes (the largest about a fifth of a message), so that a cut between them is never far."""
    parts: list[str] = []
    i = 0
    while sum(len(p) + 2 for p in parts) < size:
        words = " ".join(f"word{i}.{j}" for j in range(60 + (i * 37) % 150))
        parts.append(f"Paragraph {i}: {words}.")
        lines = "".join(f"line {i}.{j} = {j * j}  # some code\n" for j in range(20 + (i * 53) % 70))
        parts.append(f"```{LANGUAGES[i % len(LANGUAGES)]}\n{lines}```")
        i += 1
    parts.append("The end.")
    return "\n\n".join(parts)


def code_blocks(text: str) -> list[str]:
    return [m.group() for m in re.finditer(r"^```[a-z]*\n.*?^```$", text, re.M | re.S)]


def assert_shown_whole(messages: list[str], answer: str, limit: int) -> None:
    """The thread's messages hold `answer` whole: none over `limit`, none leaving a code block open (but the
    last, when the answer did), each code block of up to half a message whole in one, and together the answer."""
    assert len(messages) > 1
    assert all(len(m) <= limit for m in messages), [len(m) for m in messages]
    for message in messages[:-1]:
        assert open_fence_at_end(message) is None, message[-200:]
    for block in code_blocks(answer):
        if len(block) <= limit // 2:  # one too long to fit may be cut (closed and reopened)
            assert any(block in m for m in messages), block[:100]
    assert rejoined(messages, answer) == answer
