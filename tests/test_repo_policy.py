"""The repository a Slack message names (`@mm repo <url> [branch]`): only https:// URLs matching the channel's
`repos` patterns, never an internal host the operator did not name, never credentials, never a bad branch."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from chatops import repos
from chatops.config import ConfigError, load_config
from chatops.repos import RepoChoice, RepoRefused, check_repo

DNS = {
    "github.com": ["140.82.121.3"],
    "gitserver": ["140.82.121.4"],
    "gitlab.com": ["172.65.251.78", "2606:4700:90:0:f22e:fbec:5bed:a9b9"],
    "git.internal.example": ["10.0.0.5"],
    "sub.acme.example": ["151.101.1.7"],
    "deep.sub.acme.example": ["151.101.1.8"],
    "rebind.acme.example": ["151.101.1.9", "127.0.0.1"],
    "meta.acme.example": ["169.254.169.254"],
    "mapped.acme.example": ["::ffff:192.168.1.1"],
    "v6.acme.example": ["fd12:3456::1"],
    "garbage.acme.example": ["not an address"],
    "empty.acme.example": [],
}


def fake_resolve(host: str) -> list[str]:
    if host not in DNS:
        raise OSError(-2, "Name or service not known")
    return DNS[host]


def refuse_to_resolve(host: str) -> list[str]:
    raise AssertionError(f"{host} should not have been resolved")


GITHUB = ["https://github.com/acme/*"]
ANY = ["https://**/**"]


def check(url: str, branch: str | None = None, allowed: list[str] | None = None) -> RepoChoice:
    return check_repo(url, branch, GITHUB if allowed is None else allowed, fake_resolve, channel="C0123ABCD")


def refusal(url: str, branch: str | None = None, allowed: list[str] | None = None) -> str:
    with pytest.raises(RepoRefused) as caught:
        check(url, branch, allowed)
    return str(caught.value)


# --- what is taken -------------------------------------------------------------------------------------------

ACCEPTED = [
    # (what the person wrote, the patterns, the URL taken)
    ("https://github.com/acme/app", GITHUB, "https://github.com/acme/app"),
    ("https://github.com/acme/app.git", GITHUB, "https://github.com/acme/app.git"),
    ("https://github.com/acme/app/", ["https://github.com/acme/*/"], "https://github.com/acme/app/"),
    ("https://github.com/acme/", GITHUB, "https://github.com/acme/"),  # `*` matches nothing too; git then fails
    ("<https://github.com/acme/app>", GITHUB, "https://github.com/acme/app"),
    ("<https://github.com/acme/app|the app>", GITHUB, "https://github.com/acme/app"),
    ("  <https://github.com/acme/app>\n", GITHUB, "https://github.com/acme/app"),
    # Slack links a bare name as http://: the person wrote no scheme, so it is taken as https.
    ("<http://github.com/acme/app|github.com/acme/app>", GITHUB, "https://github.com/acme/app"),
    # git picks its transport by the scheme as written: it comes back in lower case, and the host with it.
    ("HTTPS://GitHub.COM/acme/app", GITHUB, "https://github.com/acme/app"),
    ("hTTpS://github.com/acme/app", ["HTTPS://GITHUB.COM/acme/*"], "https://github.com/acme/app"),
    ("https://github.com/acme/a/b/c.git", ["https://github.com/acme/**"], "https://github.com/acme/a/b/c.git"),
    ("https://github.com/acme/a/b.git", ["https://github.com/acme/**.git"], "https://github.com/acme/a/b.git"),
    ("https://github.com/acme/app", ["https://github.com/*/app"], "https://github.com/acme/app"),
    ("https://sub.acme.example/x", ["https://*.acme.example/*"], "https://sub.acme.example/x"),
    ("https://deep.sub.acme.example/x", ["https://**.acme.example/*"], "https://deep.sub.acme.example/x"),
    ("https://gitlab.com/g/p.git", [*GITHUB, "https://gitlab.com/g/*"], "https://gitlab.com/g/p.git"),
    ("https://gitlab.com:443/g/p", ["https://gitlab.com:443/g/*"], "https://gitlab.com:443/g/p"),
    ("https://github.com/acme/My%20App", GITHUB, "https://github.com/acme/My%20App"),
    ("https://github.com/acme/a&amp;b", GITHUB, "https://github.com/acme/a&b"),  # Slack escapes & < >
    ("https://140.82.121.3/acme/app", ["https://**/acme/*"], "https://140.82.121.3/acme/app"),
    ("https://github.com", ["https://**"], "https://github.com"),
    ("https://github.com/", ["https://**/"], "https://github.com/"),
    ("https://gitserver/a", ["https://*/*"], "https://gitserver/a"),
    # The operator names an internal host literally: that is how it is allowed (and it is not resolved).
    (
        "https://git.internal.example/team/a.git",
        ["https://git.internal.example/team/*.git"],
        "https://git.internal.example/team/a.git",
    ),
    (
        "https://GIT.internal.example/team/a",
        ["https://git.internal.example/team/*"],
        "https://git.internal.example/team/a",
    ),
    ("https://10.0.0.5/team/a", ["https://10.0.0.5/team/*"], "https://10.0.0.5/team/a"),
    ("https://[::ffff:10.0.0.1]/x", ["https://[::ffff:10.0.0.1]/x"], "https://[::ffff:10.0.0.1]/x"),
    ("https://[fd12::1]:8443/x", ["https://[FD12::1]:8443/*"], "https://[fd12::1]:8443/x"),
]


@pytest.mark.parametrize(("url", "allowed", "taken"), ACCEPTED)
def test_accepted(url: str, allowed: list[str], taken: str) -> None:
    assert check(url, None, allowed) == RepoChoice(taken, None)


def test_a_host_the_operator_named_is_not_resolved() -> None:
    allowed = ["https://git.internal.example/team/*"]
    choice = check_repo("https://git.internal.example/team/app", "main", allowed, refuse_to_resolve)
    assert choice == RepoChoice("https://git.internal.example/team/app", "main")


def test_a_wildcard_host_is_resolved_once_per_check() -> None:
    asked: list[str] = []

    def counting(host: str) -> list[str]:
        asked.append(host)
        return fake_resolve(host)

    check_repo("https://sub.acme.example/x", None, ["https://*.acme.example/*"], counting)
    assert asked == ["sub.acme.example"]


# --- what is refused -----------------------------------------------------------------------------------------

C = "C0123ABCD"
INTERNAL_TAIL = (
    f"; an internal server can be used only when a pattern in `channels.{C}.repos` names its host without a wildcard."
)
REFUSED = [
    # (what the person wrote, the patterns, the sentence)
    ("", GITHUB, repos.NO_URL),
    ("<>", GITHUB, repos.NO_URL),
    ("https://github.com/acme/" + "a" * 2000, ["https://github.com/acme/*"], repos.TOO_LONG),
    # Not https.
    ("file:///srv/git/app.git", ANY, repos.FILE),
    ("FILE:///etc/passwd", ANY, repos.FILE),
    ("/srv/git/app.git", ANY, repos.LOCAL),
    ("./app", ANY, repos.LOCAL),
    ("../app", ANY, repos.LOCAL),
    ("~/app", ANY, repos.LOCAL),
    ("app", ANY, repos.LOCAL),
    ("github.com/acme/app", ANY, repos.LOCAL),
    (
        "ext::sh -c touch% /tmp/pwned",
        ANY,
        "`ext::` makes git run a command on the worker; only https:// URLs can be used.",
    ),
    ("ext::sh", ANY, "`ext::` makes git run a command on the worker; only https:// URLs can be used."),
    ("fd::3", ANY, "`fd::` makes git run a transport over file descriptors; only https:// URLs can be used."),
    (
        "https::github.com/acme/app",
        ANY,
        "`https::` makes git run a remote helper program; only https:// URLs can be used.",
    ),
    ("git://github.com/acme/app", ANY, repos.GIT),
    ("http://github.com/acme/app", ANY, repos.HTTP),
    ("<http://github.com/acme/app>", ANY, repos.HTTP),
    ("<http://github.com/acme/app|elsewhere>", ANY, repos.HTTP),
    ("ssh://git@github.com/acme/app", ANY, repos.SSH),
    ("git+ssh://github.com/acme/app", ANY, repos.SSH),
    ("git@github.com:acme/app.git", ANY, repos.SSH),
    ("github.com:acme/app.git", ANY, repos.SSH),
    ("<mailto:git@github.com|git@github.com>:acme/app.git", ANY, repos.SSH),
    (
        "ftp://github.com/acme/app",
        ANY,
        "ftp:// is not a transport the worker's git speaks; only https:// URLs can be used.",
    ),
    # Option injection, odd characters.
    ("-uhttps://github.com/acme/app", ANY, repos.OPTION),
    ("--upload-pack=touch /tmp/x", ANY, repos.OPTION),
    ("<-c>", ANY, repos.OPTION),
    ("https://github.com/acme/a pp", ANY, repos.CONTROL),
    ("https://github.com/acme/app\x00", ANY, repos.CONTROL),
    ("https://github.com/acme/app\x1b[2J", ANY, repos.CONTROL),
    ("https://github.com/acme/app\x7f", ANY, repos.CONTROL),
    ("https://github.com/acme/\u00e4pp", ANY, repos.NON_ASCII),
    (  # the xn-- form is taken (then resolved, here in vain)
        "https://xn--80ak6aa92e.com/acme/app",
        ["https://**/acme/*"],
        "Cannot resolve xn--80ak6aa92e.com (Name or service not known), so it cannot be checked.",
    ),
    ("https://github.com/acme/a\\b", ANY, 'That URL contains "\\", which a URL cannot have there.'),
    ('https://github.com/acme/a"b', ANY, 'That URL contains """, which a URL cannot have there.'),
    ("https://github.com/acme/a&lt;b", ANY, 'That URL contains "<", which a URL cannot have there.'),
    ("https://github.com/acme/a[b]", ANY, 'That URL contains "[", which a URL cannot have there.'),
    # Credentials, queries, fragments.
    ("https://bot:hunter2@github.com/acme/app", ANY, repos.CREDENTIALS),
    ("https://ghp_abcdef0123456789@github.com/acme/app", ANY, repos.CREDENTIALS),
    ("<https://bot:hunter2@github.com/acme/app|the app>", ANY, repos.CREDENTIALS),
    # Slack makes a mail link of the user in `https://git@github.com/…`: read as written, it names a user.
    ("https://<mailto:git@github.com|git@github.com>/acme/app", ANY, repos.CREDENTIALS),
    ("https://github.com/acme/app?access_token=ghp_abcdef", ANY, repos.CREDENTIALS),
    ("https://github.com/acme/app?ref=main", ANY, repos.QUERY),
    ("https://github.com/acme/app#readme", ANY, repos.FRAGMENT),
    # Paths that would lead elsewhere than where they were matched.
    ("https://github.com/acme/../evil/app", ["https://github.com/acme/**"], repos.BAD_PATH),
    ("https://github.com/acme/./app", ["https://github.com/acme/**"], repos.BAD_PATH),
    ("https://github.com/acme/%2e%2e/evil", ["https://github.com/acme/**"], repos.BAD_PATH),
    ("https://github.com/acme/..%2Fevil%2Fapp", GITHUB, repos.BAD_PATH),
    ("https://github.com/acme/a%5Cb", GITHUB, repos.BAD_PATH),
    # Encoded control characters: a newline in a URL is how git's credential helpers were fooled.
    ("https://github.com/acme/app%0a.git", GITHUB, repos.BAD_PATH),
    ("https://github.com/acme/app%0Dhost=evil.example", GITHUB, repos.BAD_PATH),
    ("https://github.com/acme/app%7f", GITHUB, repos.BAD_PATH),
    ("https://github.com/acme//app", ["https://github.com/acme/**"], repos.BAD_PATH),
    ("https://github.com/acme/a%zz", GITHUB, repos.BAD_PERCENT),
    # Hosts.
    ("https:///acme/app", ANY, repos.NO_HOST),
    ("https://:443/acme/app", ANY, repos.NO_HOST),
    ("https://github.com:0/acme/app", ANY, repos.BAD_PORT),
    ("https://github.com:99999/acme/app", ANY, repos.BAD_PORT),
    ("https://github.com:/acme/app", ANY, repos.BAD_PORT),
    ("https://github.com:x/acme/app", ANY, repos.BAD_PORT),
    ("https://git_hub..com/acme/app", ANY, "git_hub..com is not a host name or IP address."),
    ("https://-github.com/acme/app", ANY, "-github.com is not a host name or IP address."),
    ("https://[::1%25lo]/x", ANY, "[::1%25lo] is not a host name or IP address."),
    ("https://[github.com]/x", ANY, "[github.com] is not a host name or IP address."),
    # curl reads these as IPv4 addresses (127.0.0.1 and 10.0.0.1): refused, not resolved as names.
    ("https://2130706433/x", ANY, repos.NUMERIC_HOST.format(host="2130706433")),
    ("https://0x7f000001/x", ANY, repos.NUMERIC_HOST.format(host="0x7f000001")),
    ("https://0177.0.0.1/x", ANY, repos.NUMERIC_HOST.format(host="0177.0.0.1")),
    ("https://127.1/x", ANY, repos.NUMERIC_HOST.format(host="127.1")),
    ("https://10.0.0.010/x", ANY, repos.NUMERIC_HOST.format(host="10.0.0.010")),
    ("https://evil.0x1/x", ANY, repos.NUMERIC_HOST.format(host="evil.0x1")),
    # No pattern, or none matching.
    ("https://github.com/acme/app", [], repos.NO_PATTERNS.format(channel=C)),
    (
        "https://github.com/acme-evil/app",
        GITHUB,
        "https://github.com/acme-evil/app is not among the repositories this channel allows: "
        "https://github.com/acme/*.",
    ),
    ("https://github.com/acme/app/extra", GITHUB, None),
    ("https://github.com/acme", GITHUB, None),
    ("https://github.com/ACME/app", GITHUB, None),
    ("https://github.com:8443/acme/app", GITHUB, None),
    ("https://github.com.evil.example/acme/app", GITHUB, None),
    ("https://github.com/acme/app", ["https://github.co/acme/*", "https://github.com/x/*"], None),
    ("https://sub.acme.example.evil.example/x", ["https://*.acme.example/*"], None),
    ("https://deep.sub.acme.example/x", ["https://*.acme.example/*"], None),
    ("https://github.com/acme/app", ["not a pattern", "ssh://github.com/acme/*"], None),
    ("https://[::1]/x", ["https://*/x"], None),
    # Internal addresses behind a wildcard.
    (
        "https://meta.acme.example/x",
        ["https://*.acme.example/*"],
        "meta.acme.example resolves to a cloud metadata address (169.254.169.254)" + INTERNAL_TAIL,
    ),
    (
        "https://rebind.acme.example/x",
        ["https://*.acme.example/*"],
        "rebind.acme.example resolves to a loopback address (127.0.0.1)" + INTERNAL_TAIL,
    ),
    (
        "https://v6.acme.example/x",
        ["https://*.acme.example/*"],
        "v6.acme.example resolves to a private address (fd12:3456::1)" + INTERNAL_TAIL,
    ),
    (
        "https://mapped.acme.example/x",
        ["https://*.acme.example/*"],
        "mapped.acme.example resolves to ::ffff:192.168.1.1, a private address (as 192.168.1.1 inside an IPv6 "
        "address)" + INTERNAL_TAIL,
    ),
    (
        "https://git.internal.example/team/a.git",
        ["https://git.*.example/team/*"],
        "git.internal.example resolves to a private address (10.0.0.5)" + INTERNAL_TAIL,
    ),
    (
        "https://git.internal.example/team/a.git",
        ["https://**/team/*"],
        "git.internal.example resolves to a private address (10.0.0.5)" + INTERNAL_TAIL,
    ),
    ("https://10.0.0.5/team/a", ["https://10.0.0.*/team/*"], "10.0.0.5 is a private address" + INTERNAL_TAIL),
    ("https://127.0.0.1./x", ANY, "127.0.0.1 is a loopback address" + INTERNAL_TAIL),
    ("https://[::1]/x", ANY, "::1 is a loopback address" + INTERNAL_TAIL),
    (
        "https://[::ffff:10.0.0.1]/x",
        ANY,
        "::ffff:10.0.0.1 is a private address (as 10.0.0.1 inside an IPv6 address)" + INTERNAL_TAIL,
    ),
    ("https://[::ffff:8.8.8.8]/x", ["https://[::ffff:1.1.1.1]/x"], None),
    (
        "https://unknown.acme.example/x",
        ["https://*.acme.example/*"],
        "Cannot resolve unknown.acme.example (Name or service not known), so it cannot be checked.",
    ),
    (
        "https://empty.acme.example/x",
        ["https://*.acme.example/*"],
        "Cannot resolve empty.acme.example (no address), so it cannot be checked.",
    ),
    (
        "https://garbage.acme.example/x",
        ["https://*.acme.example/*"],
        "Cannot resolve garbage.acme.example (not an address in the answer), so it cannot be checked.",
    ),
]


