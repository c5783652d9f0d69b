"""The bodies of the pull request tasks: `@mm pr`'s status (mm.show_pull_request) and housekeeping's follow-up
of each open pull request (mm.follow_pull_request): a sync that was cut short or waited for a rate limit, and
one look at the checks. Each says at most a line in the pull request's thread."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from chatops import pull_requests as records
from chatops.schema import utcnow
from chatops.sessions import snapshot
from slackio.mrkdwn import Mrkdwn
from workers.pull_requests import follow, status_text, sync
from workers.thread_push import say_in_thread
from workers.turns import process

# How often a followed pull request's checks are looked at, at the most: each look is a few requests of the
# forge's rate limit, which the token shares with everything else.
LOOK_EVERY_S = 60.0


def show_pull_request_work(session_id: str) -> None:
    proc = process()
    facts = snapshot(proc.engine, session_id, log=False)
    if facts is None:
        return
    said = status_text(proc.engine, proc.config, session_id)
    asyncio.run(say_in_thread(proc, facts, said))


def follow_pull_request_work(record_id: int) -> None:
    proc = process()
    record = records.get(proc.engine, record_id)
    if record is None or record.session_id is None:
        return
    lines = []
    # The push task syncs its own record right after recording it: housekeeping takes over a sync only once its
    # retry time has come, or when it was left (its worker stopped), never beside it; and one task at a time
    # looks at a record, every LOOK_EVERY_S at the most (claim_look).
    now = utcnow()
    waited = record.retry_at is not None and record.retry_at <= now
    left = record.retry_at is None and record.updated_at < now - timedelta(seconds=records.ABANDONED_S)
    if not records.claim_look(proc.engine, record_id, LOOK_EVERY_S, now):
        return
    if record.needs_sync and (waited or left):
        who = record.requested_by if _is_thread(record) else None
        synced = sync(proc.engine, proc.config, record_id, who=who, claimed=True)
        if synced.said:
            lines.append(synced.said)
    if checks := follow(proc.engine, proc.config, record_id):
        lines.append(checks)
    if not lines:
        return
    facts = snapshot(proc.engine, record.session_id, log=False)
    if facts is not None:
        asyncio.run(say_in_thread(proc, facts, Mrkdwn("\n").join(lines)))


def _is_thread(record: records.PullRecord) -> bool:
    return record.owner.startswith("thread:")
