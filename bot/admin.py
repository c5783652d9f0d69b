"""`/mm audit [SINCE] [csv|jsonl]` and `/mm purge LINK`: what the config's `admins` do from Slack.

Anyone may type them; only an admin (a user id under `admins`, or a member of a user group listed there, resolved
as approvers' groups are, failing closed: bot.authorize) gets more than a refusal, which changes nothing. Both
are slash commands only: Slack offers none in a thread, and the words `@mm purge` in a thread are a request to
the agent. They are told apart from a prompt by their shape (`audit` and at most two words, `purge` and at most
one), so `/mm audit the dependencies for CVEs` still starts a thread.

- **audit**: the calls asked since SINCE (30 days when not given; an ISO date or time, or an age: `7d`, `24h`),
  as a file in the admin's direct messages with the bot (conversations.open, then the upload, both through the
  gateway), never in the channel the command was typed in; CSV unless `jsonl` is said (Slack shows a CSV file
  as a table). Links to threads are built on the workspace's address, which auth.test gives. The bot holds the
  file in memory to upload it, so it stops at MAX_CHARS, and the answer says so and points to `mm-bot audit`.
- **purge**: the thread's database part at once (chatops.retention), kept with the request's record so that a
  replay says what this attempt did; the workspace's files are removed by a worker at its next housekeeping
  (workers/retention.py): data flows one way, and the bot does not even mount the volume.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine

from bot.authorize import Approvers
from bot.steps import Steps
from chatops.audit import AuditFilter, BadFilter, calls, parse_when
from chatops.audit_export import FORMATS, Written, when, write
from chatops.inbox import session_of
from chatops.permalinks import BadLink, parse_link, workspace_url
from chatops.retention import PurgeOutcome, purge_session
from chatops.schema import utcnow
from chatops.sessions import snapshot
from chatops.teams import NOWHERE, Team, same_workspace, team_of
from slackio.mrkdwn import Mrkdwn
from slackio.slack_out import SlackOut

log = logging.getLogger("mm.bot.admin")

_AUDIT = re.compile(r"^audit(?:\s+(\S+))?(?:\s+(\S+))?$", re.IGNORECASE)
_PURGE = re.compile(r"^purge(?:\s+(\S+))?$", re.IGNORECASE)

DEFAULT_SINCE = "30d"
DEFAULT_FORMAT = "csv"
# What the bot holds in memory to upload (characters of the file): a month of a busy team's calls fits.
MAX_CHARS = 20_000_000
EXPORTED = "audit_file"  # the step of `/mm audit` that uploaded the file: what it held (JSON)
PURGED = "purged"  # the step of `/mm purge` that purged the thread: what it did (JSON)

AUDIT_USAGE = (
    "Say `/mm audit [SINCE] [csv|jsonl]`: SINCE is a date or time (2026-01-31, 2026-01-31T09:00Z) or an age "
    "(7d, 24h); 30 days when not given."
)
AUDIT_SENT = "📋 The audit of {calls} tool call(s) since {since} is in your direct messages with me (`{name}`)."
AUDIT_NONE = "No tool call was asked since {since}: there is nothing to export."
AUDIT_CUT = (
    " It stops after those ({size} MB, what I upload at most); `mm-bot audit --since {since}` on a server gives "
    "the rest."
)
PURGE_USAGE = (
    "Say `/mm purge LINK`, with the link to the thread's first message or to a reply in it (Slack's "
    "\u201cCopy link\u201d). Nothing was purged."
)
NO_THREAD = "I have no session in that thread ({channel}, {ts}): nothing to purge."
PURGE_DONE = Mrkdwn(
    "🧹 Purged the thread {ts} of <#{channel}>: {events} log entry(ies), {messages} message(s) and {outputs} tool "
    "output(s) removed; the audit of its {calls} tool call(s) is kept. A worker removes its workspace at its next "
    "housekeeping. A new message there starts afresh."
)
PURGE_ALREADY = "That thread was purged on {when} and has kept nothing since: there is nothing more to remove."
PURGE_BUSY = "That thread is busy ({why}): nothing was purged. Try again once it is idle (`@mm stop` stops a turn)."


def is_admin_command(text: str) -> bool:
    """Whether a `/mm` text is an admin's command rather than a prompt (by its shape alone)."""
    text = text.strip()
    return bool(_AUDIT.match(text) or _PURGE.match(text))


