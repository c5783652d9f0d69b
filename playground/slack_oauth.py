"""The Slack emulator's workspaces, their Enterprise Grid orgs and the app's installations in them, with Slack's
OAuth v2 (playground/slack_api.py serves it; this module holds the state and Slack's rules, no HTTP).

- **Teams and orgs.** A team (a workspace, `T…`) may belong to an org (`E…`). The emulator's first team is the
  default one, where its constructor's bot token is installed (that token never expires).
- **Installations.** The app is installed in one team (a workspace install; its org named when it has one) or in
  one org (an org-wide install by the org's admin: `is_enterprise_install`, no team). Its bot token reaches the
  channels of its team, or of every team of its org; any other channel is `channel_not_found` to it, as in Slack.
  Each installation has its own bot user (`U…`, `W…` for an org), the same again when the app is reinstalled.
- **The authorize page** (`authorize()`): checks `client_id` (an HTML error page, 400), `scope` (required, its
  names Slack's shape), `redirect_uri` (an http(s) URL, one of `redirect_urls` or under one when any are set),
  then plays the person who chose a workspace and clicked Allow: `team=T…` (a workspace install) or
  `enterprise=E…` (an org-wide one) in the query, which `approve_url()` adds; `deny=1` is the person clicking
  Cancel. It answers a redirect to `redirect_uri` with `code` and `state` (or `error=access_denied`); with no
  choice made, a page that lists the choices.
- **oauth.v2.access** (`access()`): the client's id and secret (HTTP Basic, or parameters): `invalid_client_id`,
  `bad_client_secret`; a code is good once and for ten minutes (`invalid_code`), and `redirect_uri` must be the
  authorize page's when one was given there (`bad_redirect_uri`); a workspace of an org the app is installed in
  org-wide is `cannot_install_an_org_installed_app`. With token rotation, access tokens expire after
  `token_lifetime` seconds (`token_expired`) and come with a refresh token, which `grant_type=refresh_token`
  exchanges (once: `invalid_refresh_token` after) for a new pair; the older access token lasts until it expires.
- **Revocation.** `uninstall()` (and apps.uninstall) revokes an installation's tokens: a call with one answers
  `account_inactive`, Slack's answer to a bot token of a removed app; auth.revoke revokes one token
  (`token_revoked`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import html
import itertools
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from playground.errors import PlaygroundError
from playground.signed import app_uninstalled_body, tokens_revoked_body

# The methods called without a token: the app authenticates with its client id and secret.
TOKENLESS = frozenset({"oauth.v2.access"})
CODE_LIFETIME = 600  # seconds: Slack's codes expire after ten minutes
TOKEN_LIFETIME = 43_200  # seconds: Slack's rotating access tokens last twelve hours
CLIENT_ID = "1234.5678"
CLIENT_SECRET = "3d2f9c0e8b7a41d6a5c4e3f2b1a09876"
# A call with a token of an uninstalled app: Slack's answer for a bot token (token_revoked is a user token's).
UNINSTALLED = "account_inactive"
REVOKED = "token_revoked"  # a token revoked alone (auth.revoke)
# Who clicked Allow, unless the approve URL names them (`user=`): a person of the workspace, or the org's admin.
INSTALLER, ORG_INSTALLER = "U0INSTALLER", "W0INSTALLER"
# Slack's scope names: `commands`, `chat:write`, `chat:write.public`, `users:read.email`, `incoming-webhook`, …
_SCOPE = re.compile(r"[a-z][a-z_.-]*(:[a-z_.-]+)*")


class OAuthError(PlaygroundError):
    """A refusal with Slack's error name (`error`): a method answers `{"ok": false, "error": …}`, the authorize
    page an HTML error page (400) that names it. Raised too by a test helper given a team or installation that is
    not there."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(f"{error}: {detail}" if detail else error)
        self.error = error


