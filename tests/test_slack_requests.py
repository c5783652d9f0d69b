"""The record of what acts after its ack (chatops.requests), on SQLite and PostgreSQL: recorded once, claimed by
compare-and-set on the database's clock (whatever the bots' own clocks say), renewed, released until a time,
finished only by its holder, forgotten by housekeeping; and a step kept in it that a replay does not take
again. Time passes here by moving a row's times back on the database's clock."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import DBAPIError

from bot.steps import NoSteps
from chatops import db, schema
from chatops import requests as requests_module
from chatops.config import load_config
from chatops.inbox import CONTEXTS_KEPT, assistant_context, forget_assistant_contexts, keep_assistant_context
from chatops.requests import (
    KEPT,
    MAX_ATTEMPTS,
    claim_stale,
    finish,
    forget_finished,
    hold,
    keep_progress,
    record,
    release,
    renew,
    request_key,
)
from chatops.schema import AssistantContext, JobRun, RequestKind, RequestState, SlackEvent, SlackRequest, db_clock
from chatops.store import forget_seen_events, record_slack_event

T = TypeVar("T")


def key() -> str:
    return request_key(RequestKind.SLASH, str(uuid.uuid4()))


def together(n: int, fn: Callable[[int], T]) -> list[T]:
    """fn(0) … fn(n-1), started at once in threads."""
    barrier, results, errors = threading.Barrier(n), dict[int, T](), list[BaseException]()

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [results[i] for i in range(n)]


def test_a_key_is_recorded_once_whoever_records_it_at_the_same_time(engine: Engine) -> None:
    k = key()
    recorded = together(4, lambda i: record(engine, RequestKind.SLASH, k, {"text": "stop"}, f"bot{i}"))
    [first] = [r for r in recorded if r is not None]
    assert first.attempts == 1 and first.payload == {"text": "stop"} and first.progress == {}


def test_a_key_depends_on_what_slack_gives_and_not_on_its_length() -> None:
    assert request_key(RequestKind.CLICK, "1.2", "U1") == request_key(RequestKind.CLICK, "1.2", "U1")
    assert request_key(RequestKind.CLICK, "1.2", "U1") != request_key(RequestKind.CLICK, "1.2U", "1")
    assert len(request_key(RequestKind.COMMAND, "x" * 5000)) < 64


def aged(engine: Engine, request_id: int, seconds: float, column: str = "claimed_at") -> None:
    """Move one of the request's times `seconds` into the past, on the database's clock (the one claims use)."""
    with engine.begin() as conn:
        conn.execute(update(SlackRequest).where(SlackRequest.id == request_id).values({column: db_clock(-seconds)}))


@contextlib.contextmanager
def python_clock_ahead(monkeypatch: pytest.MonkeyPatch, minutes: float) -> Iterator[None]:
    """What runs inside is a bot whose own (Python) clock is `minutes` ahead: every `utcnow` the request code
    could read says so."""
    ahead = timedelta(minutes=minutes)
    with monkeypatch.context() as patch:
        for module in (schema, requests_module):
            patch.setattr(module, "utcnow", lambda: datetime.now(UTC) + ahead, raising=False)
        yield


def test_a_bot_whose_clock_is_ahead_takes_over_no_live_claim(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two bots, one's clock ten minutes ahead of the other's (and of the database's): neither finds the other's
    fresh claims stale, whichever records, renews or looks."""
    behind = record(engine, RequestKind.SLASH, key(), {}, "behind")
    with python_clock_ahead(monkeypatch, 10):
        ahead = record(engine, RequestKind.SLASH, key(), {}, "ahead")
        assert ahead is not None
        renew(engine, "ahead", {ahead.id})
        taken_by_ahead = claim_stale(engine, "ahead", 30)
    assert behind is not None
    taken_by_behind = claim_stale(engine, "behind", 30)
    assert behind.id not in {r.id for r in taken_by_ahead}
    assert ahead.id not in {r.id for r in taken_by_behind}


