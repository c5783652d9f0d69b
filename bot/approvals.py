"""Button clicks: Approve, Reject, Approve all (on an approval message or in App Home) and Stop.

The listener acks, and the click is handled after the ack (Slack wants the ack within 3 seconds, and a
user group may need a Web API call). Nothing in the click is trusted but the clicker's id, which Slack signs:

1. The value must decode (chatops.buttons) and name a call that is an approval of that session.
2. The click must come from where the bot showed the button: the session's channel and thread (and the
   call's own message, once known), or the clicker's App Home.
3. The clicker must be allowed (bot.authorize), by the config of the session's channel.
4. The decision is a compare-and-set on the approvals row (chatops.sessions.decide): of ten clicks at
   once, one wins; a click on a call already decided, or expired, changes nothing.

A refusal is an ephemeral sentence to the clicker and changes nothing. The winner's decision is shown on the
call's message (who, when; no buttons), and once the turn waits for nothing more, the session is enqueued:
the worker resumes it from the approvals table, wherever it runs, even if the worker that asked is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from bot.authorize import Approvers, counted_already, quoted
from bot.steps import NoSteps, Steps, courtesy
from chatops.buttons import Action, BadButton, ButtonValue
from chatops.inbox import request_stop
from chatops.queries import writers
from chatops.schema import ApprovalState, SessionKind
from chatops.sessions import Decided, Snapshot, decide, snapshot, waits_for_people
from chatops.store import ApprovalRow, covered_by_approve_all, get_approval
from chatops.teams import NOWHERE, Team, same_workspace, session_team, team_of
from slackio.approval_message import NO_APPROVERS, approvable, approval_blocks, layout, requesters, when
from slackio.metrics import waited
from slackio.mrkdwn import Mrkdwn
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.bot.approvals")

NOT_OURS = "This button does not belong to a call of this thread, so nothing was changed."
NOT_FOUND = "This call is no longer known (its session was removed), so nothing was changed."
DECIDED = Mrkdwn("This call was already {state} by <@{by}> {at}: your click changed nothing.")
EXPIRED = Mrkdwn(
    "This call is no longer waiting (it expired, or the turn was stopped) {at}: your click changed nothing."
)
ALL_APPROVED = Mrkdwn(
    "✅ <@{user}> approved every call {requesters} asks for in this thread: I run them without asking. A request "
    "from anyone else asks again; `@mm yolo off` or `@mm new` ends this."
)
NOT_SHOWN = (
    "This call's full {what} could not be shown {where}, so it cannot be approved there: nothing was changed. "
    "Reject it, or ask for it again."
)
NOT_ALL = (
    "This call is asked for by the rule {rule}, which “Approve all” does not cover: approve it on its own. "
    "Nothing was changed."
)
NOTHING_TO_STOP = "Nothing is running in this thread."
PUSH_UNAVAILABLE = "Pushing is not available here."
MAY_NOT_STOP = "Only the people in this conversation and the channel's approvers may stop it."
# The steps of a click (bot.steps): the decision (the calls it decided, as JSON; [] when another click won), the
# stop ("yes", or "no": nothing ran), and the "Approve all" line in the thread.
DECIDED_STEP, STOPPED_STEP, ALL_SAID_STEP = "decided", "stopped", "all_approved"


@dataclass(frozen=True)
class Click:
    """What a block_actions payload says, read once."""

    action: Action
    value: ButtonValue
    user: str
    channel: str | None  # None for a click in App Home
    thread_ts: str | None
    message_ts: str | None
    # The workspace (and org) the click came from, as the installation sees it: only its own threads' buttons.
    place: Team = NOWHERE

    @classmethod
    def of(cls, action: dict[str, Any], body: dict[str, Any]) -> Click:
        value = ButtonValue.decode(action.get("value"))
        try:
            kind = Action(action.get("action_id"))
        except ValueError:
            raise BadButton("the button is not one of ours") from None
        container = body.get("container") or {}
        in_view = container.get("type") == "view"
        message = body.get("message") or {}
        return cls(
            kind,
            value,
            (body.get("user") or {}).get("id") or "",
            None if in_view else container.get("channel_id") or (body.get("channel") or {}).get("id"),
            None if in_view else container.get("thread_ts") or message.get("thread_ts"),
            None if in_view else container.get("message_ts"),
            Team(_id(body.get("team")), _id(body.get("enterprise"))),
        )


def _id(part: Any) -> str | None:
    """A payload's `team` or `enterprise`: its id (Slack sends null for no org)."""
    found = part.get("id") if isinstance(part, dict) else None
    return found if isinstance(found, str) and found else None


