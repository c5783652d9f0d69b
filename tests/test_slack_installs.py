"""The app installed in many Slack workspaces, end to end (issue 27): `mm-bot serve` and a `celery worker` with
SLACK_CLIENT_ID and SLACK_CLIENT_SECRET (no SLACK_BOT_TOKEN), PostgreSQL, Redis, the scripted model and the Slack
emulator holding two workspaces and an Enterprise Grid org of two more.

Installs go through bolt's flow as a browser would: the bot's /slack/install page (its state cookie), the
emulator's authorize page with the person's choice, the redirect back to the bot. The emulator records which
token each Web API call came with, and answers `channel_not_found` to a token of another workspace, so a post
made with the wrong workspace's token fails as it would in Slack.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from chatops.schema import Approval, JobState, RequestState, Session, SlackRequest, slack_installations
from mmbot_helpers import free_port
from playground.signed import SlackEventSender
from slackio.installations import ROTATE_BEFORE_MINUTES
from threads_support import SECRET, OwnRedis, Stack, buttons, config, stack

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

ALPHA, BETA, ORG, ORG1, ORG2 = "T0ALPHA", "T0BETA", "E0ORG", "T0ORGONE", "T0ORGTWO"
CHANNELS = {ALPHA: "C0ALPHA", BETA: "C0BETA", ORG1: "C0ORGONE", ORG2: "C0ORGTWO"}
ALICE, BOB = "U0ALICE", "U0BOB"
CONFIG = config(
    "{yolo: true}",
    "approvals: {requester_can_approve: false, timeout: 10m}",
    "teams:",
    f"  {BETA}: {{}}",  # served, with the top level's settings
    f"  {ORG}: {{}}",  # every workspace of the org
    f"  {ALPHA}:",
    f"    channels: {{{CHANNELS[ALPHA]}: {{yolo: false, approvers: [{BOB}]}}}}",
    "    jobs:",
    f'      - {{name: alpha-nightly, schedule: "0 3 * * *", channel: {CHANNELS[ALPHA]}, prompt: nightly}}',
)
STATE_COOKIE = "slack-app-oauth-state"


@pytest.fixture
def installs(tmp_path: Path, fresh_pg_url: str, own_redis: OwnRedis) -> Iterator[tuple[Stack, str]]:
    """The stack in OAuth mode, bot and worker running, nothing installed yet; the bot's base URL."""
    with stack(tmp_path, fresh_pg_url, own_redis.url, config=CONFIG) as s:
        slack = s.slack
        slack.add_team(ALPHA, "Alpha")
        slack.add_team(BETA, "Beta")
        slack.add_team(ORG1, "Org One", enterprise_id=ORG, enterprise_name="Org")
        slack.add_team(ORG2, "Org Two", enterprise_id=ORG)
        for team, channel in CHANNELS.items():
            slack.add_channel(channel, channel.lower(), team=team)
        port = free_port()
        redirect = f"http://127.0.0.1:{port}/slack/oauth_redirect"
        slack.oauth.redirect_urls = [redirect]  # the app's settings: Slack sends installers back only there
        s.extra_env.update(
            SLACK_BOT_TOKEN="",
            SLACK_CLIENT_ID=slack.client_id,
            SLACK_CLIENT_SECRET=slack.client_secret,
            SLACK_REDIRECT_URI=redirect,
        )
        s.start_worker()
        yield s, s.start_bot(port=port)


def install(
    s: Stack, base: str, team: str | None = None, enterprise: str | None = None, expect: int = 200
) -> tuple[str, str]:
    """Install as a person would: the bot's install page, Slack's page with their choice, back to the bot. The
    redirect back (with its state and code) and the state cookie, for a test to replay."""
    page = httpx.get(f"{base}/slack/install")
    assert page.status_code == 200, page.text
    found = re.search(r'href="([^"]*/oauth/v2/authorize\?[^"]*)"', page.text)
    assert found is not None, page.text
    cookie = SimpleCookie(page.headers["set-cookie"])[STATE_COOKIE].value
    chosen = httpx.get(s.slack.approve_url(html.unescape(found.group(1)), team=team, enterprise=enterprise))
    assert chosen.status_code == 302, chosen.text
    back = chosen.headers["location"]
    done = httpx.get(back, headers={"Cookie": f"{STATE_COOKIE}={cookie}"})
    assert done.status_code == expect, done.text
    return back, cookie


def installed(s: Stack) -> list[Any]:
    with s.engine.connect() as conn:
        c = slack_installations.c
        return list(conn.execute(select(c.team_id, c.enterprise_id, c.bot_token, c.is_enterprise_install)))