@pytest.mark.parametrize(("url", "allowed", "sentence"), REFUSED)
def test_refused(url: str, allowed: list[str], sentence: str | None) -> None:
    said = refusal(url, None, allowed)
    if sentence is None:  # not matching: the sentence lists the patterns
        assert said.endswith(f"is not among the repositories this channel allows: {', '.join(allowed)}.")
    else:
        assert said == sentence
    assert "\n" not in said


@pytest.mark.parametrize(
    "url",
    [
        "https://bot:hunter2@github.com/acme/app",
        "https://hunter2@github.com/acme/app",
        "https://github.com/acme/app?token=hunter2",
        "https://github.com/acme/app?x=hunter2",
        "https://bot:hunter2@github.com/acme/a pp",
        "https://bot:hunter2@github.com/acme/app#x",
        "ssh://bot:hunter2@github.com/acme/app",
        "http://bot:hunter2@github.com/acme/app",
    ],
)
def test_a_credential_is_never_echoed(url: str) -> None:
    assert "hunter2" not in refusal(url, None, ANY)


def test_no_patterns_names_the_key_of_the_channel_or_a_placeholder() -> None:
    with pytest.raises(RepoRefused, match=r"`channels\.<id>\.repos`"):
        check_repo("https://github.com/acme/app", None, [], fake_resolve)
    with pytest.raises(RepoRefused, match=r"`channels\.C9\.repos`"):
        check_repo("https://github.com/acme/app", None, (), fake_resolve, channel="C9")


