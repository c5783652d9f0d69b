"""Retention on the workers' side, each housekeeping round: the database's purge of the sessions idle longer than
`retention.days` (chatops/retention.py), and the files of every purged thread.

The workspace is the workers' (only they mount the volume), so whoever purges the database — retention here,
`/mm purge` in the bot, `mm-bot purge` on an operator's shell — leaves the files to the next round: it lists
the workspaces under the root, asks the database which of those sessions are purged and quiet, and removes each
one nobody used since its purge. A purged thread that got a message meanwhile has a fresh workspace, made after
the purge, and keeps it; its turn removes an older one first (`clear_purged_workspace`), should it come before
this round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from chatops.config import Config
from chatops.retention import purge_idle, purged_since
from workers.workspaces import last_used, remove_workspace, workspace_ids

log = logging.getLogger("mm.worker.retention")

# Sessions asked about in one query: an IN list every database takes.
CHUNK = 500


def housekeep_retention(
    engine: Engine, config: Config, secrets: Sequence[str], now: datetime | None = None
) -> list[str]:
    """Purge the sessions idle longer than `retention.days` (when set), then remove purged threads' workspaces;
    the sessions whose workspace was removed."""
    days = config.service.retention.days
    if days is not None:
        for purged in purge_idle(engine, days, secrets=secrets, now=now):
            log.info("retention: purged session %s (idle for more than %d days)", purged.session_id, days)
    return remove_purged_workspaces(engine, config.workspaces_root)


def remove_purged_workspaces(engine: Engine, root: Path) -> list[str]:
    """Remove the workspace of each quiet purged session that nobody used since its purge."""
    ids = workspace_ids(root)
    removed = []
    for start in range(0, len(ids), CHUNK):
        for session_id, purged_at in purged_since(engine, ids[start : start + CHUNK]).items():
            if clear_purged_workspace(root, session_id, purged_at):
                removed.append(session_id)
    return removed


def clear_purged_workspace(root: Path, session_id: str, purged_at: datetime) -> bool:
    """Remove the session's workspace if it was last used before `purged_at`: the purged thread's files. One made
    after the purge belongs to the thread's new conversation."""
    used = last_used(root, session_id)
    if used is None or used > purged_at.timestamp():
        return False
    return remove_workspace(root, session_id)
