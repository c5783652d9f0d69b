"""A person of one Slack workspace never acts on another's threads: a click on a button of another workspace's
thread (bot.approvals.ClickHandler) and an admin's `/mm purge` of another workspace's thread (bot.admin) change
nothing, and a workspace's `teams.<id>.admins` are admins there alone. Driven in-process, as the bot's requests
carry them out, with the Slack emulator behind them; on SQLite and PostgreSQL (the test kit's `engine`)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import Engine, func, insert, select, update

from audit_support import add_call
from bot.admin import NO_THREAD, AdminCommands
from bot.approvals import NOT_OURS, Click, ClickHandler
from bot.authorize import Approvers
from bot.steps import NoSteps
from chatops.buttons import Action, ButtonValue, element
from chatops.config import ServiceConfig
from chatops.inbox import record_message
from chatops.schema import (
    Approval,
    ApprovalDecision,
    ApprovalState,
    InboxMessage,
    Session,
    SessionEvent,
    SessionStatus,
    utcnow,
)
from chatops.store import get_approval, request_approval
from chatops.teams import NOWHERE, Team
from playground.slack_api import SlackEmulator
from slackio.slack_out import SlackOut

ALICE, BOB = "U0ALICE", "U0BOB"  # who asks, the channel's approver
ADA = "U0ADA"  # an admin of workspace A alone (teams.<A>.admins)
ROOT = "U0ROOT"  # an admin of the top level: of every workspace without admins of its own


def unique(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10].upper()


@dataclass
class Bot:
    """The bot's click handling and admin commands, as bot.app builds them, on one config."""

    engine: Engine
    slack: SlackEmulator
    a: str  # workspace A (its own `teams` section, its own admins)
    b: str  # workspace B (no section: the top level's admins)
    org: str  # A's org
    channel: str
    enqueued: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        service = ServiceConfig.model_validate(
            {
                "admins": [ROOT],
                "channels": {self.channel: {"approvers": [BOB]}},
                "teams": {self.a: {"admins": [ADA]}},
            }
        )
        self.approvers = Approvers(lambda: service)

        async def enqueue(session_id: str) -> None:
            self.enqueued.append(session_id)

        self.clicks = ClickHandler(self.engine, self.approvers, lambda: [], enqueue)
        self.admin = AdminCommands(self.engine, self.approvers, lambda: [])

    def out(self) -> SlackOut:
        return SlackOut(AsyncWebClient(token=self.slack.bot_token, base_url=self.slack.url), [])

    def thread(self, team: Team, status: SessionStatus = SessionStatus.IDLE) -> tuple[str, str]:
        """A thread of `team` in the channel, started by Alice, its first turn done: its session id and ts."""
        ts = f"{1_767_600_000 + uuid.uuid4().int % 10_000_000}.000100"
        recorded = record_message(
            self.engine,
            channel_id=self.channel,
            thread_ts=ts,
            message_ts=ts,
            user_id=ALICE,
            text="please deploy",
            slack_team_id=team.team_id,
            enterprise_id=team.enterprise_id,
        )
        with self.engine.begin() as conn:
            conn.execute(update(Session).where(Session.id == recorded.session_id).values(status=status))
            # Its turn took the message (an idle thread waits for nothing: it may be purged).
            conn.execute(
                update(InboxMessage).where(InboxMessage.session_id == recorded.session_id).values(taken_at=utcnow())
            )
        return recorded.session_id, ts

    def click(
        self, action: Action, session_id: str, call_id: str | None, ts: str, user: str, place: Team
    ) -> str | None:
        """A click on the thread's button from workspace `place` (a block_actions body as Slack sends it); the
        refusal the clicker is told, or None."""
        button = element(action, ButtonValue(session_id, call_id))
        body = {
            "type": "block_actions",
            "user": {"id": user, "team_id": place.team_id},
            "team": {"id": place.team_id, "domain": "somewhere"},
            "enterprise": {"id": place.enterprise_id, "name": "Org"} if place.enterprise_id else None,
            "is_enterprise_install": False,
            "container": {"type": "message", "channel_id": self.channel, "thread_ts": ts, "is_ephemeral": False},
            "channel": {"id": self.channel},
            "message": {"thread_ts": ts},
            "actions": [button],
        }
        clicked = Click.of(button, body)
        assert clicked.place == place
        return asyncio.run(self.clicks.handle(self.out(), clicked))

    def admin_says(self, text: str, user: str, place: Team) -> str:
        return asyncio.run(self.admin.answer(self.out(), text, user, NoSteps(self.engine), place))

    def link(self, ts: str) -> str:
        return f"https://{self.slack.domain}.slack.com/archives/{self.channel}/p{ts.replace('.', '')}"


