"""Budgets: what a turn, a thread (a job's run is its thread) and a channel's day may spend, and what they spent.

The one owner of their arithmetic. The limits a session runs under are the config's `budgets`, key by key: the
top level's, over them the channel's, over those the job's, and over the thread's token budget the one said in
the thread (`@mm budget 20k`, kept on the session with who set it). What was spent is read from `model_usage`,
which the store writes with each model answer, an asked agent's too, in the answer's own transaction
(chatops.store): a thread's use is the sum over its session, a channel's day the sum over the channel since
midnight in the channel's time zone (`channels.<id>.timezone`), through the (channel, time) index. A turn's use
is what mm_core's loop counts (`Agent.spent`: its answers and its asked agents'), which a resumed turn reads again
from its log.

The worker hands a `Gate` to the agent as its `budget`: before each model call it reads the use again, so two
threads of one channel see each other's answers, and says which budget is used up, and how to raise it. Nothing
is reserved ahead: a turn stops at the first model call after its budget is reached, so a budget is passed by
at most one answer (of each thread running at that moment, for a channel's day). Wall time (`turnTime`) is the
worker's time limit (workers/turns.py), lowered by the budget.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, func, select

from chatops.config import BudgetsConfig, JobConfig, ServiceConfig
from chatops.db import reading
from chatops.schema import ModelUsage, Session, utcnow
from mm_core.events import Usage

# The metric's label of each budget (slackio.metrics.BUDGET_STOPS), and the config key it is.
KEYS = {
    "turn_tokens": "turnTokens",
    "thread_tokens": "threadTokens",
    "turn_time": "turnTime",
    "channel_day_tokens": "channelDayTokens",
    "thread_cost": "threadCost",
    "channel_day_cost": "channelDayCost",
}
THREAD_TOKENS_HINT = "An approver can raise it: `@mm budget {more}`."
TURN_TOKENS_HINT = "Ask again to go on, or raise `budgets.turnTokens` in the config."
THREAD_COST_HINT = "An operator can raise `budgets.threadCost` in the config; a new thread starts from nothing."
DAY_HINT = "It starts again at midnight{at}; an operator can raise `budgets.{key}` in the config."


@dataclass(frozen=True)
class OwnBudget:
    """The thread's own token budget, as `budget N` said in it set it: by whom, and whether they were an approver
    of the channel then (a budget an approver set is raised only by an approver)."""

    tokens: int
    by: str
    approver: bool


@dataclass(frozen=True)
class Limits:
    """The budgets a session runs under: the config's, key by key, and the thread's own token budget."""

    configured: BudgetsConfig
    own: OwnBudget | None = None
    zone: str = "UTC"  # the channel's: where its day starts

    @property
    def thread_tokens(self) -> int | None:
        return self.own.tokens if self.own is not None else self.configured.threadTokens

    def counted(self) -> bool:
        """Some budget counts tokens or cost (the gate has something to ask); turnTime is the worker's."""
        c = self.configured
        counts = (c.turnTokens, self.thread_tokens, c.channelDayTokens, c.threadCost, c.channelDayCost)
        return any(v is not None for v in counts)

    def raise_cap(self) -> int | None:
        """The highest thread token budget someone in the thread may set without an approver: the config's, and
        not above one an approver set (None: no cap)."""
        caps = [self.configured.threadTokens]
        if self.own is not None and self.own.approver:
            caps.append(self.own.tokens)
        known = [c for c in caps if c is not None]
        return min(known) if known else None


@dataclass(frozen=True)
class Use:
    """What was spent: by the thread (its session), and by its channel today (in the channel's time zone)."""

    thread_tokens: int = 0
    thread_cost: float = 0.0
    day_tokens: int = 0
    day_cost: float = 0.0


@dataclass(frozen=True)
class Stop:
    """A budget is used up: which (its metric label, KEYS), what happened in words for a job's summary, and the
    thread's line, which says how to raise it."""

    budget: str
    said: str
    line: str


def configured(service: ServiceConfig, channel_id: str, job: JobConfig | None = None) -> BudgetsConfig:
    """The config's budgets for a session: the top level's, over them the channel's, over those the job's, each key
    set replacing the one below it (an unset key takes the one below)."""
    merged: dict[str, Any] = {}
    for layer in (service.budgets, service.channel(channel_id).budgets, job.budgets if job is not None else None):
        if layer is not None:
            merged |= {key: value for key, value in layer.model_dump().items() if value is not None}
    return BudgetsConfig.model_validate(merged)