def test_an_unresolvable_host_is_refused_even_when_the_resolver_raises_a_unicode_error() -> None:
    def broken(host: str) -> list[str]:
        raise UnicodeError("label too long")

    with pytest.raises(RepoRefused, match=r"^Cannot resolve sub\.acme\.example \(label too long\)"):
        check_repo("https://sub.acme.example/x", None, ["https://*.acme.example/*"], broken)


def test_the_system_resolver_refuses_localhost_unless_it_is_named() -> None:
    with pytest.raises(RepoRefused, match=r"^localhost resolves to a loopback address \((127\.0\.0\.1|::1)\);"):
        check_repo("https://localhost/acme/app", None, ["https://*/acme/*"])
    assert check_repo("https://localhost/acme/app", None, ["https://localhost/acme/*"]) == RepoChoice(
        "https://localhost/acme/app", None
    )
    assert set(repos.system_resolve("localhost")) <= {"127.0.0.1", "::1"}


# --- branches ------------------------------------------------------------------------------------------------

GOOD_BRANCHES = ["main", "feature/x", "release-1.2", "a.lock.b", "a@b", "@@", "x/@", "a{b", "f\u00fcr", "v1.0_rc"]
BAD_BRANCHES = [
    ("", "it is empty"),
    ("a" * 256, "it is longer than 255 characters"),
    ("-f", "it starts with `-`, which git would read as an option"),
    ("--orphan", "it starts with `-`, which git would read as an option"),
    ("a b", "it contains a space or a control character"),
    ("a\tb", "it contains a space or a control character"),
    ("a\x7fb", "it contains a space or a control character"),
    ("a~1", "it contains `~`"),
    ("a^", "it contains `^`"),
    ("a:b", "it contains `:`"),
    ("a?", "it contains `?`"),
    ("a*", "it contains `*`"),
    ("a[b", "it contains `[`"),
    ("a\\b", "it contains `\\`"),
    ("a..b", "it contains `..`"),
    ("a@{1}", "it contains `@{`"),
    ("@", "`@` names no branch"),
    ("HEAD", "`HEAD` names no branch"),
    ("/a", "it starts or ends with `/`, or has an empty part between slashes"),
    ("a/", "it starts or ends with `/`, or has an empty part between slashes"),
    ("a//b", "it starts or ends with `/`, or has an empty part between slashes"),
    ("a.", "it ends with `.`"),
    (".a", "a part of it starts with `.`"),
    ("a/.b", "a part of it starts with `.`"),
    ("a.lock", "a part of it ends with `.lock`"),
    ("a.lock/b", "a part of it ends with `.lock`"),
]


