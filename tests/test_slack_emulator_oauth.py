"""The Slack emulator as an app distributed to many workspaces sees Slack: OAuth v2 installs from the authorize page
(a workspace's, an Enterprise Grid org's), tokens that belong to one installation and reach only its teams, token
rotation, uninstalls and revocations. Each answer is read by slack_sdk's and bolt's own code (AuthorizeUrlGenerator,
the WebClient, bolt's OAuth flow building its Installation, TokenRotator, a bolt app authorizing events from its
installation store), so a shape Slack would not send fails here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from aiohttp import web
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.oauth.async_oauth_flow import AsyncOAuthFlow
from slack_bolt.oauth.async_oauth_settings import AsyncOAuthSettings
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackTokenRotationError
from slack_sdk.oauth import AuthorizeUrlGenerator
from slack_sdk.oauth.installation_store import FileInstallationStore, Installation
from slack_sdk.oauth.state_store import FileOAuthStateStore
from slack_sdk.oauth.token_rotation import TokenRotator
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.slack_response import SlackResponse

from playground.server_thread import ThreadedAiohttpServer
from playground.signed import SlackEventSender
from playground.slack_api import SlackEmulator
from playground.slack_oauth import OAuthError

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
REDIRECT = "http://127.0.0.1:9/slack/oauth_redirect"  # the bot's; never reached: the test reads the redirect
SCOPES = ["chat:write", "commands"]


def body(response: SlackResponse) -> dict[str, Any]:
    assert isinstance(response.data, dict), response.data
    return response.data


def refusal(call: Callable[..., Any], **params: Any) -> str:
    """The error Slack answers `call(**params)` with."""
    with pytest.raises(SlackApiError) as caught:
        call(**params)
    return str(caught.value.response["error"])


def authorize_url(slack: SlackEmulator, state: str = "state-1", **changes: Any) -> str:
    """The URL bolt sends a person to (slack_sdk's generator, as OAuthSettings builds it)."""
    options = {"client_id": slack.client_id, "redirect_uri": REDIRECT, "scopes": SCOPES} | changes
    return AuthorizeUrlGenerator(authorization_url=slack.authorize_url, **options).generate(state)


def follow(url: str) -> dict[str, str]:
    """The person's click on the page: Slack's redirect to the bot's redirect URI, its query."""
    answer = httpx.get(url, follow_redirects=False)
    assert answer.status_code == 302, answer.text
    location = answer.headers["location"]
    assert location.startswith(f"{REDIRECT}?"), location
    return dict(parse_qsl(urlsplit(location).query))


def code_for(slack: SlackEmulator, team: str | None = None, enterprise: str | None = None) -> str:
    return follow(slack.approve_url(authorize_url(slack), team=team, enterprise=enterprise))["code"]


def exchange(slack: SlackEmulator, code: str, **changes: Any) -> dict[str, Any]:
    options = {"client_id": slack.client_id, "client_secret": slack.client_secret, "redirect_uri": REDIRECT}
    return body(WebClient(base_url=slack.url).oauth_v2_access(code=code, **(options | changes)))


def bolt_settings(slack: SlackEmulator, where: Path) -> AsyncOAuthSettings:
    return AsyncOAuthSettings(
        client_id=slack.client_id,
        client_secret=slack.client_secret,
        scopes=SCOPES,
        redirect_uri=REDIRECT,
        authorization_url=slack.authorize_url,
        installation_store=FileInstallationStore(base_dir=str(where / "installations")),
        state_store=FileOAuthStateStore(expiration_seconds=600, base_dir=str(where / "states")),
    )


def bolt_installs(slack: SlackEmulator, code: str, where: Path) -> Installation:
    """bolt's own OAuth flow exchanging the code (oauth.v2.access, then auth.test) into its Installation."""
    flow = AsyncOAuthFlow(client=AsyncWebClient(base_url=slack.url), settings=bolt_settings(slack, where))
    installation = asyncio.run(flow.run_installation(code))
    assert installation is not None, [c.response for c in slack.calls_to("oauth.v2.access")]
    return installation


def client(slack: SlackEmulator, token: str) -> WebClient:
    return WebClient(token=token, base_url=slack.url)


class BoltServer(ThreadedAiohttpServer):
    def __init__(self, bolt: AsyncApp) -> None:
        super().__init__()
        self.bolt = bolt

    def make_app(self) -> web.Application:
        return self.bolt.web_app(path="/slack/events")


def wait_until(done: Callable[[], bool], what: str, timeout: float = 5) -> None:
    """bolt runs listeners after it acks: their effects come a moment later."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


@pytest.fixture
def org(slack: SlackEmulator) -> Iterator[SlackEmulator]:
    """The default team, Alpha (a workspace of its own), and Beta and Gamma, two workspaces of the org E0ORG; a
    channel in each."""
    slack.add_team("T0ALPHA", "Alpha")
    slack.add_team("T0BETA", "Beta", enterprise_id="E0ORG", enterprise_name="Org Inc")
    slack.add_team("T0GAMMA", "Gamma", enterprise_id="E0ORG")
    for team in ("ALPHA", "BETA", "GAMMA"):
        slack.add_channel(f"C0{team}", team.lower(), team=f"T0{team}")
    yield slack


def test_an_install_from_the_authorize_page_gives_bolt_an_installation_of_that_team(
    slack: SlackEmulator, tmp_path: Path
) -> None:
    slack.add_team("T0ALPHA", "Alpha Corp")
    query = follow(slack.approve_url(authorize_url(slack, "st-42"), team="T0ALPHA", user="U0ALICE"))
    assert query["state"] == "st-42" and query["code"]

    installation = bolt_installs(slack, query["code"], tmp_path)
    assert (installation.team_id, installation.team_name, installation.enterprise_id) == ("T0ALPHA", "Alpha Corp", None)
    assert installation.is_enterprise_install is False and installation.app_id == slack.app_id
    assert (installation.bot_user_id, installation.bot_id) == ("U0ALPHABOT", "B0ALPHABOT")  # auth.test's bot_id
    assert installation.bot_scopes == SCOPES and installation.user_id == "U0ALICE"
    token = installation.bot_token
    assert token is not None and token.startswith("xoxb-") and token != slack.bot_token
    assert installation.bot_refresh_token is None and installation.bot_token_expires_at is None  # no rotation

    # bolt called oauth.v2.access with the client's credentials (HTTP Basic), no token.
    [access] = slack.calls_to("oauth.v2.access")
    assert access.token is None and access.headers["Authorization"].startswith("Basic ")
    assert slack.tokens_used("auth.test") == [token]
    # The token is Alpha's: auth.test says so, and users.info knows its bot user.
    alpha = client(slack, token)
    answer = body(alpha.auth_test())
    assert (answer["team_id"], answer["team"], answer["url"]) == (
        "T0ALPHA",
        "Alpha Corp",
        "https://alphacorp.slack.com/",
    )
    assert answer["is_enterprise_install"] is False and "enterprise_id" not in answer
    assert body(alpha.users_info(user="U0ALPHABOT"))["user"]["team_id"] == "T0ALPHA"
    mine = slack.installation_of(token)
    assert mine is not None and (mine.team_id, mine.enterprise_id, mine.is_enterprise_install) == (
        "T0ALPHA",
        None,
        False,
    )


def test_oauth_v2_access_answers_slacks_shape_and_a_code_works_once(slack: SlackEmulator) -> None:
    slack.add_team("T0ALPHA", "Alpha")
    code = code_for(slack, team="T0ALPHA")
    answer = exchange(slack, code)
    assert set(answer) == {
        *("ok", "access_token", "token_type", "scope", "bot_user_id", "app_id"),
        *("team", "enterprise", "is_enterprise_install", "authed_user"),
    }
    assert (answer["token_type"], answer["scope"], answer["app_id"]) == ("bot", "chat:write,commands", slack.app_id)
    assert (answer["team"], answer["enterprise"]) == ({"id": "T0ALPHA", "name": "Alpha"}, None)
    assert answer["authed_user"] == {"id": "U0INSTALLER"}

    oauth = WebClient(base_url=slack.url).oauth_v2_access
    credentials = {"client_id": slack.client_id, "client_secret": slack.client_secret, "redirect_uri": REDIRECT}
    assert refusal(oauth, code=code, **credentials) == "invalid_code"  # used already
    assert refusal(oauth, code="1.2.not-a-code", **credentials) == "invalid_code"
    assert refusal(oauth, **credentials) == "invalid_code"  # none at all
    assert refusal(oauth, grant_type="password", **credentials) == "invalid_grant_type"
    assert client(slack, answer["access_token"]).auth_test()["ok"]  # the refusals took nothing away


def test_the_apps_credentials_are_checked_in_either_form(slack: SlackEmulator) -> None:
    code = code_for(slack, team=slack.team_id)
    oauth = WebClient(base_url=slack.url).oauth_v2_access
    bad_secret = {"client_id": slack.client_id, "client_secret": "not-the-secret"}
    assert refusal(oauth, code=code, redirect_uri=REDIRECT, **bad_secret) == "bad_client_secret"
    bad_id = {"client_id": "9999.9999", "client_secret": slack.client_secret}
    assert refusal(oauth, code=code, redirect_uri=REDIRECT, **bad_id) == "invalid_client_id"
    # The same credentials as parameters (Slack takes both; Basic auth is what it recommends).
    params = {"client_id": slack.client_id, "client_secret": "wrong", "code": code, "redirect_uri": REDIRECT}
    assert refusal(WebClient(base_url=slack.url).api_call, api_method="oauth.v2.access", data=params) == (
        "bad_client_secret"
    )
    answer = body(
        WebClient(base_url=slack.url).api_call("oauth.v2.access", data=params | {"client_secret": slack.client_secret})
    )
    # A reinstall in the default team: its bot user stays, with a new token beside the old one.
    assert answer["bot_user_id"] == slack.bot_user_id and answer["access_token"] != slack.bot_token
    assert client(slack, slack.bot_token).auth_test()["ok"] and client(slack, answer["access_token"]).auth_test()["ok"]


def test_a_code_expires_after_ten_minutes_and_wants_the_authorize_pages_redirect_uri(slack: SlackEmulator) -> None:
    stale = code_for(slack, team=slack.team_id)
    slack.advance(601)
    assert refusal(exchange, slack=slack, code=stale) == "invalid_code"
    code = code_for(slack, team=slack.team_id)
    assert refusal(exchange, slack=slack, code=code, redirect_uri="http://127.0.0.1:9/elsewhere") == "bad_redirect_uri"
    assert refusal(exchange, slack=slack, code=code, redirect_uri=None) == "bad_redirect_uri"
    assert exchange(slack, code)["ok"]
    # Without a redirect_uri at the page, the app's configured one is used, and the exchange needs none.
    slack.oauth.redirect_urls = [REDIRECT]
    query = follow(slack.approve_url(authorize_url(slack, redirect_uri=None), team=slack.team_id))
    assert exchange(slack, query["code"], redirect_uri=None)["ok"]


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"client_id": "9999.9999"}, "invalid_client_id"),
        ({"scopes": []}, "no_scopes"),
        ({"scopes": ["chat:write", "DROP TABLE"]}, "invalid_scope"),
        ({"user_scopes": ["search:read"]}, "user_scopes_not_emulated"),
        ({"redirect_uri": "ftp://127.0.0.1/x"}, "bad_redirect_uri"),
        ({"redirect_uri": None}, "bad_redirect_uri"),  # none given and none configured: nowhere to go
    ],
)
def test_the_authorize_page_refuses_a_bad_request_with_an_error_page(
    slack: SlackEmulator, changes: dict[str, Any], error: str
) -> None:
    answer = httpx.get(slack.approve_url(authorize_url(slack, **changes), team=slack.team_id), follow_redirects=False)
    assert answer.status_code == 400 and answer.headers["content-type"].startswith("text/html")
    assert f'<p class="error">{error}</p>' in answer.text


def test_the_authorize_page_lets_the_person_choose_or_cancel(org: SlackEmulator) -> None:
    slack = org
    url = authorize_url(slack, "st-7")
    denied = follow(slack.approve_url(url, deny=True))
    assert denied == {"error": "access_denied", "state": "st-7"}
    unknown = httpx.get(slack.approve_url(url, team="T0NOPE"), follow_redirects=False)
    assert unknown.status_code == 400 and "team_not_found" in unknown.text
    # Before the choice, the page lists the workspaces and the org: each link is an approval.
    page = httpx.get(url)
    assert page.status_code == 200
    assert all(name in page.text for name in ("Test Team", "Alpha", "Beta", "Gamma", "All of Org Inc", "Cancel"))
    first = page.text.split('href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    assert follow(first)["state"] == "st-7"
    with pytest.raises(OAuthError):
        slack.approve_url(url)  # neither a team nor an org: no choice was made


def test_an_org_wide_install_reaches_every_team_of_its_org_and_no_other(org: SlackEmulator, tmp_path: Path) -> None:
    slack = org
    installation = bolt_installs(slack, code_for(slack, enterprise="E0ORG"), tmp_path)
    assert (installation.enterprise_id, installation.enterprise_name, installation.team_id) == (
        "E0ORG",
        "Org Inc",
        None,
    )
    assert installation.is_enterprise_install is True and installation.user_id == "W0INSTALLER"
    assert installation.bot_user_id == "W0ORGBOT"
    # bolt keeps auth.test's url of an org-wide token as the org's.
    assert installation.enterprise_url == "https://orginc.enterprise.slack.com/"

    token = installation.bot_token
    assert token is not None
    answer = body(client(slack, token).auth_test())
    assert (answer["team_id"], answer["enterprise_id"], answer["is_enterprise_install"]) == ("E0ORG", "E0ORG", True)
    post = client(slack, token).chat_postMessage
    assert post(channel="C0BETA", text="hi")["ok"] and post(channel="C0GAMMA", text="hi")["ok"]
    assert refusal(post, channel="C0ALPHA", text="hi") == "channel_not_found"  # not the org's
    assert refusal(post, channel="C0TEST", text="hi") == "channel_not_found"
    assert slack.messages("C0BETA")[0]["user"] == "W0ORGBOT"
    assert slack.sender_options("T0GAMMA") == {
        "team_id": "T0GAMMA",
        "team_domain": "gamma",
        "enterprise_id": "E0ORG",
        "enterprise_name": "Org Inc",
        "is_enterprise_install": True,
        "bot_user_id": "W0ORGBOT",
    }
    # A workspace of the org cannot install the app on its own once the org has it.
    assert refusal(exchange, slack=slack, code=code_for(slack, team="T0BETA")) == "cannot_install_an_org_installed_app"


def test_two_teams_tokens_are_kept_apart(org: SlackEmulator) -> None:
    slack = org
    alpha_token = slack.install("T0ALPHA")["access_token"]
    beta_token = slack.install("T0BETA")["access_token"]  # a workspace install, in an org
    slack.add_message("C0DELTA", "hello", "U0DAN", team="T0BETA")  # a person's message makes a channel of Beta
    alpha, beta, default = (client(slack, t) for t in (alpha_token, beta_token, slack.bot_token))

    posted = body(alpha.chat_postMessage(channel="C0ALPHA", text="for alpha"))
    assert (posted["message"]["user"], posted["message"]["team"]) == ("U0ALPHABOT", "T0ALPHA")
    beta_ts = body(beta.chat_postMessage(channel="C0DELTA", text="for beta"))["ts"]
    for call, params in [
        (alpha.chat_postMessage, {"channel": "C0BETA", "text": "x"}),
        (alpha.chat_update, {"channel": "C0DELTA", "ts": beta_ts, "text": "x"}),
        (alpha.conversations_history, {"channel": "C0DELTA"}),
        (alpha.reactions_add, {"channel": "C0DELTA", "timestamp": beta_ts, "name": "eyes"}),
        (default.chat_postMessage, {"channel": "C0ALPHA", "text": "x"}),
        (beta.chat_postMessage, {"channel": "C0TEST", "text": "x"}),
        (beta.chat_postMessage, {"channel": "C0GAMMA", "text": "x"}),  # the same org, another workspace
    ]:
        assert refusal(call, **params) == "channel_not_found", (call, params)
    assert default.chat_postMessage(channel="C0TEST", text="as before")["ok"]
    # Beta's own bot user may edit its message; another team's bot could not even see it.
    assert beta.chat_update(channel="C0DELTA", ts=beta_ts, text="edited")["ok"]

    answer = body(beta.auth_test())
    assert (answer["team_id"], answer["enterprise_id"], answer["is_enterprise_install"]) == ("T0BETA", "E0ORG", False)
    assert "enterprise_id" not in body(default.auth_test())  # the default team is in no org, as before
    posts = slack.tokens_used("chat.postMessage")
    assert posts == [alpha_token, beta_token, alpha_token, slack.bot_token, beta_token, beta_token, slack.bot_token]
    assert [c.method for c in slack.calls_with(beta_token)][-2:] == ["chat.update", "auth.test"]
    mine = slack.installation_of(beta_token)
    assert mine is not None and (mine.team_id, mine.enterprise_id, mine.is_enterprise_install) == (
        "T0BETA",
        "E0ORG",
        False,
    )
    assert slack.installation_of("xoxb-never-issued") is None


def test_rotation_through_slack_sdks_token_rotator(slack: SlackEmulator, tmp_path: Path) -> None:
    slack.token_rotation, slack.token_lifetime = True, 60
    slack.add_team("T0ALPHA", "Alpha")
    slack.add_channel("C0ALPHA", "alpha", team="T0ALPHA")
    installation = bolt_installs(slack, code_for(slack, team="T0ALPHA"), tmp_path)
    first, refresh = installation.bot_token, installation.bot_refresh_token
    assert first is not None and refresh is not None and installation.bot_token_expires_at is not None
    assert first.startswith("xoxe.xoxb-") and refresh.startswith("xoxe-1-")
    assert 0 < installation.bot_token_expires_at - time.time() <= 60

    rotator = TokenRotator(
        client_id=slack.client_id, client_secret=slack.client_secret, client=WebClient(base_url=slack.url)
    )
    rotated = rotator.perform_token_rotation(installation=installation)  # it expires within the 120 minutes
    assert rotated is not None and rotated.bot_token not in (None, first)
    assert rotated.bot_refresh_token not in (None, refresh)
    refreshed = slack.calls_to("oauth.v2.access")[-1]
    assert refreshed.params["grant_type"] == "refresh_token" and refreshed.token is None
    assert refreshed.response["team"] == {"id": "T0ALPHA", "name": "Alpha"} and refreshed.response["expires_in"] == 60
    assert rotated.bot_token is not None
    fresh = client(slack, rotated.bot_token)
    assert fresh.chat_postMessage(channel="C0ALPHA", text="rotated")["ok"]
    assert 0 < body(fresh.auth_test())["expires_in"] <= 60

    with pytest.raises(SlackTokenRotationError) as caught:  # a refresh token is good once
        rotator.perform_token_rotation(installation=installation)
    assert caught.value.api_error.response["error"] == "invalid_refresh_token"
    # The older token lasts until it expires; then it answers token_expired, as each does past its lifetime.
    assert client(slack, first).auth_test()["ok"]
    slack.expire(first)
    assert refusal(client(slack, first).chat_postMessage, channel="C0ALPHA", text="x") == "token_expired"
    slack.advance(61)
    assert refusal(fresh.auth_test) == "token_expired"
    again = rotator.perform_token_rotation(installation=rotated)
    assert again is not None and again.bot_token is not None and client(slack, again.bot_token).auth_test()["ok"]
    assert client(slack, slack.bot_token).auth_test()["ok"]  # the default team's token never expires


def test_uninstall_revokes_the_tokens_and_gives_the_events_bolt_cleans_up_with(
    org: SlackEmulator, tmp_path: Path
) -> None:
    slack = org
    store = FileInstallationStore(base_dir=str(tmp_path / "store"))
    installation = bolt_installs(slack, code_for(slack, team="T0ALPHA"), tmp_path)
    store.save(installation)
    token = installation.bot_token
    assert token is not None and store.find_bot(enterprise_id=None, team_id="T0ALPHA") is not None

    gone = slack.uninstall("T0ALPHA")
    assert gone.tokens_revoked["event"] == {"type": "tokens_revoked", "tokens": {"oauth": [], "bot": ["U0ALPHABOT"]}}
    assert gone.app_uninstalled["event"] == {"type": "app_uninstalled"}
    assert gone.app_uninstalled["team_id"] == "T0ALPHA" and "enterprise_id" not in gone.app_uninstalled
    assert refusal(client(slack, token).chat_postMessage, channel="C0ALPHA", text="x") == "account_inactive"
    assert token not in slack.tokens and slack.uninstalls == [gone]
    with pytest.raises(OAuthError):
        slack.uninstall("T0ALPHA")  # not installed any more

    bolt = AsyncApp(signing_secret=SECRET, installation_store=store, client=AsyncWebClient(base_url=slack.url))
    bolt.enable_token_revocation_listeners()
    with BoltServer(bolt) as server, SlackEventSender(server.base, SECRET, api_app_id=slack.app_id) as sender:
        assert sender.deliver(gone.tokens_revoked).status_code == 200
        assert sender.deliver(gone.app_uninstalled).status_code == 200
        wait_until(lambda: store.find_bot(enterprise_id=None, team_id="T0ALPHA") is None, "bolt deletes Alpha's bot")


def test_an_org_uninstall_names_the_org_and_revokes_for_every_team(org: SlackEmulator) -> None:
    slack = org
    token = slack.install(enterprise="E0ORG")["access_token"]
    gone = slack.uninstall("E0ORG")
    assert gone.app_uninstalled["enterprise_id"] == "E0ORG" and "team_id" not in gone.app_uninstalled
    assert gone.tokens_revoked["event"]["tokens"]["bot"] == ["W0ORGBOT"]
    assert refusal(client(slack, token).chat_postMessage, channel="C0BETA", text="x") == "account_inactive"
    with pytest.raises(OAuthError):
        slack.sender_options("T0BETA")  # Slack sends an app nothing from where it is not installed


def test_apps_uninstall_and_auth_revoke_from_the_app(org: SlackEmulator) -> None:
    slack = org
    alpha = client(slack, slack.install("T0ALPHA")["access_token"])
    assert refusal(alpha.apps_uninstall, client_id=slack.client_id, client_secret="wrong") == "bad_client_secret"
    assert alpha.apps_uninstall(client_id=slack.client_id, client_secret=slack.client_secret)["ok"]
    assert refusal(alpha.auth_test) == "account_inactive"
    assert [u.installation.team_id for u in slack.uninstalls] == ["T0ALPHA"]

    beta = client(slack, slack.install("T0BETA")["access_token"])
    assert body(beta.auth_revoke(test=True))["revoked"] is False  # Slack's trial: nothing revoked
    assert beta.auth_test()["ok"]
    assert body(beta.auth_revoke())["revoked"] is True
    assert refusal(beta.auth_test) == "token_revoked"


def test_a_bolt_app_answers_each_teams_events_with_that_teams_token(org: SlackEmulator, tmp_path: Path) -> None:
    """The sender's envelopes for a workspace and for an org-wide install are what bolt needs to find the right
    installation in its store: its replies reach the emulator with that installation's token."""
    slack = org
    store = FileInstallationStore(base_dir=str(tmp_path / "store"))
    alpha = bolt_installs(slack, code_for(slack, team="T0ALPHA"), tmp_path)
    whole_org = bolt_installs(slack, code_for(slack, enterprise="E0ORG"), tmp_path)
    store.save(alpha)
    store.save(whole_org)
    bolt = AsyncApp(signing_secret=SECRET, installation_store=store, client=AsyncWebClient(base_url=slack.url))

    @bolt.event("app_mention")
    async def mention(event: dict[str, Any], say: Any) -> None:
        await say(text="on it", thread_ts=event["ts"])

    @bolt.action("approve")
    async def approve(ack: Any, body: dict[str, Any], client: AsyncWebClient) -> None:
        await ack()
        await client.chat_postMessage(channel=body["channel"]["id"], text="approved")

    @bolt.command("/mm")
    async def command(ack: Any, command: dict[str, Any], client: AsyncWebClient) -> None:
        await ack()
        await client.chat_postMessage(channel=command["channel_id"], text="commanded")

    with BoltServer(bolt) as server, SlackEventSender(server.base, SECRET, api_app_id=slack.app_id) as base:
        senders = {team: base.for_team(**slack.sender_options(team)) for team in ("T0ALPHA", "T0BETA", "T0GAMMA")}
        for team, sender in senders.items():
            channel = f"C0{team[2:]}"
            bot = sender.bot_user_id
            assert sender.app_mention(f"<@{bot}> hi", channel=channel, user="U0PERSON").status_code == 200
            clicked = sender.block_action("approve", "v", user="U0PERSON", channel=channel, message_ts="1.000100")
            assert clicked.status_code == 200
            assert sender.slash_command("/mm", "status", user="U0PERSON", channel=channel).status_code == 200
        wait_until(lambda: len(slack.calls_to("chat.postMessage")) == 9, "nine replies")

    expected = {"C0ALPHA": alpha.bot_token, "C0BETA": whole_org.bot_token, "C0GAMMA": whole_org.bot_token}
    for call in slack.calls_to("chat.postMessage"):
        assert call.response["ok"] and call.token == expected[call.params["channel"]], call.params
    beta = senders["T0BETA"].last_payload
    assert (beta["team_id"], beta["enterprise_id"], beta["is_enterprise_install"]) == ("T0BETA", "E0ORG", "true")
    assert (beta["enterprise_name"], beta["team_domain"]) == ("Org Inc", "beta")


def test_socket_mode_pushes_speak_for_the_team_they_name(org: SlackEmulator) -> None:
    slack = org
    slack.install(enterprise="E0ORG")
    seen: list[SocketModeRequest] = []

    async def on_request(socket: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        seen.append(request)
        await socket.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    async def scenario() -> None:
        socket = SocketModeClient(app_token=slack.app_token, web_client=AsyncWebClient(base_url=slack.url))
        socket.socket_mode_request_listeners.append(on_request)
        await socket.connect()
        try:
            pushed = [
                slack.push_app_mention("<@W0ORGBOT> hi", channel="C0NEW", user="U0PERSON", team="T0BETA"),
                slack.push_app_mention("<@U0BOT> hi", channel="C0TEST", user="U0ALICE"),
                slack.push_block_action("approve", "v", user="U0PERSON", channel="C0NEW", team="T0BETA"),
            ]
            for envelope_id in pushed:
                await asyncio.to_thread(slack.wait_for_ack, envelope_id)
        finally:
            await socket.close()

    asyncio.run(scenario())
    org_mention, default_mention, click = (request.payload for request in seen)
    assert org_mention["authorizations"] == [
        {
            "enterprise_id": "E0ORG",
            "team_id": None,
            "user_id": "W0ORGBOT",
            "is_bot": True,
            "is_enterprise_install": True,
        }
    ]
    assert (org_mention["team_id"], org_mention["enterprise_id"], org_mention["context_enterprise_id"]) == (
        *("T0BETA", "E0ORG", "E0ORG"),
    )
    assert default_mention["authorizations"][0]["team_id"] == "T0TESTTEAM" and "enterprise_id" not in default_mention
    assert org_mention["event_id"] != default_mention["event_id"]  # one sequence of ids across the teams
    assert click["team"] == {"id": "T0BETA", "domain": "beta", "enterprise_id": "E0ORG", "enterprise_name": "Org Inc"}
    assert click["enterprise"] == {"id": "E0ORG", "name": "Org Inc"} and click["is_enterprise_install"] is True
    assert click["user"]["team_id"] == "T0BETA"
    # The person's event made its channel, of the team it came from: the org's token reaches it.
    assert slack.channels["C0NEW"]["context_team_id"] == "T0BETA"
