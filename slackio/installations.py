"""Which bot token answers a Slack workspace: the one SLACK_BOT_TOKEN, or that workspace's installation.

An app installed through OAuth v2 (SLACK_CLIENT_ID and SLACK_CLIENT_SECRET; docs/slack-app.md) has one
installation per workspace, or one per Enterprise Grid org when an org admin installed it org-wide: slack_sdk's
SQLAlchemy stores keep them in the project's database (their tables are in chatops/schema.py and its
migrations), with the OAuth flow's one-use states. The bot's authorize (bot.app) and every worker's Web API client
(slackio.slack_client.web_client) ask `Installations.token` for the workspace of the thread they serve, never a
process-wide token, so nothing answers a workspace with another's token.

A token that rotates (the app's "token rotation" setting: tokens live 12 hours) is refreshed with slack_sdk's
token rotator when it expires within ROTATE_BEFORE_MINUTES (bolt's own margin), before it is used, and saved for
every process. What a process found is kept CACHE_S seconds, so that a turn's hundred calls read the database once,
and a token an uninstall deleted is given up within that time everywhere (the process that saw the uninstall at
once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from slack_sdk.errors import SlackTokenRotationError
from slack_sdk.oauth.installation_store import Installation
from slack_sdk.oauth.installation_store.sqlalchemy import (
    AsyncSQLAlchemyInstallationStore,
    SQLAlchemyInstallationStore,
)
from slack_sdk.oauth.state_store.sqlalchemy import AsyncSQLAlchemyOAuthStateStore
from slack_sdk.oauth.token_rotation.async_rotator import AsyncTokenRotator
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Select, and_, delete, select

from chatops import db
from chatops.schema import BOTS_TABLE, INSTALLATIONS_TABLE, OAUTH_STATES_TABLE, slack_bots, slack_installations
from chatops.teams import Team
from slackio.errors import SlackioError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from chatops.config import Config

log = logging.getLogger("mm.slack.installations")

# A rotating token is refreshed when it expires within this (bolt's default margin: a turn never starts on a token
# that dies in its middle).
ROTATE_BEFORE_MINUTES = 120
# How long a process keeps what it found of a workspace's installation.
CACHE_S = 30.0
# After a refresh that failed, how long a living token is used before the next attempt (every call would otherwise
# try again, each a round trip to Slack).
RETRY_REFRESH_S = 60.0
# Attempts at saving a refreshed token: Slack has spent the old refresh token, so losing the new one would leave
# the workspace with a token nobody can refresh.
SAVE_ATTEMPTS = 3
# How long an install link's state may wait for the person to click Allow (bolt's default).
STATE_SECONDS = 600


class NotInstalled(SlackioError):
    """The app has no installation (or no bot token) for this workspace: never installed, or uninstalled."""

    def __init__(self, team: Team) -> None:
        super().__init__(f"the app is not installed in Slack workspace {team}")
        self.team = team


class Tokens(Protocol):
    """What answers "which bot token speaks in this workspace"."""

    async def token(self, team: Team) -> str: ...


@dataclass(frozen=True)
class SingleToken:
    """One workspace's SLACK_BOT_TOKEN, whatever the workspace asked about (the app installed by hand)."""

    value: str | None

    async def token(self, team: Team) -> str:
        if not self.value:
            raise NotInstalled(team)
        return self.value


