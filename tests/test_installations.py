"""Which bot token answers a Slack workspace (slackio.installations), on SQLite and PostgreSQL with the Slack
emulator: installations saved by slack_sdk's own store as bolt's OAuth flow builds them, found for their workspace
(or, org-wide, for every workspace of their org), their rotating tokens refreshed before they die, forgotten when
the app is uninstalled; and the workers' Web API client speaking with the token of the workspace it serves."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_sdk import WebClient
from slack_sdk.oauth.installation_store import Installation
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Engine, func, select
from sqlalchemy.pool import NullPool

from chatops import db
from chatops.config import Config, load_config
from chatops.schema import slack_bots, slack_installations
from chatops.teams import NOWHERE, Team
from playground.slack_api import SlackEmulator
from slackio.installations import ROTATE_BEFORE_MINUTES, Installations, NotInstalled, installations, tokens
from slackio.slack_client import TeamClient, outage, web_client

ALPHA, BETA = "T0ALPHA", "T0BETA"  # two workspaces of no org
GRID, GRID_ONE, GRID_TWO = "E0GRID", "T0GRIDONE", "T0GRIDTWO"  # an org and two of its workspaces
OTHER_ORG, IN_OTHER_ORG = "E0OTHER", "T0OTHERWS"  # an org whose workspace installs the app on its own
SCOPES = ("chat:write", "commands")
# A rotating token issued for this long is within ROTATE_BEFORE_MINUTES of its death from the start.
SHORT_LIFE = ROTATE_BEFORE_MINUTES * 60 // 2


@pytest.fixture
def database_url(engine: Engine) -> str:
    """The module's migrated database, SQLite then PostgreSQL (the test kit's `engine`), which the tests share: each
    test's app is its own (its client id, which every query of slackio.installations is kept to)."""
    return engine.url.render_as_string(hide_password=False)


@pytest.fixture
def grid() -> Iterator[SlackEmulator]:
    """Slack with two workspaces, an org of two more, and another org; the app of this test's own."""
    with SlackEmulator(client_id=f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**12)}") as slack:
        slack.add_team(ALPHA, "Alpha")
        slack.add_team(BETA, "Beta")
        slack.add_team(GRID_ONE, "Grid One", enterprise_id=GRID, enterprise_name="Grid")
        slack.add_team(GRID_TWO, "Grid Two", enterprise_id=GRID)
        slack.add_team(IN_OTHER_ORG, "Other Workspace", enterprise_id=OTHER_ORG, enterprise_name="Other")
        yield slack


def store_of(slack: SlackEmulator, database_url: str, api_url: str | None = None) -> Installations:
    """A process's installations (as slackio.installations.installations makes them), at the emulator."""
    engine = db.async_engine_for(database_url, poolclass=NullPool)
    client = AsyncWebClient(base_url=api_url or slack.url)
    return Installations(slack.client_id, slack.client_secret, engine, client)


def as_bolt_builds(slack: SlackEmulator, answer: dict[str, Any]) -> Installation:
    """The Installation bolt's OAuth flow builds from oauth.v2.access's answer (and auth.test's bot id)."""
    enterprise, team = answer.get("enterprise") or {}, answer.get("team") or {}
    auth = WebClient(token=answer["access_token"], base_url=slack.url).auth_test()
    return Installation(
        app_id=answer.get("app_id"),
        enterprise_id=enterprise.get("id"),
        enterprise_name=enterprise.get("name"),
        enterprise_url=auth.get("url") if answer.get("is_enterprise_install") else None,
        team_id=team.get("id"),
        team_name=team.get("name"),
        bot_token=answer["access_token"],
        bot_id=auth["bot_id"],
        bot_user_id=answer.get("bot_user_id"),
        bot_scopes=answer["scope"],
        bot_refresh_token=answer.get("refresh_token"),
        bot_token_expires_in=answer.get("expires_in"),
        user_id=answer["authed_user"]["id"],
        is_enterprise_install=answer.get("is_enterprise_install") or False,
        token_type=answer.get("token_type"),
    )