def own_budget(bind: Engine | Connection, session_id: str) -> OwnBudget | None:
    """The thread's own token budget (chatops.store.set_budget), None when nobody set one."""
    with reading(bind) as conn:
        row = conn.execute(select(Session.agent_config).where(Session.id == session_id)).scalar_one_or_none()
    found = (row or {}).get("budget")
    if not isinstance(found, dict) or not isinstance(found.get("tokens"), int):
        return None
    return OwnBudget(found["tokens"], str(found.get("by") or ""), bool(found.get("approver")))


def limits_of(
    bind: Engine | Connection, service: ServiceConfig, session_id: str, channel_id: str, job: JobConfig | None = None
) -> Limits:
    """The limits the session's next turn runs under."""
    zone = service.channel(channel_id).timezone
    return Limits(configured(service, channel_id, job), own_budget(bind, session_id), zone)


def day_of(zone: str, now: datetime) -> tuple[datetime, datetime]:
    """The channel's day holding `now`: its local midnight and the next one, as UTC instants. A midnight the clocks
    skip starts the day when they jump (zoneinfo maps the missing time after the gap)."""
    tz = zoneinfo.ZoneInfo(zone)
    local = now.astimezone(tz).date()
    start = datetime.combine(local, time(0), tzinfo=tz)
    end = datetime.combine(local + timedelta(days=1), time(0), tzinfo=tz)
    return start.astimezone(UTC), end.astimezone(UTC)


_TOKENS = func.coalesce(func.sum(ModelUsage.prompt_tokens + ModelUsage.completion_tokens), 0)
_COST = func.coalesce(func.sum(ModelUsage.cost), 0.0)


def use_of(
    bind: Engine | Connection,
    session_id: str,
    channel_id: str,
    limits: Limits,
    now: datetime | None = None,
    *,
    thread: bool = False,
) -> Use:
    """What the thread and its channel's day have spent, from model_usage: what `limits` count (nothing is read for
    a budget that is not set), and the thread's use with `thread` whatever its budgets."""
    c = limits.configured
    thread = thread or limits.thread_tokens is not None or c.threadCost is not None
    day = c.channelDayTokens is not None or c.channelDayCost is not None
    with reading(bind) as conn:
        thread_tokens, thread_cost = _summed(conn, ModelUsage.session_id == session_id) if thread else (0, 0.0)
        if day:  # through the (channel, time) index
            start, end = day_of(limits.zone, now or utcnow())
            day = ModelUsage.channel_id == channel_id, ModelUsage.created_at >= start, ModelUsage.created_at < end
            day_tokens, day_cost = _summed(conn, *day)
        else:
            day_tokens, day_cost = 0, 0.0
    return Use(thread_tokens, thread_cost, day_tokens, day_cost)


def _summed(conn: Connection, *where: ColumnElement[bool]) -> tuple[int, float]:
    """The tokens and the cost of the answers `where` says."""
    tokens_, cost = conn.execute(select(_TOKENS, _COST).where(*where)).one()
    return int(tokens_ or 0), float(cost or 0.0)


def stop(limits: Limits, use: Use, turn_tokens: int, now: datetime | None = None) -> Stop | None:
    """The budget the next model call would pass, None when none is used up. The channel's day first, then the
    thread's, then the turn's: what is said is the budget that raising the others would not lift."""
    c = limits.configured
    now = now or utcnow()
    day_hint = {"at": _midnight(limits.zone, now)}
    if c.channelDayCost is not None and use.day_cost >= c.channelDayCost:
        said = f"this channel's budget of {money(c.channelDayCost)} a day is spent ({money(use.day_cost)})"
        return _stop("channel_day_cost", said, DAY_HINT.format(key="channelDayCost", **day_hint))
    if c.channelDayTokens is not None and use.day_tokens >= c.channelDayTokens:
        said = f"this channel's budget of {tokens(c.channelDayTokens)} tokens a day is used ({tokens(use.day_tokens)})"
        return _stop("channel_day_tokens", said, DAY_HINT.format(key="channelDayTokens", **day_hint))
    if c.threadCost is not None and use.thread_cost >= c.threadCost:
        said = f"this thread's budget of {money(c.threadCost)} is spent ({money(use.thread_cost)})"
        return _stop("thread_cost", said, THREAD_COST_HINT)
    limit = limits.thread_tokens
    if limit is not None and use.thread_tokens >= limit:
        said = f"this thread's budget of {tokens(limit)} tokens is used ({tokens(use.thread_tokens)})"
        return _stop("thread_tokens", said, THREAD_TOKENS_HINT.format(more=tokens(2 * limit)))
    if c.turnTokens is not None and turn_tokens >= c.turnTokens:
        said = f"this turn's budget of {tokens(c.turnTokens)} tokens is used ({tokens(turn_tokens)})"
        return _stop("turn_tokens", said, TURN_TOKENS_HINT)
    return None