@dataclass
class Team:
    """A workspace, in an org when `enterprise_id` is set."""

    id: str
    name: str
    enterprise_id: str | None = None
    enterprise_name: str | None = None

    @property
    def domain(self) -> str:
        """Its domain (`<domain>.slack.com`), as its name makes it."""
        return self.name.lower().replace(" ", "")


@dataclass
class AppInstall:
    """The app installed in a team (`team_id`, and its org's `enterprise_id` when it has one) or org-wide
    (`enterprise_id`, no team, `is_enterprise_install`). `installed` is False once it is uninstalled."""

    team_id: str | None
    enterprise_id: str | None
    is_enterprise_install: bool
    bot_user_id: str
    bot_id: str
    scopes: list[str] = field(default_factory=list)
    installer: str | None = None
    installed: bool = True

    @property
    def key(self) -> str:
        """The team or org it is installed in: one installation each."""
        key = self.enterprise_id if self.is_enterprise_install else self.team_id
        assert key is not None
        return key


@dataclass
class Page:
    """The authorize page's answer: a redirect to `location`, or an HTML page with its status."""

    status: int
    html: str = ""
    location: str | None = None


@dataclass
class Uninstalled:
    """What Slack sends the app once it is uninstalled, in Slack's order: `tokens_revoked`, then
    `app_uninstalled` (Events API bodies, for a test to sign and send to the bot: `SlackEventSender.deliver`)."""

    installation: AppInstall
    tokens_revoked: dict[str, Any]
    app_uninstalled: dict[str, Any]


@dataclass
class _Token:
    installation: AppInstall
    expires_at: float | None = None
    refused: str | None = None  # what a call with it answers once it is revoked


@dataclass
class _Code:
    key: str
    is_enterprise_install: bool
    scopes: list[str]
    redirect_uri: str | None  # as given to the authorize page: the exchange must give the same
    installer: str
    issued_at: float
    used: bool = False


def approve_url(
    authorize_url: str,
    team: str | None = None,
    enterprise: str | None = None,
    *,
    user: str | None = None,
    deny: bool = False,
) -> str:
    """`authorize_url` (the one the bot sends a person to) with the person's choice added: install in `team`, or
    org-wide in `enterprise` (as its admin), as `user`; or `deny` (Cancel). GET it without following redirects:
    the answer is a 302 to the bot's redirect URI with `code` and `state`."""
    if not deny and (team is None) == (enterprise is None):
        raise OAuthError("invalid_arguments", "name a team or an enterprise, one of them")
    parts = urlsplit(authorize_url)
    chosen = {"team": team, "enterprise": enterprise, "user": user, "deny": "1" if deny else None}
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in chosen]
    query += [(k, v) for k, v in chosen.items() if v is not None]
    return urlunsplit(parts._replace(query=urlencode(query)))