def install(
    slack: SlackEmulator,
    store: Installations,
    team: str | None = None,
    enterprise: str | None = None,
    *,
    expires_at: int | None = None,
) -> Installation:
    """The app installed in `team` (or org-wide in `enterprise`) and saved by slack_sdk's store, as bolt does;
    `expires_at`: the token's expiry as the database holds it, when the test needs another."""
    installation = as_bolt_builds(slack, slack.install(team=team, enterprise=enterprise, scopes=SCOPES))
    if expires_at is not None:
        installation.bot_token_expires_at = expires_at
    asyncio.run(store.store.async_save(installation))
    return installation


def token(store: Installations, team: Team) -> str:
    return asyncio.run(store.token(team))


def not_installed(store: Installations, team: Team) -> NotInstalled:
    with pytest.raises(NotInstalled) as caught:
        token(store, team)
    return caught.value


def refreshes(slack: SlackEmulator) -> list[dict[str, Any]]:
    """The refresh grants the app asked Slack for."""
    return [c.params for c in slack.calls_to("oauth.v2.access") if c.params.get("grant_type") == "refresh_token"]


def owner(slack: SlackEmulator, bot_token: str) -> str | None:
    """The workspace (or org) Slack issued `bot_token` to."""
    issued = slack.installation_of(bot_token)
    assert issued is not None, "a token Slack never issued"
    return issued.key


def rows(database_url: str, slack: SlackEmulator, table: Any, **where: str | None) -> int:
    """The rows of `table` of the test's app."""
    engine = db.engine_for(database_url)
    try:
        query = select(func.count()).select_from(table).where(table.c.client_id == slack.client_id)
        for column, value in where.items():
            query = query.where(table.c[column].is_(None) if value is None else table.c[column] == value)
        with engine.connect() as conn:
            return conn.execute(query).scalar_one()
    finally:
        engine.dispose()


# -- finding a workspace's installation ------------------------------------------------------------------------


def test_a_workspace_s_installation_answers_that_workspace_and_no_other(grid: SlackEmulator, database_url: str) -> None:
    store = store_of(grid, database_url)
    alpha = install(grid, store, ALPHA)
    beta = install(grid, store, BETA)
    assert token(store, Team(ALPHA)) == alpha.bot_token and token(store, Team(BETA)) == beta.bot_token
    assert alpha.bot_token != beta.bot_token
    found = asyncio.run(store.find(Team(ALPHA)))
    assert found is not None and (found.team_id, found.bot_user_id, found.team_name) == (ALPHA, "U0ALPHABOT", "Alpha")
    # Each token is Slack's own for its workspace.
    assert owner(grid, token(store, Team(BETA))) == BETA


def test_an_org_wide_installation_answers_every_workspace_of_its_org_and_no_other_org(
    grid: SlackEmulator, database_url: str
) -> None:
    store = store_of(grid, database_url)
    org = install(grid, store, enterprise=GRID)
    assert org.team_id is None and org.is_enterprise_install
    for team in (Team(GRID_ONE, GRID), Team(GRID_TWO, GRID), Team(None, GRID)):
        assert token(store, team) == org.bot_token, team
    # The org's token reaches a channel of each of its workspaces, as Slack's does.
    grid.add_channel("C0GRIDTWO", "two", team=GRID_TWO)
    WebClient(token=token(store, Team(GRID_TWO, GRID)), base_url=grid.url).chat_postMessage(
        channel="C0GRIDTWO", text="hi"
    )
    # A workspace of another org, or one Slack names without its org, is not the org's.
    not_installed(store, Team(IN_OTHER_ORG, OTHER_ORG))
    not_installed(store, Team(ALPHA))


def test_a_workspace_s_own_installation_comes_before_its_org_s(grid: SlackEmulator, database_url: str) -> None:
    store = store_of(grid, database_url)
    own = install(grid, store, GRID_ONE)  # installed in the workspace first, then org-wide by the org's admin
    org = install(grid, store, enterprise=GRID)
    assert token(store, Team(GRID_ONE, GRID)) == own.bot_token
    assert token(store, Team(GRID_TWO, GRID)) == org.bot_token


