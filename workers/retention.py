"""Retention on the workers' side, each housekeeping round: the database's purge of the sessions idle longer than
`retention.days` (chatops/retention.py), and the files of every purged thread.

The workspace is the workers' (only they mount the volume), so whoever purges the database — retention here,
`/mm purge` in the bot, `mm-bot purge` on an operator's shell — leaves the files to the next round: it lists
the workspaces under the root, asks the database which of those sessions are purged, quiet and not started
afresh (their log is still empty), and removes their workspaces. A purged thread that gets a message removes
the old workspace itself before its first turn prepares a new one (workers/turns.py), should it come before
this round; once that turn is in its log, its workspace is its new conversation's and no round touches it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from chatops.config import Config
from chatops.retention import purge_idle, still_purged
from workers.workspaces import remove_workspace, workspace_ids

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
    """Remove the workspace of each quiet purged session that has not started afresh."""
    ids = workspace_ids(root)
    removed = []
    for start in range(0, len(ids), CHUNK):
        for session_id in still_purged(engine, ids[start : start + CHUNK]):
            # Asked again right before: a message since the batch's query may have started the thread afresh, and
            # its turn's new workspace is not the purged one's.
            if still_purged(engine, [session_id]) and remove_workspace(root, session_id):
                removed.append(session_id)
    return removed
