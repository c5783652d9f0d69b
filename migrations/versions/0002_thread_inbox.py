"""Slack threads: the inbox of messages waiting for a turn, and the session's repository, surface and stop flag;
the session's next log seq (sessions.event_seq), backfilled from its log.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("repo", sa.Text()))
        batch.add_column(sa.Column("branch", sa.String(255)))
        batch.add_column(sa.Column("assistant_thread", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("stop_requested_at", When))
        batch.add_column(sa.Column("event_seq", sa.Integer(), nullable=False, server_default="0"))
    # Existing logs go on where they stopped: the next seq is one past the last entry's.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "UPDATE sessions SET event_seq = e.next_seq"
            " FROM (SELECT session_id, max(seq) + 1 AS next_seq FROM session_events GROUP BY session_id) AS e"
            " WHERE sessions.id = e.session_id"
        )
    else:
        op.execute(
            "UPDATE sessions SET event_seq ="
            " (SELECT max(seq) + 1 FROM session_events WHERE session_events.session_id = sessions.id)"
            " WHERE id IN (SELECT session_id FROM session_events)"
        )
    op.create_table(
        "inbox",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("message_ts", sa.String(32), nullable=False),
        sa.Column("user_id", sa.String(32)),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("taken_at", When),
        sa.Column("created_at", When, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_inbox_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbox")),
        sa.UniqueConstraint("session_id", "message_ts", name=op.f("uq_inbox_session_id_message_ts")),
    )
    op.create_index(op.f("ix_inbox_session_id_taken_at"), "inbox", ["session_id", "taken_at"])
    op.create_index(op.f("ix_sessions_lease_owner"), "sessions", ["lease_owner"])


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_lease_owner"), table_name="sessions")
    op.drop_index(op.f("ix_inbox_session_id_taken_at"), table_name="inbox")
    op.drop_table("inbox")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("event_seq")
        batch.drop_column("stop_requested_at")
        batch.drop_column("assistant_thread")
        batch.drop_column("branch")
        batch.drop_column("repo")
