"""HTML → Markdown: the fixture pages byte for byte, then each removal, conversion and escaping rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_core.tools.fetch import encoding
from mm_core.tools.fetch.webmd import MAX_DEPTH, Options, to_markdown

FIXTURES = Path(__file__).parent / "fixtures" / "fetch"
BASE = "https://ex.org/docs/page.html"


def md(html: str, **kw) -> str:
    return to_markdown(html, Options(kw.pop("base", BASE), **kw))


@pytest.mark.parametrize("name", ["sphinx_page", "mkdocs_page", "news_page", "malformed"])
def test_fixture_pages_convert_to_the_reviewed_markdown(name: str) -> None:
    html = encoding.decode((FIXTURES / f"{name}.html").read_bytes(), None)
    expected = (FIXTURES / f"{name}.md").read_text(encoding="utf-8")
    assert md(html, base=f"https://docs.example/guide/{name}/") == expected


@pytest.mark.parametrize(
    "tag",
    [
        "script",
        "style",
        "noscript",
        "template",
        "svg",
        "canvas",
        "iframe",
        "object",
        "nav",
        "aside",
        "dialog",
        "button",
        "select",
        "textarea",
    ],
)
def test_removed_elements(tag: str) -> None:
    assert md(f"<p>keep</p><{tag}>gone</{tag}>") == "keep\n"


@pytest.mark.parametrize(
    "html",
    [
        '<div role="navigation">gone</div>',
        '<div role="banner">gone</div>',
        '<div role="complementary">gone</div>',
        '<div role="search">gone</div>',
        '<div role="contentinfo">gone</div>',
        '<div role="dialog">gone</div>',
        '<div aria-hidden="true">gone</div>',
        "<div hidden>gone</div>",
        '<span class="sr-only">gone</span>',
        '<span class="visually-hidden">gone</span>',
        '<span class="screen-reader-text">gone</span>',
        '<div class="ad">gone</div>',
        '<div id="ads">gone</div>',
        '<div class="sponsor-box">gone</div>',
        '<div class="cookie-banner">gone</div>',
        '<div class="gdpr">gone</div>',
        '<div class="newsletter">gone</div>',
        '<div class="share-bar">gone</div>',
        '<div class="social">gone</div>',
        '<div class="breadcrumbs">gone</div>',
        '<div class="navbar">gone</div>',
        '<div class="site-menu">gone</div>',
        '<div class="sidebar">gone</div>',
        '<a class="skip-link" href="#m">gone</a>',
        '<div class="modal">gone</div>',
        '<div class="popup">gone</div>',
        "<footer>gone</footer>",
        '<input type="text" value="gone">',
        "<!-- gone -->",
    ],
)
def test_removal_rules(html: str) -> None:
    assert md(f"<p>keep</p>{html}") == "keep\n"


def test_class_words_do_not_match_inside_other_words() -> None:
    assert md('<div class="header shadow add-to-cart">kept</div>') == "kept\n"


@pytest.mark.parametrize("inner", ["<main><p>kept</p></main>", "<article><p>kept</p></article>", "<h1>kept</h1>"])
def test_furniture_class_is_kept_when_it_holds_the_content(inner: str) -> None:
    assert md(f'<div class="has-sidebar">{inner}</div>').strip("# \n") == "kept"


def test_footer_inside_article_or_main_is_kept() -> None:
    assert md("<article><p>a</p><footer>by me</footer></article>") == "a\n\nby me\n"
    assert md("<main><footer>by me</footer></main>") == "by me\n"


def test_a_class_on_body_never_empties_the_page() -> None:
    assert md('<body class="sidebar-open nav"><p>text</p></body>') == "text\n"


def test_headings_paragraphs_and_emphasis() -> None:
    html = (
        "<h1>A</h1><h2>B</h2><h3>C</h3><h4>D</h4><h5>E</h5><h6>F</h6>"
        "<p>x <strong>s</strong> <b>b</b> <em>e</em> <i>i</i></p>"
    )
    assert md(html) == "# A\n\n## B\n\n### C\n\n#### D\n\n##### E\n\n###### F\n\nx **s** **b** *e* *i*\n"


def test_spaces_move_outside_emphasis_and_nested_styles_do_not_repeat() -> None:
    assert md("<p>a<b> bold </b>c <b><strong>x</strong></b></p>") == "a **bold** c **x**\n"


def test_inline_code_uses_a_fence_longer_than_its_backticks() -> None:
    assert (
        md("<p><code>x</code> <kbd>k</kbd> <samp>s</samp> <tt>t</tt> <code>a`b</code> <code>`x</code></p>")
        == "`x` `k` `s` `t` ``a`b`` `` `x ``\n"
    )


def test_pre_is_a_fenced_block_with_the_language_and_a_long_enough_fence() -> None:
    html = '<pre><code class="language-go hljs">x := "```"\n\ty</code></pre><pre class="lang-sh">ls</pre>'
    assert md(html) == '````go\nx := "```"\n\ty\n````\n\n```sh\nls\n```\n'


def test_br_hr_blockquote() -> None:
    assert (
        md("<p>a<br>b</p><hr><blockquote><p>q</p><blockquote><p>n</p></blockquote></blockquote>")
        == "a\\\nb\n\n---\n\n> q\n>\n> > n\n"
    )


def test_links() -> None:
    html = (
        '<p><a href="../x">rel</a> <a href="javascript:go()">js</a> <a href="https://o.org/a_b"></a> '
        '<a href="/p q(1)">sp</a> <a>no href</a></p>'
    )
    assert md(html) == (
        "[rel](https://ex.org/x) js [https://o.org/a_b](https://o.org/a_b) [sp](https://ex.org/p%20q%281%29) no href\n"
    )


def test_images() -> None:
    html = '<p><img src="i.png" alt="A pic"> <img src="/j.png"> <img src="data:image/png;base64,AA" alt="dot"></p>'
    assert md(html) == "![A pic](https://ex.org/docs/i.png) ![](https://ex.org/j.png) dot\n"


def test_lists_nested_by_the_parent_marker_width() -> None:
    html = '<ol start="9"><li>nine<ul><li>sub</li></ul></li><li>ten<ol><li>a</li></ol></li></ol><ul><li>x</li></ul>'
    assert md(html) == "9. nine\n   - sub\n10. ten\n    1. a\n\n- x\n"


def test_list_item_with_paragraphs() -> None:
    assert md("<ul><li><p>one</p><p>two</p></li><li></li></ul>") == "- one\n\n  two\n"


def test_simple_table_is_gfm_with_caption_escaped_pipes_and_br() -> None:
    html = "<table><caption>Cap</caption><tr><th>a|b</th><th>c</th></tr><tr><td>1<br>2</td></tr></table>"
    assert md(html) == "Cap\n\n| a\\|b | c |\n| --- | --- |\n| 1<br>2 |  |\n"


SPANNED = '<table><tr><th colspan="2">h</th></tr><tr><td rowspan="2">r</td><td>1</td></tr><tr><td>2</td></tr></table>'


def test_spanned_table_is_raw_html_by_default_with_only_kept_attributes() -> None:
    html = SPANNED.replace("<table>", '<table class="x" style="y">').replace("<td>1", '<td id="z">1')
    assert md(html) == (
        '<table><tbody><tr><th colspan="2">h</th></tr><tr><td rowspan="2">r</td><td>1</td></tr>'
        "<tr><td>2</td></tr></tbody></table>\n"
    )


def test_spanned_table_flattened_copies_the_cell_into_every_slot() -> None:
    assert md(SPANNED, tables="flatten") == "| h | h |\n| --- | --- |\n| r | 1 |\n| r | 2 |\n"


def test_nested_table_is_complex() -> None:
    html = "<table><tr><td><table><tr><td>in</td></tr></table></td></tr></table>"
    assert md(html).startswith("<table>")
    assert md(html, tables="flatten") == "| in |\n| --- |\n"


def test_strikethrough_option() -> None:
    html = "<p><del>a</del> <s>b</s> <strike>c</strike></p>"
    assert md(html) == "a b c\n"
    assert md(html, strikethrough=True) == "~~a~~ ~~b~~ ~~c~~\n"


def test_task_list_option() -> None:
    html = (
        '<ul><li><input type="checkbox" checked> done</li><li><p><input type="checkbox"> todo</p></li>'
        '<li>x <input type="checkbox"></li></ul>'
    )
    assert md(html) == "- done\n- todo\n- x\n"
    assert md(html, task_list=True) == "- [x] done\n- [ ] todo\n- x\n"


def test_unknown_elements_keep_text_and_act_as_containers_around_blocks() -> None:
    assert md("<p>a <custom-x>b</custom-x> c</p><my-card><p>one</p><p>two</p></my-card>") == "a b c\n\none\n\ntwo\n"


def test_empty_elements_leave_nothing() -> None:
    assert md("<p>a</p><p> </p><div><span></span></div><h2></h2><ul><li> </li></ul><p>b</p>") == "a\n\nb\n"


def test_escaping() -> None:
    html = (
        "<p>\\ * ` [x] &lt;tag&gt; snake_case _lead trail_ a_b_c</p>"
        "<p># h</p><p>&gt; q</p><p>- d</p><p>+ p</p><p>= e</p><p>| t</p><p>12. n</p>"
    )
    assert md(html) == (
        "\\\\ \\* \\` \\[x\\] \\<tag> snake_case \\_lead trail\\_ a_b_c\n\n\\# h\n\n\\> q\n\n\\- d\n\n"
        "\\+ p\n\n\\= e\n\n\\| t\n\n12\\. n\n"
    )


def test_code_is_not_escaped() -> None:
    assert md("<p><code>*a* [b]</code></p><pre>_x_ # y</pre>") == "`*a* [b]`\n\n```\n_x_ # y\n```\n"


def test_no_title_and_exactly_one_final_newline() -> None:
    assert md("<html><head><title>T</title></head><body>\n\n<p>x</p>\n\n</body></html>") == "x\n"


def test_page_without_content_is_empty() -> None:
    assert md("<nav>menu</nav><script>x()</script><footer>f</footer>") == ""


def test_deep_nesting_falls_back_to_text_instead_of_crashing() -> None:
    depth = MAX_DEPTH * 5
    assert md("<div>" * depth + "deep <b>text</b>" + "</div>" * depth) == "deep text\n"
    assert md("<span>" * depth + "x" + "</span>" * depth) == "x\n"