def sender(s: Stack, base: str, team: str) -> SlackEventSender:
    return SlackEventSender(base, SECRET, api_app_id=s.slack.app_id, **s.slack.sender_options(team))


def mention(s: Stack, base: str, team: str, text: str, user: str = ALICE) -> str:
    """@mm in the team's channel, by Alice; the thread's ts."""
    with sender(s, base, team) as slack:
        bot = s.slack.sender_options(team)["bot_user_id"]
        response = slack.app_mention(f"<@{bot}> {text}", channel=CHANNELS[team], user=user)
        assert response.status_code == 200, response.text
        return str(slack.last_payload["event"]["ts"])


def answered(s: Stack, team: str, ts: str, text: str) -> str:
    """The bot's answer in the thread, once it is there; it must contain `text`."""
    channel = CHANNELS[team]
    return s.wait(
        lambda: next(
            (m["text"] for m in s.slack.messages(channel, ts) if text in (m.get("text") or "") and m.get("bot_id")),
            None,
        ),
        message=f"the answer in {channel}",
    )


def tokens_in(s: Stack, channel: str) -> set[str]:
    """The tokens of every call the bot or a worker made about `channel`."""
    return {c.token for c in s.slack.calls if c.params.get("channel") == channel and c.token}


def session_in(s: Stack, channel: str, ts: str) -> Any:
    with s.engine.connect() as conn:
        return conn.execute(
            select(Session.__table__).where(Session.channel_id == channel, Session.thread_ts == ts)
        ).one()


def test_each_workspace_installs_through_oauth_and_is_answered_with_its_own_token(
    installs: tuple[Stack, str],
) -> None:
    s, base = installs
    # A state the bot never issued is refused, and nothing is installed.
    forged = httpx.get(
        f"{base}/slack/oauth_redirect?code=forged&state=forged", headers={"Cookie": f"{STATE_COOKIE}=forged"}
    )
    assert forged.status_code != 200 and installed(s) == []

    # A workspace the config does not serve (no teams section): its install is refused, and nothing is kept.
    s.slack.add_team("T0STRANGER", "Stranger")
    install(s, base, team="T0STRANGER", expect=403)
    assert installed(s) == []

    back, cookie = install(s, base, team=ALPHA)
    assert [(r.team_id, r.enterprise_id) for r in installed(s)] == [(ALPHA, None)]
    # The same redirect again (a replayed state, from a browser's history or a proxy's log): refused.
    replayed = httpx.get(back, headers={"Cookie": f"{STATE_COOKIE}={cookie}"})
    assert replayed.status_code != 200 and len(installed(s)) == 1
    install(s, base, team=BETA)
    install(s, base, enterprise=ORG)  # org-wide, by the org's admin
    rows = {(r.team_id, r.enterprise_id, r.is_enterprise_install) for r in installed(s)}
    assert rows == {(ALPHA, None, False), (BETA, None, False), (None, ORG, True)}

    # Two workspaces and two workspaces of the org: each answered, with its own installation's token only.
    threads = {team: mention(s, base, team, f"hello from {team}") for team in CHANNELS}
    for team, ts in threads.items():
        answered(s, team, ts, f"answer: hello from {team}")
        used = tokens_in(s, CHANNELS[team])
        owners = {(i.team_id, i.enterprise_id) for t in used if (i := s.slack.installation_of(t)) is not None}
        expected = (None, ORG) if team in (ORG1, ORG2) else (team, None)
        assert used and owners == {expected}, (team, owners)
        row = session_in(s, CHANNELS[team], ts)
        assert (row.slack_team_id, row.enterprise_id) == (team, ORG if team in (ORG1, ORG2) else None)

    # Alpha's channel asks Bob to approve; Bob clicking as a member of Beta is refused, and changes nothing.
    ts = mention(s, base, ALPHA, "run: echo guarded")
    waiting = s.wait(
        lambda: next((m for m in s.slack.messages(CHANNELS[ALPHA], ts) if _has_buttons(m)), None),
        message="the approval in Alpha's thread",
    )
    value = buttons(waiting)["approve"]
    with sender(s, base, BETA) as beta:
        beta.block_action("approve", value, user=BOB, channel=CHANNELS[ALPHA], message_ts=waiting["ts"], thread_ts=ts)
    s.wait(lambda: _requests_done(s), message="the refused click carried out")
    assert _approval(s) == ("pending", None)
    with sender(s, base, ALPHA) as alpha:
        alpha.block_action("approve", value, user=BOB, channel=CHANNELS[ALPHA], message_ts=waiting["ts"], thread_ts=ts)
    s.wait(lambda: _approval(s) == ("approved", BOB), message="Bob's click from Alpha")
    answered(s, ALPHA, ts, "done: guarded")


