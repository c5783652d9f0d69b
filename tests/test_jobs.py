"""Firing scheduled jobs in the database, on a clock the tests drive: one leader at a time, one run a tick even
with two schedulers, a restart across a tick runs it once, an outage's older ticks are recorded as missed."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, insert, select, update

from chatops.config import JobConfig
from chatops.jobs import MAX_MISSED, Cursor, fire_due, give_up_leadership, take_leadership
from chatops.schema import JobRun, JobRunStatus, JobState

_names = itertools.count(1)


def at(hhmm: str, seconds: int = 0) -> datetime:
    hours, minutes = hhmm.split(":")
    return datetime(2026, 12, 1, int(hours), int(minutes), seconds, tzinfo=UTC)


def job(schedule: str = "*/5 * * * *", **values: object) -> JobConfig:
    # The engine is the module's: each test's jobs have names of their own.
    fields = {"name": f"job-{next(_names)}", "schedule": schedule, "channel": "C0JOBS", "prompt": "tidy up"}
    return JobConfig.model_validate(fields | values)


def runs(engine: Engine, name: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(JobRun.scheduled_for, JobRun.status).where(JobRun.job_name == name).order_by(JobRun.scheduled_for)
        ).all()
    return [(f"{when:%H:%M}", status) for when, status in rows]


def test_one_leader_at_a_time_and_a_clean_stop_hands_over_at_once(engine: Engine) -> None:
    give_up_leadership(engine, "nobody")  # a row may be left by another test of this module: harmless
    now = at("10:00") + timedelta(days=365 * 10)  # later than any lease this module's other tests took
    assert take_leadership(engine, "a", 30, now)
    assert not take_leadership(engine, "b", 30, now + timedelta(seconds=10))
    assert take_leadership(engine, "a", 30, now + timedelta(seconds=20))  # renewed: runs to +50 s
    assert not take_leadership(engine, "b", 30, now + timedelta(seconds=45))
    assert take_leadership(engine, "b", 30, now + timedelta(seconds=51))  # a stopped renewing: b takes over
    assert not take_leadership(engine, "a", 30, now + timedelta(seconds=52))
    give_up_leadership(engine, "b")
    assert take_leadership(engine, "a", 30, now + timedelta(seconds=53))


def test_each_tick_runs_once_even_with_two_schedulers(engine: Engine) -> None:
    chore = job()
    first, second = Cursor(), Cursor()
    # A job that never ran starts from now: deploying it does not run it at once.
    assert fire_due(engine, [chore], first, at("10:02"), 600) == []
    assert fire_due(engine, [chore], second, at("10:02", 30), 600) == []
    for now in (at("10:05", 1), at("10:05", 2), at("10:07"), at("10:10", 0)):
        fire_due(engine, [chore], first, now, 600)
        fire_due(engine, [chore], second, now, 600)
    assert runs(engine, chore.name) == [("10:05", "scheduled"), ("10:10", "scheduled")]


def test_a_scheduler_restarted_across_a_tick_runs_it_once_and_an_outage_is_recorded(engine: Engine) -> None:
    chore = job()
    cursor = Cursor()
    fire_due(engine, [chore], cursor, at("10:04"), 600)
    [fired] = fire_due(engine, [chore], cursor, at("10:05", 1), 600)
    assert fired.status == JobRunStatus.SCHEDULED and fired.scheduled_for == at("10:05")
    # The scheduler stops at 10:09 and another starts at 10:31: 10:30 is 1 minute late (within the grace) and
    # runs once; the ticks before it are recorded as missed.
    restarted = Cursor()
    fired_late = fire_due(engine, [chore], restarted, at("10:31"), 600)
    assert [(f.scheduled_for, f.status) for f in fired_late][-1] == (at("10:30"), JobRunStatus.SCHEDULED)
    assert runs(engine, chore.name) == [
        ("10:05", "scheduled"),
        *((f"10:{m}", "missed") for m in (10, 15, 20, 25)),
        ("10:30", "scheduled"),
    ]
    # Beyond the grace, even the latest is missed.
    assert [f.status for f in fire_due(engine, [chore], Cursor(), at("10:52"), 60)] == [JobRunStatus.MISSED] * 4


def test_paused_and_disabled_jobs_fire_nothing_and_resume_from_their_resumption(engine: Engine) -> None:
    paused, disabled = job(), job(enabled=False)
    cursor = Cursor()
    fire_due(engine, [paused, disabled], cursor, at("11:00", 1), 3600)
    with engine.begin() as conn:
        conn.execute(insert(JobState).values(job_name=paused.name, paused=True, updated_at=at("11:01")))
    assert fire_due(engine, [paused, disabled], cursor, at("11:30", 1), 3600) == []
    with engine.begin() as conn:
        conn.execute(
            update(JobState).where(JobState.job_name == paused.name).values(paused=False, updated_at=at("11:32"))
        )
    # A scheduler starting now resumes from the resumption: the paused half-hour is neither run nor missed.
    fired = fire_due(engine, [paused, disabled], Cursor(), at("11:35", 1), 3600)
    assert [(f.job, f.scheduled_for) for f in fired] == [(paused.name, at("11:35"))]
    assert runs(engine, disabled.name) == []


def test_a_long_outage_records_a_bounded_number_of_missed_ticks(engine: Engine) -> None:
    chore = job("* * * * *")
    cursor = Cursor()
    fire_due(engine, [chore], cursor, at("00:00", 30), 60)
    fire_due(engine, [chore], cursor, at("00:01", 1), 60)
    fired = fire_due(engine, [chore], Cursor(), at("09:00", 1), 60)
    assert len(fired) == MAX_MISSED and fired[-1].status == JobRunStatus.SCHEDULED


def test_a_run_whose_end_was_never_recorded_is_closed_so_the_job_runs_again(engine: Engine) -> None:
    from chatops.schema import Session, SessionKind, SessionStatus
    from workers.jobs import NO_END, STALE_S, close_stale_runs

    now = at("12:00")
    quiet, busy = job(), job()
    ids = {}
    with engine.begin() as conn:
        for chore, status in ((quiet, SessionStatus.IDLE), (busy, SessionStatus.RUNNING)):
            session = conn.execute(
                insert(Session)
                .values(kind=SessionKind.JOB, status=status, updated_at=now - timedelta(seconds=STALE_S + 1))
                .returning(Session.id)
            ).scalar_one()
            ids[chore.name] = conn.execute(
                insert(JobRun)
                .values(job_name=chore.name, scheduled_for=now, status="running", session_id=session)
                .returning(JobRun.id)
            ).scalar_one()
    never_started = job()
    with engine.begin() as conn:
        ids[never_started.name] = conn.execute(
            insert(JobRun)
            .values(
                job_name=never_started.name,
                scheduled_for=now,
                status="running",
                started_at=now - timedelta(seconds=STALE_S + 1),
            )
            .returning(JobRun.id)
        ).scalar_one()
    # The module's other tests leave runs of their own: only these three are looked at.
    closed = set(close_stale_runs(engine, now))
    assert {ids[quiet.name], ids[never_started.name]} <= closed and ids[busy.name] not in closed
    assert runs(engine, quiet.name) == [("12:00", "failed")] and runs(engine, busy.name) == [("12:00", "running")]
    with engine.connect() as conn:
        assert conn.execute(select(JobRun.error).where(JobRun.id == ids[quiet.name])).scalar_one() == NO_END
    assert close_stale_runs(engine, now) == []


def test_counting_a_run_leaves_the_resume_point_and_lost_hand_offs_are_found(engine: Engine) -> None:
    from chatops.jobs import NEVER
    from workers.jobs import count_run, undelivered_runs

    chore = job()
    cursor = Cursor()
    fire_due(engine, [chore], cursor, at("13:04"), 600)
    fire_due(engine, [chore], cursor, at("13:05", 1), 600)
    count_run(engine, chore, failed=True)  # the 13:05 run failed at 13:07 …
    count_run(engine, chore, failed=True)
    with engine.connect() as conn:
        state = conn.execute(select(JobState.__table__).where(JobState.job_name == chore.name)).one()
    assert state.consecutive_failures == 2 and state.updated_at == NEVER
    # … and a scheduler taking over at 13:16 still catches up from 13:05, not from the failure's time.
    fired = fire_due(engine, [chore], Cursor(), at("13:16"), 600)
    assert [(f.scheduled_for, f.status) for f in fired] == [
        (at("13:10"), JobRunStatus.MISSED),
        (at("13:15"), JobRunStatus.SCHEDULED),
    ]
    # The 13:15 run was recorded but never started: two minutes on, housekeeping sends it again.
    assert fired[-1].run_id not in undelivered_runs(engine, at("13:16"))
    assert fired[-1].run_id in undelivered_runs(engine, at("13:18"))


def test_a_run_s_time_limit_counts_its_work_and_not_its_waits_for_a_decision(engine: Engine) -> None:
    from chatops.schema import Approval, Session, SessionEvent, SessionKind
    from workers.jobs import RunningJob, time_left

    chore = job(timeLimit="30m")
    with engine.begin() as conn:
        session = conn.execute(insert(Session).values(kind=SessionKind.JOB).returning(Session.id)).scalar_one()
    # Claimed at 09:40; the queue and the clone took until 10:00, when its first turn took the prompt.
    run = RunningJob(1, chore, at("09:40"), at("09:40"))
    assert time_left(engine, run, session, at("09:59")) == 30 * 60  # not begun: nothing used
    with engine.begin() as conn:
        conn.execute(
            insert(SessionEvent).values(session_id=session, seq=0, kind="user", payload={}, created_at=at("10:00"))
        )
    assert time_left(engine, run, session, at("10:10")) == 20 * 60

    def ask(call: str, asked: str, decided: str | None) -> None:
        with engine.begin() as conn:
            conn.execute(
                insert(Approval).values(
                    call_id=call,
                    session_id=session,
                    tool="bash",
                    state="approved" if decided else "pending",
                    created_at=at(asked),
                    decided_at=at(decided) if decided else None,
                )
            )

    # Two calls asked together at 10:05, decided at 10:50 and 11:05: one wait of an hour; then 5 minutes of
    # work, and a call waiting since 11:10.
    ask("a", "10:05", "10:50")
    ask("b", "10:05", "11:05")
    ask("c", "11:10", None)
    assert time_left(engine, run, session, at("11:10")) == 30 * 60 - 10 * 60  # 10:00-10:05 and 11:05-11:10
    assert time_left(engine, run, session, at("13:00")) == 30 * 60 - 10 * 60  # still waiting: nothing used
    # An approval from before the run's first turn does not count.
    ask("old", "09:00", "09:59")
    assert time_left(engine, run, session, at("11:10")) == 20 * 60


def test_unrun_times_are_forgotten_after_a_month_and_a_running_run_is_found(engine: Engine) -> None:
    from chatops.jobs import UNRUN_KEPT, forget_unrun, running_run

    chore = job()
    now = at("12:00")
    with engine.begin() as conn:
        for minutes, status in ((1, "skipped"), (2, "missed"), (3, "failed"), (4, "succeeded")):
            old = now - UNRUN_KEPT - timedelta(minutes=minutes)
            conn.execute(insert(JobRun).values(job_name=chore.name, scheduled_for=old, status=status))
        conn.execute(insert(JobRun).values(job_name=chore.name, scheduled_for=now, status="skipped"))
    assert running_run(engine, chore.name) is None
    assert forget_unrun(engine, now) == 2
    assert sorted(s for _, s in runs(engine, chore.name)) == ["failed", "skipped", "succeeded"]
    with engine.begin() as conn:
        conn.execute(
            insert(JobRun).values(
                job_name=chore.name,
                scheduled_for=now + timedelta(seconds=1),
                status="running",
                channel_id="C0JOBS",
                root_ts="1.2",
                trigger="manual",
            )
        )
    assert running_run(engine, chore.name) == ("C0JOBS", "1.2")


def test_a_standby_scheduler_asks_without_failing_and_forgets_jobs_a_reload_removed(engine: Engine) -> None:
    from chatops.jobs import NEVER, Cursor, ensure_state
    from chatops.schema import SchedulerLease

    later = at("08:00") + timedelta(days=365 * 20)  # after any lease this module's other tests took
    assert take_leadership(engine, "leader", 30, later)
    assert not take_leadership(engine, "standby", 30, later)
    with engine.connect() as conn:
        assert conn.execute(select(SchedulerLease.owner)).scalar_one() == "leader"
    give_up_leadership(engine, "leader")

    now = at("08:00")
    # A job whose state row its runs made (never paused by a person) catches up from its runs, not from 2000.
    chore = job("* * * * *")
    with engine.begin() as conn:
        ensure_state(conn, chore.name)
        assert conn.execute(select(JobState.updated_at).where(JobState.job_name == chore.name)).scalar_one() == NEVER
    cursor = Cursor()
    assert fire_due(engine, [chore], cursor, now, 60) == []  # never ran: it starts from now
    assert [f.status for f in fire_due(engine, [chore], cursor, at("08:01", 1), 60)] == [JobRunStatus.SCHEDULED]
    assert fire_due(engine, [], cursor, at("08:02", 1), 60) == []  # removed by a reload …
    # … added back: it catches up from when it was last seen removed, so 08:02 is no "missed" run.
    fired = fire_due(engine, [chore], cursor, at("08:03", 1), 60)
    assert [(f.scheduled_for, f.status) for f in fired] == [(at("08:03"), JobRunStatus.SCHEDULED)]


def test_a_run_whose_job_an_edit_removed_ends_failed_saying_so(engine: Engine, tmp_path: Path) -> None:
    import asyncio

    from chatops.config import load_config
    from chatops.schema import Session, SessionKind
    from workers.jobs import REMOVED, REMOVED_REASON, finish_run

    chore = job()
    with engine.begin() as conn:
        session = conn.execute(insert(Session).values(kind=SessionKind.JOB).returning(Session.id)).scalar_one()
        run_id = conn.execute(
            insert(JobRun)
            .values(job_name=chore.name, scheduled_for=at("09:00"), status="running", session_id=session)
            .returning(JobRun.id)
        ).scalar_one()
    said: list[str] = []

    async def post(text: str, in_channel: bool = False) -> None:
        said.append(text)

    (tmp_path / "mm.yaml").write_text("jobs: []\n")
    no_jobs = load_config(tmp_path / "mm.yaml", environ={})
    asyncio.run(finish_run(engine, no_jobs, session, None, None, None, post, []))
    assert said == [REMOVED]
    with engine.connect() as conn:
        row = conn.execute(select(JobRun.status, JobRun.error).where(JobRun.id == run_id)).one()
    assert (row.status, row.error) == (JobRunStatus.FAILED, REMOVED_REASON)
    asyncio.run(finish_run(engine, no_jobs, session, None, None, None, post, []))  # once
    assert said == [REMOVED]


def test_a_run_takes_only_its_prompt_and_replies_wait_for_its_end(engine: Engine) -> None:
    from chatops.inbox import record_message
    from chatops.store import DbStore

    thread = f"{next(_names)}.0001"
    prompt = record_message(engine, channel_id="C0JOBS", thread_ts=thread, message_ts=thread, user_id=None, text="p")
    record_message(engine, channel_id="C0JOBS", thread_ts=thread, message_ts=f"{thread}1", user_id="U0EVE", text="rm")
    store = DbStore(engine)
    taken = store.take_inbox(prompt.session_id, people=False)
    assert taken is not None and (taken.text, taken.author) == ("p", None)
    assert store.take_inbox(prompt.session_id, people=False) is None  # the reply waits …
    later = store.take_inbox(prompt.session_id)  # … for a turn after the run
    assert later is not None and (later.text, later.author) == ("rm", "U0EVE")


def test_a_tick_whose_runs_could_not_be_recorded_is_looked_at_again(tmp_path: Path) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from chatops import db

    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    db.migrate(url)
    engine = db.engine_for(url)
    chore, cursor = job(), Cursor()
    fire_due(engine, [chore], cursor, at("11:02"), 600)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE job_runs RENAME TO job_runs_away"))
    try:
        fire_due(engine, [chore], cursor, at("11:05", 1), 600)
        raise AssertionError("the run was recorded without its table")
    except OperationalError:
        pass
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE job_runs_away RENAME TO job_runs"))
    fired = fire_due(engine, [chore], cursor, at("11:05", 11), 600)
    assert [(f.scheduled_for, f.status) for f in fired] == [(at("11:05"), JobRunStatus.SCHEDULED)]
    engine.dispose()


def test_a_job_disabled_for_a_while_does_not_catch_up_when_enabled_again(engine: Engine) -> None:
    from workers.jobs import count_run

    chore, cursor = job("*/5 * * * *"), Cursor()
    fire_due(engine, [chore], cursor, at("14:00"), 600)
    fire_due(engine, [chore], cursor, at("14:05", 1), 600)
    count_run(engine, chore, failed=False)  # the 14:05 run: the job has a state row
    off = chore.model_copy(update={"enabled": False})
    for hhmm in ("14:06", "15:00", "16:00"):  # schedulers restarted while it was disabled
        assert fire_due(engine, [off], Cursor(), at(hhmm), 600) == []
    fired = fire_due(engine, [chore], Cursor(), at("16:01"), 600)  # enabled again: a new scheduler
    assert fired == [] and runs(engine, chore.name) == [("14:05", "scheduled")]
    assert [f.status for f in fire_due(engine, [chore], Cursor(), at("16:05", 1), 600)] == [JobRunStatus.SCHEDULED]


def test_an_auto_paused_job_resumed_starts_afresh_and_fires_again(engine: Engine) -> None:
    from chatops.jobs import set_paused
    from workers.jobs import count_run, pause_job

    chore = job("*/5 * * * *", maxFailures=2)
    fire_due(engine, [chore], Cursor(), at("17:00"), 600)  # first seen at 17:00: it catches up from there
    for _ in range(2):
        count_run(engine, chore, failed=True)
    assert pause_job(engine, chore, 2) and not pause_job(engine, chore, 2)  # announced once
    assert fire_due(engine, [chore], Cursor(), at("17:05", 1), 600) == []  # paused: it does not fire
    assert set_paused(engine, chore.name, False, "U0GRACE", at("17:06"))
    with engine.connect() as conn:
        state = conn.execute(select(JobState.__table__).where(JobState.job_name == chore.name)).one()
    assert (state.paused, state.consecutive_failures) == (False, 0)
    fired = fire_due(engine, [chore], Cursor(), at("17:10", 1), 600)
    assert [(f.scheduled_for, f.status) for f in fired] == [(at("17:10"), JobRunStatus.SCHEDULED)]