def test_a_stale_claim_goes_to_one_replica_and_a_live_one_to_none(engine: Engine) -> None:
    stale = record(engine, RequestKind.CLICK, key(), {}, "dead")
    live = record(engine, RequestKind.CLICK, key(), {}, "alive")
    assert stale is not None and live is not None
    aged(engine, stale.id, 60)
    aged(engine, live.id, 60)
    renew(engine, "alive", {live.id})
    claims = together(4, lambda i: claim_stale(engine, f"replica{i}", 30))
    won = [r for claimed in claims for r in claimed if r.id == stale.id]
    assert len(won) == 1 and won[0].attempts == 2 and won[0].failures == 1  # its bot died: a failure that counts
    assert not [r for claimed in claims for r in claimed if r.id == live.id]


def test_only_the_holder_keeps_progress_posts_and_finishes(engine: Engine) -> None:
    request = record(engine, RequestKind.SLASH, key(), {}, "old")
    assert request is not None
    aged(engine, request.id, 60)
    [taken] = [r for r in claim_stale(engine, "new", 30) if r.id == request.id]
    assert not hold(engine, request.id, "old")  # the stalled bot posts nothing: it stops before its post
    assert not keep_progress(engine, request.id, "old", {"root_ts": "1.1"})  # taken over: the old bot stops
    assert hold(engine, request.id, "new")
    assert keep_progress(engine, request.id, "new", {"root_ts": "1.2"})
    assert not finish(engine, request.id, "old")
    assert finish(engine, request.id, "new")
    assert request.id not in {r.id for r in claim_stale(engine, "later", 0)}
    with engine.connect() as conn:
        row = conn.execute(
            select(SlackRequest.state, SlackRequest.progress, SlackRequest.attempts).where(SlackRequest.id == taken.id)
        ).one()
    assert tuple(row) == (RequestState.DONE, {"root_ts": "1.2"}, 2)


def test_a_released_request_is_tried_again_at_its_time_and_counted_only_for_our_failures(engine: Engine) -> None:
    request = record(engine, RequestKind.COMMAND, key(), {}, "bot")
    assert request is not None
    release(engine, request.id, "bot", retry_in_s=30, counted=False)  # Slack failed: a wait, not a failure
    assert request.id not in {r.id for r in claim_stale(engine, "bot", 30)}
    aged(engine, request.id, 31, "retry_at")
    [again] = [r for r in claim_stale(engine, "bot", 30) if r.id == request.id]
    assert (again.attempts, again.failures) == (2, 0)
    release(engine, request.id, "bot", retry_in_s=0, counted=True)  # ours: counted
    [third] = [r for r in claim_stale(engine, "bot", 30) if r.id == request.id]
    assert (third.attempts, third.failures) == (3, 1)
    assert MAX_ATTEMPTS == 3


def test_housekeeping_forgets_finished_requests_after_a_while(engine: Engine) -> None:
    old, recent, open_ = (record(engine, RequestKind.CLICK, key(), {}, "bot") for _ in range(3))
    assert old is not None and recent is not None and open_ is not None
    finish(engine, old.id, "bot")
    aged(engine, old.id, KEPT.total_seconds() + 60, "done_at")
    finish(engine, recent.id, "bot", state=RequestState.FAILED)
    forget_finished(engine)
    with engine.connect() as conn:
        left = set(
            conn.execute(select(SlackRequest.id).where(SlackRequest.id.in_([old.id, recent.id, open_.id]))).scalars()
        )
    assert left == {recent.id, open_.id}


