"""The mrkdwn type and the gateway's rules: the service's markup is kept, everyone else's text is escaped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slack_sdk.web.async_client import AsyncWebClient

from slackio.mrkdwn import (
    ZWSP,
    Mrkdwn,
    code_block,
    escape,
    mrkdwn_of,
    quiet_markdown,
    safe_markdown,
    safe_mrkdwn,
    safe_plain,
)
from slackio.slack_out import outgoing
from workers.render import ThreadRenderer

SECRET = "xoxb-secret-token-1234"


def test_values_formatted_into_the_services_text_are_escaped_and_its_markup_kept() -> None:
    text = Mrkdwn("✅ Approved by <@{user}>: {what}").format(user="U123", what="<!channel> & <https://x|y>")
    assert isinstance(text, Mrkdwn)
    assert text == "✅ Approved by <@U123>: &lt;!channel&gt; &amp; &lt;https://x|y&gt;"


def test_mrkdwn_formatted_into_mrkdwn_is_not_escaped_twice() -> None:
    inner = Mrkdwn("<@{u}>").format(u="U1")
    assert Mrkdwn("asked by {who}").format(who=inner) == "asked by <@U1>"
    assert Mrkdwn("{n:>4}").format(n=7) == "   7"


def test_adding_and_joining_plain_text_escapes_it() -> None:
    own = Mrkdwn("<@U1> said: ")
    assert own + "<!here>" == "<@U1> said: &lt;!here&gt;"
    assert "<b>" + own == "&lt;b&gt;<@U1> said: "
    assert isinstance("x" + own, Mrkdwn)
    assert Mrkdwn(", ").join(["<a>", Mrkdwn("<@U2>")]) == "&lt;a&gt;, <@U2>"
    assert own.replace("said", "<wrote>") == "<@U1> &lt;wrote&gt;: "
    with pytest.raises(TypeError):
        _ = Mrkdwn("%s") % "<!here>"


def test_slicing_keeps_the_type_and_makes_no_markup() -> None:
    text = Mrkdwn.of("a <!channel> b")
    assert isinstance(text[:5], Mrkdwn)
    assert "<" not in text[:9]


def test_bare_channel_words_are_neutralised() -> None:
    assert mrkdwn_of("ping @here and @Channel", []) == f"ping @{ZWSP}here and @{ZWSP}Channel"


def test_plain_text_sent_as_mrkdwn_is_escaped_and_scrubbed() -> None:
    sent = safe_mrkdwn(f"fatal: '<!channel> URGENT' {SECRET} <@U9> <https://evil|ok>", [SECRET])
    assert "<" not in sent and ">" not in sent
    assert SECRET not in sent and "***" in sent


def test_the_services_own_text_keeps_its_markup_but_never_a_special_mention() -> None:
    own = Mrkdwn("<@U1> at <!date^1700000000^{date_short_pretty}|2023> <!channel> <!subteam^S1> @everyone")
    sent = safe_mrkdwn(own, [])
    assert "<@U1>" in sent and "<!date^1700000000^" in sent
    assert "<!channel>" not in sent and "<!subteam" not in sent and "@everyone" not in sent


def test_a_secret_is_scrubbed_in_its_escaped_form_too() -> None:
    secret = "p&ss<word>"
    assert secret not in safe_mrkdwn(Mrkdwn.of(f"key {secret}"), [secret])
    assert escape(secret) not in safe_mrkdwn(Mrkdwn.of(f"key {secret}"), [secret])


def test_markdown_and_plain_fields() -> None:
    assert safe_markdown(f"**hi** <!here> {SECRET}", [SECRET]) == f"**hi** <{ZWSP}!here> ***"
    assert safe_plain(f"<b> {SECRET}", [SECRET]) == "<b> ***"


def test_outgoing_walks_blocks_views_and_prompts() -> None:
    params = {
        "channel": "C1",
        "text": "<!channel>",
        "markdown_text": "@here",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": "<!everyone>"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": Mrkdwn("<@U1>")}},
            {"type": "header", "text": {"type": "plain_text", "text": f"<h> {SECRET}"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": "<https://evil|x>"}]},
            {
                "type": "actions",
                "elements": [{"type": "button", "value": "<keep>", "text": {"type": "plain_text", "text": "Go"}}],
            },
        ],
        "view": {"type": "home", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "<!here>"}}]},
        "prompts": [{"title": SECRET, "message": "m"}],
        "thread_ts": None,
    }
    out = outgoing(params, [SECRET])
    assert "thread_ts" not in out
    assert out["text"] == "&lt;!channel&gt;"
    assert out["markdown_text"] == f"@{ZWSP}here"
    blocks = out["blocks"]
    assert blocks[0]["text"]["text"] == "&lt;!everyone&gt;"
    assert blocks[1]["text"]["text"] == "<@U1>"
    assert blocks[2]["text"]["text"] == "<h> ***"
    assert blocks[3]["elements"][0]["text"] == "&lt;https://evil|x&gt;"
    assert blocks[4]["elements"][0]["value"] == "<keep>"
    assert out["view"]["blocks"][0]["text"]["text"] == "&lt;!here&gt;"
    assert out["prompts"][0]["title"] == "***"
    assert params["text"] == "<!channel>"  # the caller's arguments are left as they were


@given(st.text())
def test_whatever_anyone_writes_reaches_slack_without_markup(text: str) -> None:
    sent = safe_mrkdwn(text, [])
    assert "<" not in sent and ">" not in sent
    assert "@here" not in sent.lower() and "@channel" not in sent.lower() and "@everyone" not in sent.lower()
    # Nothing is lost: unescaping gives the text back but for the zero-width spaces.
    back = sent.replace(ZWSP, "").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    assert back == text.replace(ZWSP, "")


@pytest.mark.parametrize("text", ["echo ````", "```", "a ``` b", "`````x`````", "x`\n```"])
def test_no_run_of_backticks_survives_inside_a_code_block(text: str) -> None:
    block = code_block(text)
    body = block.removeprefix("```\n").removesuffix("\n```")
    assert "``" not in body, body  # neither a fence nor an empty code span can end the block early
    assert body.replace(ZWSP, "") == text


def test_quiet_markdown_leaves_slack_s_markup_as_text() -> None:
    said = "see <https://evil.example|docs.python.org>, <@U0ADMIN>, <#C1>, <!here> and a < b <c>"
    quiet = quiet_markdown(said)
    assert "<https:" not in quiet and "<@" not in quiet and "<#" not in quiet and "<!" not in quiet
    assert "a < b <c>" in quiet  # markdown's own `<` stays as written
    assert (
        quiet.replace(ZWSP, "")
        == "see <https://evil.example|docs.python.org>, <@U0ADMIN>, <#C1>, <!here> and a < b <c>"
    )


@given(st.text(alphabet="<@!#:/hHtTpPsSeErRcCaAnNlLyYoOvV ab-", max_size=80))
def test_a_streamed_answer_shows_a_prefix_that_only_grows(raw: str) -> None:
    """The renderer sends a stream piece by piece: what it has shown must stay the start of what it shows next,
    whatever arrives after (render's _stable holds back more than quiet_markdown looks ahead)."""
    renderer = ThreadRenderer(AsyncWebClient(), "C1", "1.0", preview_lines=3)
    shown = [renderer._stable(raw[:i], False) for i in range(len(raw) + 1)]
    final = renderer._stable(raw, True)
    for before, after in zip(shown, [*shown[1:], final], strict=True):
        assert after.startswith(before), (before, after)
    assert final == quiet_markdown(raw)
