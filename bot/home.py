"""App Home: a person's recent sessions, with their status and a link to each thread, the calls waiting for a
decision that this person may give, with the same buttons and the same checks as in the thread (but Approve on
a call whose whole text the page cannot hold: the thread has it, and a link goes there), and the scheduled jobs
(as `/mm jobs` lists them).

Published when the person opens the tab (`app_home_opened`) and again after each of their clicks in it. The
page is built from the database on each publish: it is a view, never a source of truth.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine

from bot.authorize import Approvers
from bot.jobs import JobCommands
from chatops.queries import PendingApproval, SessionSummary, pending_approvals, recent_sessions
from chatops.teams import NOWHERE, Team, section_covers
from slackio.approval_message import approval_blocks, when
from slackio.mrkdwn import Mrkdwn
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.bot.home")

SESSIONS = 10
LINKS_KEPT = 5000  # permalinks remembered, at most (a thread's never changes)
# Pending approvals read a publish, oldest first, before keeping those this person may decide.
PENDING_READ = 200
APPROVALS = 8  # a view holds 100 blocks; an approval takes up to seven
STATUS = {
    "idle": "💤 idle",
    "queued": "⏳ queued",
    "running": "🏃 running",
    "awaiting_approval": "⏸ waiting for a decision",
}
NO_SESSIONS = "No sessions yet: mention me in a channel, or write to me here, and I work on it in a thread."
NO_APPROVALS = "Nothing waits for your decision."


class Home:
    def __init__(
        self,
        engine: Engine,
        approvers: Approvers,
        secrets: Callable[[], Sequence[str]],
        jobs: JobCommands | None = None,
    ) -> None:
        self.engine, self.approvers, self.secrets, self.jobs = engine, approvers, secrets, jobs
        self._links: dict[tuple[str, str], str] = {}  # a thread's permalink never changes

    async def publish(self, slack: SlackOut, user: str, notice: str | None = None, place: Team = NOWHERE) -> None:
        """`user`'s App Home in the workspace `place`: their sessions there and the calls waiting there."""
        try:
            view = await self.view(slack.client, user, notice, place)
            await slack.publish_home(user, view)
        except Exception as e:  # noqa: BLE001 - the page is a courtesy; the thread has everything
            log.warning("could not publish App Home for %s: %s", user, e)

    async def view(self, client: Any, user: str, notice: str | None = None, place: Team = NOWHERE) -> dict[str, Any]:
        sessions = await asyncio.to_thread(recent_sessions, self.engine, user, SESSIONS, place)
        waiting = await asyncio.to_thread(pending_approvals, self.engine, PENDING_READ, None, place)
        blocks: list[dict[str, Any]] = []
        if notice:
            blocks.append(_context(Mrkdwn("⚠️ ") + notice))
        blocks += [_header("Your sessions")]
        for session in sessions:
            blocks.append(_section(await self._session_line(client, session)))
        if not sessions:
            blocks.append(_context(NO_SESSIONS))
        blocks += [{"type": "divider"}, _header("Waiting for your decision")]
        shown = 0
        for pending in waiting:
            if shown == APPROVALS:
                break
            if (
                await self.approvers.may_approve(
                    client, pending.channel_id, user, pending.row.requested_by, row=pending.row, place=place
                )
                is None
            ):
                blocks += await self._approval(client, pending)
                shown += 1
        if not shown:
            blocks.append(_context(NO_APPROVALS))
        jobs = [j for j in self.jobs.config.service.jobs if section_covers(j.team, place)] if self.jobs else []
        if self.jobs is not None and jobs:
            listing = await asyncio.to_thread(self.jobs.listing, jobs)
            blocks += [{"type": "divider"}, _header("Scheduled jobs"), _section(listing[:2900])]
        return {"type": "home", "blocks": blocks[:100]}

    async def _session_line(self, client: Any, session: SessionSummary) -> Mrkdwn:
        link = await self._link(client, session.channel_id, session.thread_ts)
        where = _where(link, "thread in {channel}", session.channel_id)
        status = STATUS.get(session.status, session.status)
        return Mrkdwn("{where} · {status} · last active {when}").format(
            where=where, status=status, when=when(session.updated_at)
        )

    async def _approval(self, client: Any, pending: PendingApproval) -> list[dict[str, Any]]:
        # A call whose whole text the page cannot hold is shown without Approve: the thread has it (its file).
        blocks, _text = approval_blocks(pending.row, pending.channel_id, self.secrets(), in_home=True)
        link = await self._link(client, pending.channel_id, pending.thread_ts)
        where = (
            _where(link, "In a thread of {channel}", pending.channel_id)
            if link
            else _where(None, "In {channel}", pending.channel_id)
        )
        # Oldest first (pending_approvals): the age says why this one is on top.
        since = Mrkdwn(" · waiting since ") + when(pending.row.created_at) if pending.row.created_at else Mrkdwn()
        return [_context(where + since), *blocks]

    async def _link(self, client: Any, channel: str | None, ts: str | None) -> str | None:
        if not channel or not ts:
            return None
        key = (channel, ts)
        if len(self._links) > LINKS_KEPT:
            self._links.clear()
        if key not in self._links:
            try:
                response = await client.chat_getPermalink(channel=channel, message_ts=ts)
            except Exception as e:  # noqa: BLE001 - the line goes without its link
                log.info("no permalink for %s/%s: %s", channel, ts, e)
                return None
            self._links[key] = str(response.get("permalink") or "")
        return self._links[key] or None


def _where(link: str | None, label: str, channel: str | None) -> Mrkdwn:
    """`label` naming the channel (`<#C…>`), as a link to the thread when there is one (Slack's permalink)."""
    named = Mrkdwn(label).format(channel=Mrkdwn("<#{id}>").format(id=channel or ""))
    return Mrkdwn("<{link}|{label}>").format(link=link, label=named) if link else named


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": text}}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:2900]}]}