def _midnight(zone: str, now: datetime) -> str:
    """When the channel's next day starts, for a person anywhere: ` Europe/Paris time (23:00 UTC)`."""
    if zone == "UTC":
        return " UTC"
    _start, end = day_of(zone, now)
    return f" {zone} time ({end:%H:%M} UTC)"


def _stop(budget: str, said: str, hint: str) -> Stop:
    return Stop(budget, said, f"⛔ {said[0].upper()}{said[1:]}. {hint}")


def against(limits: Limits, use: Use, turn_tokens: int | None = None) -> list[str]:
    """Each budget that applies with what was spent against it (`this thread: 12.4k / 20k tokens`); the turn's
    only when its tokens are given."""
    c, parts = limits.configured, []
    if c.turnTokens is not None and turn_tokens is not None:
        parts.append(f"this turn: {tokens(turn_tokens)} / {tokens(c.turnTokens)} tokens")
    if limits.thread_tokens is not None:
        parts.append(f"this thread: {tokens(use.thread_tokens)} / {tokens(limits.thread_tokens)} tokens")
    if c.threadCost is not None:
        parts.append(f"this thread: {money(use.thread_cost)} / {money(c.threadCost)}")
    if c.channelDayTokens is not None:
        parts.append(f"today in this channel: {tokens(use.day_tokens)} / {tokens(c.channelDayTokens)} tokens")
    if c.channelDayCost is not None:
        parts.append(f"today in this channel: {money(use.day_cost)} / {money(c.channelDayCost)}")
    return parts


def recap_line(limits: Limits, use: Use, turn_tokens: int) -> str | None:
    """The line under a turn's recap: its use against each budget (`💰 this thread: 12.4k / 20k tokens`); None when
    no budget counts."""
    parts = against(limits, use, turn_tokens)
    return "💰 " + " · ".join(parts) if parts else None


def tokens(count: int) -> str:
    """A number of tokens as people read it and `budget` takes it: 929, 12.4k, 20k, 1.5M."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if count >= size:
            shown = f"{count / size:.1f}".removesuffix(".0")
            if suffix == "k" and shown == "1000":  # 999,950 and up round to a thousand k: say 1M
                return "1M"
            return f"{shown}{suffix}"
    return str(count)


def money(amount: float) -> str:
    """An amount in the currency of the models' `price`."""
    return f"{amount:,.2f}"


class Gate:
    """One turn's budgets as mm_core's Agent asks them before each model call (its `budget`): the line that ends
    the turn, or None. `stopped` keeps the budget that ended it, for the worker (its metric, a job's reason);
    `spent` is the agent's count of the turn's tokens, for the recap."""

    def __init__(
        self,
        engine: Engine,
        session_id: str,
        channel_id: str,
        limits: Limits,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.engine, self.session_id, self.channel_id, self.limits = engine, session_id, channel_id, limits
        self.clock = clock
        self.stopped: Stop | None = None
        self.spent: Callable[[], Usage] = Usage

    def __call__(self, turn: Usage) -> str | None:
        now = self.clock()
        use = use_of(self.engine, self.session_id, self.channel_id, self.limits, now)
        self.stopped = stop(self.limits, use, turn.total_tokens, now)
        return self.stopped.line if self.stopped is not None else None

    def recap(self) -> str | None:
        """The recap's budget line, once the turn ended (its last answer is recorded)."""
        if not self.limits.counted():
            return None
        use = use_of(self.engine, self.session_id, self.channel_id, self.limits, self.clock())
        return recap_line(self.limits, use, self.spent().total_tokens)
