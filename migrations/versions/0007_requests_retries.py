"""Requests retried after Slack's outages without counting them, from a time the database's clock says; a job run
asked for in Slack knows its request; assistant contexts forgotten by their age.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

When = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("slack_requests") as batch:
        batch.add_column(sa.Column("retry_at", When))
        batch.add_column(sa.Column("failures", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("job_runs") as batch:
        batch.add_column(sa.Column("request_key", sa.String(64)))
        batch.create_unique_constraint(op.f("uq_job_runs_request_key"), ["request_key"])
    op.create_index(op.f("ix_assistant_contexts_updated_at"), "assistant_contexts", ["updated_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_assistant_contexts_updated_at"), table_name="assistant_contexts")
    with op.batch_alter_table("job_runs") as batch:
        batch.drop_constraint(op.f("uq_job_runs_request_key"), type_="unique")
        batch.drop_column("request_key")
    with op.batch_alter_table("slack_requests") as batch:
        batch.drop_column("failures")
        batch.drop_column("retry_at")
