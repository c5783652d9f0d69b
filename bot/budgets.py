"""`budget`: a thread's budgets shown, and its token budget set from the thread (chatops.budgets does the arithmetic).

`budget` alone answers privately with the budgets that apply and what was spent against them. `budget 20k` sets the
thread's own token budget, over the config's `threadTokens`: the people in the conversation and the channel's
approvers may lower it, and raise it again up to the channel's (the config's, and not above a budget an approver
set); beyond that only an approver may. The change is said in the thread, naming who made it, and kept on the
session with who set it (chatops.store.set_budget); the request itself is kept in `slack_requests`. A refusal is a
private sentence and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from bot.approvals import may_stop
from bot.authorize import Approvers
from chatops import budgets
from chatops.budgets import Limits, Use, tokens
from chatops.config import Config, parse_tokens
from chatops.store import set_budget
from chatops.teams import session_team
from slackio.blocks import duration
from slackio.mrkdwn import Mrkdwn
from workers.jobs import job_of_session

BAD_BUDGET = "I can't set that budget: {problem}. Nothing was changed."
MAY_NOT_SET = (
    "Only the people in this conversation and the channel's approvers may set its budget. Nothing was changed."
)
BUDGET_SET = Mrkdwn("💰 <@{user}> set this thread's budget to {limit} tokens ({used} used so far).")
NO_BUDGET = "No budget applies to this thread; it has used {used} tokens."
HOW_TO_SET = (
    "`budget 20k` sets this thread's token budget: the people in it may lower it, and raise it up to {cap}; above that "
    "only an approver may."
)
HOW_TO_SET_ANY = "`budget 20k` sets this thread's token budget: the people in it and the channel's approvers may."


class BudgetCommand:
    """`budget [TOKENS]` in a thread (and `/mm budget` for the person's latest session)."""

    def __init__(self, engine: Engine, config: Callable[[], Config], approvers: Approvers) -> None:
        self.engine, self.config, self.approvers = engine, config, approvers

    async def answer(
        self, client: Any, channel: str, session_id: str, user: str, argument: str | None
    ) -> tuple[Mrkdwn | None, str | None]:
        """What to say in the thread (the change, naming who made it) and to the person alone."""
        if argument is None:
            return None, await asyncio.to_thread(self.shown, channel, session_id)
        try:
            wanted = parse_tokens(argument)
        except ValueError as e:
            return None, BAD_BUDGET.format(problem=e)
        if not await may_stop(self.engine, self.approvers, client, channel, session_id, user):
            return None, MAY_NOT_SET  # the people who may stop the conversation may also bound what it spends
        limits, use = await asyncio.to_thread(self._read, channel, session_id)
        place = await asyncio.to_thread(session_team, self.engine, session_id)
        approver, problems = await self.approvers.is_approver(client, channel, user, place=place)
        current, cap = limits.thread_tokens, limits.raise_cap()
        lowering = current is not None and wanted <= current
        if not approver and not lowering and cap is not None and wanted > cap:
            what = f"raise this thread's budget above {tokens(cap)} tokens"
            return None, self.approvers.refusal(channel, what, problems, self.approvers.accepted(channel, place=place))
        await asyncio.to_thread(set_budget, self.engine, session_id, wanted, user, approver)
        return BUDGET_SET.format(user=user, limit=tokens(wanted), used=tokens(use.thread_tokens)), None

    def _read(self, channel: str, session_id: str) -> tuple[Limits, Use]:
        config = self.config()
        # A job's run is its thread: its job's budgets apply while it runs (as the worker reads them).
        running = job_of_session(self.engine, config, session_id)
        job = running.job if running is not None else None
        limits = budgets.limits_of(self.engine, config.service, session_id, channel, job)
        return limits, budgets.use_of(self.engine, session_id, channel, limits, thread=True)

    def shown(self, channel: str, session_id: str) -> Mrkdwn:
        """`budget`: each budget that applies, with what was spent against it, and how to set the thread's."""
        limits, use = self._read(channel, session_id)
        c, own = limits.configured, limits.own
        lines = [Mrkdwn("• {part}").format(part=part) for part in budgets.against(limits, use)]
        if own is not None:
            channel_s = (
                f"the channel's is {tokens(c.threadTokens)}" if c.threadTokens is not None else "the channel sets none"
            )
            lines.append(
                Mrkdwn("• this thread's token budget was set here by <@{by}> ({whose})").format(
                    by=own.by, whose=channel_s
                )
            )
        if c.turnTokens is not None:
            lines.append(Mrkdwn("• a turn: at most {limit} tokens").format(limit=tokens(c.turnTokens)))
        if c.turnTime is not None:
            lines.append(Mrkdwn("• a turn's time: at most {limit}").format(limit=duration(c.turnTime)))
        if c.channelDayTokens is not None or c.channelDayCost is not None:
            lines.append(Mrkdwn("• the channel's day starts at midnight, {zone} time").format(zone=limits.zone))
        cap = limits.raise_cap()
        how = Mrkdwn.of(HOW_TO_SET.format(cap=tokens(cap)) if cap is not None else HOW_TO_SET_ANY)
        if not lines:
            return Mrkdwn.of(NO_BUDGET.format(used=tokens(use.thread_tokens))) + Mrkdwn("\n") + how
        return Mrkdwn("💰 This thread's budgets:\n") + Mrkdwn("\n").join(lines) + Mrkdwn("\n") + how
