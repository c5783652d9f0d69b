"""Record before ack, and the inbound side never answers 500 to what Slack sends: the real bot (`mm-bot serve`),
PostgreSQL and the Slack emulator; no worker (what is checked is the bot's own record and action).

For each kind of request that acts after its ack (`/mm PROMPT`, a `/mm` command, a thread command, a click),
the bot is killed (SIGKILL) after Slack got its ack and before the action: the Web API call the action needs
first is held by the emulator, so the window is certain. A bot started again carries the request out from its
record, once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from sqlalchemy import select, text

from chatops.buttons import Action, ButtonValue
from chatops.inbox import assistant_context, record_message
from chatops.schema import (
    Approval,
    InboxMessage,
    RequestKind,
    RequestState,
    Session,
    SessionStatus,
    SlackRequest,
)
from chatops.store import ensure_session, request_approval, set_status
from playground.signed import FORM, SlackEventSender
from threads_support import CHANNEL, SECRET, Stack, config, stack

pytestmark = [pytest.mark.timeout(180), pytest.mark.process]

ALICE, BOB = "U0ALICE", "U0BOB"  # Bob approves (through a user group); Alice wrote the thread
APPROVERS = "S0APPROVERS"
PAYLOADS = Path(__file__).resolve().parent / "fixtures" / "slack_payloads"  # README.md there: whence, and how
HELD = "usergroups.users.list"  # what stopping and approving ask Slack first (Bob is an approver by group)


@pytest.fixture
def threads(tmp_path: Path, fresh_pg_url: str) -> Iterator[Stack]:
    # A claim renewed every two thirds of a second: a killed bot's requests are taken over within seconds.
    text = config(f"{{yolo: false, approvers: [{APPROVERS}]}}", "bot: {claimSeconds: 2}")
    with stack(tmp_path, fresh_pg_url, "memory://", config=text) as s:
        s.slack.add_usergroup(APPROVERS, "approvers", [BOB])
        yield s


def sender(threads: Stack, base: str) -> SlackEventSender:
    s = threads.slack
    return SlackEventSender(base, SECRET, team_id=s.team_id, bot_user_id=s.bot_user_id, response_url=s.response_url)


def bot_log(threads: Stack) -> str:
    return (threads.tmp / "bot.log").read_text(errors="replace")


def kill_bot(threads: Stack) -> None:
    """kill -9: nothing after the ack gets to run, nothing is cleaned up."""
    assert threads.bot is not None
    os.kill(threads.bot.pid, signal.SIGKILL)
    threads.bot.wait()


def requests(threads: Stack) -> list[tuple[str, str, int]]:
    """Every recorded request: its kind, its state, its attempts so far."""
    with threads.engine.connect() as conn:
        rows = conn.execute(select(SlackRequest.kind, SlackRequest.state, SlackRequest.attempts)).all()
    return [(kind, state, attempts) for kind, state, attempts in rows]


def crash_between_ack_and_action(threads: Stack, held: str, send: Callable[[SlackEventSender], httpx.Response]) -> None:
    """Send the request to the bot while `held` is held, see its ack, kill the bot while the action waits on
    `held`, let the call through (the dead bot's is dropped), and start the bot again."""
    threads.slack.hold(held)
    with sender(threads, threads.start_bot()) as slack:
        assert send(slack).status_code == 200  # Slack has its ack: it never sends this again
    threads.slack.wait_for_held(held)
    kill_bot(threads)
    threads.slack.release(held)
    threads.start_bot()


def carried_out_once(threads: Stack, kind: RequestKind) -> None:
    """The request is done, by its second attempt (the replay). A done request is never claimed again: the
    effects the caller counts afterwards are all there will be."""
    threads.wait(lambda: requests(threads) == [(kind, RequestState.DONE, 2)], timeout=30, message="the replay")


def running_session(threads: Stack) -> tuple[str, str]:
    """A thread Alice started (Bob is its requester, so that `/mm stop` finds it as his, without writing in it),
    with a turn running; its session and root."""
    root = threads.slack.add_message(CHANNEL, "fix the tests", ALICE)["ts"]
    session = ensure_session(threads.engine, channel_id=CHANNEL, thread_ts=root, requester=BOB)
    record_message(threads.engine, channel_id=CHANNEL, thread_ts=root, message_ts=root, user_id=ALICE, text="fix")
    set_status(threads.engine, session, SessionStatus.RUNNING)
    return session, root


def stop_asked(threads: Stack, session: str, root: str) -> None:
    def asked() -> bool:
        with threads.engine.connect() as conn:
            flag = conn.execute(select(Session.stop_requested_at).where(Session.id == session)).scalar_one()
        return flag is not None and f"<@{BOB}> asked me to stop" in threads.thread_text(root)

    threads.wait(asked, timeout=30, message="the stop")


# --- a bot killed between the ack and the action --------------------------------------------------------------


def test_a_slash_prompt_acked_by_a_bot_killed_before_its_thread_starts_is_carried_out_once(threads: Stack) -> None:
    prompt = "what is in the repository?"
    crash_between_ack_and_action(
        threads, "chat.postMessage", lambda s: s.slash_command("/mm", prompt, user=ALICE, channel=CHANNEL)
    )

    def roots() -> list[dict[str, Any]]:
        return [m for m in threads.slack.messages(CHANNEL) if f"asked: {prompt}" in (m.get("text") or "")]

    threads.wait(roots, timeout=30, message="the thread of the prompt")
    carried_out_once(threads, RequestKind.SLASH)
    [root] = roots()  # the dead bot's post never reached Slack, and the replay posted one root
    with threads.engine.connect() as conn:
        rows = conn.execute(
            select(InboxMessage.text, InboxMessage.user_id)
            .join(Session, Session.id == InboxMessage.session_id)
            .where(Session.channel_id == CHANNEL, Session.thread_ts == root["ts"])
        ).all()
    assert [tuple(r) for r in rows] == [(prompt, ALICE)]


def test_a_slash_stop_acked_by_a_bot_killed_before_it_stopped_is_carried_out_once(threads: Stack) -> None:
    session, root = running_session(threads)
    crash_between_ack_and_action(threads, HELD, lambda s: s.slash_command("/mm", "stop", user=BOB, channel=CHANNEL))
    stop_asked(threads, session, root)
    carried_out_once(threads, RequestKind.SLASH)
    assert threads.thread_text(root).count("asked me to stop") == 1
    assert [c.params.get("text") for c in threads.slack.calls_to("chat.postMessage")] == [
        f"⏹ <@{BOB}> asked me to stop."
    ]
    assert threads.slack.responses == [] and threads.slack.ephemerals == []  # nothing else said, to anyone


def test_a_thread_stop_acked_by_a_bot_killed_before_it_stopped_is_carried_out_once(threads: Stack) -> None:
    session, root = running_session(threads)

    def stop(s: SlackEventSender) -> httpx.Response:
        return s.app_mention("<@U0BOT> stop", channel=CHANNEL, user=BOB, thread_ts=root)

    crash_between_ack_and_action(threads, HELD, stop)
    stop_asked(threads, session, root)
    carried_out_once(threads, RequestKind.COMMAND)
    assert threads.thread_text(root).count("asked me to stop") == 1
    assert len(threads.slack.calls_to("chat.postMessage")) == 1
    assert threads.slack.responses == [] and threads.slack.ephemerals == []


def test_an_approval_acked_by_a_bot_killed_before_it_decided_is_carried_out_once(threads: Stack) -> None:
    session, root = running_session(threads)
    set_status(threads.engine, session, SessionStatus.AWAITING_APPROVAL)
    request_approval(threads.engine, call_id="call_rba1", session_id=session, tool="bash", requested_by=ALICE)
    value = ButtonValue(session, "call_rba1").encode()

    def approve(s: SlackEventSender) -> httpx.Response:
        return s.block_action(Action.APPROVE, value, user=BOB, channel=CHANNEL, message_ts=s.new_ts(), thread_ts=root)

    crash_between_ack_and_action(threads, HELD, approve)

    def decided() -> Any:
        with threads.engine.connect() as conn:
            row = conn.execute(select(Approval.state, Approval.decided_by).where(Approval.call_id == "call_rba1"))
            return tuple(row.one()) if row else None

    threads.wait(lambda: decided() == ("approved", BOB), timeout=30, message="the approval")
    carried_out_once(threads, RequestKind.CLICK)
    # A second run of the click would have found the call decided and told Bob so.
    assert threads.slack.ephemerals == [] and threads.slack.responses == []


def test_a_request_that_keeps_failing_is_given_up_with_one_sentence(threads: Stack) -> None:
    """Three attempts whose Web API call fails each time on what was asked (the root of `/mm PROMPT`, refused
    as no outage would be: a failure of ours): the person is told once."""
    threads.slack.fail("chat.postMessage", "invalid_blocks", times=3)
    with sender(threads, threads.start_bot()) as slack:
        assert slack.slash_command("/mm", "hello there", user=BOB, channel=CHANNEL).status_code == 200
    threads.wait(lambda: requests(threads) == [(RequestKind.SLASH, RequestState.FAILED, 3)], message="given up")
    threads.wait(lambda: threads.slack.responses, timeout=30, message="the sentence")
    [said] = [r["body"]["text"] for r in threads.slack.responses]
    assert said == (
        "Something went wrong on my side, so I gave up on `/mm hello there` after 3 attempts; the error is in my log."
    )
    assert not [m for m in threads.slack.messages(CHANNEL) if "hello there" in (m.get("text") or "")]


def test_a_slash_command_is_acked_only_once_recorded(threads: Stack) -> None:
    with (
        sender(threads, threads.start_bot()) as slack,
        threads.engine.connect() as blocker,
        ThreadPoolExecutor(1) as pool,
    ):
        stalls_on_purpose(blocker)
        blocker.execute(text("LOCK TABLE slack_requests IN EXCLUSIVE MODE"))  # the record waits for it
        answer = pool.submit(slack.slash_command, "/mm", "status", user=ALICE, channel=CHANNEL)
        threads.wait(lambda: waiting_on("slack_requests", blocker), timeout=30, message="the record, waiting")
        assert not answer.done(), "acked before it was recorded"
        blocker.rollback()
        assert answer.result(timeout=30).status_code == 200
    threads.wait(lambda: requests(threads) == [(RequestKind.SLASH, RequestState.DONE, 1)], message="carried out")


def test_a_request_that_cannot_be_recorded_is_not_acked_and_said_in_one_line(threads: Stack) -> None:
    """A click is not acked (Slack shows its own failure); a slash command is answered that nothing was done,
    which is true: nothing was kept."""
    with threads.engine.begin() as conn:  # every insert refused by the database
        conn.execute(text("ALTER TABLE slack_requests ADD CONSTRAINT refuse_all CHECK (id < 0) NOT VALID"))
    with sender(threads, threads.start_bot()) as slack:
        answer = slack.slash_command("/mm", "stop", user=BOB, channel=CHANNEL)
        assert answer.status_code == 200
        assert answer.text == "I could not take `/mm stop`: my database failed; nothing was done, try again."
        value = ButtonValue("0b5e-session", "call_1").encode()
        assert slack.block_action(Action.APPROVE, value, user=BOB, channel=CHANNEL, message_ts="1.1").status_code == 500
    log = bot_log(threads)
    assert "Traceback" not in log
    failed = [line for line in log.splitlines() if "a Slack request failed" in line]
    assert len(failed) == 1 and "IntegrityError" in failed[0] and "not recorded, so not acked" in failed[0]
    [told] = [line for line in log.splitlines() if "could not record /mm" in line]
    assert "IntegrityError" in told and "stop" not in told.split("could not record /mm", 1)[1]


def stalls_on_purpose(conn: Any) -> None:
    """This connection's transaction holds its locks, idle, as long as the test needs (a slow database, another
    process's lock): the server's end of stalled transactions (chatops.db.STALLED_S) is off for it alone."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))


def waiting_on(table: str, conn: Any) -> bool:
    """Whether another connection waits for a lock on `table`."""
    return bool(
        conn.execute(
            text(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = :t AND NOT l.granted"
            ),
            {"t": table},
        ).scalar_one()
    )


# --- what Slack sends, whatever the Web API answers -------------------------------------------------------------


def shared_payloads() -> list[Path]:
    found = sorted(PAYLOADS.glob("*.json"))
    assert found, f"no payloads in {PAYLOADS}"
    return found


def posted(slack: SlackEventSender, kind: str, body: dict[str, Any]) -> httpx.Response:
    """A payload as Slack posts it: an event as JSON, an interaction as a form's `payload`, a command as a form."""
    if kind == "event":
        return slack.send(json.dumps(body), "application/json")
    if kind == "interactive":
        return slack.send(urlencode({"payload": json.dumps(body)}), FORM)
    return slack.send(urlencode(body), FORM)


def take_slack_away(slack: Any, failure: str) -> None:
    """Every Web API method answers 429 or `ok: false`, or never answers, from now on."""
    for method in slack.methods:
        if failure == "ratelimited":
            slack.rate_limit(method, times=10_000)
        elif failure == "hangs":
            slack.hold(method)
        else:
            slack.fail(method, "fatal_error", times=10_000)


@pytest.mark.parametrize("failure", ["ratelimited", "ok-false", "hangs"])
@pytest.mark.parametrize("since", ["start", "a-first-request"])
def test_every_real_payload_is_answered_200_while_the_web_api_fails(threads: Stack, failure: str, since: str) -> None:
    """Slack fails from the bot's start (auth.test included), or once a first request went through (the bot
    knows who it is; what it would ask Slack before an ack, such as an assistant thread's context, fails). Each
    answer comes within Slack's 3 seconds (hung Web API calls included: nothing before an ack waits on one)."""
    if since == "start":
        take_slack_away(threads.slack, failure)
    with sender(threads, threads.start_bot()) as slack:
        if since == "a-first-request":
            assert slack.app_mention("<@U0BOT> hello", channel=CHANNEL, user=ALICE).status_code == 200
            take_slack_away(threads.slack, failure)
        for path in shared_payloads():
            payload = json.loads(path.read_text())
            started = time.monotonic()
            response = posted(slack, payload["kind"], payload["body"])
            assert response.status_code == 200, (path.name, response.status_code, response.text)
            assert time.monotonic() - started < 3, path.name
            if payload["body"].get("type") == "url_verification":
                assert response.json() == {"challenge": payload["body"]["challenge"]}
    # Recorded, not only acked: the mention, and the context of the assistant thread.
    with threads.engine.connect() as conn:
        texts = list(conn.execute(select(InboxMessage.text)).scalars())
    assert "Hi there!" in " ".join(texts)
    assert assistant_context(threads.engine, "D111", "1726133698.626339") == {
        "channel_id": "C333",
        "team_id": "T111",
        "enterprise_id": "E111",
    }
    assert "Traceback" not in bot_log(threads)


# --- bodies of any shape ---------------------------------------------------------------------------------------

DEEP = 50_000
NESTED = {
    "json-arrays": ("[" * DEEP + "]" * DEEP, "application/json"),
    "json-objects": ('{"a":' * DEEP + "1" + "}" * DEEP, "application/json"),
    "form-payload": (urlencode({"payload": "[" * DEEP + "]" * DEEP}), FORM),
    "form-payload-objects": (urlencode({"payload": '{"a":' * DEEP + "1" + "}" * DEEP}), FORM),
}
MALFORMED = {
    "json-list": ("[1, 2]", "application/json"),
    "json-string": ('"event_callback"', "application/json"),
    "json-number": ("7", "application/json"),
    "form-payload-list": (urlencode({"payload": "[1]"}), FORM),
    "form-payload-string": (urlencode({"payload": '"x"'}), FORM),
    "authorizations-not-a-list": ('{"type": "event_callback", "authorizations": "x", "event": {}}', "application/json"),
    "team-a-list": ('{"type": "block_actions", "team": [1], "user": 7}', "application/json"),
}


def test_bodies_of_any_shape_get_a_4xx_and_no_traceback(threads: Stack) -> None:
    with sender(threads, threads.start_bot()) as slack:
        for name, (body, content_type) in (NESTED | MALFORMED).items():
            unsigned = slack.send(body, content_type, secret="not-the-signing-secret")
            assert unsigned.status_code == 401, (name, unsigned.text)
            signed = slack.send(body, content_type)
            assert signed.status_code == 400, (name, signed.text)
        bad_timestamp = slack.send("{}", "application/json", headers={"X-Slack-Request-Timestamp": "soon"})
        assert bad_timestamp.status_code == 401
        assert slack.app_mention("<@U0BOT> still here", channel=CHANNEL, user=ALICE).status_code == 200
    log = bot_log(threads)
    assert "Traceback" not in log
    assert log.count("its signature did not verify") == len(NESTED | MALFORMED) + 1
    assert log.count("refused a request to the Slack endpoint: signed, but") == len(NESTED | MALFORMED)
    assert "[[[" not in log and '{"a"' not in log


def test_over_the_socket_envelopes_of_any_shape_are_harmless(threads: Stack) -> None:
    threads.start_bot(socket=True)
    slack = threads.slack
    envelopes: list[str] = [
        "not json",
        "{not json",
        '{"a":' * DEEP + "1" + "}" * DEEP,
        "[" * DEEP + "]" * DEEP,
        json.dumps({"type": "events_api", "envelope_id": "e1", "payload": [1]}),
        json.dumps({"type": "events_api", "envelope_id": "e2", "payload": {"type": "event_callback", "event": "x"}}),
        json.dumps({"type": "events_api", "envelope_id": "e3", "payload": {"authorizations": "x"}}),
        json.dumps({"type": "interactive", "envelope_id": "e4", "payload": {"type": "block_actions", "actions": "x"}}),
    ]
    for envelope in envelopes:
        slack.push_raw(envelope)
    envelope = slack.push_app_mention("<@U0BOT> still here", channel=CHANNEL, user=ALICE)
    assert slack.wait_for_ack(envelope, timeout=30) == {"envelope_id": envelope}
    ts = slack.last_pushed_payload["event"]["ts"]
    with threads.engine.connect() as conn:  # acked means recorded
        assert conn.execute(select(InboxMessage.text).where(InboxMessage.message_ts == ts)).scalars().all() == [
            "still here"
        ]
    log = bot_log(threads)
    assert "Traceback" not in log
    assert "[[[" not in log and '{"a"' not in log