def test_a_team_id_alone_finds_its_installation_in_an_org(grid: SlackEmulator, database_url: str) -> None:
    store = store_of(grid, database_url)
    own = install(grid, store, IN_OTHER_ORG)
    assert own.enterprise_id == OTHER_ORG and own.team_id == IN_OTHER_ORG  # what the store keeps
    # A job names its workspace by its id alone (Team.named), a thread by its workspace and org.
    assert token(store, Team.named(IN_OTHER_ORG)) == own.bot_token
    assert token(store, Team(IN_OTHER_ORG, OTHER_ORG)) == own.bot_token


def test_a_workspace_the_app_is_not_installed_in_is_named_in_the_refusal(
    grid: SlackEmulator, database_url: str
) -> None:
    store = store_of(grid, database_url)
    install(grid, store, ALPHA)
    assert "T0NOWHERE" in str(not_installed(store, Team("T0NOWHERE")))
    refused = not_installed(store, Team(GRID_ONE, GRID))
    assert refused.team == Team(GRID_ONE, GRID) and str(refused).endswith(f"workspace {GRID_ONE} (org {GRID})")
    assert str(not_installed(store, NOWHERE)).endswith("an unknown workspace")
    assert not grid.calls_to("oauth.v2.access")


# -- rotation -----------------------------------------------------------------------------------------------------


def test_a_rotating_token_near_its_expiry_is_refreshed_before_it_is_used_and_saved_for_every_process(
    grid: SlackEmulator, database_url: str
) -> None:
    grid.token_rotation, grid.token_lifetime = True, SHORT_LIFE
    store = store_of(grid, database_url)
    old = install(grid, store, ALPHA)
    assert old.bot_refresh_token and old.bot_token_expires_at is not None
    assert old.bot_token_expires_at < time.time() + ROTATE_BEFORE_MINUTES * 60
    grid.token_lifetime = 43_200  # Slack's twelve hours for the new one

    new = token(store, Team(ALPHA))
    assert new != old.bot_token and new in grid.tokens
    [refresh] = refreshes(grid)
    assert refresh["refresh_token"] == old.bot_refresh_token
    assert owner(grid, new) == ALPHA

    # Another process reads the new token, and its refresh token, from the database: no second refresh.
    other = asyncio.run(store_of(grid, database_url).find(Team(ALPHA)))
    assert other is not None and other.bot_token == new
    assert other.bot_refresh_token not in (None, old.bot_refresh_token)
    assert (other.bot_token_expires_at or 0) > time.time() + ROTATE_BEFORE_MINUTES * 60
    assert token(store_of(grid, database_url), Team(ALPHA)) == new and len(refreshes(grid)) == 1
    assert rows(database_url, grid, slack_installations, team_id=ALPHA) == 1  # refreshed in place, not a new install


def test_a_token_far_from_its_expiry_is_used_as_it_is(grid: SlackEmulator, database_url: str) -> None:
    grid.token_rotation = True  # twelve hours
    store = store_of(grid, database_url)
    installed = install(grid, store, ALPHA)
    assert installed.bot_refresh_token
    for _ in range(3):
        assert token(store, Team(ALPHA)) == installed.bot_token
    assert not grid.calls_to("oauth.v2.access")


def test_a_refresh_slack_refuses_leaves_a_living_token_in_use(grid: SlackEmulator, database_url: str) -> None:
    grid.token_rotation, grid.token_lifetime = True, SHORT_LIFE
    store = store_of(grid, database_url)
    installed = install(grid, store, ALPHA)
    grid.fail("oauth.v2.access", "invalid_refresh_token")
    assert token(store, Team(ALPHA)) == installed.bot_token
    assert len(refreshes(grid)) == 1 and installed.bot_token in grid.tokens


def test_a_living_token_stays_in_use_while_slack_cannot_be_reached_for_its_refresh(
    grid: SlackEmulator, database_url: str
) -> None:
    grid.token_rotation, grid.token_lifetime = True, SHORT_LIFE
    installed = install(grid, store_of(grid, database_url), ALPHA)
    # oauth.v2.access unreachable (nothing listens on the discard port): Slack's outage, not a refusal.
    unreachable = store_of(grid, database_url, api_url="http://127.0.0.1:9/api/")
    assert token(unreachable, Team(ALPHA)) == installed.bot_token


