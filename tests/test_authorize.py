"""Who may decide, checked by bot.authorize against the config and the Slack emulator's user groups."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot import authorize
from bot.authorize import Approvers
from chatops.config import ServiceConfig
from chatops.schema import ApprovalState
from chatops.store import ApprovalRow
from mm_testkit.clocks import HandClock
from mm_testkit.ports import free_port
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


def test_a_reject_by_someone_else_is_refused_naming_who_may(slack: SlackEmulator) -> None:
    refusal = check(slack, approvers(), "U0EVE", "U0ALICE", approve=False)
    assert refusal == (
        "Only this channel's approvers may reject calls (<@U0BOB>, the user group `S0LEADS`). Nothing was changed."
    )


def test_while_slack_cannot_list_a_group_clicks_are_refused_with_why_without_asking_it_each_time(
    slack: SlackEmulator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = HandClock()
    monkeypatch.setattr(authorize, "time", clock)
    rules = approvers()
    slack.fail("usergroups.users.list", "ratelimited")
    with caplog.at_level(logging.WARNING, logger="mm.bot.authorize"):
        for _ in range(3):  # an outage: everybody clicks
            refusal = check(slack, rules, "U0CAROL", "U0ALICE")
            assert refusal is not None
            assert refusal.endswith(" (the user group S0LEADS could not be checked: ratelimited)")
            clock.now += authorize.FAILED_TTL / 4
    assert len(slack.calls_to("usergroups.users.list")) == 1
    # The operator reads it once, with Slack's answer, not once a click.
    assert [m for m in caplog.messages if "S0LEADS" in m] == ["user group S0LEADS could not be resolved: ratelimited"]
    clock.now += authorize.FAILED_TTL / 4  # Slack is asked again once the failure is old, and now it answers
    assert check(slack, rules, "U0CAROL", "U0ALICE") is None
    assert len(slack.calls_to("usergroups.users.list")) == 2


def test_a_lookup_that_hung_until_its_timeout_is_remembered_from_its_end(
    slack: SlackEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = HandClock()
    monkeypatch.setattr(authorize, "time", clock)
    rules = approvers()

    class Hanging(AsyncWebClient):
        async def usergroups_users_list(self, **kwargs: Any) -> Any:  # type: ignore[override]
            clock.now += 30  # slack_sdk's timeout passed while it waited
            raise TimeoutError

    async def click() -> str | None:
        return await rules.may_approve(Hanging(token=slack.bot_token, base_url=slack.url), CHANNEL, "U0CAROL", "U0A")

    assert (asyncio.run(click()) or "").endswith(" (the user group S0LEADS could not be checked: TimeoutError)")
    # The next click, at once: answered from what is remembered, not after another 30 s wait.
    assert (asyncio.run(check_at_once(slack, rules)) or "").endswith("could not be checked: TimeoutError)")
    assert clock.now == 1030.0


async def check_at_once(slack: SlackEmulator, rules: Approvers) -> str | None:
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.url)
    return await rules.may_approve(client, CHANNEL, "U0CAROL", "U0ALICE")


def test_a_group_slack_cannot_be_reached_for_refuses_the_click_and_says_so(slack: SlackEmulator) -> None:
    async def run() -> str | None:
        unreachable = AsyncWebClient(token=slack.bot_token, base_url=f"http://127.0.0.1:{free_port()}/api/")
        return await approvers().may_approve(unreachable, CHANNEL, "U0CAROL", "U0ALICE")

    refusal = asyncio.run(run())
    assert refusal is not None
    assert refusal.endswith(" (the user group S0LEADS could not be checked: ClientConnectorError)"), refusal


def pending(rule: str | None = "deploy", needed: int = 1, approved_by: tuple[str, ...] = ()) -> ApprovalRow:
    """A call of the channel asked by U0ALICE, which an approval policy's rule `rule` gates (approved by U0DAN)."""
    return ApprovalRow(
        call_id="call_1",
        session_id="s1",
        tool="bash",
        title=None,
        arguments=None,
        preview=None,
        requested_by="U0ALICE",
        state=ApprovalState.PENDING,
        decided_by=None,
        decided_at=None,
        expires_at=None,
        message_ts=None,
        rule=rule,
        needed=needed,
        approvers=("U0DAN",) if rule else None,
        approved_by=approved_by,
    )


def decide(slack: SlackEmulator, rules: Approvers, user: str, row: ApprovalRow) -> str | None:
    async def run() -> str | None:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.url)
        return await rules.may_approve(client, CHANNEL, user, row.requested_by, row=row)

    return asyncio.run(run())


def test_a_rule_says_how_many_other_people_its_call_needs_when_the_requester_clicks(slack: SlackEmulator) -> None:
    rules = approvers(requester_can_approve=True)  # self-service does not reach a rule's calls
    assert decide(slack, rules, "U0ALICE", pending(needed=1)) == (
        "You asked for this call, and the rule “deploy” needs its approval from someone else. Nothing was changed."
    )
    assert decide(slack, rules, "U0ALICE", pending(needed=2)) == (
        "You asked for this call, and the rule “deploy” needs its approval from 2 other people. Nothing was changed."
    )


def test_a_rules_call_is_refused_to_the_channels_approvers_naming_whom_the_rule_accepts(slack: SlackEmulator) -> None:
    rules = approvers()
    assert decide(slack, rules, "U0BOB", pending()) == (
        "Only the approvers the rule “deploy” accepts may approve this call (<@U0DAN>). Nothing was changed."
    )
    assert decide(slack, rules, "U0DAN", pending()) is None


def test_an_approver_who_counted_already_is_told_how_many_more_approvals_the_call_needs(slack: SlackEmulator) -> None:
    rules = approvers()
    said = "You have already approved this call: it needs {} from someone else (not whoever asked for it). "
    assert decide(slack, rules, "U0DAN", pending(needed=2, approved_by=("U0DAN",))) == (
        said.format("one more approval") + "Nothing was changed."
    )
    assert decide(slack, rules, "U0DAN", pending(needed=3, approved_by=("U0DAN",))) == (
        said.format("2 more approvals") + "Nothing was changed."
    )
