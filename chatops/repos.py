"""Which repository a thread may be cloned from when a person names one in Slack (`@mm repo <url> [branch]`).

A repository named in a Slack message is untrusted input: the worker's git runs outside the sandbox, with the
worker's network and, for a push, the team's credentials. `check_repo` takes a URL only when

- it is a plain `https://` URL: the worker's git speaks https and file (workers/git.py, PROTOCOLS), and file is
  for the operator's own mirrors. So no transport helper (`ext::`, `fd::`, any `<name>::`), no ssh (nor its
  scp-like `git@host:path`), no git:// or http://, no local path; nothing git could read as an option (a leading
  `-`); no whitespace, control or non-ASCII character; no credentials, query or fragment; no `.` or `..`
  segment, empty segment or encoded `/`, `\\` or `.` in the path (curl or the server would resolve those to
  another path than the one matched); a host that is a DNS name, a dotted IPv4 address or a bracketed IPv6
  address (`https://2130706433/` and `0x7f.1` are IPv4 addresses to curl, and are refused); 2000 characters at
  most;
- it matches one of the channel's patterns (`channels.<id>.repos`);
- its host resolves to no internal address (mm_core.tools.fetch.guard.blocked_kind), unless a matching pattern
  names that host without a wildcard: that is how the operator says an internal server is meant (the host is then
  not resolved at all: the bot may not see the internal DNS the workers see).

Patterns are globs over the whole URL. The scheme and the host compare case-insensitively, the path exactly. In
the path `*` matches within one segment and `**` across segments: `https://github.com/acme/**` takes
`https://github.com/acme/a/b`. In the host `*` matches within one label (`https://*.example.com/*`) and `**`
anything, port and IP addresses included (`https://**/*`: any server). Nothing else is special (an IPv6 host's
brackets are literal), and a pattern matches the whole URL, not a prefix: `https://github.com/acme/*` takes
neither `https://github.com/acme-evil/x` nor `https://github.com/acme/x/y`.

The URL comes back unwrapped from Slack's `<url|label>` and with its scheme and host in lower case (git picks its
transport by the scheme as written: `HTTPS://` would ask for a `git-remote-HTTPS`), otherwise as given.

The check is made when the repository is chosen, from the machine that runs it. It does not follow git's HTTP
redirects, nor a name that resolves differently when the worker clones: a wildcard host pattern over a domain
someone else controls trusts that someone.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chatops.errors import ChatopsError
from mm_core.tools.fetch.guard import blocked_kind

MAX_URL = 2000
MAX_BRANCH = 255

NO_URL = "No repository URL was given."
TOO_LONG = f"That URL is longer than {MAX_URL} characters."
OPTION = "A repository cannot start with `-`: git would read it as an option."
HELPER = "`{helper}::` makes git run {what}; only https:// URLs can be used."
CONTROL = "That URL contains whitespace or control characters."
NON_ASCII = "That URL has characters outside ASCII; write its host in the xn-- form and percent-encode its path."
CREDENTIALS = (
    "That URL carries credentials, and credentials do not go in a Slack message; the operator configures them "
    "(revoke a real token sent here)."
)
FILE = (
    "A file:// URL names the worker's own disk, which only the operator's config may; only https:// URLs can be used."
)
GIT = "git:// is neither encrypted nor authenticated; only https:// URLs can be used."
HTTP = "Plain http:// is not encrypted; only https:// URLs can be used."
SSH = "The worker's git does not speak ssh; give the repository's https:// URL instead."
SCHEME = "{scheme}:// is not a transport the worker's git speaks; only https:// URLs can be used."
LOCAL = "Without https:// git would take that for a path on the worker's disk; only https:// URLs can be used."
CHARACTER = 'That URL contains "{char}", which a URL cannot have there.'
QUERY = "That URL has a query (?…); a repository's URL has none."
FRAGMENT = "That URL has a fragment (#…); a repository's URL has none."
NO_HOST = "That URL names no host."
BAD_HOST = "{host} is not a host name or IP address."
NUMERIC_HOST = "{host} is not a host name, and an IPv4 address is taken only in its dotted form (such as 192.0.2.10)."
BAD_PORT = "That URL's port is not a number from 1 to 65535."
BAD_PATH = (
    "That URL's path has a `.`, `..` or empty segment, or an encoded `/`, `\\` or `.`, which would lead elsewhere "
    "than the path the patterns were checked against."
)
BAD_PERCENT = "That URL has a `%` that is not followed by two hexadecimal digits."
NO_PATTERNS = (
    "This channel takes no repository from Slack: the operator allows repositories with `channels.{channel}.repos` "
    "in the config (URL patterns such as https://github.com/acme/*)."
)
NOT_ALLOWED = "{url} is not among the repositories this channel allows: {patterns}."
INTERNAL = (
    "{host} {what}; an internal server can be used only when a pattern in `channels.{channel}.repos` names its host "
    "without a wildcard."
)
UNRESOLVED = "Cannot resolve {host} ({reason}), so it cannot be checked."
BRANCH = "{branch} is not a valid branch name: {why}."

_HELPERS = {"ext": "a command on the worker", "fd": "a transport over file descriptors"}
_SLACK_MAILTO = re.compile(r"<mailto:[^|>]*\|([^>]*)>")
_HELPER = re.compile(r"^([A-Za-z0-9][A-Za-z0-9+.-]*)::")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_URL_CHAR = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]")
_PATH_CHAR = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@%/]")
_SECRET_PARAM = re.compile(r"pass|secret|token|key|auth|sig", re.IGNORECASE)
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_DNS_NAME = re.compile(rf"(?=[^:]{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")
# Separators that would change the path once decoded, and control characters (a newline in a URL is how
# git's credential helpers were fooled: CVE-2020-5260, CVE-2024-52006).
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c|2e|[01][0-9a-f]|7f)", re.IGNORECASE)
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")

Resolve = Callable[[str], list[str]]


class RepoRefused(ChatopsError, ValueError):
    """str() is one sentence for the Slack thread saying why."""


@dataclass(frozen=True)
class RepoChoice:
    url: str
    branch: str | None


def system_resolve(host: str) -> list[str]:
    """The host's addresses as the system resolves them (getaddrinfo), as address texts, without scope ids."""
    infos = socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


