"""What a pull request says: its title, and a body a reviewer reads on the forge — what was asked, what the agent
answered, the diff stat, where it came from (the thread's link, who asked, who approved) and a marker naming
the session or the job, by which the pull request is known again (workers/pull_requests.py).

Everything here was written by people in Slack or by the model: it goes to the forge as text (quoted, fenced),
with the process's secrets scrubbed, and bounded in length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, select

from chatops.config import Config, JobConfig
from chatops.queries import writers
from chatops.schema import CallDecision, InboxMessage, SessionEvent, ToolCall
from chatops.secrets import scrub
from chatops.sessions import Snapshot
from chatops.teams import Team, team_of
from slackio.slack_client import web_client

MAX_TITLE = 72
MAX_ASKED = 2000
MAX_ANSWER = 2000
DEFAULT_TITLE = "Changes from a Slack thread"
_MENTION = re.compile(r"<@([UW][A-Z0-9]{2,})(?:\|[^>]*)?>")
_FENCE = re.compile(r"`{3,}")
# What a forge acts on in a body: `@name` notifies a person or a team, `#12` (`!12` on GitLab) links an issue, and
# a closing keyword ("fixes #12", "Closes https://…/issues/12") closes it on merge. In text people or the model
# wrote, a zero-width space (a character, not an entity: it must stay invisible in code spans too) after the sign
# or the keyword's first letter keeps the text as it reads and makes it nothing the forge acts on.
ZWSP = "\u200b"
_REFERENCE = re.compile(r"([@#!])(?=[\w-])")
# GitHub's closing keywords, and GitLab's default pattern's (closing, fixing, resolving, implement…).
_CLOSING = re.compile(
    r"\b([cfri])(?=(?:los(?:e[sd]?|ing)|ix(?:e[sd]|ing)?|esolv(?:e[sd]?|ing)|mplement(?:s|ed|ing)?)\b)",
    re.IGNORECASE,
)
# An issue or pull request named by its URL (`…/issues/12`, GitLab's `…/-/issues/12`) or GitHub's `GH-12`.
_LINK = re.compile(r"(/issues/|/pull/|/merge_requests/|\bGH-)(?=\d)", re.IGNORECASE)


def marker(owner: str) -> str:
    """The line that names the pull request's owner (`thread:<session>`, `job:<name>`), invisible on the forge."""
    return f"<!-- mm:{owner} -->"


def thread_title(engine: Engine, session_id: str, asked: str | None) -> str:
    """The title a person gave (`@mm pr TITLE`), else the first sentence of the agent's last answer."""
    text = asked or _first_sentence(_last_answer(engine, session_id)) or DEFAULT_TITLE
    return _one_line(text, MAX_TITLE)


async def thread_body(
    engine: Engine,
    config: Config,
    secrets: Sequence[str],
    session_id: str,
    facts: Snapshot,
    user: str,
    changes: str,
) -> str:
    asked = _first_request(engine, session_id)
    people = {u for u in (*writers(engine, session_id), user, *_approvers(engine, session_id)) if u}
    names, link = await _slack_facts(config, team_of(facts), facts.channel_id, facts.thread_ts, people)
    parts = []
    if asked:
        parts.append(_quoted(_unmention(asked, names), MAX_ASKED))
    if answer := _last_answer(engine, session_id):
        parts.append("**The agent's answer**\n\n" + _quoted(_unmention(answer, names), MAX_ANSWER))
    if changes:
        parts.append(f"**Changes**\n\n```\n{_FENCE.sub('``', changes)}\n```")
    asked_by = sorted(writers(engine, session_id))
    approvers = sorted({user, *_approvers(engine, session_id)})
    origin = [
        f"From a Slack thread{f' ({link})' if link else ''}.",
        f"Asked by {_names(asked_by, names) or 'nobody named'}; approved by {_names(approvers, names)}.",
    ]
    parts.append("\n".join(origin))
    parts.append(marker(f"thread:{session_id}"))
    return scrub("\n\n".join(parts), list(secrets))