def test_a_dead_token_whose_refresh_cannot_reach_slack_is_an_outage_not_an_uninstall(
    grid: SlackEmulator, database_url: str
) -> None:
    grid.token_rotation = True
    install(grid, store_of(grid, database_url), ALPHA, expires_at=int(time.time()) - 60)
    unreachable = store_of(grid, database_url, api_url="http://127.0.0.1:9/api/")
    with pytest.raises(aiohttp.ClientError) as caught:
        token(unreachable, Team(ALPHA))
    assert outage(caught.value) is not None  # the worker tries again later, rather than give the thread up


def test_a_dead_token_whose_refresh_slack_refuses_is_not_used(grid: SlackEmulator, database_url: str) -> None:
    grid.token_rotation = True
    store = store_of(grid, database_url)
    installed = install(grid, store, ALPHA, expires_at=int(time.time()) - 60)
    assert installed.bot_token is not None
    grid.expire(installed.bot_token)
    grid.fail("oauth.v2.access", "invalid_refresh_token")
    refused = not_installed(store, Team(ALPHA))
    assert refused.team == Team(ALPHA) and len(refreshes(grid)) == 1


def test_an_org_token_one_workspace_refreshed_answers_the_org_s_other_workspaces(
    grid: SlackEmulator, database_url: str
) -> None:
    grid.token_rotation = True
    store = store_of(grid, database_url)
    org = install(grid, store, enterprise=GRID, expires_at=int(time.time()) - 60)  # died overnight
    assert org.bot_token is not None
    grid.expire(org.bot_token)

    async def both() -> tuple[str, str]:
        return await store.token(Team(GRID_ONE, GRID)), await store.token(Team(GRID_TWO, GRID))

    one, two = asyncio.run(both())
    # The refresh token is good once: the second workspace gets the refreshed token, not a second refresh.
    assert one == two != org.bot_token and len(refreshes(grid)) == 1


# -- uninstalling, listing ------------------------------------------------------------------------------------------


def test_forget_deletes_a_workspace_s_installation_and_what_the_process_kept_of_it(
    grid: SlackEmulator, database_url: str
) -> None:
    store = store_of(grid, database_url)
    install(grid, store, ALPHA)
    beta = install(grid, store, BETA)
    token(store, Team(ALPHA))  # kept for CACHE_S
    assert rows(database_url, grid, slack_installations, team_id=ALPHA) == 1
    assert rows(database_url, grid, slack_bots, team_id=ALPHA) == 1

    asyncio.run(store.forget(Team(ALPHA)))
    assert rows(database_url, grid, slack_installations, team_id=ALPHA) == 0
    assert rows(database_url, grid, slack_bots, team_id=ALPHA) == 0
    not_installed(store, Team(ALPHA))  # at once in this process, whatever it kept
    assert token(store, Team(BETA)) == beta.bot_token  # another workspace's stays


def test_forget_of_an_org_deletes_its_org_wide_installation_and_what_every_workspace_kept(
    grid: SlackEmulator, database_url: str
) -> None:
    store = store_of(grid, database_url)
    install(grid, store, enterprise=GRID)
    own = install(grid, store, IN_OTHER_ORG)
    for team in (Team(GRID_ONE, GRID), Team(GRID_TWO, GRID)):
        token(store, team)

    asyncio.run(store.forget(Team(None, GRID)))
    assert rows(database_url, grid, slack_installations, enterprise_id=GRID) == 0
    assert rows(database_url, grid, slack_bots, enterprise_id=GRID) == 0
    for team in (Team(GRID_ONE, GRID), Team(GRID_TWO, GRID), Team(None, GRID)):
        not_installed(store, team)
    assert token(store, Team(IN_OTHER_ORG, OTHER_ORG)) == own.bot_token


def test_every_lists_the_latest_installation_of_each_workspace_and_org(grid: SlackEmulator, database_url: str) -> None:
    store = store_of(grid, database_url)
    install(grid, store, ALPHA)
    org = install(grid, store, enterprise=GRID)
    again = install(grid, store, ALPHA)  # reinstalled (more scopes, a new token): a new row
    assert rows(database_url, grid, slack_installations, team_id=ALPHA) == 2
    found = asyncio.run(store.every())
    assert [(i.team_id, i.enterprise_id, i.bot_token) for i in found] == [
        (ALPHA, None, again.bot_token),
        (None, GRID, org.bot_token),
    ]
    # Another app's installations (another client id) in the same database are not this app's.
    assert asyncio.run(Installations("9999.0000", "secret", store.engine, AsyncWebClient()).every()) == []