def check_repo(
    url: str,
    branch: str | None,
    allowed: Sequence[str],
    resolve: Resolve = system_resolve,
    *,
    channel: str = "<id>",
) -> RepoChoice:
    """The repository and branch a person named in Slack, when the channel's patterns (`allowed`) take them.

    `channel` only names the config key in the sentences. Raises RepoRefused, whose str() says why.
    """
    normalized, authority, path = _parse(_unwrap(url))
    if branch is not None:
        check_branch(branch)
    if not allowed:
        raise RepoRefused(NO_PATTERNS.format(channel=channel))
    patterns = [p for p in map(_compile, allowed) if p is not None]
    matching = [p for p in patterns if p.authority.fullmatch(authority) and p.path.fullmatch(path)]
    if not matching:
        raise RepoRefused(NOT_ALLOWED.format(url=normalized, patterns=", ".join(allowed)))
    if not any(p.literal_host for p in matching):
        _check_addresses(_host_of(authority), resolve, channel)
    return RepoChoice(normalized, branch)


# --- the URL --------------------------------------------------------------------------------------------------


def _unwrap(text: str) -> str:
    """The URL in what Slack sent: `<url|label>` and `<url>` unwrapped, `&amp;` `&lt;` `&gt;` unescaped.

    A bare name Slack linked on its own (`github.com/acme/app` becomes `<http://github.com/acme/app|github.com/
    acme/app>`) is taken as https: the person wrote no scheme, Slack's guess is not theirs.
    """
    text = _SLACK_MAILTO.sub(r"\1", text.strip())  # `git@github.com:x` arrives as `<mailto:git@github.com|…>:x`
    if len(text) >= 2 and text.startswith("<") and text.endswith(">"):
        target, bar, label = text[1:-1].partition("|")
        if bar and target[:7].lower() == "http://" and target[7:] == label:
            target = f"https://{label}"
        text = target
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _parse(text: str) -> tuple[str, str, str]:
    """(the normalized URL, its authority in lower case, its path), or RepoRefused."""
    if not text:
        raise RepoRefused(NO_URL)
    if len(text) > MAX_URL:
        raise RepoRefused(TOO_LONG)
    if text.startswith("-"):
        raise RepoRefused(OPTION)
    helper = _HELPER.match(text)
    if helper:
        name = helper.group(1)
        what = _HELPERS.get(name.lower(), "a remote helper program")
        raise RepoRefused(HELPER.format(helper=name[:30], what=what))
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise RepoRefused(CONTROL)
    if not text.isascii():
        raise RepoRefused(NON_ASCII)
    scheme = _SCHEME.match(text)
    if scheme is None:
        raise _not_a_url(text)
    name = scheme.group(1).lower()
    if name != "https":
        raise RepoRefused(_SCHEMES.get(name) or SCHEME.format(scheme=name[:30]))

    rest = text[scheme.end() :]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise RepoRefused(CREDENTIALS)
    _, question, query = rest.partition("#")[0].partition("?")
    if question and _SECRET_PARAM.search(query):  # `?access_token=…`
        raise RepoRefused(CREDENTIALS)
    bad = next((c for c in text if not _URL_CHAR.fullmatch(c)), None)
    if bad is not None:
        raise RepoRefused(CHARACTER.format(char=bad))
    if "?" in rest:
        raise RepoRefused(QUERY)
    if "#" in rest:
        raise RepoRefused(FRAGMENT)
    path = rest[len(authority) :]
    authority = authority.lower()
    _check_authority(authority)
    _check_path(path)
    return f"https://{authority}{path}", authority, path