@pytest.fixture
def bot(engine: Engine, slack: SlackEmulator) -> Iterator[Bot]:
    for user, name in ((ALICE, "alice"), (BOB, "bob"), (ADA, "ada"), (ROOT, "root")):
        slack.add_user(user, name)
    yield Bot(engine, slack, a=unique("T"), b=unique("T"), org=unique("E"), channel=unique("C"))


def waiting_call(bot: Bot, session_id: str) -> str:
    """A call of the thread waiting for a decision, as the worker asks for one."""
    call_id = f"call_{uuid.uuid4().hex[:20]}"
    request_approval(
        bot.engine,
        call_id=call_id,
        session_id=session_id,
        tool="bash",
        title="bash",
        arguments=json.dumps({"command": "make deploy"}),
        preview="$ make deploy",
        requested_by=ALICE,
    )
    with bot.engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == session_id).values(status=SessionStatus.AWAITING_APPROVAL))
    return call_id


def decisions(engine: Engine, call_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(ApprovalDecision).where(ApprovalDecision.call_id == call_id)
        ).scalar_one()


def state_of(engine: Engine, call_id: str) -> tuple[str, str | None]:
    with engine.connect() as conn:
        row = conn.execute(select(Approval.state, Approval.decided_by).where(Approval.call_id == call_id)).one()
    return row.state, row.decided_by


# -- clicks -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", [Action.APPROVE, Action.REJECT, Action.APPROVE_ALL, Action.STOP])
def test_a_click_from_another_workspace_is_not_ours_and_changes_nothing(bot: Bot, action: Action) -> None:
    session_id, ts = bot.thread(Team(bot.a, bot.org))
    call_id = waiting_call(bot, session_id)
    # The channel's approver, on the right thread and call: only the workspace is not the thread's.
    for place in (Team(bot.b), Team(bot.b, bot.org), Team(bot.a, unique("E"))):
        said = bot.click(action, session_id, None if action == Action.STOP else call_id, ts, BOB, place)
        assert said == NOT_OURS, place
    assert state_of(bot.engine, call_id) == (ApprovalState.PENDING, None)
    assert decisions(bot.engine, call_id) == 0
    with bot.engine.connect() as conn:
        stop = conn.execute(select(Session.stop_requested_at).where(Session.id == session_id)).scalar_one()
    assert stop is None and bot.enqueued == []
    assert not bot.slack.calls  # nothing said or shown in Slack, not even a lookup


def test_the_same_click_from_the_thread_s_workspace_approves(bot: Bot) -> None:
    session_id, ts = bot.thread(Team(bot.a, bot.org))
    call_id = waiting_call(bot, session_id)
    assert bot.click(Action.APPROVE, session_id, call_id, ts, BOB, Team(bot.a, bot.org)) is None
    assert state_of(bot.engine, call_id) == (ApprovalState.APPROVED, BOB)
    assert bot.enqueued == [session_id]  # the turn waits for nothing more: a worker resumes it


def test_a_click_naming_its_workspace_without_its_org_is_the_workspace_s(bot: Bot) -> None:
    session_id, ts = bot.thread(Team(bot.a, bot.org))
    call_id = waiting_call(bot, session_id)
    assert bot.click(Action.REJECT, session_id, call_id, ts, BOB, Team(bot.a)) is None
    row = get_approval(bot.engine, call_id)
    assert row is not None and (row.state, row.decided_by) == (ApprovalState.REJECTED, BOB)


def test_a_thread_recorded_before_workspaces_takes_a_click_from_its_channel(bot: Bot) -> None:
    session_id, ts = bot.thread(NOWHERE)
    call_id = waiting_call(bot, session_id)
    assert bot.click(Action.APPROVE, session_id, call_id, ts, BOB, Team(bot.b)) is None
    assert state_of(bot.engine, call_id) == (ApprovalState.APPROVED, BOB)


# -- admins ---------------------------------------------------------------------------------------------------------


def log_entries(engine: Engine, session_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(SessionEvent).where(SessionEvent.session_id == session_id)
        ).scalar_one()


def with_log(engine: Engine, session_id: str) -> None:
    with engine.begin() as conn:
        for seq in range(2):
            conn.execute(
                insert(SessionEvent).values(
                    session_id=session_id, seq=seq, kind="user", payload={"kind": "user", "text": f"talk {seq}"}
                )
            )
        conn.execute(update(Session).where(Session.id == session_id).values(event_seq=2))


def purged_at(engine: Engine, session_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Session.purged_at).where(Session.id == session_id)).scalar_one()


