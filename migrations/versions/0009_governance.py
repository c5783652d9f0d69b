"""Governance: the approval policy's rule and count on each approval, every decision appended on its own row,
reminders and escalations, the model usage budgets count, and retention's mark on a purged session.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("rule", sa.String(200)))
        batch.add_column(sa.Column("matched", sa.Text()))
        batch.add_column(sa.Column("needed", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("approvers", sa.JSON()))
        batch.add_column(sa.Column("reminded_at", When))
        batch.add_column(sa.Column("escalated_at", When))
    with op.batch_alter_table("tool_calls") as batch:
        batch.add_column(sa.Column("rule", sa.String(200)))
        batch.add_column(sa.Column("requested_by", sa.Text()))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("purged_at", When))
    op.create_table(
        "approval_decisions",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("user_id", sa.String(32)),
        sa.Column("vote", sa.String(16), nullable=False),
        sa.Column("approve_all", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("rule", sa.String(200)),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approval_decisions")),
        sa.ForeignKeyConstraint(
            ["call_id"],
            ["approvals.call_id"],
            name=op.f("fk_approval_decisions_call_id_approvals"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_approval_decisions_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("call_id", "user_id", "vote", name=op.f("uq_approval_decisions_call_id_user_id_vote")),
        sa.CheckConstraint("vote IN ('approve', 'reject', 'expire')", name=op.f("ck_approval_decisions_vote")),
    )
    op.create_index(op.f("ix_approval_decisions_call_id"), "approval_decisions", ["call_id"])
    op.create_table(
        "model_usage",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("channel_id", sa.String(32)),
        sa.Column("model", sa.String(200)),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost", sa.Float()),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_usage")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_model_usage_session_id_sessions"), ondelete="CASCADE"
        ),
    )
    op.create_index(op.f("ix_model_usage_session_id"), "model_usage", ["session_id"])
    op.create_index(op.f("ix_model_usage_channel_id_created_at"), "model_usage", ["channel_id", "created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_model_usage_channel_id_created_at"), table_name="model_usage")
    op.drop_index(op.f("ix_model_usage_session_id"), table_name="model_usage")
    op.drop_table("model_usage")
    op.drop_index(op.f("ix_approval_decisions_call_id"), table_name="approval_decisions")
    op.drop_table("approval_decisions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("purged_at")
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("requested_by")
        batch.drop_column("rule")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("escalated_at")
        batch.drop_column("reminded_at")
        batch.drop_column("approvers")
        batch.drop_column("needed")
        batch.drop_column("matched")
        batch.drop_column("rule")