_SCHEMES = {
    "file": FILE,
    "git": GIT,
    "http": HTTP,
    "ssh": SSH,
    "git+ssh": SSH,
    "ssh+git": SSH,
}


def _not_a_url(text: str) -> RepoRefused:
    before_colon, colon, _ = text.partition(":")
    # git's own rule (url_is_local_not_ssh): a colon before any slash makes `host:path` an ssh address.
    return RepoRefused(SSH if colon and "/" not in before_colon else LOCAL)


def _check_authority(authority: str) -> None:
    if not authority:
        raise RepoRefused(NO_HOST)
    if authority.startswith("["):
        inside, bracket, port = authority[1:].partition("]")  # port: `:443` or nothing
        if not bracket or "%" in inside:
            raise RepoRefused(BAD_HOST.format(host=authority))
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise RepoRefused(BAD_HOST.format(host=authority)) from None
    else:
        host, colon, digits = authority.partition(":")
        port = colon + digits
        if not host:
            raise RepoRefused(NO_HOST)
        if not _DNS_NAME.fullmatch(host):
            raise RepoRefused(BAD_HOST.format(host=host))
        # curl (like a browser) reads a name whose last label is a number as an IPv4 address, in any of its old
        # forms (2130706433, 0x7f000001, 0177.0.0.1, 127.1): only the dotted form is taken.
        if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
            try:
                ipaddress.IPv4Address(host.rstrip("."))
            except ValueError:
                raise RepoRefused(NUMERIC_HOST.format(host=host)) from None
    if port and not (re.fullmatch(r":[0-9]{1,5}", port) and 1 <= int(port[1:]) <= 65535):
        raise RepoRefused(BAD_PORT)


def _check_path(path: str) -> None:
    bad = next((c for c in path if not _PATH_CHAR.fullmatch(c)), None)
    if bad is not None:
        raise RepoRefused(CHARACTER.format(char=bad))
    if _BAD_PERCENT.search(path):
        raise RepoRefused(BAD_PERCENT)
    segments = path.split("/")[1:]
    if (
        _ENCODED_SEPARATOR.search(path)
        or any(s in (".", "..") for s in segments)
        or any(not s for s in segments[:-1])  # a trailing `/` is fine, `//` is not
    ):
        raise RepoRefused(BAD_PATH)


