"""A pull request's record and the forge, when a worker stops between them: the record is written before the
forge is asked, so whatever the forge got, a later sync finishes it with one pull request, never two. Against
the forge emulator over HTTPS (git http-backend behind it), with the record in SQLite."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from chatops import db
from chatops import pull_requests as records
from chatops.config import Config
from chatops.schema import PullRequestRecord, PullRequestState, utcnow
from forge_support import PATH, TOKEN, configured, new_branch
from playground.forge_server import ForgeServer
from workers.forges import forge_for
from workers.pull_requests import follow, sync

BRANCH = "mm/thread-1"


@pytest.fixture
def github(forge_server: Callable[..., ForgeServer], monkeypatch: pytest.MonkeyPatch) -> ForgeServer:
    server = forge_server("github", tokens={TOKEN: None})
    for name, value in server.ca_env().items():
        monkeypatch.setenv(name, value)
    server.add_repo(PATH)
    return server


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    db.migrate(sqlite_url)
    made = db.engine_for(sqlite_url)
    yield made
    made.dispose()


def _pushed(forge: ForgeServer, head: str, owner: str = "thread:s1") -> records.Pushed:
    return records.Pushed(
        owner=owner,
        session_id=None,
        host=forge.host,
        repo=PATH,
        branch=BRANCH,
        base="main",
        head_sha=head,
        title="Fix the greeting",
        body="what was asked\n\n<!-- mm:thread:s1 -->",
        draft=True,
        requested_by="U0BOB",
    )


def away(forge: ForgeServer, tmp_path: Path) -> None:
    """The forge stops answering; its CA (removed with it) stays trusted, as an operator's bundle would."""
    assert forge.ca_file is not None
    kept = tmp_path / "ca.pem"
    kept.write_bytes(forge.ca_file.read_bytes())
    os.environ["SSL_CERT_FILE"] = str(kept)  # monkeypatch (the fixture's) restores it
    forge.stop()


def _config(forge: ForgeServer, tmp_path: Path) -> Config:
    return configured(forge, tmp_path, extra="")