class ClickHandler:
    """The bot process's click handling: its engine, config, approvers cache and the Web API client."""

    def __init__(
        self,
        engine: Engine,
        approvers: Approvers,
        secrets: Callable[[], Sequence[str]],
        enqueue: Any,
        enqueue_push: Any = None,
        enqueue_status: Any = None,
    ) -> None:
        self.engine, self.approvers, self.secrets, self.enqueue = engine, approvers, secrets, enqueue
        self.enqueue_push, self.enqueue_status = enqueue_push, enqueue_status

    async def handle(self, slack: SlackOut, click: Click, steps: Steps | None = None) -> str | None:
        """Carry out a click; the sentence for the clicker when it changed nothing (None when it did). `steps`:
        what an earlier attempt at the same click did (a decision it made is shown and handed on, not refused
        as already made)."""
        steps = steps or NoSteps(self.engine)
        session = await asyncio.to_thread(snapshot, self.engine, click.value.session_id, log=False)
        if session is None:
            return NOT_FOUND
        if click.channel is not None and (click.channel != session.channel_id or click.thread_ts != session.thread_ts):
            return NOT_OURS
        if not same_workspace(team_of(session), click.place):
            log.warning("a click from Slack workspace %s on a thread of %s; refused", click.place, team_of(session))
            return NOT_OURS
        if click.action == Action.STOP:
            return await self._stop(slack, click, session, steps)
        if click.action in (Action.PUSH, Action.PULL_REQUEST):
            pull_request = click.action == Action.PULL_REQUEST
            return await self.push(slack, session.id, session.channel_id or "", click.user, None, pull_request)
        row = await asyncio.to_thread(get_approval, self.engine, click.value.call_id or "")
        if row is None or row.session_id != session.id:
            return NOT_OURS
        if click.message_ts is not None and row.message_ts is not None and click.message_ts != row.message_ts:
            return NOT_OURS
        channel = session.channel_id or ""
        approve = click.action != Action.REJECT
        everything = click.action == Action.APPROVE_ALL
        if steps.done(DECIDED_STEP) is None:
            if row.state != ApprovalState.PENDING:
                return _already(row)
            if approve and not approvable(row, in_home=click.channel is None):
                # The button is not offered there (approval_message): a click that says otherwise changes nothing.
                where = "in App Home" if click.channel is None else "in this thread"
                return NOT_SHOWN.format(what=layout(row).what, where=where)
            if everything and not covered_by_approve_all(row):
                return NOT_ALL.format(rule=quoted(row.rule or "?"))
            if approve:
                refusal = await self.approvers.may_approve(
                    slack.client, channel, click.user, row.requested_by, row=row, place=team_of(session)
                )
            else:
                refusal = await self.approvers.may_reject(
                    slack.client, channel, click.user, row.requested_by, row, team_of(session)
                )
            if refusal is not None:
                return refusal
            clicked = row

            def decided_now(conn: Connection) -> str:
                in_home = click.channel is None
                return decide(
                    conn,
                    clicked.call_id,
                    approve,
                    click.user,
                    everything=everything,
                    readable=lambda row: approvable(row, in_home=in_home),
                ).to_json()

            outcome = Decided.from_json(await steps.take(DECIDED_STEP, decided_now))
            for call_id in outcome.calls:
                if (won := await asyncio.to_thread(get_approval, self.engine, call_id)) is not None:
                    waited(won, "approved" if approve else "rejected")
        else:  # an earlier attempt decided: what it left (the messages, the line, the hand-off) is done now
            outcome = Decided.from_json(steps.done(DECIDED_STEP) or "[]")
        job_run = session.kind == SessionKind.JOB
        if outcome.voted:  # counted towards a call that needs more people: it waits for them, as its message says
            await self._show(slack, channel, row.call_id, job_run)
            return None
        decided = list(outcome.calls)
        if not decided:
            found = await asyncio.to_thread(get_approval, self.engine, row.call_id)
            if found is not None and found.state == ApprovalState.PENDING and click.user in found.approved_by:
                return counted_already(found)
            return _already(found) if found is not None else NOT_FOUND
        # A job's run: an "Approve all" there covers the run's prompt, which nobody wrote.
        for call_id in decided:
            await self._show(slack, channel, call_id, job_run)
        if everything:
            whose = requesters(None if job_run else row.requested_by)
            said = ALL_APPROVED.format(user=click.user, requesters=whose)
            async with courtesy(f"tell {channel}/{session.thread_ts} whom an approval covers"):
                await steps.post(slack, ALL_SAID_STEP, channel, said, session.thread_ts)
        if not await asyncio.to_thread(waits_for_people, self.engine, session.id):
            await self._enqueue(session.id)
        return None

    # -- the steps ------------------------------------------------------------------------------------------

    async def _show(self, slack: SlackOut, channel: str, call_id: str, job_run: bool = False) -> None:
        """The call's message as it now stands: the decision, who and when, no buttons."""
        row = await asyncio.to_thread(get_approval, self.engine, call_id)
        if row is None or row.message_ts is None:
            return
        blocks, text = approval_blocks(row, channel, self.secrets(), job_run=job_run)
        # The decision stands either way; the message is only its display (shown again after an outage).
        async with courtesy(f"show the decision on {call_id}"):
            await slack.update(channel, row.message_ts, text, blocks=blocks)

    async def push(
        self,
        slack: SlackOut,
        session_id: str,
        channel: str,
        user: str,
        branch: str | None,
        pull_request: bool = False,
        title: str | None = None,
    ) -> str | None:
        """Push the thread's changes (the buttons, `push [branch]` and `pr [title]`), and open their pull request
        when asked: for the channel's approvers, and, as for an approval, not one of the thread's own writers
        unless the config allows it."""
        authors = ",".join(sorted(await asyncio.to_thread(writers, self.engine, session_id)))
        what = "open a thread's pull request" if pull_request else "push a thread's changes"
        place = await asyncio.to_thread(session_team, self.engine, session_id)
        refusal = await self.approvers.may_approve(slack.client, channel, user, authors or None, what, place=place)
        if refusal is not None:
            return refusal
        if self.enqueue_push is None:
            return PUSH_UNAVAILABLE
        await self.enqueue_push(session_id, branch, user, pull_request, title)
        return None

    async def show_pull_request(self, session_id: str) -> str | None:
        """`pr` in a thread that has one: its status, from a worker (the forge's tokens are the workers'); anyone
        in the channel may look."""
        if self.enqueue_status is None:
            return PUSH_UNAVAILABLE
        await self.enqueue_status(session_id)
        return None

    async def _stop(self, slack: SlackOut, click: Click, session: Snapshot, steps: Steps) -> str | None:
        channel = session.channel_id or ""
        if steps.done(STOPPED_STEP) is None and not await may_stop(
            self.engine, self.approvers, slack.client, channel, session.id, click.user
        ):
            return MAY_NOT_STOP
        stopped = await steps.take(STOPPED_STEP, lambda conn: "yes" if request_stop(conn, session.id) else "no")
        if stopped != "yes":
            return NOTHING_TO_STOP
        await self._enqueue(session.id)  # a turn that waits for a decision has no worker to tell
        return None

    async def _enqueue(self, session_id: str) -> None:
        try:
            await self.enqueue(session_id)
        except Exception as e:  # noqa: BLE001 - the decision is recorded: housekeeping enqueues it later
            log.warning("could not enqueue session %s (%s); housekeeping will", session_id, e)


async def may_stop(engine: Engine, approvers: Approvers, client: Any, channel: str, session_id: str, user: str) -> bool:
    """The people in the conversation and the channel's approvers (as its workspace configures them) may stop
    it (the button and `stop` alike)."""
    if user in await asyncio.to_thread(writers, engine, session_id):
        return True
    place = await asyncio.to_thread(session_team, engine, session_id)
    return (await approvers.is_approver(client, channel, user, place=place))[0]


def _already(row: ApprovalRow) -> str:
    at = when(row.decided_at) if row.decided_at else Mrkdwn()
    if row.decided_by == NO_APPROVERS:
        return "This call was not run: nobody may approve calls in this channel, so your click changed nothing."
    if row.state == ApprovalState.EXPIRED or row.decided_by is None:
        return EXPIRED.format(at=at).replace("  ", " ")
    return DECIDED.format(state=row.state, by=row.decided_by, at=at)