@pytest.mark.parametrize("branch", GOOD_BRANCHES)
def test_valid_branch(branch: str) -> None:
    assert check("https://github.com/acme/app", branch) == RepoChoice("https://github.com/acme/app", branch)


@pytest.mark.parametrize(("branch", "why"), BAD_BRANCHES)
def test_invalid_branch(branch: str, why: str) -> None:
    said = refusal("https://github.com/acme/app", branch)
    shown = f"`{branch}`" if branch and branch.isprintable() and len(branch) <= 100 else "That"
    assert said == f"{shown} is not a valid branch name: {why}."


def test_a_bad_branch_is_refused_before_anything_is_resolved() -> None:
    with pytest.raises(RepoRefused, match="not a valid branch name"):
        check_repo("https://sub.acme.example/x", "a..b", ["https://*.acme.example/*"], refuse_to_resolve)


def _compared_with_git(branch: str) -> bool:
    """All but where this is stricter on purpose: `@` (git reads it as HEAD), a name over 255 characters, and a
    NUL (which no command line carries)."""
    return branch not in ("@", "a" * 256) and "\x00" not in branch


@pytest.mark.process
@pytest.mark.parametrize(
    "branch", [b for b in [*GOOD_BRANCHES, *(b for b, _ in BAD_BRANCHES)] if _compared_with_git(b)]
)
def test_branch_rules_agree_with_git(branch: str) -> None:
    """git check-ref-format --branch decides the same."""
    git = subprocess.run(["git", "check-ref-format", "--branch", branch], capture_output=True, check=False)
    try:
        check("https://github.com/acme/app", branch)
        ours = True
    except RepoRefused:
        ours = False
    assert ours == (git.returncode == 0)


