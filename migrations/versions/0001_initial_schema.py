"""The initial schema: sessions and their event log, tool calls, approvals, errors, Slack event ids, job runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The types as they were at this revision; a migration never imports the models, which move on.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("team_id", sa.String(32)),
        sa.Column("channel_id", sa.String(32)),
        sa.Column("thread_ts", sa.String(32)),
        sa.Column("requester", sa.String(32)),
        sa.Column("workspace", sa.Text()),
        sa.Column("agent_name", sa.String(100)),
        sa.Column("agent_config", sa.JSON()),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("yolo", sa.Boolean()),
        sa.Column("lease_token", sa.BigInteger(), nullable=False),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_expires_at", When),
        sa.Column("created_at", When, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.CheckConstraint("kind IN ('thread', 'job')", name=op.f("ck_sessions_kind")),
        sa.CheckConstraint(
            "status IN ('idle', 'queued', 'running', 'awaiting_approval')", name=op.f("ck_sessions_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
        sa.UniqueConstraint("channel_id", "thread_ts", name=op.f("uq_sessions_channel_id_thread_ts")),
    )
    op.create_index(op.f("ix_sessions_status_lease_expires_at"), "sessions", ["status", "lease_expires_at"])

    op.create_table(
        "session_events",
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_session_events_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name=op.f("pk_session_events")),
    )

    op.create_table(
        "tool_calls",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("tool", sa.String(100), nullable=False),
        sa.Column("agent", sa.String(100)),
        sa.Column("arguments", sa.Text()),
        sa.Column("output", sa.Text()),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("started_at", When),
        sa.Column("finished_at", When),
        sa.Column("duration_ms", sa.Integer()),
        sa.Column("decision", sa.String(16)),
        sa.Column("decided_by", sa.String(64)),
        sa.CheckConstraint("decision IN ('approved', 'rejected', 'auto')", name=op.f("ck_tool_calls_decision")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_tool_calls_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_calls")),
        sa.UniqueConstraint("session_id", "call_id", name=op.f("uq_tool_calls_session_id_call_id")),
    )

    op.create_table(
        "approvals",
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("tool", sa.String(100), nullable=False),
        sa.Column("arguments", sa.Text()),
        sa.Column("preview", sa.Text()),
        sa.Column("requested_by", sa.String(64)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("decided_by", sa.String(64)),
        sa.Column("decided_at", When),
        sa.Column("expires_at", When),
        sa.Column("message_ts", sa.String(32)),
        sa.Column("created_at", When, nullable=False),
        sa.CheckConstraint("state IN ('pending', 'approved', 'rejected', 'expired')", name=op.f("ck_approvals_state")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_approvals_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("call_id", name=op.f("pk_approvals")),
    )
    op.create_index(op.f("ix_approvals_session_id"), "approvals", ["session_id"])
    op.create_index(op.f("ix_approvals_state_expires_at"), "approvals", ["state", "expires_at"])

    op.create_table(
        "errors",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(36)),
        sa.Column("where", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON()),
        sa.Column("created_at", When, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_errors_session_id_sessions"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_errors")),
    )
    op.create_index(op.f("ix_errors_session_id"), "errors", ["session_id"])

    op.create_table(
        "slack_events",
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("received_at", When, nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_slack_events")),
    )
    op.create_index(op.f("ix_slack_events_received_at"), "slack_events", ["received_at"])

    op.create_table(
        "job_runs",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_name", sa.String(100), nullable=False),
        sa.Column("scheduled_for", When, nullable=False),
        sa.Column("session_id", sa.String(36)),
        sa.Column("started_at", When),
        sa.Column("finished_at", When),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("summary", sa.Text()),
        sa.CheckConstraint(
            "status IN ('scheduled', 'running', 'succeeded', 'failed')", name=op.f("ck_job_runs_status")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_job_runs_session_id_sessions"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_runs")),
        sa.UniqueConstraint("job_name", "scheduled_for", name=op.f("uq_job_runs_job_name_scheduled_for")),
    )


def downgrade() -> None:
    # Dependants first; dropping a table drops its indexes.
    for table in ("job_runs", "slack_events", "errors", "approvals", "tool_calls", "session_events", "sessions"):
        op.drop_table(table)