def test_a_rotating_token_is_refreshed_before_use_and_an_uninstall_stops_the_workspace_until_reinstalled(
    installs: tuple[Stack, str],
) -> None:
    s, base = installs
    # Tokens that rotate, living a few seconds more than the margin the bot and the workers refresh them at.
    s.slack.token_rotation = True
    s.slack.token_lifetime = ROTATE_BEFORE_MINUTES * 60 + 6
    install(s, base, team=ALPHA)
    install(s, base, team=BETA)
    [first] = [r.bot_token for r in installed(s) if r.team_id == ALPHA]
    ts = mention(s, base, ALPHA, "hello before")
    answered(s, ALPHA, ts, "answer: hello before")
    assert tokens_in(s, CHANNELS[ALPHA]) == {first}
    refreshes = len(_refreshes(s))

    time.sleep(7)  # the token now expires within the margin: the next use refreshes it first
    s.slack.expire(first)  # and a use of the old one would fail, as Slack refuses a dead token
    before = len(s.slack.calls)
    ts = mention(s, base, ALPHA, "hello after")
    answered(s, ALPHA, ts, "answer: hello after")
    assert len(_refreshes(s)) > refreshes
    now = {r.bot_token for r in installed(s) if r.team_id == ALPHA}
    assert first not in now  # saved for every process
    since = [c for c in s.slack.calls[before:] if c.params.get("channel") == CHANNELS[ALPHA]]
    assert since and all(c.token in now and c.response.get("ok") for c in since), [
        (c.method, c.response.get("error")) for c in since
    ]

    # A turn waits for Bob in Alpha; then Alpha removes the app.
    waiting_ts = mention(s, base, ALPHA, "run: echo never")
    s.wait(lambda: session_in(s, CHANNELS[ALPHA], waiting_ts).status == "awaiting_approval", message="the wait")
    alpha = sender(s, base, ALPHA)  # as Slack sent Alpha's events while the app was there
    bot = s.slack.sender_options(ALPHA)["bot_user_id"]
    gone = s.slack.uninstall(ALPHA)
    assert alpha.deliver(gone.tokens_revoked).status_code == 200
    assert alpha.deliver(gone.app_uninstalled).status_code == 200
    assert [r.team_id for r in installed(s)] == [BETA]  # Alpha's tokens deleted, Beta's kept
    with s.engine.connect() as conn:
        state = conn.execute(select(JobState.__table__).where(JobState.job_name == "alpha-nightly")).one()
    assert state.paused and "removed from Slack workspace T0ALPHA" in (state.paused_reason or "")
    s.wait(lambda: session_in(s, CHANNELS[ALPHA], waiting_ts).status == "idle", message="the waiting turn stopped")
    assert session_in(s, CHANNELS[ALPHA], ts) is not None  # the audit stays

    # Alpha's events are not answered any more; Beta's still are.
    calls = len(s.slack.calls)
    late = alpha.app_mention(f"<@{bot}> anyone there?", channel=CHANNELS[ALPHA], user=ALICE)
    assert late.status_code == 200  # acked (Slack would send it again otherwise), and dropped
    alpha.close()
    beta_ts = mention(s, base, BETA, "still here")
    answered(s, BETA, beta_ts, "answer: still here")
    assert not [c for c in s.slack.calls[calls:] if c.params.get("channel") == CHANNELS[ALPHA]]

    # Installed again, Alpha is answered again (its job stays paused until someone resumes it).
    install(s, base, team=ALPHA)
    ts = mention(s, base, ALPHA, "back again")
    answered(s, ALPHA, ts, "answer: back again")


def _has_buttons(message: dict[str, Any]) -> bool:
    """An approval's message, its Approve button still there."""
    return any(b.get("type") == "actions" for b in message.get("blocks") or []) and "approve" in buttons(message)


def _approval(s: Stack) -> tuple[str, str | None]:
    with s.engine.connect() as conn:
        row = conn.execute(select(Approval.state, Approval.decided_by)).one()
    return row.state, row.decided_by


def _requests_done(s: Stack) -> bool:
    with s.engine.connect() as conn:
        states = list(conn.execute(select(SlackRequest.state)).scalars())
    return bool(states) and all(state == RequestState.DONE for state in states)


def _refreshes(s: Stack) -> list[Any]:
    return [c for c in s.slack.calls_to("oauth.v2.access") if c.params.get("grant_type") == "refresh_token"]
