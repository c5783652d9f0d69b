"""Who may approve a call: the one answer the bot's checks (bot/authorize.py) and the worker's reminders and
escalations (workers/nudges.py) both ask."""

from __future__ import annotations

from chatops.config import ServiceConfig
from chatops.store import ApprovalRow


def accepted(service: ServiceConfig, channel: str, row: ApprovalRow | None = None) -> list[str]:
    """The user and group ids that may approve `row`: those it names (its rule's `approvers`, widened by an
    escalation: chatops/nudges.py), else `channel`'s approvers (also for anything else an approver may do)."""
    if row is not None and row.approvers is not None:
        return list(row.approvers)
    return list(service.channel(channel).approvers)
