"""Tasks are declared in one place (workers/tasks.py `task`): the name on the wire is made once, from the
function, and everything that sends or schedules a task takes it from there; a task's log lines carry the session
it names; each run is timed by outcome."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from chatops import logs


@pytest.fixture
def celery_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mm.yaml"
    path.write_text("jobs: []\n")
    monkeypatch.setenv("MM_CONFIG", str(path))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'mm.sqlite3'}")


def runs(name: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("mm_task_seconds_count", {"task": name, "outcome": outcome}) or 0.0


def test_every_task_is_registered_under_the_name_and_queue_it_is_sent_by(celery_config: None, tmp_path: Path) -> None:
    from workers import tasks
    from workers.celery_app import HOUSEKEEPING_QUEUE, TURNS_QUEUE, app
    from workers.scheduler import JobScheduler

    declared = [v for v in vars(tasks).values() if isinstance(v, tasks.Declared)]
    assert {d.name for d in declared} == {
        *("mm.run_session", "mm.run_job", "mm.push_thread", "mm.housekeeping"),
        *("mm.show_pull_request", "mm.follow_pull_request"),
    }
    for d in declared:
        assert app.tasks[d.name].queue == d.queue
    assert tasks.housekeeping.queue == HOUSEKEEPING_QUEUE and tasks.run_session.queue == TURNS_QUEUE
    # The scheduler fires housekeeping by the same name, on its queue.
    scheduler = JobScheduler(app=app, schedule_filename=str(tmp_path / "beat"))
    try:
        entry = scheduler.schedule["housekeeping"]
        assert (entry.task, entry.options["queue"]) == (tasks.housekeeping.name, HOUSEKEEPING_QUEUE)
    finally:
        scheduler.engine.dispose()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the scheduler's handler, not this test process's


def test_a_task_logs_with_its_session_and_is_timed_by_how_it_ended(celery_config: None) -> None:
    from workers.celery_app import TURNS_QUEUE
    from workers.tasks import task

    seen: list[str | None] = []

    @task(TURNS_QUEUE)
    def probe_the_declaration(session_id: str) -> None:
        seen.append(logs.session_id.get())
        if session_id == "S-boom":
            raise ValueError("boom")

    assert probe_the_declaration.name == "mm.probe_the_declaration"
    ok, failed = runs(probe_the_declaration.name, "ok"), runs(probe_the_declaration.name, "failed")
    probe_the_declaration.task.apply(args=["S-1"])
    result = probe_the_declaration.task.apply(args=["S-boom"])
    assert isinstance(result.result, ValueError)
    assert seen == ["S-1", "S-boom"]

    @task(TURNS_QUEUE)
    def probe_without_a_session(run_id: int) -> None:
        seen.append(logs.session_id.get())

    # The threads pool runs the next task in the same thread: the session of the one before is not carried over.
    probe_without_a_session.task.apply(args=[7])
    assert seen[-1] is None
    assert runs(probe_the_declaration.name, "ok") == ok + 1
    assert runs(probe_the_declaration.name, "failed") == failed + 1


@pytest.mark.parametrize(
    ("broker", "conf", "direct"),
    [
        ("redis://127.0.0.1:6379/0", {}, True),
        ("redis://:secret@cache.internal:6380/3", {"broker_transport_options": {"visibility_timeout": 60}}, True),
        ("rediss://cache.internal:6380/0", {}, False),  # TLS: kombu's own settings for it
        ("redis://a:6379/0;redis://b:6379/0", {}, False),  # a failover list
        ("redis://127.0.0.1:6379/0", {"broker_transport_options": {"global_keyprefix": "mm:"}}, False),
        ("redis://127.0.0.1:6379/0", {"task_compression": "gzip"}, False),
        ("redis://127.0.0.1:6379/0", {"task_default_priority": 5}, False),  # kombu's list for that priority
        ("amqp://guest@127.0.0.1//", {}, False),
        ("sqla+sqlite:///var/broker.sqlite3", {}, False),
    ],
)
def test_the_hand_off_writes_messages_itself_only_to_one_plain_redis(broker: str, conf: dict, direct: bool) -> None:
    """workers.publish pushes kombu's envelope itself where that is all kombu would do; anywhere else (another
    transport, a key prefix, compression, several brokers) the hand-off keeps Celery's send_task."""
    from celery import Celery

    from workers.publish import RedisPublisher

    app = Celery("probe", broker=broker, set_as_current=False)
    app.conf.update(conf)
    publisher = RedisPublisher.for_app(app)
    assert (publisher is not None) is direct
    if publisher is not None:
        publisher.close()  # never connected: redis-py connects on the first command
