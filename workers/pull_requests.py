"""Pull requests, the worker's side: telling the forge what a push recorded (`sync`), following the checks of
its head (`follow`), and a pull request's status as `@mm pr` shows it.

A push (a thread's, workers/thread_push.py; a job run's, workers/jobs.py) records first and asks the forge
after (chatops/pull_requests.py): `sync` opens the pull request, or finds the one already open for the branch
(a worker that stopped after the forge opened it, before the record said so) and refreshes its body. A refusal
is said in the forge's words; a rate limit or a forge that does not answer is tried again by housekeeping
after the forge's reset time (`due`). Nothing here waits: the checks are polled by housekeeping's tasks, never
by a worker that sleeps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from chatops import pull_requests as records
from chatops.config import Config
from chatops.pull_requests import OPEN_STATES, PullRecord
from chatops.schema import PullRequestState, utcnow
from slackio.mrkdwn import Mrkdwn
from workers.forges import (
    CheckState,
    Forge,
    ForgeError,
    PullRequest,
    PullState,
    RateLimited,
    Refused,
    Repo,
    Status,
    Unreachable,
    forge_for,
)

log = logging.getLogger("mm.worker.pull_requests")

OPENED = Mrkdwn("🔀 {did} <{url}|pull request {label}> into `{base}`{draft}: {title}")
UPDATED = Mrkdwn("🔀 {did} <{url}|pull request {label}> with `{commit}`.")
ENDED = Mrkdwn("The pull request <{url}|{label}> was {state} meanwhile: the next push opens a new one.")
NOT_SENT = "The pull request was not {what}: {words}"
LATER = "{words} It is tried again after {at}, by itself."
CHECKS_PASSED = Mrkdwn("✅ Checks passed on <{url}|{label}>: {count}.")
CHECKS_FAILED = Mrkdwn("❌ Checks failed on <{url}|{label}>: {names}.")
CHECKS_SLOW = Mrkdwn("⏳ Checks on <{url}|{label}> are still running after {minutes} minutes: `@mm pr` shows them.")
STATUS = Mrkdwn("🔀 <{url}|{label}> {title} · {state} · {review} · {checks}")
NO_PULL_REQUEST = (
    "This thread has no pull request yet: an approver opens one with the *Open pull request* button or `@mm pr`."
)
PENDING = "This thread's pull request is not opened yet: {why}"
# A forge that does not answer, or says nothing of when: tried again after this, doubled at each attempt up to
# MAX_WAIT_S, and given up after MAX_ATTEMPTS (about six hours; the next push tries again).
RETRY_S = 60.0
MAX_WAIT_S = 3600.0
MAX_ATTEMPTS = 12
GAVE_UP = "{words} It was tried {attempts} times; the next push tries again."


def remote_of(record: PullRecord) -> str:
    return f"https://{record.host}/{record.repo}.git"


def _forge(config: Config, record: PullRecord) -> tuple[Forge, Repo]:
    return forge_for(config, remote_of(record))


def _link(pull: PullRequest) -> dict[str, object]:
    return {"url": pull.url, "label": records.label_of(pull.number, pull.url)}


@dataclass(frozen=True)
class Synced:
    """What a sync said, for the thread (None: nothing to say); `refused`: the forge refused, and nothing tries
    again by itself (a rate limit or a forge that did not answer is tried again: not refused)."""

    said: Mrkdwn | str | None
    refused: bool = False


def sync(engine: Engine, config: Config, record_id: int, *, who: str | None = None, claimed: bool = False) -> Synced:
    """Tell the forge what the record holds: open the pull request (or adopt the one open for its branch), or
    update its body. `who`: the person the thread names as having asked (None: a job's). `claimed`: the caller
    took the record's look (records.claim_look), which set its next one: its time has come."""
    record = records.get(engine, record_id)
    if record is None or record.state not in OPEN_STATES or not record.needs_sync:
        return Synced(None)
    if not claimed and record.retry_at is not None and record.retry_at > utcnow():
        return Synced(None)
    what = "updated" if record.number is not None else "opened"
    try:
        forge, repo = _forge(config, record)
        pull, opened = _send(forge, repo, record, config)
    except RateLimited as e:
        return _later(engine, record, what, e.text, e.reset)
    except Unreachable as e:
        return _later(engine, record, what, e.text, None)
    except ForgeError as e:
        said = NOT_SENT.format(what=what, words=e.text)
        records.record_refusal(engine, record.id, said, None)
        return Synced(said, refused=True)
    if pull.state != PullState.OPEN:
        records.record_ended(engine, record.id, PullRequestState(pull.state.value), pull.head_sha)
        return Synced(ENDED.format(state=pull.state.value, **_link(pull)))
    minutes = config.service.pullRequest.followChecksMinutes
    follow_for = timedelta(minutes=minutes) if minutes else None
    recorded = records.record_synced(
        engine,
        record.id,
        number=pull.number,
        url=pull.url,
        draft=pull.draft,
        head_sha=record.head_sha,
        follow_for=follow_for,
    )
    if not recorded:  # a newer push recorded meanwhile: its own sync says what the pull request became
        return Synced(None)
    if opened:
        did = _did(who, "opened")
        draft = " (draft)" if pull.draft else ""
        said = OPENED.format(did=did, base=pull.base, draft=draft, title=pull.title, **_link(pull))
    else:
        said = UPDATED.format(did=_did(who, "updated"), commit=record.head_sha[:10], **_link(pull))
    return Synced(said)


def _did(who: str | None, verb: str) -> Mrkdwn:
    """ "<@U…> opened" for a person's push, "Opened" for a job's."""
    return Mrkdwn("<@{user}> {verb}").format(user=who, verb=verb) if who else Mrkdwn.of(verb.capitalize())


@dataclass(frozen=True)
class Delivered:
    """A push made for a pull request: the branch of `repo` it went to and its commit, the base it is to be
    merged into, and what the forge is to show (`title`, `body`)."""

    owner: str  # chatops.pull_requests.thread_owner / job_owner
    session_id: str | None  # the thread told
    repo: Repo
    branch: str
    base: str
    commit: str
    title: str
    body: str
    who: str | None  # the person who asked (None: a job's run)


def record_and_sync(engine: Engine, config: Config, delivered: Delivered) -> Synced:
    """The one order a pushed pull request takes: recorded first (what the forge is to be told), then told, so a
    worker stopped between the two leaves a record housekeeping finishes."""
    record_id = records.record_push(engine, pushed_record(config, delivered))
    # Its own record, just written: told now, whatever look housekeeping claimed on it meanwhile.
    return sync(engine, config, record_id, who=delivered.who, claimed=True)


def pushed_record(config: Config, delivered: Delivered) -> records.Pushed:
    return records.Pushed(
        owner=delivered.owner,
        session_id=delivered.session_id,
        host=delivered.repo.host,
        repo=delivered.repo.path,
        branch=delivered.branch,
        base=delivered.base,
        head_sha=delivered.commit,
        title=delivered.title,
        body=delivered.body,
        draft=config.service.pullRequest.draft,
        requested_by=delivered.who,
    )


def _send(forge: Forge, repo: Repo, record: PullRecord, config: Config) -> tuple[PullRequest, bool]:
    """The forge's pull request for the record, opened or updated; whether it was opened now."""
    if record.number is not None:
        current = forge.get(repo, record.number)
        if current.state != PullState.OPEN:
            return current, False
        return forge.update(repo, record.number, body=record.body), False
    found = forge.find_open(repo, record.branch)
    if found is None:
        settings = config.service.pullRequest
        try:
            return (
                forge.open(
                    repo,
                    branch=record.branch,
                    base=record.base,
                    title=record.title,
                    body=record.body,
                    draft=record.draft,
                    labels=tuple(settings.labels),
                    reviewers=tuple(settings.reviewers),
                ),
                True,
            )
        except Refused:
            # Another worker opened it between the search and the open (the forge refuses a second one): adopt it.
            found = forge.find_open(repo, record.branch)
            if found is None:
                raise
    return forge.update(repo, found.number, body=record.body), False


def _later(engine: Engine, record: PullRecord, what: str, words: str, reset: datetime | None) -> Synced:
    """Try again at the forge's `reset`, else after a wait that doubles with each attempt; the thread is told
    the first time, and once more when it is given up (a forge away for hours is one line, not one a minute)."""
    if record.attempts + 1 >= MAX_ATTEMPTS:
        said = GAVE_UP.format(words=NOT_SENT.format(what=what, words=words), attempts=record.attempts + 1)
        records.record_refusal(engine, record.id, said, None)
        return Synced(said, refused=True)
    wait = timedelta(seconds=min(RETRY_S * 2**record.attempts, MAX_WAIT_S))
    at = max(reset, utcnow()) if reset is not None else utcnow() + wait
    said = LATER.format(words=NOT_SENT.format(what=what, words=words), at=f"{at.astimezone(UTC):%H:%M} UTC")
    records.record_refusal(engine, record.id, said, at)
    return Synced(said if record.attempts == 0 else None)


def follow(engine: Engine, config: Config, record_id: int) -> Mrkdwn | None:
    """One look at the checks of a followed pull request: the line to say once they have all finished (or once
    following ends with some still running), else None."""
    record = records.get(engine, record_id)
    if record is None or record.follow_until is None or record.number is None or record.needs_sync:
        return None
    try:
        forge, repo = _forge(config, record)
        status = forge.status(repo, forge.get(repo, record.number))
    except ForgeError as e:
        log.info("pull request %s: its checks could not be read (%s); tried again later", record.id, e.text)
        if utcnow() >= record.follow_until:  # following ends, whatever the forge says
            records.record_checks_said(engine, record.id, record.head_sha)
        return None
    if status.pull.state != PullState.OPEN:
        records.record_ended(engine, record.id, PullRequestState(status.pull.state.value), status.pull.head_sha)
        return None
    if status.pull.head_sha != record.head_sha:
        # Not mm's head (yet: a forge may show a push a moment late; or someone pushed after mm, whose checks are
        # theirs to follow): looked at again until following ends.
        if utcnow() >= record.follow_until:
            records.record_checks_said(engine, record.id, record.head_sha)
        return None
    checks = status.checks
    link = _link(status.pull)
    running = any(c.state == CheckState.PENDING for c in checks)
    if checks and not running:
        if not records.record_checks_said(engine, record.id, record.head_sha):
            return None
        failed = [c.name for c in checks if c.state == CheckState.FAILURE]
        if failed:
            return CHECKS_FAILED.format(names=", ".join(f"`{n}`" for n in failed), **link)
        passed = sum(c.state == CheckState.SUCCESS for c in checks)
        return CHECKS_PASSED.format(count=f"{passed} of {len(checks)}", **link)
    if utcnow() < record.follow_until:
        return None
    if not records.record_checks_said(engine, record.id, record.head_sha):
        return None
    if not checks:
        return None  # no check ever started: nothing to report
    minutes = config.service.pullRequest.followChecksMinutes
    return CHECKS_SLOW.format(minutes=minutes, **link)


def status_text(engine: Engine, config: Config, session_id: str) -> str:
    """The thread's pull request as `@mm pr` shows it: state, review decision and checks, read from the forge."""
    record = records.of_session(engine, session_id)
    if record is None:
        return NO_PULL_REQUEST
    if record.number is None:
        return PENDING.format(why=record.error or "it is being opened.")
    try:
        forge, repo = _forge(config, record)
        status = forge.status(repo, forge.get(repo, record.number))
    except ForgeError as e:
        return f"The pull request {record.url or record.label} could not be read: {e.text}"
    if status.pull.state != PullState.OPEN and record.state in OPEN_STATES:
        records.record_ended(engine, record.id, PullRequestState(status.pull.state.value), status.pull.head_sha)
    return describe(record, status)


def describe(record: PullRecord | None, status: Status) -> Mrkdwn:
    pull = status.pull
    state = f"{pull.state.value} (draft)" if pull.draft and pull.state == PullState.OPEN else pull.state.value
    review = f"review: {status.review}" if status.review else "no review yet"
    return STATUS.format(title=f"*{pull.title}*", state=state, review=review, checks=checks_text(status), **_link(pull))


def checks_text(status: Status) -> str:
    if not status.checks:
        return "no checks"
    by_state: dict[CheckState, list[str]] = {}
    for check in status.checks:
        by_state.setdefault(check.state, []).append(check.name)
    parts = []
    if passed := by_state.get(CheckState.SUCCESS):
        parts.append(f"{len(passed)} passed")
    if failed := by_state.get(CheckState.FAILURE):
        parts.append(f"{len(failed)} failing ({', '.join(failed)})")
    if running := by_state.get(CheckState.PENDING):
        parts.append(f"{len(running)} running")
    if neutral := by_state.get(CheckState.NEUTRAL):
        parts.append(f"{len(neutral)} skipped")
    return "checks: " + ", ".join(parts)
