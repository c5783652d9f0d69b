"""Where a thread is in Slack: the workspace (team) and the Enterprise Grid org the app's installation answers it
from. An app installed in many workspaces keeps them apart: a thread's token is its workspace's
(slackio.installations), and a click or a read model of one workspace never reaches another's threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import ColumnElement, Connection, Engine, or_, select

from chatops.db import reading
from chatops.schema import Session


@dataclass(frozen=True)
class Team:
    """Where a thread is, as the app's installation sees it: the workspace, and its Enterprise Grid org. An org-wide
    installation answers every workspace of its org."""

    team_id: str | None
    enterprise_id: str | None = None

    @classmethod
    def named(cls, key: str | None) -> Team:
        """The workspace (T…) or the org (E…) a config's `teams.<id>` section, or a job's `team`, names."""
        return cls(None, key) if key and key.startswith("E") else cls(key)

    def __str__(self) -> str:
        if self.enterprise_id and self.team_id:
            return f"{self.team_id} (org {self.enterprise_id})"
        return self.team_id or (f"org {self.enterprise_id}" if self.enterprise_id else "an unknown workspace")


# A request or record that names no workspace (single-token mode's, a thread recorded before workspaces).
NOWHERE = Team(None)


class InWorkspace(Protocol):
    """A record that knows its workspace: a session's row or snapshot."""

    @property
    def slack_team_id(self) -> str | None: ...
    @property
    def enterprise_id(self) -> str | None: ...


def team_of(record: InWorkspace) -> Team:
    """The workspace a session (or another record of a thread) is in."""
    return Team(record.slack_team_id, record.enterprise_id)


def session_team(bind: Engine | Connection, session_id: str) -> Team:
    """The workspace a session is in (NOWHERE for no such session)."""
    with reading(bind) as conn:
        row = conn.execute(select(Session.slack_team_id, Session.enterprise_id).where(Session.id == session_id)).first()
    return Team(row.slack_team_id, row.enterprise_id) if row is not None else NOWHERE


def same_workspace(thread: Team, request: Team) -> bool:
    """Whether a request (a click, a command naming a session) comes from the workspace a thread is in: the one
    place that decides, so that nobody of one workspace acts on another's thread. What one side does not know
    (a thread recorded before the app knew workspaces, Slack leaving the org out) does not refuse."""
    if thread.team_id and request.team_id and thread.team_id != request.team_id:
        return False
    return not (thread.enterprise_id and request.enterprise_id and thread.enterprise_id != request.enterprise_id)


def section_covers(key: str | None, place: Team) -> bool:
    """Whether what a config's `teams.<key>` section holds (a job's `team`) belongs to the workspace `place`: its
    own section (T…), or its org's (E…); the top level's (None) belongs to every workspace."""
    if key is None or place == NOWHERE:
        return True
    return key in (place.team_id, place.enterprise_id)


def in_workspace(team: Team) -> list[ColumnElement[bool]]:
    """The conditions on `sessions` of a read model that shows one workspace's threads (App Home)."""
    conditions: list[ColumnElement[bool]] = []
    if team.team_id:
        conditions.append(or_(Session.slack_team_id.is_(None), Session.slack_team_id == team.team_id))
    if team.enterprise_id:
        conditions.append(or_(Session.enterprise_id.is_(None), Session.enterprise_id == team.enterprise_id))
    return conditions
