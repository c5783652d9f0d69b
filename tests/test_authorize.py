"""Who may decide, checked by bot.authorize against the config and the Slack emulator's user groups."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.authorize import Approvers
from chatops.config import ServiceConfig
from playground.slack_api import SlackEmulator

CHANNEL = "C0TEAM"


@pytest.fixture
def slack() -> Iterator[SlackEmulator]:
    with SlackEmulator() as emulator:
        emulator.add_usergroup("S0LEADS", "leads", ["U0CAROL"])
        yield emulator


def approvers(requester_can_approve: bool = False, **channels: list[str]) -> Approvers:
    config = {CHANNEL: {"approvers": channels.get("approvers", ["U0BOB", "S0LEADS"])}}
    service = ServiceConfig.model_validate(
        {"channels": config, "approvals": {"requester_can_approve": requester_can_approve}}
    )
    return Approvers(lambda: service)


def check(slack: SlackEmulator, rules: Approvers, user: str, requested_by: str | None, approve: bool = True):
    async def run() -> str | None:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.url)
        decide = rules.may_approve if approve else rules.may_reject
        return await decide(client, CHANNEL, user, requested_by)

    return asyncio.run(run())


def test_approvers_by_id_and_by_group_and_nobody_else(slack: SlackEmulator) -> None:
    rules = approvers()
    assert check(slack, rules, "U0BOB", "U0ALICE") is None
    assert check(slack, rules, "U0CAROL", "U0ALICE") is None  # through the user group
    refusal = check(slack, rules, "U0EVE", "U0ALICE")
    assert refusal is not None and "Only this channel's approvers" in refusal


def test_no_self_approval_by_any_author_of_the_turn_unless_allowed(slack: SlackEmulator) -> None:
    rules = approvers()
    # Several people wrote while the last turn ran: the turn is asked by all of them.
    assert "You asked for this call" in (check(slack, rules, "U0BOB", "U0ALICE,U0BOB") or "")
    assert check(slack, approvers(requester_can_approve=True), "U0BOB", "U0ALICE,U0BOB") is None
    # A requester who is not an approver: only when the config makes the channel self-service.
    assert check(slack, approvers(requester_can_approve=True), "U0ALICE", "U0ALICE") is None
    assert check(slack, rules, "U0ALICE", "U0ALICE") is not None


def test_the_requester_may_always_reject_and_others_only_as_approvers(slack: SlackEmulator) -> None:
    rules = approvers()
    assert check(slack, rules, "U0ALICE", "U0ALICE", approve=False) is None
    assert check(slack, rules, "U0BOB", "U0ALICE", approve=False) is None
    assert check(slack, rules, "U0EVE", "U0ALICE", approve=False) is not None


def test_a_group_slack_cannot_resolve_grants_nothing_and_says_so(slack: SlackEmulator) -> None:
    rules = approvers(approvers=["S0GONE"])
    refusal = check(slack, rules, "U0CAROL", "U0ALICE")
    assert refusal is not None and "S0GONE could not be checked: no_such_subteam" in refusal


def test_a_channel_without_approvers_names_the_key(slack: SlackEmulator) -> None:
    refusal = check(slack, approvers(approvers=[]), "U0BOB", "U0ALICE")
    assert refusal is not None and f"channels.{CHANNEL}.approvers" in refusal


def test_group_members_are_cached_briefly(slack: SlackEmulator) -> None:
    rules = approvers()
    for _ in range(5):
        assert check(slack, rules, "U0CAROL", "U0ALICE") is None
    assert len(slack.calls_to("usergroups.users.list")) == 1