def test_a_sync_cut_short_is_finished_by_housekeeping_with_one_pull_request(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    head = new_branch(github, BRANCH)
    record_id = records.record_push(engine, _pushed(github, head))
    # The worker stopped here: the row says what the forge is to get; housekeeping leaves it a while (its worker
    # may still be asking), then hands it over.
    assert records.due(engine) == []
    later = utcnow() + timedelta(seconds=records.ABANDONED_S + 1)
    assert records.due(engine, later) == [record_id]

    synced = sync(engine, config, record_id, who="U0BOB")
    [pull] = github.pulls(PATH)
    assert synced.said is not None and f"|pull request #{pull['number']}>" in synced.said
    assert (pull["head"], pull["title"], pull["draft"]) == (BRANCH, "Fix the greeting", True)
    record = records.get(engine, record_id)
    assert record is not None and (record.state, record.number, record.needs_sync) == ("open", pull["number"], False)
    # A second delivery of the same sync does nothing: the record says the forge has it.
    assert sync(engine, config, record_id).said is None
    assert len(github.pulls(PATH)) == 1


def test_a_pull_request_the_forge_opened_before_the_worker_stopped_is_adopted(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    head = new_branch(github, BRANCH)
    forge, repo = forge_for(config, f"{github.base}/{PATH}.git")
    opened = forge.open(repo, branch=BRANCH, base="main", title="Fix the greeting", body="first", draft=True)
    # The forge opened it; the record never heard: a later sync finds it by its branch and updates its body.
    record_id = records.record_push(engine, _pushed(github, head))
    synced = sync(engine, config, record_id)
    [pull] = github.pulls(PATH)
    assert pull["number"] == opened.number and pull["body"].endswith("<!-- mm:thread:s1 -->")
    assert synced.said is not None and "Updated <" in synced.said
    record = records.get(engine, record_id)
    assert record is not None and record.number == opened.number


def test_a_push_recorded_meanwhile_wins_over_an_older_sync(github: ForgeServer, engine: Engine, tmp_path: Path) -> None:
    config = _config(github, tmp_path)
    first = new_branch(github, BRANCH)
    record_id = records.record_push(engine, _pushed(github, first))
    assert sync(engine, config, record_id).said is not None
    # A newer push records a new head; the older sync's end (same record, old head) must not mark it told.
    second = new_branch(github, BRANCH)
    assert records.record_push(engine, _pushed(github, second)) == record_id  # the same pull request
    assert not records.record_synced(engine, record_id, number=1, url="u", draft=True, head_sha=first, follow_for=None)
    record = records.get(engine, record_id)
    assert record is not None and record.needs_sync and record.head_sha == second


def test_a_closed_pull_request_ends_its_record_and_the_next_push_opens_another(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    record_id = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    sync(engine, config, record_id)
    [pull] = github.pulls(PATH)
    github.close(PATH, pull["number"])
    records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    said = sync(engine, config, record_id).said
    assert said is not None and "was closed meanwhile" in said
    assert records.current(engine, "thread:s1") is None
    again = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    assert again != record_id
    sync(engine, config, again)
    assert [p["state"] for p in github.pulls(PATH)] == ["closed", "open"]


def test_checks_are_told_once_when_they_have_all_finished(github: ForgeServer, engine: Engine, tmp_path: Path) -> None:
    config = _config(github, tmp_path)
    head = new_branch(github, BRANCH)
    record_id = records.record_push(engine, _pushed(github, head))
    sync(engine, config, record_id)
    assert records.due(engine) == [record_id]  # followed
    github.set_checks(PATH, head, [("test", "pending")])
    assert follow(engine, config, record_id) is None
    github.set_checks(PATH, head, [("test", "success"), ("docs", "neutral")])
    said = follow(engine, config, record_id)
    assert said is not None and said.startswith("✅ Checks passed on <") and said.endswith(": 1 of 2.")
    assert follow(engine, config, record_id) is None  # once
    assert records.due(engine) == []


def test_following_ends_with_a_line_when_checks_still_run_at_the_deadline(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    head = new_branch(github, BRANCH)
    record_id = records.record_push(engine, _pushed(github, head))
    sync(engine, config, record_id)
    github.set_checks(PATH, head, [("test", "pending")])
    with engine.begin() as conn:
        conn.execute(update(PullRequestRecord).values(follow_until=utcnow() - timedelta(seconds=1)))
    said = follow(engine, config, record_id)
    assert said is not None and "still running after 30 minutes" in said
    record = records.get(engine, record_id)
    assert record is not None and record.follow_until is None and record.state == PullRequestState.OPEN


def test_a_rate_limited_sync_waits_for_the_reset(github: ForgeServer, engine: Engine, tmp_path: Path) -> None:
    config = _config(github, tmp_path)
    record_id = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    reset = utcnow() + timedelta(minutes=5)
    github.limit_rate(reset)
    said = sync(engine, config, record_id).said
    assert said is not None and "rate limit" in said and f"after {reset:%H:%M} UTC" in said
    record = records.get(engine, record_id)
    assert record is not None and record.needs_sync and record.retry_at is not None
    assert records.due(engine) == []  # not before the reset
    assert records.due(engine, reset + timedelta(seconds=1)) == [record_id]
    assert sync(engine, config, record_id).said is None  # still waiting: the forge is not asked
    assert github.pulls(PATH) == []


def test_a_forge_away_is_told_once_tried_less_and_less_often_then_given_up(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    from workers import pull_requests

    config = _config(github, tmp_path)
    record_id = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    away(github, tmp_path)
    said = [sync(engine, config, record_id).said]
    waits = []
    for _ in range(pull_requests.MAX_ATTEMPTS - 1):
        record = records.get(engine, record_id)
        assert record is not None and record.retry_at is not None
        waits.append((record.retry_at - record.updated_at).total_seconds())
        with engine.begin() as conn:  # its time has come
            conn.execute(update(PullRequestRecord).values(retry_at=utcnow() - timedelta(seconds=1)))
        said.append(sync(engine, config, record_id).said)
    assert said[0] is not None and "did not answer" in said[0] and "tried again after" in said[0]
    assert said[1:-1] == [None] * (len(said) - 2)  # one line, not one a minute
    assert said[-1] is not None and f"tried {pull_requests.MAX_ATTEMPTS} times" in said[-1]
    assert waits[:3] == [pytest.approx(60, abs=2), pytest.approx(120, abs=2), pytest.approx(240, abs=2)]
    assert max(waits) <= pull_requests.MAX_WAIT_S + 2
    record = records.get(engine, record_id)
    assert record is not None and not record.needs_sync and records.due(engine, utcnow() + timedelta(days=1)) == []


def test_following_ends_at_its_deadline_when_the_head_moved_or_the_forge_is_away(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    record_id = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    sync(engine, config, record_id)
    new_branch(github, BRANCH)  # someone pushed after mm
    assert follow(engine, config, record_id) is None
    assert records.due(engine) == [record_id]  # looked at again until following ends
    with engine.begin() as conn:
        conn.execute(update(PullRequestRecord).values(follow_until=utcnow() - timedelta(seconds=1)))
    assert follow(engine, config, record_id) is None
    assert records.due(engine) == []

    other = records.record_push(engine, _pushed(github, new_branch(github, "mm/other"), owner="thread:s2"))
    with engine.begin() as conn:
        conn.execute(update(PullRequestRecord).where(PullRequestRecord.id == other).values(branch="mm/other"))
    sync(engine, config, other)
    away(github, tmp_path)
    with engine.begin() as conn:
        past = utcnow() - timedelta(seconds=1)
        conn.execute(update(PullRequestRecord).where(PullRequestRecord.id == other).values(follow_until=past))
    assert follow(engine, config, other) is None
    assert records.due(engine) == []


def test_one_task_at_a_time_looks_at_a_record_and_no_more_often_than_its_pace(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    record_id = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    sync(engine, config, record_id)
    now = utcnow()
    assert records.claim_look(engine, record_id, 60, now)
    assert not records.claim_look(engine, record_id, 60, now)  # a second task delivered meanwhile: nothing to do
    assert records.due(engine, now + timedelta(seconds=30)) == []  # housekeeping does not send it again
    assert records.due(engine, now + timedelta(seconds=61)) == [record_id]
    assert records.claim_look(engine, record_id, 60, now + timedelta(seconds=61))


def test_a_push_s_own_sync_is_not_put_off_by_a_look_housekeeping_claimed_meanwhile(
    github: ForgeServer, engine: Engine, tmp_path: Path
) -> None:
    config = _config(github, tmp_path)
    record_id = records.record_push(engine, _pushed(github, new_branch(github, BRANCH)))
    assert records.claim_look(engine, record_id, 60)  # housekeeping's task, between the record and its sync
    assert sync(engine, config, record_id).said is None  # anyone else waits for the claimed look
    said = sync(engine, config, record_id, who="U0BOB", claimed=True).said  # as record_and_sync syncs its own
    assert said is not None and "opened <" in said and len(github.pulls(PATH)) == 1