# --- the config key ------------------------------------------------------------------------------------------


def _load(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "mm.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    return [p.removeprefix(f"{path}:") for p in caught.value.problems]


EXPECTED = 'expected a list of https:// URL patterns such as "https://github.com/acme/*"'


def test_config_takes_repos_per_channel_and_for_default(tmp_path: Path) -> None:
    path = tmp_path / "mm.yaml"
    path.write_text(
        textwrap.dedent(
            """
            channels:
              default:
                repos: ["https://github.com/acme/*", "HTTPS://git.internal.example/team/*.git"]
              C0123ABCD:
                repo: https://github.com/acme/app.git
            """
        ),
        encoding="utf-8",
    )
    service = load_config(path, {}).service
    assert service.channel("C0NOTLISTED").repos == [
        "https://github.com/acme/*",
        "HTTPS://git.internal.example/team/*.git",
    ]
    assert service.channel("C0123ABCD").repos == []  # a channel listed on its own does not inherit default's


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("https://github.com/acme/*", f"{EXPECTED}, got a string"),
        ("{a: 1}", f"{EXPECTED}, got a mapping"),
        ("[3]", f"{EXPECTED}, got 3"),
        ("[null]", f"{EXPECTED}, got nothing (null)"),
        ('["http://github.com/acme/*"]', f'{EXPECTED}, got "http://github.com/acme/*"'),
        ('["github.com/acme/*"]', f'{EXPECTED}, got "github.com/acme/*"'),
        ('["ssh://git@github.com/acme/*"]', f'{EXPECTED}, got "ssh://git@github.com/acme/*"'),
        ('["https://"]', f'{EXPECTED}, got "https://"'),
        ('["https:///acme/*"]', f'{EXPECTED}, got "https:///acme/*"'),
        ('["https://github.com/acme/*?x=1"]', f'{EXPECTED}, got "https://github.com/acme/*?x=1"'),
        ('["https://github.com/acme/*#x"]', f'{EXPECTED}, got "https://github.com/acme/*#x"'),
        ('["https://github.com/a b/*"]', f'{EXPECTED}, got "https://github.com/a b/*"'),
        (
            '["https://bot:hunter2@github.com/acme/*"]',
            f'{EXPECTED}, got "https://***@github.com/acme/*" (credentials do not go in a pattern)',
        ),
        (
            '["https://hunter2@github.com"]',
            f'{EXPECTED}, got "https://***@github.com" (credentials do not go in a pattern)',
        ),
    ],
)
def test_config_refuses_what_is_no_https_pattern(tmp_path: Path, value: str, problem: str) -> None:
    problems = _load(
        tmp_path,
        f"""
        channels:
          C0123ABCD:
            repos: {value}
        """,
    )
    assert problems == [f"3: channels.C0123ABCD.repos: {problem}"]


@pytest.mark.parametrize(
    ("pattern", "url"),
    [
        ("https://*", "https://gitserver"),
        ("https://**/**", "https://github.com/a/b"),
        ("https://[::1]:8443/x", "https://[::1]:8443/x"),
        ("https://git.internal.example/a/**.git", "https://git.internal.example/a/b/c.git"),
        ("HTTPS://GitHub.com/", "https://github.com/"),
    ],
)
def test_every_pattern_the_config_takes_is_used(tmp_path: Path, pattern: str, url: str) -> None:
    path = tmp_path / "mm.yaml"
    path.write_text(f'channels:\n  default:\n    repos: ["{pattern}"]\n', encoding="utf-8")
    allowed = load_config(path, {}).service.channel("C1").repos
    assert check_repo(url, None, allowed, fake_resolve).url == url