class Installations:
    """Teams, orgs, the app's installations, their tokens and the OAuth codes of one emulated app. Not thread-safe:
    the emulator calls it under its lock. `clock` gives the time codes and tokens expire by."""

    def __init__(
        self,
        *,
        app_id: str,
        client_id: str,
        client_secret: str,
        token_rotation: bool,
        token_lifetime: int,
        clock: Callable[[], float],
    ) -> None:
        self.app_id, self.client_id, self.client_secret = app_id, client_id, client_secret
        self.token_rotation, self.token_lifetime = token_rotation, token_lifetime
        self.clock = clock
        # The app's redirect URLs (its manifest's oauth_config.redirect_urls); none: any http(s) URL is taken.
        self.redirect_urls: list[str] = []
        self.reset()

    def reset(self) -> None:
        self.teams: dict[str, Team] = {}
        self.enterprises: dict[str, str] = {}  # id → name
        self.installs: dict[str, AppInstall] = {}  # by key: the team or org installed in
        self.uninstalls: list[Uninstalled] = []
        self._tokens: dict[str, _Token] = {}
        self._refresh: dict[str, AppInstall] = {}
        self._codes: dict[str, _Code] = {}
        self._ids = itertools.count(1)

    # -- teams, installations, tokens -------------------------------------------------------------------------

    def add_team(
        self, team_id: str, name: str, *, enterprise_id: str | None = None, enterprise_name: str | None = None
    ) -> Team:
        if not team_id.startswith("T") or (enterprise_id is not None and not enterprise_id.startswith("E")):
            raise OAuthError("invalid_arguments", f"a team's id starts with T, an org's with E: {team_id}")
        if enterprise_id is not None:
            self.enterprises.setdefault(enterprise_id, enterprise_name or enterprise_id)
        team = Team(team_id, name, enterprise_id, self.enterprises.get(enterprise_id or ""))
        self.teams[team_id] = team
        return team

    def team(self, team_id: str) -> Team:
        if team_id not in self.teams:
            raise OAuthError("team_not_found", f"no team {team_id} (add_team makes one)")
        return self.teams[team_id]

    def seed(self, token: str, team_id: str, bot_user_id: str, bot_id: str) -> AppInstall:
        """The app already installed in `team_id` with `token`, which never expires (the emulator's default)."""
        installation = AppInstall(self.team(team_id).id, self.teams[team_id].enterprise_id, False, bot_user_id, bot_id)
        self.installs[team_id] = installation
        self._tokens[token] = _Token(installation)
        return installation

    def check(self, token: str) -> AppInstall:
        """The installation whose live token this is; Slack's refusal otherwise."""
        held = self._tokens.get(token)
        if held is None:
            raise OAuthError("invalid_auth")
        if held.refused is not None:
            raise OAuthError(held.refused)
        if held.expires_at is not None and self.clock() >= held.expires_at:
            raise OAuthError("token_expired")
        return held.installation

    def live_tokens(self) -> set[str]:
        return {token for token in self._tokens if self._live(token)}

    def _live(self, token: str) -> bool:
        try:
            self.check(token)
        except OAuthError:
            return False
        return True

    def installation_of(self, token: str) -> AppInstall | None:
        """The installation a token was issued to (live or not), a copy; None for a token Slack never issued."""
        held = self._tokens.get(token)
        return _copy(held.installation) if held is not None else None

    def expires_in(self, token: str) -> int | None:
        held = self._tokens.get(token)
        if held is None or held.expires_at is None:
            return None
        return max(0, int(held.expires_at - self.clock()))

    def expire(self, token: str) -> None:
        """Make `token` expired now (its refresh token still works)."""
        if token not in self._tokens:
            raise OAuthError("invalid_auth", "a token the emulator never issued")
        self._tokens[token].expires_at = self.clock() - 1

    def sender_options(self, team_id: str) -> dict[str, Any]:
        """A workspace's fields for a SlackEventSender: its team, its org, and the installation reaching it."""
        team = self.team(team_id)
        installation = self.covering(team.id)
        if installation is None:
            raise OAuthError("not_installed", f"the app is not installed in {team.id}: Slack sends it nothing")
        return {
            "team_id": team.id,
            "team_domain": team.domain,
            "enterprise_id": team.enterprise_id,
            "enterprise_name": team.enterprise_name,
            "is_enterprise_install": installation.is_enterprise_install,
            "bot_user_id": installation.bot_user_id,
        }

    def covers(self, installation: AppInstall, team_id: str) -> bool:
        """Whether a token of `installation` reaches the channels of `team_id`."""
        if not installation.is_enterprise_install:
            return installation.team_id == team_id
        team = self.teams.get(team_id)
        return team is not None and team.enterprise_id == installation.enterprise_id

    def covering(self, team_id: str) -> AppInstall | None:
        """The live installation that reaches `team_id`: its own, else its org's org-wide one."""
        own = self.installs.get(team_id)
        if own is not None and own.installed:
            return own
        org = self.installs.get(self.team(team_id).enterprise_id or "")
        return org if org is not None and org.installed and org.is_enterprise_install else None

    def auth_test(self, installation: AppInstall, token: str | None) -> dict[str, Any]:
        """auth.test's answer but for the bot's name: an org-wide token answers for its org, whose id Slack gives
        as `team_id` too (`url` is then the org's, which bolt stores as the installation's enterprise_url)."""
        if installation.is_enterprise_install:
            assert installation.enterprise_id is not None
            org, name = installation.enterprise_id, self.enterprises[installation.enterprise_id]
            answer: dict[str, Any] = {"url": f"https://{_domain(name)}.enterprise.slack.com/", "team": name}
            answer["team_id"] = org
        else:
            team = self.team(installation.team_id or "")
            answer = {"url": f"https://{team.domain}.slack.com/", "team": team.name, "team_id": team.id}
        answer |= {"user_id": installation.bot_user_id, "bot_id": installation.bot_id}
        if installation.enterprise_id is not None:
            answer["enterprise_id"] = installation.enterprise_id
        answer["is_enterprise_install"] = installation.is_enterprise_install
        left = self.expires_in(token) if token else None
        if left is not None:
            answer["expires_in"] = left
        return answer

    # -- the authorize page -----------------------------------------------------------------------------------

    def authorize(self, query: Mapping[str, str], url: str) -> Page:
        """The page at `url` (/oauth/v2/authorize with `query`), once the person chose (or not)."""
        try:
            return self._authorize(query, url)
        except OAuthError as exc:
            return Page(400, _html("Something went wrong", f'<p class="error">{html.escape(exc.error)}</p>'))

    def _authorize(self, query: Mapping[str, str], url: str) -> Page:
        if query.get("client_id") != self.client_id:
            raise OAuthError("invalid_client_id")
        if query.get("user_scope"):
            # A user token would act as the person: the emulator grants bot tokens only (and says so).
            raise OAuthError("user_scopes_not_emulated")
        scopes = [s.strip() for s in (query.get("scope") or "").split(",") if s.strip()]
        if not scopes:
            raise OAuthError("no_scopes")
        if not all(_SCOPE.fullmatch(s) for s in scopes):
            raise OAuthError("invalid_scope")
        given = query.get("redirect_uri") or None
        redirect = self._redirect_uri(given)
        state = query.get("state")
        if query.get("deny") == "1":
            return Page(302, location=_with_query(redirect, error="access_denied", state=state))
        team, enterprise = query.get("team"), query.get("enterprise")
        if not team and not enterprise:
            return Page(200, self._choices(url))
        if team and enterprise:
            raise OAuthError("invalid_arguments")
        if enterprise:
            if enterprise not in self.enterprises:
                raise OAuthError("enterprise_not_found")
            key, org_wide, installer = enterprise, True, query.get("user") or ORG_INSTALLER
        else:
            key, org_wide, installer = self.team(team or "").id, False, query.get("user") or INSTALLER
        code = self.grant(key, org_wide, scopes, given, installer)
        return Page(302, location=_with_query(redirect, code=code, state=state))

    def _redirect_uri(self, given: str | None) -> str:
        if given is None:
            if not self.redirect_urls:
                raise OAuthError("bad_redirect_uri", "no redirect_uri, and the app has no redirect URL")
            return self.redirect_urls[0]
        if urlsplit(given).scheme not in ("http", "https") or not urlsplit(given).netloc:
            raise OAuthError("bad_redirect_uri")
        # Slack takes one of the app's redirect URLs or a URL under one.
        if self.redirect_urls and not any(given.startswith(u.rstrip("/")) for u in self.redirect_urls):
            raise OAuthError("bad_redirect_uri")
        return given

    def _choices(self, url: str) -> str:
        """The page before the person chose: a link per workspace and per org (as its admin), and Cancel."""
        links = [
            f'<li><a href="{html.escape(approve_url(url, team=t.id))}">{html.escape(t.name)} ({t.id})</a></li>'
            for t in self.teams.values()
        ]
        links += [
            f'<li><a href="{html.escape(approve_url(url, enterprise=e))}">All of {html.escape(n)} ({e})</a></li>'
            for e, n in self.enterprises.items()
        ]
        links.append(f'<li><a href="{html.escape(approve_url(url, deny=True))}">Cancel</a></li>')
        return _html("Install the app", f"<ul>{''.join(links)}</ul>")

    def grant(
        self, key: str, is_enterprise_install: bool, scopes: list[str], redirect_uri: str | None, installer: str
    ) -> str:
        """A fresh code for installing in `key` (a team, or an org when `is_enterprise_install`)."""
        code = f"{next(self._ids)}.{secrets.randbelow(10**12)}.{secrets.token_hex(32)}"
        self._codes[code] = _Code(key, is_enterprise_install, scopes, redirect_uri, installer, self.clock())
        return code

    def install(
        self, team: str | None, enterprise: str | None, scopes: Sequence[str], user: str | None
    ) -> dict[str, Any]:
        """An install without the page (the person's Allow and the app's exchange at once): oauth.v2.access's
        answer."""
        if (team is None) == (enterprise is None):
            raise OAuthError("invalid_arguments", "install in a team or in an org, one of them")
        if enterprise is not None and enterprise not in self.enterprises:
            raise OAuthError("enterprise_not_found", f"no org {enterprise}")
        key = enterprise or self.team(team or "").id
        installer = user or (ORG_INSTALLER if enterprise else INSTALLER)
        return self.redeem(self.grant(key, enterprise is not None, list(scopes), None, installer), None)

    # -- oauth.v2.access, apps.uninstall, auth.revoke ---------------------------------------------------------

    def access(self, params: Mapping[str, Any], authorization: str) -> dict[str, Any]:
        """oauth.v2.access: a code exchanged for an installation's token, or a refresh token for a new pair."""
        self._client(params, authorization)
        grant_type = params.get("grant_type") or "authorization_code"
        if grant_type == "refresh_token":
            return self._refreshed(str(params.get("refresh_token") or ""))
        if grant_type != "authorization_code":
            raise OAuthError("invalid_grant_type")
        return self.redeem(str(params.get("code") or ""), params.get("redirect_uri"))

    def redeem(self, code: str, redirect_uri: str | None) -> dict[str, Any]:
        """A code's exchange, its client already checked."""
        granted = self._codes.get(code)
        if granted is None or granted.used or self.clock() - granted.issued_at > CODE_LIFETIME:
            raise OAuthError("invalid_code")
        if granted.redirect_uri is not None and redirect_uri != granted.redirect_uri:
            raise OAuthError("bad_redirect_uri")
        installation = self._install(granted)
        granted.used = True
        return self._answer(installation, self._issue(installation)) | {"authed_user": {"id": granted.installer}}

    def _client(self, params: Mapping[str, Any], authorization: str) -> None:
        client_id, client_secret = params.get("client_id"), params.get("client_secret")
        if authorization.startswith("Basic "):
            try:
                decoded = base64.b64decode(authorization.removeprefix("Basic "), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            client_id, _, client_secret = decoded.partition(":")
        if client_id != self.client_id:
            raise OAuthError("invalid_client_id")
        if client_secret != self.client_secret:
            raise OAuthError("bad_client_secret")

    def _install(self, granted: _Code) -> AppInstall:
        if not granted.is_enterprise_install:
            org = self.teams[granted.key].enterprise_id
            held = self.installs.get(org or "")
            if held is not None and held.installed and held.is_enterprise_install:
                raise OAuthError("cannot_install_an_org_installed_app")
        installation = self.installs.get(granted.key)
        if installation is None:
            # Slack's bot user of an installation stays the same when the app is reinstalled.
            prefix = "W" if granted.is_enterprise_install else "U"
            team = None if granted.is_enterprise_install else self.teams[granted.key]
            installation = AppInstall(
                team_id=team.id if team is not None else None,
                enterprise_id=team.enterprise_id if team is not None else granted.key,
                is_enterprise_install=granted.is_enterprise_install,
                bot_user_id=f"{prefix}{granted.key[1:]}BOT",
                bot_id=f"B{granted.key[1:]}BOT",
            )
            self.installs[granted.key] = installation
        installation.installed, installation.installer = True, granted.installer
        # A reinstall adds scopes, never takes one away (Slack's scopes are additive).
        installation.scopes += [s for s in granted.scopes if s not in installation.scopes]
        return installation

    def _issue(self, installation: AppInstall) -> dict[str, Any]:
        """A new access token (with a refresh token when tokens rotate)."""
        if not self.token_rotation:
            token = f"xoxb-{next(self._ids)}-{next(self._ids)}-{secrets.token_hex(12)}"
            self._tokens[token] = _Token(installation)
            return {"access_token": token}
        token = f"xoxe.xoxb-1-{secrets.token_hex(24)}"
        refresh = f"xoxe-1-{secrets.token_hex(24)}"
        self._tokens[token] = _Token(installation, self.clock() + self.token_lifetime)
        self._refresh[refresh] = installation
        return {"access_token": token, "refresh_token": refresh, "expires_in": self.token_lifetime}

    def _answer(self, installation: AppInstall, issued: dict[str, Any]) -> dict[str, Any]:
        team = self.teams[installation.team_id] if installation.team_id else None
        org = installation.enterprise_id
        return {
            "access_token": issued["access_token"],
            "token_type": "bot",
            "scope": ",".join(installation.scopes),
            "bot_user_id": installation.bot_user_id,
            "app_id": self.app_id,
            "team": {"id": team.id, "name": team.name} if team is not None else None,
            "enterprise": {"id": org, "name": self.enterprises[org]} if org else None,
            "is_enterprise_install": installation.is_enterprise_install,
        } | {k: v for k, v in issued.items() if k != "access_token"}

    def _refreshed(self, refresh_token: str) -> dict[str, Any]:
        # A refresh token is good once: Slack revokes it as it answers the new pair.
        installation = self._refresh.pop(refresh_token, None)
        if installation is None or not installation.installed:
            raise OAuthError("invalid_refresh_token")
        return self._answer(installation, self._issue(installation))

    def uninstall(self, key: str) -> Uninstalled:
        """The app removed from a team or an org (`key`): its tokens revoked; what Slack then sends the app."""
        installation = self.installs.get(key)
        if installation is None or not installation.installed:
            raise OAuthError("not_installed", f"the app is not installed in {key}")
        installation.installed = False
        for held in self._tokens.values():
            if held.installation is installation:
                held.refused = UNINSTALLED
        for refresh in [r for r, i in self._refresh.items() if i is installation]:
            del self._refresh[refresh]
        where = {"api_app_id": self.app_id, "team_id": installation.team_id}
        where["enterprise_id"] = installation.enterprise_id
        done = Uninstalled(
            _copy(installation),
            tokens_revoked_body(**where, bot=[installation.bot_user_id]),
            app_uninstalled_body(**where),
        )
        self.uninstalls.append(done)
        return done

    def apps_uninstall(self, params: Mapping[str, Any], installation: AppInstall) -> dict[str, Any]:
        """apps.uninstall: the app's client id and secret, and a token of the installation it removes."""
        if params.get("client_id") != self.client_id:
            raise OAuthError("invalid_client_id")
        if params.get("client_secret") != self.client_secret:
            raise OAuthError("bad_client_secret")
        self.uninstall(installation.key)
        return {}

    def revoke(self, token: str, test: bool) -> dict[str, Any]:
        """auth.revoke: this one token (with `test`, nothing: Slack's trial mode)."""
        if not test:
            self._tokens[token].refused = REVOKED
        return {"revoked": not test}


def _copy(installation: AppInstall) -> AppInstall:
    """A copy a test may keep: later installs and uninstalls change the emulator's own."""
    return dataclasses.replace(installation, scopes=list(installation.scopes))


def _domain(name: str) -> str:
    return name.lower().replace(" ", "")


def _with_query(url: str, **params: str | None) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + [(k, v) for k, v in params.items() if v is not None]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _html(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><title>{title} | Slack</title></head><body><h1>{title}</h1>{body}</body></html>"