def test_housekeeping_forgets_seen_events_and_quiet_assistant_contexts(engine: Engine) -> None:
    channel = f"D{uuid.uuid4().hex[:8]}"
    old_event, new_event = f"Ev{uuid.uuid4().hex[:10]}", f"Ev{uuid.uuid4().hex[:10]}"
    for event_id in (old_event, new_event):
        assert record_slack_event(engine, event_id)
    keep_assistant_context(engine, channel, "1.1", {"channel_id": "C1"})
    keep_assistant_context(engine, channel, "2.2", {"channel_id": "C2"})
    with engine.begin() as conn:
        conn.execute(
            update(SlackEvent).where(SlackEvent.event_id == old_event).values(received_at=db_clock(-86_400 - 60))
        )
        conn.execute(
            update(AssistantContext)
            .where(AssistantContext.channel_id == channel, AssistantContext.thread_ts == "1.1")
            .values(updated_at=db_clock(-CONTEXTS_KEPT.total_seconds() - 60))
        )
    assert forget_seen_events(engine) >= 1 and forget_assistant_contexts(engine) >= 1
    assert not record_slack_event(engine, new_event)  # still seen: a retry of it is still a retry
    assert record_slack_event(engine, old_event)  # forgotten
    assert assistant_context(engine, channel, "1.1") is None
    assert assistant_context(engine, channel, "2.2") == {"channel_id": "C2"}


def test_a_job_run_asked_again_by_a_replay_is_recorded_once_and_handed_over_again(
    tmp_path: Path, engine: Engine
) -> None:
    """`/mm job run` carried out twice from one record (its bot died after recording the run, before keeping
    anything of it): one run, handed over twice (a run handed over twice starts once)."""
    from bot.authorize import Approvers
    from bot.jobs import JobCommands
    from chatops.reload import ConfigFile

    path = tmp_path / "mm.yaml"
    name = f"tidy{uuid.uuid4().hex[:6]}"
    path.write_text(
        "channels:\n  default: {approvers: [U0BOB]}\n"
        f"jobs:\n  - {{name: {name}, schedule: '0 3 * * *', channel: C0JOBS, prompt: tidy up}}\n"
    )
    config_file = ConfigFile(load_config(path), check_s=3600)
    handed: list[int] = []

    async def hand_over(run_id: int) -> None:
        handed.append(run_id)

    class Forgetful(NoSteps):
        """What the record keeps between attempts (bot.requests.RecordedSteps), of a bot killed after it
        recorded the run and before it could keep anything of it: nothing but the request's key."""

        @property
        def key(self) -> str | None:
            return request

    request = key()
    jobs = JobCommands(engine, config_file, Approvers(lambda: config_file.current().service), hand_over)
    for _ in range(2):
        said, _public = asyncio.run(jobs.answer(None, f"job run {name}", "U0BOB", Forgetful(engine)))
        assert said.startswith("🔧 <@U0BOB> started")
    with engine.connect() as conn:
        runs = list(conn.execute(select(JobRun.id).where(JobRun.job_name == name)).scalars())
    assert len(runs) == 1 and handed == runs * 2


def test_a_bot_stalled_inside_a_transaction_holds_up_no_replica(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bot stops (SIGSTOP, a swap storm) between its claim renewal's UPDATE and its commit: the row stays
    locked. The server ends that transaction after STALLED_S, and a replica's takeover goes on; the stalled bot,
    woken, finds its connection gone and its renewal undone."""
    monkeypatch.setattr(db, "STALLED_S", 0.5)
    db.migrate(pg_url)
    stalled, replica = db.engine_for(pg_url), db.engine_for(pg_url)
    pool = ThreadPoolExecutor(1)  # shut down last: without the timeout, the replica waits until the lock goes
    try:
        request = record(stalled, RequestKind.SLASH, key(), {}, "stalled")
        assert request is not None
        aged(stalled, request.id, 60)
        with stalled.connect() as conn:
            conn.execute(update(SlackRequest).where(SlackRequest.id == request.id).values(claimed_at=db_clock()))
            taken = pool.submit(claim_stale, replica, "replica", 30).result(timeout=30)
            assert [(r.id, r.attempts, r.failures) for r in taken] == [(request.id, 2, 1)]
            with pytest.raises(DBAPIError, match="idle-in-transaction timeout"):
                conn.execute(select(1))
    finally:
        pool.shutdown()
        stalled.dispose()
        replica.dispose()