class Installations:
    """The app's installations in the project's database (slack_sdk's stores), and their tokens, rotated."""

    def __init__(self, client_id: str, client_secret: str, engine: AsyncEngine, client: AsyncWebClient) -> None:
        """`client`: a Web API client without a token, at the configured API URL (oauth.v2.access's)."""
        self.engine = engine
        self.store = AsyncSQLAlchemyInstallationStore(
            client_id=client_id,
            engine=engine,
            bots_table_name=BOTS_TABLE,
            installations_table_name=INSTALLATIONS_TABLE,
            logger=log,
        )
        self.states = AsyncSQLAlchemyOAuthStateStore(
            expiration_seconds=STATE_SECONDS, engine=engine, table_name=OAUTH_STATES_TABLE, logger=log
        )
        self.rotator = AsyncTokenRotator(client_id=client_id, client_secret=client_secret, client=client)
        self._found: dict[Team, tuple[float, Installation]] = {}
        self._failed: dict[str, float] = {}  # a refresh token whose refresh failed: when

    async def find(self, team: Team) -> Installation | None:
        """The workspace's latest installation: its own (a team id is unique in all of Slack, in an org or not),
        else its org's org-wide one (kept CACHE_S)."""
        kept = self._found.get(team)
        if kept is not None and time.monotonic() - kept[0] < CACHE_S:
            return kept[1]
        c = slack_installations.c
        query = select(slack_installations).where(c.client_id == self.store.client_id)
        if team.team_id:
            query = query.where(c.team_id == team.team_id)
        elif team.enterprise_id:
            query = query.where(c.enterprise_id == team.enterprise_id, c.is_enterprise_install.is_(True))
        else:
            return None
        found = await self._latest(query)
        if found is None and team.team_id and team.enterprise_id:
            org = Team(None, team.enterprise_id)
            found = await self.find(org)
        if found is None:
            self._found.pop(team, None)
            return None
        self._found[team] = (time.monotonic(), found)
        return found

    async def _latest(self, query: Select[Any]) -> Installation | None:
        query = query.order_by(slack_installations.c.installed_at.desc(), slack_installations.c.id.desc()).limit(1)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return SQLAlchemyInstallationStore.build_installation_entity(row) if row is not None else None

    async def fresh(self, team: Team) -> Installation:
        """The workspace's installation with a token that lives ROTATE_BEFORE_MINUTES more, refreshed if it would
        not. A refresh Slack refused is read again from the database (another process, the bot or a worker, may
        have refreshed it first); else, refused or unable to reach Slack, the token in hand is used while it lives
        (Slack may answer again before it dies), and a dead one is not."""
        found = await self.find(team)
        if found is None or not found.bot_token:
            raise NotInstalled(team)
        if not found.bot_refresh_token:
            return found
        failed = self._failed.get(found.bot_refresh_token)
        if failed is not None and time.monotonic() - failed < RETRY_REFRESH_S and _alive(found):
            return found
        try:
            refreshed = await self.rotator.perform_token_rotation(
                installation=found, minutes_before_expiration=ROTATE_BEFORE_MINUTES
            )
        except (SlackTokenRotationError, aiohttp.ClientError, TimeoutError) as exc:
            # Refused, or Slack not reached (its outage: the caller's to report as one, once the token is dead).
            if isinstance(exc, SlackTokenRotationError):
                # Another process may have refreshed it first, with the refresh token this one holds.
                self._found.pop(team, None)
                latest = await self.find(team)
                if latest is not None and latest.bot_token and latest.bot_token != found.bot_token:
                    return latest
            self._failed[found.bot_refresh_token] = time.monotonic()
            if not _alive(found):
                if isinstance(exc, SlackTokenRotationError):
                    raise NotInstalled(team) from exc
                raise
            log.warning("Slack did not refresh the token of workspace %s (%s); using it while it lives", team, exc)
            return found
        if refreshed is None:
            return found
        await self._save(refreshed)
        log.info("refreshed the bot token of Slack workspace %s", team)
        # Every workspace kept with the old token (an org-wide install's, a team found with and without its org)
        # reads the new one: the old refresh token is spent, and a refresh with it would be refused.
        for key in [k for k, (_, kept) in self._found.items() if kept.bot_token == found.bot_token]:
            del self._found[key]
        self._found[team] = (time.monotonic(), refreshed)
        return refreshed

    async def _save(self, refreshed: Installation) -> None:
        for attempt in range(1, SAVE_ATTEMPTS + 1):
            try:
                await self.store.async_save(refreshed)
                return
            except Exception:  # the database, for a moment: the new token must not be lost
                if attempt == SAVE_ATTEMPTS:
                    raise
                log.warning("could not save the refreshed token (attempt %d); trying again", attempt)
                await asyncio.sleep(0.2 * attempt)

    async def token(self, team: Team) -> str:
        token = (await self.fresh(team)).bot_token
        assert token is not None  # fresh refuses an installation without one
        return token

    async def forget(self, team: Team) -> None:
        """Delete a workspace's installations and bots (with no team id: the org's org-wide ones): the app was
        uninstalled or its tokens revoked. The sessions, approvals and audit of the workspace stay."""
        async with self.engine.begin() as conn:
            for table in (slack_installations, slack_bots):
                c = table.c
                if team.team_id:
                    where = c.team_id == team.team_id
                else:
                    where = and_(c.team_id.is_(None), c.enterprise_id == team.enterprise_id)
                await conn.execute(delete(table).where(c.client_id == self.store.client_id, where))
        gone = [k for k in self._found if k == team or (not team.team_id and k.enterprise_id == team.enterprise_id)]
        for key in gone:
            self._found.pop(key, None)

    async def every(self) -> list[Installation]:
        """Every installation, the latest of each workspace or org, oldest first (`mm-bot doctor`)."""
        c = slack_installations.c
        query = select(slack_installations).where(c.client_id == self.store.client_id).order_by(c.installed_at)
        latest: dict[tuple[str | None, str | None], Installation] = {}
        async with self.engine.connect() as conn:
            for row in (await conn.execute(query)).mappings():
                latest[(row["enterprise_id"], row["team_id"])] = SQLAlchemyInstallationStore.build_installation_entity(
                    row
                )
        return list(latest.values())


def _alive(installation: Installation) -> bool:
    return (installation.bot_token_expires_at or 0) > time.time()


# One per process and database: a Celery worker's tasks each run their own event loop, so its engine keeps no
# connection between them (NullPool), and its cache is the process's.
_process: dict[tuple[str, str], Installations] = {}


def installations(config: Config) -> Installations:
    """The process's installations of the app `config` names (it has an OAuth client: `config.oauth`)."""
    assert config.slack_client_id and config.slack_client_secret, "installations need the app's OAuth client"
    key = (config.database_url, config.slack_client_id)
    found = _process.get(key)
    if found is None:
        from sqlalchemy.pool import NullPool

        engine = db.async_engine_for(config.database_url, poolclass=NullPool)
        # slack_sdk joins method names onto base_url, so it ends with a slash (as slack_client.api_base makes it).
        # No retries: a refresh answered but lost on the way spends the refresh token.
        client = AsyncWebClient(base_url=config.slack_api_url.rstrip("/") + "/", retry_handlers=[])
        found = _process[key] = Installations(config.slack_client_id, config.slack_client_secret, engine, client)
    return found


def tokens(config: Config) -> Tokens:
    """What answers a workspace's token in this process: its installations under OAuth, else SLACK_BOT_TOKEN."""
    return installations(config) if config.oauth else SingleToken(config.slack_bot_token)
