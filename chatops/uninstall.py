"""What a workspace's uninstall (or its bot token's revocation) does to its threads and jobs: the turns that run
or wait there are asked to stop, and its jobs are paused, saying why. Its sessions, approvals, tool calls and
errors stay: the audit of what the agent did there outlives the app's place in the workspace. The tokens
themselves are slack_sdk's store's to delete (slackio.installations.Installations.forget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import update

from chatops.db import transaction
from chatops.jobs import set_paused
from chatops.schema import Session, SessionStatus, utcnow
from chatops.teams import Team

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import Engine

    from chatops.config import ServiceConfig

PAUSED_WHY = "paused: the app was removed from Slack workspace {team}"


@dataclass(frozen=True)
class Uninstalled:
    stopped: int  # sessions asked to stop
    paused: tuple[str, ...]  # jobs paused


def uninstalled(engine: Engine, service: ServiceConfig, team: Team, now: datetime | None = None) -> Uninstalled:
    """Stop the workspace's turns (an org's: every workspace of the org) and pause its jobs, in one transaction."""
    now = now or utcnow()
    if team.team_id:
        where = Session.slack_team_id == team.team_id
    elif team.enterprise_id:
        where = Session.enterprise_id == team.enterprise_id
    else:
        return Uninstalled(0, ())
    busy = [SessionStatus.RUNNING, SessionStatus.AWAITING_APPROVAL, SessionStatus.QUEUED]
    paused: list[str] = []
    with transaction(engine) as conn:
        stopped = conn.execute(
            update(Session).where(where, Session.status.in_(busy)).values(stop_requested_at=now)
        ).rowcount
        for job in service.jobs:
            if _runs_in(Team.named(job.team), team) and set_paused(
                conn, job.name, True, None, now, why=PAUSED_WHY.format(team=team)
            ):
                paused.append(job.name)
    return Uninstalled(stopped, tuple(paused))


def _runs_in(job: Team, team: Team) -> bool:
    """Whether a job of `job`'s section runs in the workspace (or org) that went away."""
    if team.team_id:
        return job.team_id == team.team_id
    return job.enterprise_id == team.enterprise_id and job.enterprise_id is not None