async def job_body(
    config: Config,
    secrets: Sequence[str],
    job: JobConfig,
    run_id: int,
    channel: str | None,
    thread_ts: str | None,
    summary: str,
    changes: str,
) -> str:
    _names_unused, link = await _slack_facts(config, Team.named(job.team), channel, thread_ts, set())
    parts = [f"The scheduled job `{job.name}` (`{job.schedule}`, {job.timezone}) changed these files in run {run_id}."]
    if summary:
        parts.append("**The agent's answer**\n\n" + _quoted(summary, MAX_ANSWER))
    if changes:
        parts.append(f"**Changes**\n\n```\n{_FENCE.sub('``', changes)}\n```")
    parts.append(
        f"Each run of the job updates this pull request{f'; this one is in Slack: {link}' if link else ''}. "
        "Close it and the next run with changes opens a new one."
    )
    parts.append(marker(f"job:{job.name}"))
    return scrub("\n\n".join(parts), list(secrets))


def job_title(job: JobConfig) -> str:
    return _one_line(f"{job.name}: changes from the scheduled job", MAX_TITLE)


# --- what the thread holds ----------------------------------------------------------------------------------


def _first_request(engine: Engine, session_id: str) -> str:
    with engine.connect() as conn:
        text = conn.execute(
            select(InboxMessage.text)
            .where(InboxMessage.session_id == session_id, InboxMessage.command.is_(None))
            .order_by(InboxMessage.id)
            .limit(1)
        ).scalar_one_or_none()
    return (text or "").strip()


def _last_answer(engine: Engine, session_id: str) -> str:
    """The agent's latest answer: its last message that called no tool."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(SessionEvent.payload)
            .where(SessionEvent.session_id == session_id, SessionEvent.kind == "assistant")
            .order_by(SessionEvent.seq.desc())
            .limit(50)
        ).scalars()
        for payload in rows:
            text = payload.get("text") if isinstance(payload, dict) else None
            if isinstance(text, str) and text.strip() and not payload.get("tool_calls"):
                return text.strip()
    return ""


def _approvers(engine: Engine, session_id: str) -> set[str]:
    """Who approved the thread's calls (each a Slack user id)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(ToolCall.decided_by)
            .where(ToolCall.session_id == session_id, ToolCall.decision == CallDecision.APPROVED)
            .distinct()
        )
        return {u for by in rows.scalars() if by for u in by.split(",") if _MENTION.fullmatch(f"<@{u}>")}


async def _slack_facts(
    config: Config, team: Team, channel: str | None, thread_ts: str | None, people: set[str]
) -> tuple[dict[str, str], str | None]:
    """The people's names (by id) and the thread's link, as Slack gives them; what Slack does not give is left
    out (the ids stand for the names)."""
    client = web_client(config, team)
    names: dict[str, str] = {}
    link = None
    try:
        for user in sorted(people)[:20]:
            try:
                answer: Any = await client.users_info(user=user)
                profile = answer["user"].get("profile") or {}
                name = profile.get("display_name") or profile.get("real_name") or answer["user"].get("name")
                if isinstance(name, str) and name:
                    names[user] = name
            except Exception:  # noqa: BLE001 - a name is a courtesy: the id stands in for it
                continue
        if channel and thread_ts:
            try:
                found: Any = await client.chat_getPermalink(channel=channel, message_ts=thread_ts)
                link = found.get("permalink") if isinstance(found.get("permalink"), str) else None
            except Exception:  # noqa: BLE001 - the body says where without it
                link = None
    finally:
        if client.session is not None:
            await client.session.close()
    return names, link


# --- text ---------------------------------------------------------------------------------------------------


def _names(users: Sequence[str], names: dict[str, str]) -> str:
    return defused(", ".join(f"{names[u]} ({u})" if u in names else u for u in users))


def _unmention(text: str, names: dict[str, str]) -> str:
    return _MENTION.sub(lambda m: f"@{names.get(m.group(1), m.group(1))}", text).strip()


def _quoted(text: str, most: int) -> str:
    if len(text) > most:
        text = text[: most - 1] + "…"
    return "\n".join(f"> {line}" if line else ">" for line in defused(text).splitlines())


def defused(text: str) -> str:
    """`text` with its mentions, issue references and closing keywords made inert on a forge."""
    for pattern in (_REFERENCE, _CLOSING, _LINK):
        text = pattern.sub(lambda m: f"{m.group(1)}{ZWSP}", text)
    return text


def _first_sentence(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    match = re.match(r"(.+?[.!?])(\s|$)", line)
    return match.group(1) if match else line


def _one_line(text: str, most: int) -> str:
    line = " ".join(_MENTION.sub("", text).split())
    line = line.lstrip("#>*-_ ").strip() or DEFAULT_TITLE
    return line if len(line) <= most else line[: most - 1].rstrip() + "…"
