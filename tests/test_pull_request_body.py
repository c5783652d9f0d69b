"""What a pull request's body quotes from Slack and the model is inert on the forge: no mention notifies, no
reference links or closes an issue, and it still reads as written (the zero-width space is invisible)."""

from __future__ import annotations

import re

from workers.pull_request_body import ZWSP, defused

TEXT = (
    "Fixes #12, closes https://github.com/acme/app/issues/3 and resolved !4; thanks @alice and @acme/ops. "
    "Closing https://gitlab.com/g/p/-/issues/12, implements GH-7, fixing https://git.example.com/o/r/pull/9."
)


def test_mentions_references_and_closing_keywords_are_defused() -> None:
    out = defused(TEXT)
    assert out.replace(ZWSP, "") == TEXT  # reads as written
    # What GitHub, GitLab and Gitea act on: none of it is left.
    assert not re.search(r"(?<![\w\u200b])@[\w-]", out)
    assert not re.search(r"[#!]\d", out)
    assert not re.search(
        r"\b(?:clos(?:e[sd]?|ing)|fix(?:e[sd]|ing)?|resolv(?:e[sd]?|ing)|implement(?:s|ed|ing)?)\b", out, re.I
    )
    assert not re.search(r"(?:/issues/|/pull/|\bGH-)\d", out)


def test_code_stays_readable_and_plain_words_are_left_alone() -> None:
    assert (
        defused("`@Override` in Fixture.java, a prefix, no issue")
        == f"`@{ZWSP}Override` in Fixture.java, a prefix, no issue"
    )