# -- the workers' Web API client ------------------------------------------------------------------------------------


def config_of(tmp_path: Path, **env: str) -> Config:
    path = tmp_path / "mm.yaml"
    path.write_text("{}\n")
    return load_config(path, env)


def test_web_client_under_oauth_posts_with_the_workspace_s_own_token(
    grid: SlackEmulator, database_url: str, tmp_path: Path
) -> None:
    config = config_of(
        tmp_path,
        DATABASE_URL=database_url,
        SLACK_API_URL=grid.url,
        SLACK_CLIENT_ID=grid.client_id,
        SLACK_CLIENT_SECRET=grid.client_secret,
        SLACK_BOT_TOKEN=grid.bot_token,  # not used under OAuth
    )
    assert config.oauth and tokens(config) is installations(config)
    store = installations(config)
    alpha, beta = install(grid, store, ALPHA), install(grid, store, BETA)
    grid.add_channel("C0ALPHA", "alpha", team=ALPHA)
    grid.add_channel("C0BETA", "beta", team=BETA)

    async def post(team: Team, channel: str) -> None:
        client = web_client(config, team)
        assert isinstance(client, TeamClient)
        await client.chat_postMessage(channel=channel, text=f"hello {channel}")

    asyncio.run(post(Team(ALPHA), "C0ALPHA"))
    asyncio.run(post(Team(BETA), "C0BETA"))
    assert alpha.bot_token and beta.bot_token
    assert [c.params["channel"] for c in grid.calls_with(alpha.bot_token) if c.method == "chat.postMessage"] == [
        "C0ALPHA"
    ]
    assert [c.params["channel"] for c in grid.calls_with(beta.bot_token) if c.method == "chat.postMessage"] == [
        "C0BETA"
    ]
    assert not grid.calls_with(grid.bot_token)
    assert [m["text"] for m in grid.messages("C0ALPHA")] == ["hello C0ALPHA"]

    # A workspace the app is not installed in gets no call at all.
    with pytest.raises(NotInstalled):
        asyncio.run(post(Team("T0NOWHERE"), "C0ALPHA"))
    assert len(grid.calls_to("chat.postMessage")) == 2


def test_a_client_asks_its_workspace_s_token_before_each_call(
    grid: SlackEmulator, database_url: str, tmp_path: Path
) -> None:
    config = config_of(
        tmp_path,
        DATABASE_URL=database_url,
        SLACK_API_URL=grid.url,
        SLACK_CLIENT_ID=grid.client_id,
        SLACK_CLIENT_SECRET=grid.client_secret,
    )
    store = installations(config)
    first = install(grid, store, ALPHA)
    grid.add_channel("C0ALPHA", "alpha", team=ALPHA)

    async def run() -> str | None:
        client = web_client(config, Team(ALPHA))  # made once, as a turn's client is
        await client.chat_postMessage(channel="C0ALPHA", text="before")
        await store.forget(Team(ALPHA))  # uninstalled, then installed again: a new token
        again = await asyncio.to_thread(install, grid, store, ALPHA)
        await client.chat_postMessage(channel="C0ALPHA", text="after")
        return again.bot_token

    second = asyncio.run(run())
    assert [c.token for c in grid.calls_to("chat.postMessage")] == [first.bot_token, second]


def test_web_client_with_one_bot_token_posts_with_slack_bot_token(
    slack: SlackEmulator, sqlite_url: str, tmp_path: Path
) -> None:
    config = config_of(tmp_path, DATABASE_URL=sqlite_url, SLACK_API_URL=slack.url, SLACK_BOT_TOKEN=slack.bot_token)
    assert not config.oauth

    async def post() -> None:
        await web_client(config, Team("T0WHATEVER")).chat_postMessage(channel="C0TEST", text="hi")
        await web_client(config).chat_postMessage(channel="C0TEST", text="again")

    asyncio.run(post())
    assert slack.tokens_used("chat.postMessage") == [slack.bot_token, slack.bot_token]
    assert asyncio.run(tokens(config).token(Team("T0ANY"))) == slack.bot_token
