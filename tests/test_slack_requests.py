"""The record of what acts after its ack (chatops.requests), on SQLite and PostgreSQL: recorded once, claimed by
compare-and-set, renewed, released, finished only by its holder, forgotten by housekeeping; and a step kept in
it that a replay does not take again."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, select

from chatops.config import load_config
from chatops.requests import (
    KEPT,
    MAX_ATTEMPTS,
    claim_stale,
    finish,
    forget_finished,
    keep_progress,
    record,
    release,
    renew,
    request_key,
)
from chatops.schema import JobRun, RequestKind, RequestState, SlackRequest, utcnow

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


def test_a_stale_claim_goes_to_one_replica_and_a_live_one_to_none(engine: Engine) -> None:
    now = utcnow()
    stale = record(engine, RequestKind.CLICK, key(), {}, "dead", now=now - timedelta(seconds=60))
    live = record(engine, RequestKind.CLICK, key(), {}, "alive", now=now - timedelta(seconds=60))
    assert stale is not None and live is not None
    renew(engine, "alive", {live.id}, now=now)
    claims = together(4, lambda i: claim_stale(engine, f"replica{i}", 30, 10, now=now))
    won = [r for claimed in claims for r in claimed if r.id == stale.id]
    assert len(won) == 1 and won[0].attempts == 2
    assert not [r for claimed in claims for r in claimed if r.id == live.id]


def test_only_the_holder_keeps_progress_and_finishes(engine: Engine) -> None:
    now = utcnow()
    request = record(engine, RequestKind.SLASH, key(), {}, "old", now=now - timedelta(seconds=60))
    assert request is not None
    [taken] = [r for r in claim_stale(engine, "new", 30, 10, now=now) if r.id == request.id]
    assert not keep_progress(engine, request.id, "old", {"root_ts": "1.1"})  # taken over: the old bot stops
    assert keep_progress(engine, request.id, "new", {"root_ts": "1.2"})
    assert not finish(engine, request.id, "old")
    assert finish(engine, request.id, "new")
    assert request.id not in {r.id for r in claim_stale(engine, "later", 0, 0, now=now + timedelta(hours=1))}
    with engine.connect() as conn:
        row = conn.execute(
            select(SlackRequest.state, SlackRequest.progress, SlackRequest.attempts).where(SlackRequest.id == taken.id)
        ).one()
    assert tuple(row) == (RequestState.DONE, {"root_ts": "1.2"}, 2)


def test_a_released_request_is_tried_again_soon_and_counted(engine: Engine) -> None:
    now = utcnow()
    request = record(engine, RequestKind.COMMAND, key(), {}, "bot", now=now)
    assert request is not None
    release(engine, request.id, "bot", now=now)
    assert request.id not in {r.id for r in claim_stale(engine, "bot", 30, 10, now=now + timedelta(seconds=5))}
    again = [r for r in claim_stale(engine, "bot", 30, 10, now=now + timedelta(seconds=11)) if r.id == request.id]
    assert [r.attempts for r in again] == [2]
    assert MAX_ATTEMPTS == 3


def test_housekeeping_forgets_finished_requests_after_a_while(engine: Engine) -> None:
    now = utcnow()
    old, recent, open_ = (record(engine, RequestKind.CLICK, key(), {}, "bot", now=now) for _ in range(3))
    assert old is not None and recent is not None and open_ is not None
    finish(engine, old.id, "bot", now=now - KEPT - timedelta(minutes=1))
    finish(engine, recent.id, "bot", state=RequestState.FAILED, now=now)
    forget_finished(engine, now=now)
    with engine.connect() as conn:
        left = set(
            conn.execute(select(SlackRequest.id).where(SlackRequest.id.in_([old.id, recent.id, open_.id]))).scalars()
        )
    assert left == {recent.id, open_.id}


def test_a_job_run_asked_again_by_a_replay_is_recorded_once_and_handed_over_again(
    tmp_path: Path, engine: Engine
) -> None:
    """`/mm job run` carried out twice from one record (its bot died after recording the run): one run."""
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

    class Kept:  # what the record keeps between attempts (bot.requests.RecordedSteps)
        def __init__(self) -> None:
            self.steps: dict[str, str] = {}

        def done(self, step: str) -> str | None:
            return self.steps.get(step)

        async def keep(self, step: str, value: str) -> None:
            self.steps[step] = value

    jobs, kept = JobCommands(engine, config_file, Approvers(lambda: config_file.current().service), hand_over), Kept()
    for _ in range(2):
        said, _public = asyncio.run(jobs.answer(None, f"job run {name}", "U0BOB", kept))
        assert said.startswith("🔧 <@U0BOB> started")
    with engine.connect() as conn:
        runs = list(conn.execute(select(JobRun.id).where(JobRun.job_name == name)).scalars())
    assert len(runs) == 1 and handed == runs * 2
