"""Requests that act after their ack (slash commands, thread commands, clicks), recorded before it; the context
of assistant threads, kept in the database instead of in Slack.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "slack_requests",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("progress", sa.JSON()),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("received_at", When, nullable=False),
        sa.Column("claimed_by", sa.String(200)),
        sa.Column("claimed_at", When),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("done_at", When),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slack_requests")),
        sa.UniqueConstraint("key", name=op.f("uq_slack_requests_key")),
        sa.CheckConstraint("kind IN ('slash', 'command', 'click')", name=op.f("ck_slack_requests_kind")),
        sa.CheckConstraint("state IN ('received', 'done', 'failed')", name=op.f("ck_slack_requests_state")),
    )
    op.create_index(op.f("ix_slack_requests_state_claimed_at"), "slack_requests", ["state", "claimed_at"])
    op.create_index(op.f("ix_slack_requests_done_at"), "slack_requests", ["done_at"])
    op.create_table(
        "assistant_contexts",
        sa.Column("channel_id", sa.String(32), nullable=False),
        sa.Column("thread_ts", sa.String(32), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("channel_id", "thread_ts", name=op.f("pk_assistant_contexts")),
    )


def downgrade() -> None:
    op.drop_table("assistant_contexts")
    op.drop_index(op.f("ix_slack_requests_done_at"), table_name="slack_requests")
    op.drop_index(op.f("ix_slack_requests_state_claimed_at"), table_name="slack_requests")
    op.drop_table("slack_requests")