class AdminCommands:
    def __init__(self, engine: Engine, approvers: Approvers, secrets: Callable[[], Sequence[str]]) -> None:
        self.engine, self.approvers, self.secrets = engine, approvers, secrets

    async def answer(self, slack: SlackOut, text: str, user: str, steps: Steps, place: Team = NOWHERE) -> str:
        """The private answer to `/mm audit …` or `/mm purge …` (is_admin_command) in the workspace `place` (an
        admin acts on that workspace's threads alone); the export is in the person's DM, the purge done, or
        nothing changed and the sentence says why."""
        text = text.strip()
        audit = _AUDIT.match(text)
        what = "export the audit" if audit else "purge a thread"
        admin, problems = await self.approvers.is_admin(slack.client, user, place)
        if not admin:
            log.info("%s refused to %s: not an admin", user, what)
            return self.approvers.admin_refusal(what, problems, place)
        if audit:
            return await self._audit(slack, [w for w in audit.groups() if w], user, steps, place)
        found = _PURGE.match(text)
        link = found.group(1) if found else None
        return await self._purge(link, user, steps, place) if link else PURGE_USAGE

    # -- audit ----------------------------------------------------------------------------------------------------

    async def _audit(self, slack: SlackOut, words: list[str], user: str, steps: Steps, place: Team) -> str:
        formats = [w.lower() for w in words if w.lower() in FORMATS]
        others = [w for w in words if w.lower() not in FORMATS]
        if len(formats) > 1 or len(others) > 1:
            return AUDIT_USAGE
        now = utcnow()
        try:
            since = parse_when(others[0] if others else DEFAULT_SINCE, now, "since")
        except BadFilter as e:
            return f"{e}. Nothing was exported."
        fmt = formats[0] if formats else DEFAULT_FORMAT
        done = steps.done(EXPORTED)
        if done is None:
            base = await _workspace_address(slack)
            content, written = await asyncio.to_thread(self._export, since, fmt, base, place)
            name = f"mm-audit-{now:%Y%m%dT%H%MZ}.{fmt}"
            if written.calls:  # an empty file would say nothing the answer does not
                title = f"mm audit: {written.calls} tool call(s) since {when(since)}"
                channel = await slack.open_dm(user)
                await slack.upload(channel, None, content, name, title)
            done = json.dumps(
                {"calls": written.calls, "complete": written.complete, "name": name, "since": when(since)}
            )
            await steps.keep(EXPORTED, done)
        held = json.loads(done)  # a replay says what the file it uploaded holds
        if not held["calls"]:
            return AUDIT_NONE.format(since=held["since"])
        said = AUDIT_SENT.format(calls=f"{held['calls']:,}", since=held["since"], name=held["name"])
        if not held["complete"]:
            said += AUDIT_CUT.format(size=MAX_CHARS // 1_000_000, since=held["since"])
        return said

    def _export(self, since: Any, fmt: str, base: str | None, place: Team) -> tuple[str, Written]:
        out = io.StringIO()
        found = calls(self.engine, AuditFilter(since=since, place=place), secrets=self.secrets())
        written = write(found, out, fmt, workspace=base, max_chars=MAX_CHARS)
        return out.getvalue(), written

    # -- purge ----------------------------------------------------------------------------------------------------

    async def _purge(self, link: str, user: str, steps: Steps, place: Team) -> str:
        try:
            thread = parse_link(link)
        except BadLink as e:
            return f"{e}. Nothing was purged."
        session = await asyncio.to_thread(session_of, self.engine, thread.channel, thread.ts)
        facts = await asyncio.to_thread(snapshot, self.engine, session, log=False) if session is not None else None
        if session is None or facts is None or not same_workspace(team_of(facts), place):
            # Another workspace's thread is not this admin's to purge, nor to learn of.
            return NO_THREAD.format(channel=thread.channel, ts=thread.ts)
        secrets = list(self.secrets())

        def purge(conn: Any) -> str:
            done = purge_session(conn, session, by=user, why="/mm purge", secrets=secrets)
            if done is None:  # the session went between the two reads (nothing removes one: never so far)
                return json.dumps({"outcome": "gone"})
            return json.dumps(
                {
                    "outcome": done.outcome,
                    "at": done.purged_at.isoformat() if done.purged_at else None,
                    "events": done.events,
                    "messages": done.messages,
                    "outputs": done.outputs,
                    "calls": done.calls,
                    "busy": done.busy,
                }
            )

        held = json.loads(await steps.take(PURGED, purge))
        if held["outcome"] == PurgeOutcome.PURGED:
            return PURGE_DONE.format(ts=thread.ts, channel=thread.channel, **{k: f"{held[k]:,}" for k in _COUNTS})
        if held["outcome"] == PurgeOutcome.ALREADY:
            return PURGE_ALREADY.format(when=(held["at"] or "?")[:16].replace("T", " ") + " UTC")
        if held["outcome"] == PurgeOutcome.BUSY:
            return PURGE_BUSY.format(why=held["busy"])
        return NO_THREAD.format(channel=thread.channel, ts=thread.ts)


_COUNTS = ("events", "messages", "outputs", "calls")


async def _workspace_address(slack: SlackOut) -> str | None:
    """The workspace's address, for links to threads (auth.test's `url`); None when Slack does not say: the
    export then gives each thread's channel and ts alone."""
    try:
        answer = await slack.client.auth_test()
        return workspace_url(str(answer.get("url") or ""))
    except Exception as e:  # noqa: BLE001 - the links are a convenience; the channel and ts are in the file anyway
        log.info("no workspace address for the audit's links: %s", e)
        return None
