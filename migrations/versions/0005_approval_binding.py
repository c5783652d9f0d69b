"""Approvals bound to what was shown: the digest of the call as the approver saw it, and the file holding a text
too long for its message. "Approve all" no longer sets the session's yolo (it covers its requesters alone, in the
log): a yolo it set before is taken back.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_sessions = sa.table("sessions", sa.column("id", sa.String(36)), sa.column("yolo", sa.Boolean()))
_events = sa.table(
    "session_events",
    sa.column("session_id", sa.String(36)),
    sa.column("seq", sa.Integer()),
    sa.column("kind", sa.String(32)),
    sa.column("payload", sa.JSON()),
)
_inbox = sa.table(
    "inbox",
    sa.column("id", sa.BigInteger()),
    sa.column("session_id", sa.String(36)),
    sa.column("command", sa.String(16)),
    sa.column("text", sa.Text()),
    sa.column("taken_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("shown", sa.String(64)))
        batch.add_column(sa.Column("text_file", sa.String(64)))
    # A thread's yolo is now only what `yolo on` set: one whose latest `yolo` (waiting in the inbox, else in the
    # log) is not "on" got it from an "Approve all", which opened the thread to anyone; it goes back to the
    # channel's policy.
    bind = op.get_bind()
    for session_id in bind.execute(sa.select(_sessions.c.id).where(_sessions.c.yolo.is_(True))).scalars().all():
        waiting = bind.execute(
            sa.select(_inbox.c.text)
            .where(_inbox.c.session_id == session_id, _inbox.c.command == "yolo", _inbox.c.taken_at.is_(None))
            .order_by(_inbox.c.id.desc())
            .limit(1)
        ).scalar()
        if waiting is not None:
            on = waiting == "on"
        else:
            logged = bind.execute(
                sa.select(_events.c.payload)
                .where(_events.c.session_id == session_id, _events.c.kind == "yolo")
                .order_by(_events.c.seq.desc())
                .limit(1)
            ).scalar()
            on = isinstance(logged, dict) and logged.get("on") is True
        if not on:
            bind.execute(sa.update(_sessions).where(_sessions.c.id == session_id).values(yolo=None))


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("text_file")
        batch.drop_column("shown")
