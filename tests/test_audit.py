"""The audit's read model and its formats (chatops/audit.py, chatops/audit_export.py), on SQLite and PostgreSQL:
each call with its requester, the rule, every decision with who and when, and its outcome; in the order the
calls were asked, a page at a time; filtered by time, channel and person; its arguments scrubbed of secrets."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from audit_support import (
    T0,
    add_approval,
    add_call,
    add_decision,
    add_thread,
    new_channel,
    thread_ts_of,
    two_person_call,
)
from chatops.audit import AuditFilter, BadFilter, calls, check_channel, check_user, parse_when
from chatops.audit_export import CSV_COLUMNS, write
from chatops.permalinks import BadLink, parse_link, permalink, workspace_url

NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)


def in_channel(engine: Engine, channel: str, **where: object) -> list:
    return list(calls(engine, AuditFilter(channel=channel, **where)))  # type: ignore[arg-type]


def jsonl(engine: Engine, channel: str, workspace: str | None = None) -> list[dict]:
    out = io.StringIO()
    write(calls(engine, AuditFilter(channel=channel)), out, "jsonl", workspace=workspace)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_call_is_listed_with_its_requester_rule_each_decision_and_outcome(engine: Engine) -> None:
    channel = new_channel()
    session_id, call_id = two_person_call(engine, channel)
    [record] = jsonl(engine, channel, workspace="https://acme.slack.com")
    ts = thread_ts_of(engine, session_id)
    assert record == {
        "at": "2026-01-05T09:00:00Z",  # when it was asked: its approval's time
        "call_id": call_id,
        "session_id": session_id,
        "kind": "thread",
        "channel": channel,
        "thread_ts": ts,
        "permalink": f"https://acme.slack.com/archives/{channel}/p{ts.replace('.', '')}",
        "requested_by": ["U0ALICE"],
        "tool": "bash",
        "agent": None,
        "arguments": '{"command": "make deploy"}',
        "rule": "prod-deploy",
        "matched": "make deploy",
        "needed": 2,
        "approval": "approved",
        "decisions": [
            {
                "by": "U0BOB",
                "vote": "approve",
                "approve_all": False,
                "rule": "prod-deploy",
                "at": "2026-01-05T09:02:00Z",
            },
            {
                "by": "U0CAROL",
                "vote": "approve",
                "approve_all": False,
                "rule": "prod-deploy",
                "at": "2026-01-05T09:04:00Z",
            },
        ],
        "decision": "approved",
        "decided_by": "U0CAROL",
        "outcome": "ok",
        "started_at": "2026-01-05T09:05:00Z",
        "finished_at": "2026-01-05T09:05:02Z",
        "duration_ms": 2000,
        "purged_at": None,
        "purged_by": None,
    }


def test_without_the_workspace_address_a_call_names_its_channel_and_thread_and_no_link(engine: Engine) -> None:
    channel = new_channel()
    session_id, _ = two_person_call(engine, channel)
    [record] = jsonl(engine, channel)
    assert record["permalink"] is None
    assert (record["channel"], record["thread_ts"]) == (channel, thread_ts_of(engine, session_id))


def test_calls_come_in_the_order_they_were_asked_a_page_at_a_time(engine: Engine) -> None:
    channel = new_channel()
    session_id = add_thread(engine, channel)
    made = [add_call(engine, session_id, started_at=T0 + timedelta(minutes=i)) for i in range(7)]
    for page in (1, 2, 3, 7, 500):
        found = list(calls(engine, AuditFilter(channel=channel), page=page))
        assert [c.call_id for c in found] == made, page


def test_since_until_channel_and_user_select_calls(engine: Engine) -> None:
    here, there = new_channel(), new_channel()
    early = add_call(engine, add_thread(engine, here), started_at=T0, requested_by="U0ALICE")
    late = add_call(engine, add_thread(engine, here), started_at=T0 + timedelta(days=2), requested_by="U0DAN,U0ERIN")
    _, decided = two_person_call(engine, here)  # asked by Alice, decided by Bob and Carol
    elsewhere = add_call(engine, add_thread(engine, there), started_at=T0)

    def ids(**where: object) -> list[str]:
        return [c.call_id for c in in_channel(engine, here, **where)]

    assert ids() == [early, late, decided]
    assert [c.call_id for c in in_channel(engine, there)] == [elsewhere]
    assert ids(since=T0 + timedelta(days=1)) == [late]
    assert ids(until=T0 + timedelta(days=1)) == [early, decided]
    assert ids(since=T0, until=T0 + timedelta(seconds=1)) == [early, decided]  # since inclusive, until exclusive
    assert ids(user="U0ERIN") == [late]  # one of several requesters
    assert ids(user="U0BOB") == [decided]  # a decider
    assert ids(user="U0ALICE") == [early, decided]
    assert ids(user="U0NOBODY") == []


def test_arguments_are_scrubbed_of_secrets_also_as_json_escapes(engine: Engine) -> None:
    channel = new_channel()
    secret = 'xoxb-"quoted"-token'
    arguments = json.dumps({"command": f"curl -H 'Authorization: Bearer {secret}' https://x", "env": "xoxb-plain-123"})
    add_call(engine, add_thread(engine, channel), arguments=arguments)
    [found] = list(calls(engine, AuditFilter(channel=channel), secrets=[secret, "xoxb-plain-123"]))
    assert found.arguments is not None
    assert "quoted" not in found.arguments and "xoxb-plain-123" not in found.arguments
    assert json.loads(found.arguments) == {"command": "curl -H 'Authorization: Bearer ***' https://x", "env": "***"}


def test_a_call_decided_before_decisions_had_rows_shows_the_one_its_approval_holds(engine: Engine) -> None:
    channel = new_channel()
    session_id = add_thread(engine, channel)
    rejected = add_call(engine, session_id, status="rejected", decision="rejected", decided_by="U0BOB", started_at=None)
    add_approval(engine, session_id, rejected, state="rejected", decided_by="U0BOB", decided_at=T0 + timedelta(hours=1))
    expired = add_call(engine, session_id, status="rejected", decision="rejected", started_at=None)
    add_approval(engine, session_id, expired, state="expired", asked_at=T0 + timedelta(minutes=1), decided_at=T0)
    first, second = in_channel(engine, channel)
    assert [(d.by, d.vote) for d in first.decisions] == [("U0BOB", "reject")]
    assert [(d.by, d.vote) for d in second.decisions] == [(None, "expire")]
    assert first.needed == 1 and first.approval == "rejected" and first.outcome == "rejected"


def test_an_expiry_and_a_call_that_ran_without_asking(engine: Engine) -> None:
    channel = new_channel()
    session_id = add_thread(engine, channel)
    waited = add_call(engine, session_id, status="rejected", decision="rejected", started_at=None)
    add_approval(engine, session_id, waited, state="expired", decided_at=T0 + timedelta(minutes=30))
    add_decision(engine, session_id, waited, "U0BOB", "approve", T0 + timedelta(minutes=1), rule="two-person")
    add_decision(engine, session_id, waited, None, "expire", T0 + timedelta(minutes=30))
    auto = add_call(engine, session_id, tool="read_file", started_at=T0 + timedelta(hours=1))
    first, second = in_channel(engine, channel)
    assert first.call_id == waited and [(d.by, d.vote) for d in first.decisions] == [
        ("U0BOB", "approve"),
        (None, "expire"),
    ]
    assert second.call_id == auto and second.decisions == () and second.decision == "auto"
    assert second.approval is None and second.needed is None and second.requested_by == ("U0ALICE",)


def test_csv_is_one_row_a_call_with_its_decisions_in_words_and_no_formula(engine: Engine) -> None:
    channel = new_channel()
    two_person_call(engine, channel)
    add_call(engine, add_thread(engine, channel), arguments='=HYPERLINK("https://evil.example","x")')
    out = io.StringIO()
    written = write(calls(engine, AuditFilter(channel=channel)), out, "csv")
    assert written.calls == 2 and written.complete
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert rows[0]["decisions"] == (
        "approve by U0BOB at 2026-01-05T09:02:00Z (rule prod-deploy); "
        "approve by U0CAROL at 2026-01-05T09:04:00Z (rule prod-deploy)"
    )
    assert rows[0]["requested_by"] == "U0ALICE" and rows[0]["rule"] == "prod-deploy" and rows[0]["needed"] == "2"
    assert rows[1]["arguments"] == '\'=HYPERLINK("https://evil.example","x")'  # shown, never run


def test_an_export_with_a_bound_stops_between_calls_and_says_so(engine: Engine) -> None:
    channel = new_channel()
    session_id = add_thread(engine, channel)
    for i in range(5):
        add_call(engine, session_id, started_at=T0 + timedelta(minutes=i))
    out = io.StringIO()
    written = write(calls(engine, AuditFilter(channel=channel)), out, "jsonl", max_chars=1)
    assert (written.calls, written.complete) == (1, False)  # one call at least, whatever the bound
    assert len(out.getvalue().splitlines()) == 1
    out = io.StringIO()
    written = write(calls(engine, AuditFilter(channel=channel)), out, "jsonl", max_chars=10**6)
    assert (written.calls, written.complete) == (5, True)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7d", NOW - timedelta(days=7)),
        ("24h", NOW - timedelta(hours=24)),
        ("30m", NOW - timedelta(minutes=30)),
        ("2w", NOW - timedelta(weeks=2)),
        ("2026-01-31", datetime(2026, 1, 31, tzinfo=UTC)),
        ("2026-01-31T09:30", datetime(2026, 1, 31, 9, 30, tzinfo=UTC)),
        ("2026-01-31T09:30Z", datetime(2026, 1, 31, 9, 30, tzinfo=UTC)),
        ("2026-01-31T11:30+02:00", datetime(2026, 1, 31, 9, 30, tzinfo=UTC)),
    ],
)
def test_times_are_iso_dates_and_times_or_ages(text: str, expected: datetime) -> None:
    assert parse_when(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "7", "7 days", "-7d", "2026-13-01", "", "999999999w"])
def test_other_times_are_refused_saying_what_is_expected(text: str) -> None:
    with pytest.raises(BadFilter) as refused:
        parse_when(text, NOW, "--since")
    said = str(refused.value)
    assert said.startswith("--since: ")
    assert "7d" in said or "calendar" in said


def test_ids_are_checked_before_they_reach_a_query() -> None:
    assert check_user("U0ALICE") == "U0ALICE" and check_channel("C0123ABCD") == "C0123ABCD"
    for bad in ("alice", "U0%", "U0ALICE,U0BOB", "<@U0ALICE>"):
        with pytest.raises(BadFilter, match="--user: expected a Slack user id"):
            check_user(bad)
    with pytest.raises(BadFilter, match="--channel: expected a Slack channel id"):
        check_channel("#general")


@pytest.mark.parametrize(
    "link, channel, ts",
    [
        ("https://acme.slack.com/archives/C0123ABCD/p1700000000123456", "C0123ABCD", "1700000000.123456"),
        ("https://acme.slack.com/archives/C0123ABCD/p1700000000123456/", "C0123ABCD", "1700000000.123456"),
        (
            "https://acme.slack.com/archives/C0123ABCD/p1700000999000100?thread_ts=1700000000.123456&cid=C0123ABCD",
            "C0123ABCD",
            "1700000000.123456",
        ),
        ("<https://acme.enterprise.slack.com/archives/G0PRIVATE/p1700000000000001>", "G0PRIVATE", "1700000000.000001"),
        ("<https://x.slack-gov.com/archives/D0DM/p1700000000000001|a thread> ", "D0DM", "1700000000.000001"),
    ],
)
def test_a_thread_link_gives_its_channel_and_thread(link: str, channel: str, ts: str) -> None:
    found = parse_link(link)
    assert (found.channel, found.ts) == (channel, ts)


@pytest.mark.parametrize(
    "link",
    [
        "C0123ABCD",
        "1700000000.123456",
        "http://acme.slack.com/archives/C0123ABCD/p1700000000123456",
        "https://acme.slack.com/archives/general/p1700000000123456",
        "https://acme.slack.com/archives/C0123ABCD/1700000000123456",
        "https://acme.slack.com/archives/C0123ABCD/p17",
        "https://acme.slack.com/archives/C0123ABCD/p1700000000123456?thread_ts=tomorrow",
        "https://app.slack.com/client/T0/C0123ABCD",
    ],
)
def test_anything_else_is_refused_saying_what_a_link_looks_like(link: str) -> None:
    with pytest.raises(BadLink, match=r"expected a Slack message link such as https://acme\.slack\.com/archives/"):
        parse_link(link)


def test_a_link_is_built_on_the_workspace_address_and_reads_back() -> None:
    base = workspace_url("https://acme.slack.com/")
    assert base == "https://acme.slack.com"
    link = permalink(base, "C0123ABCD", "1700000000.123456")
    assert link == "https://acme.slack.com/archives/C0123ABCD/p1700000000123456"
    assert parse_link(link).ts == "1700000000.123456"
    for bad in ("acme.slack.com", "http://acme.slack.com", "https://acme.slack.com/archives/C1", "https://u@x.y"):
        with pytest.raises(BadLink, match="workspace's address"):
            workspace_url(bad)
