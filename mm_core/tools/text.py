"""Text helpers shared by the tools (bash, read_file, read_skill, lsp, fetch_content)."""

from __future__ import annotations

# Appended on its own line when a tool's output is cut to `maxOutput`; the count tells the model how much it
# did not see, so it can ask for a narrower range instead of guessing.
TRUNCATED = "[... output truncated: {omitted} more characters not shown ...]"


def truncate(text: str, max_chars: int) -> str:
    """The first `max_chars` characters of `text`, then a marker line saying how much was cut."""
    if max_chars < 0 or len(text) <= max_chars:
        return text
    head = text[:max_chars]
    sep = "" if head.endswith("\n") or not head else "\n"
    return f"{head}{sep}{TRUNCATED.format(omitted=len(text) - max_chars)}"


def plural(n: int, word: str) -> str:
    """`1 edit`, `2 edits`: the reference's counters say `N file op(s)`, but sentences read better."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def show(text: str) -> str:
    """Text decoded with errors="surrogateescape", as the model sees it: each byte that was not UTF-8 becomes
    U+FFFD. The file tools keep the escapes internally so that an edit writes those bytes back unchanged."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
