"""Budgets' arithmetic (chatops/budgets.py) and the usage they count, recorded by the store with each model answer,
on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, insert, select

from bot.commands import Command, parse
from chatops import budgets, store
from chatops.budgets import Gate, Limits, OwnBudget, Use, configured, day_of, limits_of, stop, tokens, use_of
from chatops.config import BudgetsConfig, JobConfig, ServiceConfig, parse_tokens
from chatops.schema import ModelUsage, utcnow
from mm_core.config import ModelPrice
from mm_core.events import Usage
from mm_core.log import AssistantMessage, Fenced, Nested, ToolCallRequest, UserMessage, to_dict

PARIS = "C0PARIS"


def service(**data: object) -> ServiceConfig:
    return ServiceConfig.model_validate(data)


def test_the_config_s_budgets_are_taken_key_by_key_top_channel_job() -> None:
    config = service(
        budgets={"turnTokens": "20k", "threadTokens": "100k", "turnTime": "10m"},
        channels={PARIS: {"budgets": {"threadTokens": "50k", "channelDayTokens": "1M"}, "timezone": "Europe/Paris"}},
    )
    job = JobConfig.model_validate(
        {"name": "nightly", "schedule": "0 3 * * *", "channel": PARIS, "prompt": "x", "budgets": {"turnTokens": 5000}}
    )
    assert configured(config, PARIS, job) == BudgetsConfig(
        turnTokens=5000, threadTokens=50_000, turnTime=600.0, channelDayTokens=1_000_000
    )
    assert configured(config, PARIS) == BudgetsConfig(
        turnTokens=20_000, threadTokens=50_000, turnTime=600.0, channelDayTokens=1_000_000
    )
    # Another channel has none of its own: the top level's, whole.
    assert configured(config, "C0OTHER") == config.budgets
    assert configured(service(), PARIS) == BudgetsConfig()


def test_a_thread_s_own_budget_is_over_the_config_s_and_an_approver_s_caps_raising() -> None:
    config = BudgetsConfig(threadTokens=50_000)
    assert Limits(config).thread_tokens == 50_000 and Limits(config).raise_cap() == 50_000
    lowered = Limits(config, OwnBudget(10_000, "U0ALICE", approver=False))
    assert lowered.thread_tokens == 10_000 and lowered.raise_cap() == 50_000  # back up to the channel's
    raised = Limits(config, OwnBudget(80_000, "U0BOB", approver=True))
    assert raised.thread_tokens == 80_000 and raised.raise_cap() == 50_000
    capped = Limits(config, OwnBudget(20_000, "U0BOB", approver=True))
    assert capped.raise_cap() == 20_000  # an approver's lower budget is raised only by an approver
    assert Limits(BudgetsConfig()).raise_cap() is None and not Limits(BudgetsConfig()).counted()
    assert Limits(BudgetsConfig(turnTime=60)).counted() is False  # the worker's time limit, not the gate's
    assert Limits(BudgetsConfig(), OwnBudget(1000, "U0ALICE", approver=False)).counted()


@pytest.mark.parametrize(
    "count, shown",
    [(1, "1"), (929, "929"), (1000, "1k"), (12_400, "12.4k"), (20_300, "20.3k"), (999_950, "1M"), (1_500_000, "1.5M")],
)
def test_token_counts_read_as_people_write_them_and_budget_takes_them(count: int, shown: str) -> None:
    assert tokens(count) == shown
    assert abs(parse_tokens(shown) - count) <= max(50, count // 200)  # the config's own reading of it


def test_the_channel_s_day_is_its_own_time_zone_s() -> None:
    # 00:30 in Paris on 1 July is 22:30 UTC on 30 June: Paris's day began at 22:00 UTC.
    assert day_of("Europe/Paris", datetime(2026, 6, 30, 22, 30, tzinfo=UTC)) == (
        datetime(2026, 6, 30, 22, 0, tzinfo=UTC),
        datetime(2026, 7, 1, 22, 0, tzinfo=UTC),
    )
    assert day_of("UTC", datetime(2026, 6, 30, 22, 30, tzinfo=UTC))[0] == datetime(2026, 6, 30, tzinfo=UTC)
    # Santiago's clocks skip from 00:00 to 01:00 on 6 September 2026: that day starts when they jump, and the day
    # before ends there, with no gap and no overlap.
    sixth = day_of("America/Santiago", datetime(2026, 9, 6, 12, tzinfo=UTC))
    fifth = day_of("America/Santiago", datetime(2026, 9, 5, 12, tzinfo=UTC))
    assert fifth[1] == sixth[0] == datetime(2026, 9, 6, 4, 0, tzinfo=UTC)
    assert sixth[1] - sixth[0] == timedelta(hours=23)


def test_stop_names_the_budget_used_up_and_how_to_raise_it() -> None:
    now = datetime(2026, 6, 30, 12, tzinfo=UTC)
    thread = Limits(BudgetsConfig(turnTokens=5000, threadTokens=20_000))
    assert stop(thread, Use(thread_tokens=19_999), 4_999, now) is None
    found = stop(thread, Use(thread_tokens=20_300), 4_000, now)
    assert found is not None and found.budget == "thread_tokens"
    assert found.line == (
        "⛔ This thread's budget of 20k tokens is used (20.3k). An approver can raise it: `@mm budget 40k`."
    )
    assert found.said == "this thread's budget of 20k tokens is used (20.3k)"
    turn = stop(thread, Use(thread_tokens=6_000), 5_000, now)
    assert turn is not None and turn.line == (
        "⛔ This turn's budget of 5k tokens is used (5k). Ask again to go on, or raise `budgets.turnTokens` in the "
        "config."
    )
    # The channel's day comes first: raising the thread's would not lift it. Its line says when it starts again.
    day = Limits(BudgetsConfig(threadTokens=1000, channelDayTokens=1_000_000), zone="Europe/Paris")
    found = stop(day, Use(thread_tokens=5000, day_tokens=1_020_000), 0, now)
    assert found is not None and found.line == (
        "⛔ This channel's budget of 1M tokens a day is used (1M). It starts again at midnight Europe/Paris time "
        "(22:00 UTC); an operator can raise `budgets.channelDayTokens` in the config."
    )
    money = Limits(BudgetsConfig(threadCost=2, channelDayCost=10))
    found = stop(money, Use(thread_cost=2.004, day_cost=3), 0, now)
    assert found is not None and found.budget == "thread_cost"
    assert found.said == "this thread's budget of 2.00 is spent (2.00)"
    found = stop(money, Use(thread_cost=1, day_cost=10.5), 0, now)
    assert found is not None and found.budget == "channel_day_cost" and "midnight UTC;" in found.line
    assert stop(Limits(BudgetsConfig()), Use(10**9, 10**6, 10**9, 10**6), 10**9, now) is None


def test_the_recap_shows_each_budget_that_applies_against_its_use() -> None:
    limits = Limits(
        BudgetsConfig(turnTokens=5000, channelDayTokens=1_000_000, threadCost=5), OwnBudget(20_000, "U", False)
    )
    use = Use(thread_tokens=12_400, thread_cost=0.42, day_tokens=150_000)
    assert budgets.recap_line(limits, use, 3_100) == (
        "💰 this turn: 3.1k / 5k tokens · this thread: 12.4k / 20k tokens · this thread: 0.42 / 5.00 · "
        "today in this channel: 150k / 1M tokens"
    )
    assert budgets.recap_line(Limits(BudgetsConfig()), use, 3_100) is None


# --- on the database ---------------------------------------------------------------------------------------


@pytest.fixture
def session_id(engine: Engine) -> str:
    return store.ensure_session(engine, channel_id=PARIS, thread_ts=f"{uuid.uuid4().int % 10**10}.000100")


def _usage_rows(engine: Engine, session_id: str) -> list[tuple]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                ModelUsage.channel_id,
                ModelUsage.model,
                ModelUsage.prompt_tokens,
                ModelUsage.completion_tokens,
                ModelUsage.cost,
            )
            .where(ModelUsage.session_id == session_id)
            .order_by(ModelUsage.id)
        )
        return [tuple(r) for r in rows]


def test_each_answer_s_usage_is_recorded_once_with_its_channel_model_and_cost(engine: Engine, session_id: str) -> None:
    metered = store.Metered(PARIS, "big", ModelPrice(input=1.5, output=6))
    log = store.DbStore(engine, metered=metered)
    call = ToolCallRequest("c1", "ask_agent", "{}")
    asked = AssistantMessage("ok", (), 300, 20, agent="reviewer")
    for entry in (
        UserMessage("hi", "U0ALICE"),
        AssistantMessage("", (call,), 1000, 200),
        Nested("c1", to_dict(asked)),  # an asked agent's answer costs tokens too
        Nested("c1", to_dict(Nested("c9", to_dict(AssistantMessage("deeper", (), 40, 2))))),  # and its own asked one
        Nested("c1", to_dict(UserMessage("review it"))),
        AssistantMessage("no usage reported", (), 0, 0),  # some servers send none: nothing to count
    ):
        asyncio.run(log.append(session_id, entry))
    rows = _usage_rows(engine, session_id)
    assert [r[:4] for r in rows] == [(PARIS, "big", 1000, 200), (PARIS, "big", 300, 20), (PARIS, "big", 40, 2)]
    assert [r[4] for r in rows] == pytest.approx([(1000 * 1.5 + 200 * 6) / 1e6, (300 * 1.5 + 20 * 6) / 1e6, 72e-6])

    # An unpriced model costs nothing known; a fenced append records nothing, its answer was not kept either.
    token = store.acquire_lease(engine, session_id, "w1", ttl_s=30)
    assert token is not None
    unpriced = store.DbStore(engine, token, store.Metered(PARIS, "small"))
    asyncio.run(unpriced.append(session_id, AssistantMessage("a", (), 10, 1)))
    assert store.acquire_lease(engine, session_id, "w2", ttl_s=30, now=utcnow() + timedelta(seconds=31))
    with pytest.raises(Fenced):
        asyncio.run(unpriced.append(session_id, AssistantMessage("late", (), 99, 9)))
    assert _usage_rows(engine, session_id)[3:] == [(PARIS, "small", 10, 1, None)]


def test_use_is_the_thread_s_sum_and_the_channel_s_local_day(engine: Engine) -> None:
    # 00:30 in Paris on 1 July (22:30 UTC on 30 June).
    now = datetime(2026, 6, 30, 22, 30, tzinfo=UTC)
    channel = f"C0{uuid.uuid4().hex[:8].upper()}"  # the module's database is shared by its tests: a channel of its own
    session_id = store.ensure_session(engine, channel_id=channel, thread_ts=f"{uuid.uuid4().int % 10**10}.000100")
    other = store.ensure_session(engine, channel_id=channel, thread_ts=f"{uuid.uuid4().int % 10**10}.000200")
    elsewhere = store.ensure_session(engine, channel_id="C0ELSE", thread_ts=f"{uuid.uuid4().int % 10**10}.000300")

    def answer(session: str, in_channel: str, at: datetime, count: int, cost: float | None = None) -> None:
        with engine.begin() as conn:
            conn.execute(
                insert(ModelUsage).values(
                    session_id=session,
                    channel_id=in_channel,
                    model="m",
                    prompt_tokens=count,
                    completion_tokens=0,
                    cost=cost,
                    created_at=at,
                )
            )

    answer(session_id, channel, datetime(2026, 6, 30, 21, 59, tzinfo=UTC), 1000, 0.5)  # 23:59 in Paris, the day before
    answer(session_id, channel, datetime(2026, 6, 30, 22, 1, tzinfo=UTC), 200, 0.25)  # 00:01 in Paris
    answer(other, channel, datetime(2026, 6, 30, 22, 10, tzinfo=UTC), 30)  # another thread of the channel, unpriced
    answer(elsewhere, "C0ELSE", datetime(2026, 6, 30, 22, 20, tzinfo=UTC), 4000, 1.0)  # another channel
    counted = BudgetsConfig(threadTokens=10_000, channelDayTokens=10_000, channelDayCost=9)
    paris = Limits(counted, zone="Europe/Paris")
    assert use_of(engine, session_id, channel, paris, now) == Use(1200, 0.75, 230, 0.25)
    # In UTC every answer of the channel was today.
    assert use_of(engine, session_id, channel, Limits(counted), now) == Use(1200, 0.75, 1230, 0.75)
    # Only what a budget counts is read.
    assert use_of(engine, session_id, channel, Limits(BudgetsConfig(turnTokens=5)), now) == Use()
    assert use_of(engine, session_id, channel, Limits(BudgetsConfig()), now, thread=True) == Use(1200, 0.75)


def test_the_gate_reads_the_use_before_each_call_and_the_thread_s_own_budget_from_the_session(
    engine: Engine, session_id: str
) -> None:
    config = service(budgets={"threadTokens": "1k"}, channels={PARIS: {"timezone": "Europe/Paris"}})
    store.set_budget(engine, session_id, 500, "U0ALICE", approver=False)
    limits = limits_of(engine, config, session_id, PARIS)
    assert limits == Limits(BudgetsConfig(threadTokens=1000), OwnBudget(500, "U0ALICE", False), "Europe/Paris")
    now = utcnow()
    gate = Gate(engine, session_id, PARIS, limits, clock=lambda: now)
    assert gate(Usage()) is None and gate.stopped is None
    asyncio.run(
        store.DbStore(engine, metered=store.Metered(PARIS)).append(session_id, AssistantMessage("a", (), 450, 60))
    )
    line = gate(Usage(450, 60))
    assert line == "⛔ This thread's budget of 500 tokens is used (510). An approver can raise it: `@mm budget 1k`."
    assert gate.stopped is not None and gate.stopped.budget == "thread_tokens"
    gate.spent = lambda: Usage(450, 60)
    assert gate.recap() == "💰 this thread: 510 / 500 tokens"


@pytest.mark.parametrize(
    "text, command",
    [
        ("budget", Command("budget")),
        ("budget 20k", Command("budget", ("20k",))),
        ("  BUDGET -5 ", Command("budget", ("-5",))),  # a command, refused for its number (bot.budgets)
        ("budget for the launch: what do we need?", None),  # a request to the agent
    ],
)
def test_budget_is_a_command_only_as_the_whole_message(text: str, command: Command | None) -> None:
    assert parse(text) == command