def _host_of(authority: str) -> str:
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.partition(":")[0]


def _check_addresses(host: str, resolve: Resolve, channel: str) -> None:
    """Every address of the host must be public: one internal answer refuses it (a name that mixes public and
    internal answers could be steered to the internal one)."""
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host.rstrip("."))
    except ValueError:
        literal = None
    if literal is not None:
        kind = blocked_kind(literal)
        if kind:
            raise RepoRefused(INTERNAL.format(host=host.rstrip("."), what=f"is {kind}", channel=channel))
        return
    try:
        answers = resolve(host)
        addresses = [(a, ipaddress.ip_address(a)) for a in answers]
    except (OSError, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise RepoRefused(UNRESOLVED.format(host=host, reason=reason)) from None
    except ValueError:
        raise RepoRefused(UNRESOLVED.format(host=host, reason="not an address in the answer")) from None
    if not addresses:
        raise RepoRefused(UNRESOLVED.format(host=host, reason="no address"))
    for shown, ip in addresses:
        kind = blocked_kind(ip)
        if kind:
            what = f"resolves to {shown}, {kind}" if "(" in kind else f"resolves to {kind} ({shown})"
            raise RepoRefused(INTERNAL.format(host=host, what=what, channel=channel))


# --- the patterns ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    authority: re.Pattern[str]
    path: re.Pattern[str]
    literal_host: bool  # no wildcard in the host: the operator named it, an internal address is meant


def _compile(pattern: str) -> _Pattern | None:
    """The pattern as two regular expressions (authority, path); None for what is no https:// pattern (the
    config refuses those; a caller passing one gets it ignored, so it matches nothing)."""
    if not isinstance(pattern, str) or pattern[:8].lower() != "https://":
        return None
    authority, slash, path = pattern[8:].partition("/")
    if not authority or "@" in authority:
        return None
    return _Pattern(
        authority=re.compile(_glob(authority.lower(), one=r"[^/.:\[\]@]*", many=r"[^/@]*")),
        path=re.compile(_glob(slash + path, one=r"[^/]*", many=r".*")),
        literal_host="*" not in authority,
    )


def _glob(text: str, *, one: str, many: str) -> str:
    parts = re.split(r"(\*\*|\*)", text)
    return "".join(many if p == "**" else one if p == "*" else re.escape(p) for p in parts)


# --- the branch -----------------------------------------------------------------------------------------------


def check_branch(branch: str) -> None:
    """git check-ref-format --branch: the rules of refs/heads/<branch>, plus no leading `-` and not HEAD."""
    why = _branch_problem(branch)
    if why:
        safe = branch and branch.isprintable() and "`" not in branch and len(branch) <= 100
        shown = f"`{branch}`" if safe else "That"
        raise RepoRefused(BRANCH.format(branch=shown, why=why))


def _branch_problem(branch: str) -> str | None:
    if not branch:
        return "it is empty"
    if len(branch) > MAX_BRANCH:
        return f"it is longer than {MAX_BRANCH} characters"
    if branch.startswith("-"):
        return "it starts with `-`, which git would read as an option"
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c == " " for c in branch):
        return "it contains a space or a control character"
    bad = next((c for c in "~^:?*[\\" if c in branch), None)
    if bad:
        return f"it contains `{bad}`"
    if ".." in branch:
        return "it contains `..`"
    if "@{" in branch:
        return "it contains `@{`"
    if branch == "@" or branch == "HEAD":
        return f"`{branch}` names no branch"
    if branch.startswith("/") or branch.endswith("/") or "//" in branch:
        return "it starts or ends with `/`, or has an empty part between slashes"
    if branch.endswith("."):
        return "it ends with `.`"
    for part in branch.split("/"):
        if part.startswith("."):
            return "a part of it starts with `.`"
        if part.endswith(".lock"):
            return "a part of it ends with `.lock`"
    return None


__all__ = ["RepoChoice", "RepoRefused", "check_repo", "system_resolve"]
