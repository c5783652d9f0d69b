"""`mm-bot audit` and `mm-bot purge` as an operator runs them, on SQLite and PostgreSQL: the export lists each call
with who asked, the rule, every approver and when; the purge removes a thread's content once and says so the
second time; bad input is one sentence and exit 2, with nothing read or changed."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from audit_support import add_call, add_thread, new_channel, thread_ts_of, two_person_call
from chatops import db
from chatops.schema import Session, SessionEvent, ToolCall
from mmbot_helpers import clean_env, mm_bot

pytestmark = pytest.mark.process  # its tests start processes (mm_testkit/process_guard.py)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    db.migrate(url)
    engine = db.engine_for(url)
    yield url, engine
    engine.dispose()


def link(channel: str, ts: str) -> str:
    return f"https://acme.slack.com/archives/{channel}/p{ts.replace('.', '')}"


def test_mm_bot_audit_lists_a_call_with_its_requester_rule_approvers_and_times(
    database: tuple[str, Engine], tmp_path: Path
) -> None:
    url, engine = database
    channel = new_channel()
    session_id, call_id = two_person_call(engine, channel)
    add_call(engine, add_thread(engine, new_channel()))  # another channel's: not asked for
    secret = "xoxb-cli-secret-42"
    add_call(engine, session_id, arguments=json.dumps({"command": f"echo {secret}"}))

    result = mm_bot(
        "audit",
        "--format",
        "jsonl",
        "--channel",
        channel,
        "--since",
        "2026-01-01",
        "--workspace-url",
        "https://acme.slack.com",
        env=clean_env(DATABASE_URL=url, SLACK_BOT_TOKEN=secret),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["call_id"] == call_id and first["requested_by"] == ["U0ALICE"]
    assert (first["rule"], first["needed"], first["approval"], first["outcome"]) == ("prod-deploy", 2, "approved", "ok")
    assert [(d["by"], d["at"]) for d in first["decisions"]] == [
        ("U0BOB", "2026-01-05T09:02:00Z"),
        ("U0CAROL", "2026-01-05T09:04:00Z"),
    ]
    assert first["at"] == "2026-01-05T09:00:00Z" and first["started_at"] == "2026-01-05T09:05:00Z"
    assert first["permalink"] == link(channel, thread_ts_of(engine, session_id))
    assert json.loads(second["arguments"]) == {"command": "echo ***"}  # the config's secret, scrubbed
    assert secret not in result.stdout

    by_bob = mm_bot("audit", "--user", "U0BOB", "--channel", channel, env=clean_env(DATABASE_URL=url), cwd=tmp_path)
    assert [json.loads(line)["call_id"] for line in by_bob.stdout.splitlines()] == [call_id]
    none_yet = mm_bot(
        "audit", "--channel", channel, "--until", "2026-01-05", env=clean_env(DATABASE_URL=url), cwd=tmp_path
    )
    assert none_yet.returncode == 0 and none_yet.stdout == ""


def test_mm_bot_audit_writes_csv_into_a_new_file_and_never_over_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    db.migrate(url)
    engine = db.engine_for(url)
    channel = new_channel()
    two_person_call(engine, channel)
    engine.dispose()
    env = clean_env(DATABASE_URL=url)

    made = mm_bot("audit", "--format", "csv", "--output", "audit.csv", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout == "" and "1 tool call(s) written to audit.csv" in made.stderr
    [row] = list(csv.DictReader(io.StringIO((tmp_path / "audit.csv").read_text())))
    assert row["channel"] == channel and row["permalink"] == "" and row["requested_by"] == "U0ALICE"
    assert row["decisions"] == (
        "approve by U0BOB at 2026-01-05T09:02:00Z (rule prod-deploy); "
        "approve by U0CAROL at 2026-01-05T09:04:00Z (rule prod-deploy)"
    )

    kept = (tmp_path / "audit.csv").read_text()
    again = mm_bot("audit", "--output", "audit.csv", env=env, cwd=tmp_path)
    assert again.returncode == 2 and "audit.csv exists: name another file" in again.stderr
    assert (tmp_path / "audit.csv").read_text() == kept
    assert sorted(p.name for p in tmp_path.iterdir() if "audit" in p.name) == ["audit.csv"]  # no partial file left


@pytest.mark.parametrize(
    "args, said",
    [
        (("--since", "last week"), "--since: expected a date or time such as 2026-01-31"),
        (("--until", "7"), "--until: expected a date or time"),
        (("--since", "1d", "--until", "2d"), "must come before --until"),
        (("--user", "alice"), "--user: expected a Slack user id such as U0123ABCD, got 'alice'"),
        (("--channel", "#general"), "--channel: expected a Slack channel id"),
        (("--workspace-url", "acme"), "expected the workspace's address such as https://acme.slack.com"),
        (("--output", "no/such/dir/a.jsonl"), "--output: the directory no/such/dir does not exist"),
    ],
)
def test_mm_bot_audit_says_what_it_expected_and_reads_nothing(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"  # never created: the input is refused before the database
    result = mm_bot("audit", *args, env=clean_env(DATABASE_URL=url), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("mm-bot audit: ") and said in result.stderr
    assert not (tmp_path / "mm.sqlite3").exists()


def test_mm_bot_audit_on_a_database_without_the_schema_says_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    result = mm_bot("audit", env=clean_env(DATABASE_URL=url), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "has no schema yet" in result.stderr and "run `mm-bot migrate` first" in result.stderr


def test_mm_bot_purge_removes_a_thread_once_and_says_so_the_second_time(
    database: tuple[str, Engine], tmp_path: Path
) -> None:
    url, engine = database
    channel = new_channel()
    session_id, call_id = two_person_call(engine, channel)
    ts = thread_ts_of(engine, session_id)
    env = clean_env(DATABASE_URL=url)

    first = mm_bot("purge", "--thread", link(channel, ts), env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "purged 3 log entry(ies), 1 message(s) and 1 tool output(s)" in first.stdout
    assert "the audit of its 1 tool call(s) is kept" in first.stdout
    with engine.connect() as conn:
        row = conn.execute(select(Session.purged_at, Session.agent_config).where(Session.id == session_id)).one()
        events = conn.execute(select(SessionEvent.seq).where(SessionEvent.session_id == session_id)).all()
        output = conn.execute(select(ToolCall.output).where(ToolCall.call_id == call_id)).scalar_one()
    assert row.purged_at is not None and row.agent_config["purged"]["why"] == "mm-bot purge"
    assert row.agent_config["purged"]["by"].endswith("(mm-bot purge)") and events == [] and output is None

    # A reply's link names the thread too.
    reply = f"{link(channel, '1799999999.000001')}?thread_ts={ts}&cid={channel}"
    second = mm_bot("purge", "--thread", reply, env=env, cwd=tmp_path)
    assert second.returncode == 0 and "was purged on " in second.stdout and "nothing more to remove" in second.stdout

    audit = mm_bot("audit", "--channel", channel, env=env, cwd=tmp_path)
    [record] = [json.loads(line) for line in audit.stdout.splitlines()]
    assert record["call_id"] == call_id and len(record["decisions"]) == 2 and record["purged_at"] is not None


def test_mm_bot_purge_says_what_a_link_is_and_when_no_thread_has_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mm.sqlite3'}"
    db.migrate(url)
    env = clean_env(DATABASE_URL=url)
    bad = mm_bot("purge", "--thread", "C0123ABCD/1700000000.123456", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("mm-bot purge: --thread: expected a Slack message link such as https://")
    unknown = mm_bot("purge", "--thread", link("C0NOWHERE", "1700000000.123456"), env=env, cwd=tmp_path)
    assert unknown.returncode == 1 and "no session is in the thread 1700000000.123456 of C0NOWHERE" in unknown.stderr