def test_purge_of_another_workspace_s_thread_answers_no_thread_and_purges_nothing(bot: Bot) -> None:
    session_id, ts = bot.thread(Team(bot.a, bot.org))
    with_log(bot.engine, session_id)
    # ROOT is an admin in B (no section of its own); A's thread is not B's to purge, nor to learn of.
    said = bot.admin_says(f"purge {bot.link(ts)}", ROOT, Team(bot.b))
    assert said == NO_THREAD.format(channel=bot.channel, ts=ts)
    assert purged_at(bot.engine, session_id) is None and log_entries(bot.engine, session_id) == 2
    # The same words of A's own admin, from A, purge it.
    done = bot.admin_says(f"purge {bot.link(ts)}", ADA, Team(bot.a, bot.org))
    assert done.startswith(f"🧹 Purged the thread {ts} of <#{bot.channel}>: 2 log entry(ies)")
    assert purged_at(bot.engine, session_id) is not None and log_entries(bot.engine, session_id) == 0


def test_an_admin_of_one_workspace_s_section_is_an_admin_there_alone(bot: Bot) -> None:
    in_a, ts_a = bot.thread(Team(bot.a))
    in_b, ts_b = bot.thread(Team(bot.b))
    for session_id in (in_a, in_b):
        with_log(bot.engine, session_id)
    out = bot.out()
    assert asyncio.run(bot.approvers.is_admin(out.client, ADA, Team(bot.a)))[0]
    assert asyncio.run(bot.approvers.is_admin(out.client, ADA, Team(bot.a, bot.org)))[0]
    assert not asyncio.run(bot.approvers.is_admin(out.client, ADA, Team(bot.b)))[0]
    # The top level's admins are not A's: its section names its own, in their place.
    assert not asyncio.run(bot.approvers.is_admin(out.client, ROOT, Team(bot.a)))[0]
    assert asyncio.run(bot.approvers.is_admin(out.client, ROOT, Team(bot.b)))[0]

    refused = bot.admin_says(f"purge {bot.link(ts_b)}", ADA, Team(bot.b))
    assert refused.startswith("Only the bot's admins may purge a thread") and f"<@{ROOT}>" in refused
    assert ADA not in refused
    refused = bot.admin_says(f"purge {bot.link(ts_a)}", ROOT, Team(bot.a))
    assert refused.startswith("Only the bot's admins may purge a thread") and f"<@{ADA}>" in refused
    assert purged_at(bot.engine, in_a) is None and purged_at(bot.engine, in_b) is None
    assert bot.admin_says(f"purge {bot.link(ts_b)}", ROOT, Team(bot.b)).startswith("🧹 Purged the thread")
    assert purged_at(bot.engine, in_a) is None and purged_at(bot.engine, in_b) is not None


def test_an_admin_s_audit_holds_the_calls_of_their_workspace_alone(bot: Bot) -> None:
    in_a, _ = bot.thread(Team(bot.a, bot.org))
    in_b, _ = bot.thread(Team(bot.b))
    before, _ = bot.thread(NOWHERE)
    asked = {session_id: add_call(bot.engine, session_id) for session_id in (in_a, in_b, before)}
    said = bot.admin_says("audit 3650d jsonl", ADA, Team(bot.a, bot.org))
    assert said.startswith("📋 The audit of")
    [file] = [f for c in bot.slack.channels for m in bot.slack.messages(c) for f in m.get("files") or []]
    exported = {json.loads(line)["call_id"] for line in bot.slack.uploads[file["id"]].decode().splitlines()}
    assert asked[in_a] in exported and asked[before] in exported and asked[in_b] not in exported


def test_a_workspace_s_own_approvers_decide_in_it_and_the_top_level_s_do_not() -> None:
    """The bot asks the approvers the thread's workspace configures (its section's `default`), as the worker does
    when it asks for the call: neither side goes by the top level's list for a workspace with its own."""
    service = ServiceConfig.model_validate(
        {
            "channels": {"default": {"approvers": ["U0OPS"], "repos": ["https://git.example.com/*"]}},
            "teams": {"T0SALES": {"channels": {"default": {"approvers": [ALICE], "repos": []}}}},
        }
    )
    approvers = Approvers(lambda: service)
    sales = Team("T0SALES")

    async def check(user: str, place: Team) -> str | None:
        return await approvers.may_approve(None, "C0ANY", user, BOB, "switch yolo", place=place)

    assert asyncio.run(check(ALICE, sales)) is None
    assert asyncio.run(check("U0OPS", sales)) is not None  # the top level's approver is not this workspace's
    assert asyncio.run(check("U0OPS", NOWHERE)) is None  # a workspace with no section of its own: the top level's
    assert approvers.accepted("C0ANY", place=sales) == [ALICE]
