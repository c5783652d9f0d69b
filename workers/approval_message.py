"""The approval message: one Block Kit message per gated call, built from its approvals row.

The worker posts it when a turn suspends; the bot rebuilds it from the same row once someone decides (or the
worker, once it expired), so the two sides show the same call the same way and only the last lines change:
while pending, who asked, until when, and the buttons; once decided, who decided what and when, and no
buttons. Everything from the call (its line, the command, the diff) is the model's or the repository's text:
it is scrubbed of the service's secrets and shown so that it can notify nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chatops.buttons import Action, ButtonValue, element
from chatops.schema import ApprovalState
from chatops.store import ApprovalRow
from mm_core import display
from workers.blocks import code_sections, context_block, mrkdwn_of, section_block

WAITING = "⏸ The turn waits for a decision"
NO_APPROVERS = "no approvers configured"  # decided_by of a call that nobody in its channel may approve
NOBODY_MAY_APPROVE = (
    "🚫 Not run: nobody may approve calls in this channel. Whoever runs the bot lists approvers (user or user "
    "group ids) under `channels.{channel}.approvers` in its config file, or sets `yolo: true` for the channel."
)


@dataclass(frozen=True)
class ApprovalAsked:
    """The worker's event for the renderer: the gated calls of a suspended turn, recorded as approval rows."""

    rows: tuple[ApprovalRow, ...]
    channel: str


def when(moment: datetime) -> str:
    """A time every reader sees in their own time zone (Slack's date formatting), with a UTC fallback."""
    fallback = moment.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def details(title: str, preview: str) -> tuple[str, ...]:
    """What a person judges a call by, below its line: the diff, the content; nothing when the preview only
    repeats the line (bash's command)."""
    repeats = preview == title.split(": ", 1)[-1]
    return () if not preview or repeats else tuple(preview.splitlines())


def approval_blocks(row: ApprovalRow, channel: str, secrets: Sequence[str] = ()) -> tuple[list[dict[str, Any]], str]:
    """The message's blocks for the row as it stands, and its notification text."""

    def mrkdwn(text: str) -> str:
        return mrkdwn_of(text, secrets)

    title = row.title or row.tool
    line = f"{display.PROMPT_ICON} {mrkdwn(title)}"
    code, _cut = code_sections(details(title, row.preview or ""), mrkdwn)
    blocks = [section_block(line), *code, context_block(_state_line(row, channel))]
    if row.state == ApprovalState.PENDING:
        value = ButtonValue(row.session_id, row.call_id)
        blocks.append(
            {
                "type": "actions",
                "block_id": f"approval:{row.call_id}"[:255],
                "elements": [element(a, value) for a in (Action.APPROVE, Action.REJECT, Action.APPROVE_ALL)],
            }
        )
    fallback = f"{display.PROMPT_ICON} {mrkdwn(title)}: {_fallback_state(row)}"
    return blocks, fallback[:3000]


def _state_line(row: ApprovalRow, channel: str) -> str:
    at = f" {when(row.decided_at)}" if row.decided_at else ""
    if row.state == ApprovalState.PENDING:
        authors = ", ".join(f"<@{a}>" for a in row.requested_by.split(",")) if row.requested_by else ""
        asked = f" · asked by {authors}" if authors else ""
        expires = f" · expires {when(row.expires_at)}" if row.expires_at else ""
        return f"{WAITING}{asked}{expires}"
    if row.decided_by == NO_APPROVERS:
        return NOBODY_MAY_APPROVE.format(channel=channel)
    if row.state == ApprovalState.APPROVED:
        also = ", and every further call in this thread" if row.approve_all else ""
        return f"✅ Approved by <@{row.decided_by}>{also}{at}"
    if row.state == ApprovalState.REJECTED:
        return f"❌ Rejected by <@{row.decided_by}>{at}"
    return f"⌛ Not decided: it expired, or the turn was stopped{at}"


def _fallback_state(row: ApprovalRow) -> str:
    return "waiting for a decision" if row.state == ApprovalState.PENDING else str(row.state)
