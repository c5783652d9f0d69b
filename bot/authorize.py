"""Who may decide what: checked by the bot, on the server, from the config and Slack's own user groups.

A click carries the clicker's id, signed by Slack; everything else in it (the button's value, the message) is
only a claim, checked against the database by the caller (bot.approvals). The rules:

- **Approve** (and "Approve all", and `yolo on|off`): a channel's approvers, listed by user id or user group
  id under `channels.<id>.approvers` (else `channels.default`). The person whose message started the turn
  may approve its calls only with `approvals.requester_can_approve: true`, approver or not: that is how an
  operator makes a channel self-service. Without it, a second person always looks at a call.
- **A call an approval policy rule asks for** (`approvals.policies`): the rule's `approvers` when it names
  some, else the channel's; once the call is escalated (`approvals.escalateAfter`), the `escalateTo` ids too.
  Nobody who asked for it may approve it, whatever `requester_can_approve` says (that key makes the tool's own
  gating self-service, not a rule), and a person counts once towards the people it needs.
- **Reject**: the approvers (the rule's and the channel's), and the person who asked: anyone may withdraw
  their own request.
- **Stop**: the approvers, and whoever wrote to the session.
- **Audit and purge** (`/mm audit`, `/mm purge`): the config's `admins` (user or group ids), whatever the channel.

User groups are resolved through `usergroups.users.list` and kept for GROUP_TTL seconds, so that a burst of
clicks costs one call per group and a person removed from a group loses the right within a minute. When
Slack cannot answer, the group grants nothing (and the refusal says why): failing closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from bot.errors import BotError
from chatops.approvers import accepted
from chatops.config import ServiceConfig
from chatops.store import ApprovalRow
from chatops.teams import NOWHERE, Team
from slackio.mrkdwn import Mrkdwn

log = logging.getLogger("mm.bot.authorize")

GROUP_TTL = 60.0
FAILED_TTL = 10.0
NOT_AN_APPROVER = Mrkdwn("Only this channel's approvers may {what} ({who}). Nothing was changed.")
NO_APPROVERS = (
    "Nobody may {what} in this channel: whoever runs the bot lists approvers (user or group ids) under "
    "`channels.{channel}.approvers` in its config file. Nothing was changed."
)
OWN_REQUEST = (
    "You asked for this call, and another approver must decide on it "
    "(`approvals.requester_can_approve` is off). Nothing was changed."
)
GROUP_UNKNOWN = " (the user group {group} could not be checked: {error})"
NOT_FOR_RULE = Mrkdwn("Only the approvers the rule {rule} accepts may approve this call ({who}). Nothing was changed.")
OWN_UNDER_RULE = "You asked for this call, and the rule {rule} needs its approval from {who}. Nothing was changed."
COUNTED_ALREADY = (
    "You have already approved this call: it needs {missing} from someone else (not whoever asked for it). "
    "Nothing was changed."
)
NOT_AN_ADMIN = Mrkdwn("Only the bot's admins may {what} ({who}). Nothing was changed.")
NO_ADMINS = (
    "Nobody may {what}: whoever runs the bot lists admins (user or group ids) under `admins` in its config file. "
    "Nothing was changed."
)


class Approvers:
    """The approver checks of one bot process, with its cache of user groups."""

    def __init__(self, service: Callable[[], ServiceConfig], ttl: float = GROUP_TTL) -> None:
        self._service, self.ttl = service, ttl
        # A group's members until a time, or why Slack could not list them (until a sooner time).
        self._groups: dict[str, tuple[float, frozenset[str] | str]] = {}

    def _view(self, place: Team) -> ServiceConfig:
        """The config as the workspace `place` sees it (its `teams` section over the top level's)."""
        return self._service().for_team(place.team_id, place.enterprise_id)

    def accepted(self, channel: str, row: ApprovalRow | None = None, place: Team = NOWHERE) -> list[str]:
        """Who may approve `row` (None: anything else an approver may do in `channel`): the ids the row names (its
        rule's approvers, widened by an escalation: chatops/nudges.py), else the channel's, as the workspace
        `place` configures it."""
        return accepted(self._view(place), channel, row)

    async def is_approver(
        self, client: Any, channel: str, user: str, accepted: Sequence[str] | None = None, place: Team = NOWHERE
    ) -> tuple[bool, str]:
        """Whether `user` is one of `accepted` (None: the channel's approvers in the workspace `place`), by id or
        user group; and, when a group could not be checked, why."""
        ids = self.accepted(channel, place=place) if accepted is None else accepted
        return await self._listed(client, ids, user)

    async def is_admin(self, client: Any, user: str, place: Team = NOWHERE) -> tuple[bool, str]:
        """Whether `user` is one of the `admins` of the workspace `place` (its `teams` section's, else the
        config's); and, when a group could not be checked, why."""
        return await self._listed(client, self._admins(place), user)

    def _admins(self, place: Team) -> list[str]:
        return list(self._view(place).admins)

    def admin_refusal(self, what: str, problems: str = "", place: Team = NOWHERE) -> str:
        admins = self._admins(place)
        if not admins:
            return NO_ADMINS.format(what=what)
        return NOT_AN_ADMIN.format(what=what, who=_named(admins)) + problems

    async def _listed(self, client: Any, ids: Sequence[str], user: str) -> tuple[bool, str]:
        """Whether `user` is in `ids`, by user id or as a member of a user group there; and, when a group could not
        be checked, why."""
        if user in ids:
            return True, ""
        problems = ""
        for group in (a for a in ids if a.startswith("S")):
            try:
                if user in await self._members(client, group):
                    return True, ""
            except Exception as e:  # noqa: BLE001 - Slack's answer decides; without one the group grants nothing
                if not isinstance(e, _Unchecked):  # said once per failure, not once per click after it
                    log.warning("user group %s could not be resolved: %s", group, _error(e))
                problems += GROUP_UNKNOWN.format(group=group, error=_error(e))
        return False, problems

    async def may_approve(
        self,
        client: Any,
        channel: str,
        user: str,
        requested_by: str | None,
        what: str = "approve calls",
        row: ApprovalRow | None = None,
        place: Team = NOWHERE,
    ) -> str | None:
        """None when `user` may approve `row`, a call of `channel` (of the workspace `place`) asked by
        `requested_by` (or, without a row, do `what` else an approver may); else the sentence why not."""
        own = _asked(user, requested_by)
        ruled = row is not None and row.rule is not None
        if own and ruled:
            assert row is not None
            who = "someone else" if row.needed <= 1 else f"{row.needed} other people"
            return OWN_UNDER_RULE.format(rule=quoted(row.rule or ""), who=who)
        if own and self._service().approvals.requester_can_approve:
            return None
        if row is not None and user in row.approved_by:
            return counted_already(row)
        accepted = self.accepted(channel, row, place)
        approver, problems = await self.is_approver(client, channel, user, accepted)
        if approver:
            return OWN_REQUEST if own else None
        if ruled and row is not None and row.approvers is not None:
            return NOT_FOR_RULE.format(rule=quoted(row.rule or ""), who=_named(accepted)) + problems
        return self.refusal(channel, what, problems, accepted)

    async def may_reject(
        self,
        client: Any,
        channel: str,
        user: str,
        requested_by: str | None,
        row: ApprovalRow | None = None,
        place: Team = NOWHERE,
    ) -> str | None:
        if _asked(user, requested_by):
            return None
        accepted = self.accepted(channel, row, place)
        # A rule's approvers, and the channel's.
        accepted += [a for a in self.accepted(channel, place=place) if a not in accepted]
        approver, problems = await self.is_approver(client, channel, user, accepted)
        return None if approver else self.refusal(channel, "reject calls", problems, accepted)

    def refusal(self, channel: str, what: str, problems: str = "", accepted: Sequence[str] | None = None) -> str:
        approvers = self.accepted(channel) if accepted is None else accepted
        if not approvers:
            return NO_APPROVERS.format(what=what, channel=channel)
        return NOT_AN_APPROVER.format(what=what, who=_named(approvers)) + problems

    async def _members(self, client: Any, group: str) -> frozenset[str]:
        """The group's members, as Slack said within `ttl`; _Unchecked while Slack could not say."""
        cached = self._groups.get(group)
        if cached is not None and cached[0] > time.monotonic():
            if isinstance(cached[1], str):
                raise _Unchecked(cached[1])
            return cached[1]
        try:
            response = await client.usergroups_users_list(usergroup=group)
        except Exception as e:
            # Slack could not say: the group grants nothing for a while, rather than a call per click (a
            # rate-limited method, in an outage), and every refusal meanwhile says why. The while starts when the
            # answer came: a call that hung until its timeout must not leave an entry already expired.
            self._groups[group] = (time.monotonic() + FAILED_TTL, _error(e))
            raise
        members = frozenset(u for u in response.get("users") or [] if isinstance(u, str))
        self._groups[group] = (time.monotonic() + self.ttl, members)
        return members


class _Unchecked(BotError):
    """A user group Slack could not list a moment ago (the error it gave), remembered for FAILED_TTL."""


def _named(ids: Sequence[str]) -> Mrkdwn:
    # A user group is named by its id, not mentioned: `<!subteam^…>` would notify the whole group.
    return Mrkdwn(", ").join(
        Mrkdwn("the user group `{id}`").format(id=a) if a.startswith("S") else Mrkdwn("<@{id}>").format(id=a)
        for a in ids
    )


def counted_already(row: ApprovalRow) -> str:
    return COUNTED_ALREADY.format(missing=_people(row.missing))


def _people(count: int) -> str:
    return "one more approval" if count == 1 else f"{count} more approvals"


def quoted(rule: str) -> str:
    """A rule's label as people read it in a sentence."""
    return f"“{rule}”"


def _asked(user: str, requested_by: str | None) -> bool:
    """Whether `user` is one of the people whose messages started the turn (comma-separated when several
    wrote while the last turn ran)."""
    return requested_by is not None and user in requested_by.split(",")


def _error(e: Exception) -> str:
    """What went wrong, in a word: Slack's error code, else the exception's kind (Slack did not answer)."""
    if isinstance(e, _Unchecked):
        return str(e)
    response = getattr(e, "response", None)
    data = getattr(response, "data", None)
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])
    return type(e).__name__
