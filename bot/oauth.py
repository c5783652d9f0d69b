"""Installing the app in many Slack workspaces: bolt's OAuth v2 flow, and the authorize that finds a workspace's
token before a request's listener runs.

With SLACK_CLIENT_ID and SLACK_CLIENT_SECRET (docs/slack-app.md), `/slack/install` sends whoever installs to
Slack's authorize page with the bot scopes of the manifest (`bot/slack-app-manifest.yaml`, the one list: a test
holds it to what the code calls), and `/slack/oauth_redirect` takes Slack's answer: bolt checks the state (one
use, issued to this browser: its cookie), exchanges the code (oauth.v2.access) and saves the installation with
slack_sdk's store (slackio.installations). A workspace install and an Enterprise Grid org-wide install alike.

Authorize (`InstallationAuthorize`) reads the workspace's installation and answers with its bot token and bot
user, as bolt's own does, but without bolt's auth.test on each new token: the installation already says who the
bot is, and nothing before an ack calls the Web API (bot.app) but a rotating token's refresh, once in ten hours a
workspace, when it would otherwise die within ROTATE_BEFORE_MINUTES.
"""

from __future__ import annotations

import logging
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.authorization.async_authorize import AsyncAuthorize
from slack_bolt.error import BoltError
from slack_bolt.oauth.async_callback_options import AsyncFailureArgs
from slack_bolt.oauth.async_oauth_flow import AsyncOAuthFlow
from slack_bolt.oauth.async_oauth_settings import AsyncOAuthSettings
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from bot.errors import BotError
from chatops.teams import Team
from slackio.installations import ROTATE_BEFORE_MINUTES, Installations, NotInstalled

if TYPE_CHECKING:
    from collections.abc import Callable

    from slack_bolt.context.async_context import AsyncBoltContext
    from slack_bolt.request.async_request import AsyncBoltRequest
    from slack_sdk.oauth.installation_store import Installation

    from chatops.config import Config

log = logging.getLogger("mm.bot.oauth")

MANIFEST = "slack-app-manifest.yaml"
# The workspace an Events API envelope names (its `team_id`), put in the context before bolt reads it (bot.app).
ENVELOPE_TEAM = "mm_envelope_team"
INSTALL_PATH = "/slack/install"
REDIRECT_PATH = "/slack/oauth_redirect"


@cache
def bot_scopes() -> tuple[str, ...]:
    """The bot scopes the app asks for when installed: the manifest's, the one list of them."""
    manifest = yaml.safe_load(resources.files("bot").joinpath(MANIFEST).read_text(encoding="utf-8"))
    return tuple(manifest["oauth_config"]["scopes"]["bot"])


def authorize_url(api_url: str) -> str:
    """Slack's page where a person allows the install, beside the Web API it answers from (Slack's own,
    GovSlack's, or the emulator's: `…/api/` → `…/oauth/v2/authorize`)."""
    base = api_url.rstrip("/").removesuffix("/api")
    return f"{base}/oauth/v2/authorize"


# A workspace (or org) the config has no `teams` section for: served by this deployment only once named there.
NOT_SERVED = (
    "an install in Slack workspace {team} was refused: the config has no teams.{key} section (add one, even "
    "empty, to serve it, then install again)"
)


REFUSED_PAGE = (
    "<!DOCTYPE html><html><head><title>Not installed</title></head><body><h1>Not installed</h1>"
    "<p>This deployment of mm does not serve this Slack workspace. Its operator can add it to the configuration "
    "(a <code>teams</code> section), after which installing again works.</p></body></html>"
)


class NotServed(BotError, BoltError):
    """An install in a workspace the config does not serve (bolt answers its failure page)."""


class ServedFlow(AsyncOAuthFlow):
    """Bolt's install flow, which keeps an installation only for a workspace (or org) the config serves: the
    install link is public, and anyone could otherwise install the app and run the agent on the operator's
    repositories."""

    def __init__(self, *, serves: Callable[[Team], bool], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.serves = serves
        failed = self.failure_handler

        async def failure(args: AsyncFailureArgs) -> BoltResponse:
            # Bolt's page for a store that failed says 500; a workspace not served is a refusal, said so.
            if isinstance(args.error, NotServed):
                return BoltResponse(status=403, body=REFUSED_PAGE, headers={"Content-Type": "text/html; charset=utf-8"})
            return await failed(args)

        self.failure_handler = failure

    async def store_installation(self, request: AsyncBoltRequest, installation: Installation) -> None:
        team = Team(installation.team_id, installation.enterprise_id)
        if not self.serves(team):
            key = installation.team_id or installation.enterprise_id
            log.warning(NOT_SERVED.format(team=team, key=key))
            raise NotServed(NOT_SERVED.format(team=team, key=key))
        await super().store_installation(request, installation)


def install_flow(
    config: Config, installations: Installations, client: AsyncWebClient, serves: Callable[[Team], bool]
) -> ServedFlow:
    """The app's install flow at the configured Slack, keeping what the config serves."""
    return ServedFlow(serves=serves, client=client, logger=log, settings=oauth_settings(config, installations))


def oauth_settings(config: Config, installations: Installations) -> AsyncOAuthSettings:
    """Bolt's OAuth flow on the project's database (slack_sdk's stores), at the configured Slack."""
    assert config.slack_client_id and config.slack_client_secret
    return AsyncOAuthSettings(
        client_id=config.slack_client_id,
        client_secret=config.slack_client_secret,
        scopes=list(bot_scopes()),
        redirect_uri=config.slack_redirect_uri,
        install_path=INSTALL_PATH,
        redirect_uri_path=REDIRECT_PATH,
        authorization_url=authorize_url(config.slack_api_url),
        installation_store=installations.store,
        state_store=installations.states,
        token_rotation_expiration_minutes=ROTATE_BEFORE_MINUTES,
    )


def workspace_of(context: AsyncBoltContext) -> Team:
    """The workspace (and org) a request came from, as the installation answering it sees it: bolt's (the
    authorization's, which for a Slack Connect channel is the installation's own workspace), else, for an
    org-wide installation (whose authorization names no workspace), the one the envelope names."""
    return Team(context.team_id or context.get(ENVELOPE_TEAM), context.enterprise_id)


class InstallationAuthorize(AsyncAuthorize):
    """Bolt's authorize for an app installed in many workspaces: the request's workspace's installation (its
    own, else its org's org-wide one), its token refreshed when it would die soon. None (bolt then drops the
    request) for a workspace the app is not installed in."""

    def __init__(self, installations: Installations, serves: Callable[[Team], bool]) -> None:
        self.installations, self.serves = installations, serves

    async def __call__(
        self,
        *,
        context: AsyncBoltContext,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None,
        **_actor: Any,
    ) -> AuthorizeResult | None:
        # An org-wide install answers with team_id None (Slack names no workspace for org-level events).
        team = Team(None if context.is_enterprise_install else team_id, enterprise_id)
        if not self.serves(workspace_of(context)):
            log.warning("a request from Slack workspace %s, which the config does not serve (teams); dropped", team)
            return None
        try:
            found = await self.installations.fresh(team)
        except NotInstalled:
            log.warning("a request from Slack workspace %s, where the app is not installed; dropped", team)
            return None
        return AuthorizeResult(
            enterprise_id=found.enterprise_id,
            team_id=found.team_id or team_id,
            team=found.team_name,
            bot_user_id=found.bot_user_id,
            bot_id=found.bot_id,
            bot_token=found.bot_token,
            bot_scopes=found.bot_scopes,
            user_id=user_id,
        )
