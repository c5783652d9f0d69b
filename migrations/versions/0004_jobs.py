"""Scheduled jobs: a run's trigger, thread, error and pushed branch, the skipped and missed states; what a job
remembers between runs (paused, failures in a row); the scheduler's leadership lease.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

When = sa.DateTime(timezone=True)
STATES = "status IN ('scheduled', 'running', 'succeeded', 'failed', 'skipped', 'missed')"
OLD_STATES = "status IN ('scheduled', 'running', 'succeeded', 'failed')"


def upgrade() -> None:
    with op.batch_alter_table("job_runs") as batch:
        batch.add_column(sa.Column("trigger", sa.String(16), nullable=False, server_default="schedule"))
        batch.add_column(sa.Column("requested_by", sa.String(32)))
        batch.add_column(sa.Column("channel_id", sa.String(32)))
        batch.add_column(sa.Column("root_ts", sa.String(32)))
        batch.add_column(sa.Column("error", sa.Text()))
        batch.add_column(sa.Column("pushed_branch", sa.String(255)))
        batch.drop_constraint(op.f("ck_job_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_job_runs_status"), STATES)
        batch.create_check_constraint(op.f("ck_job_runs_trigger"), "trigger IN ('schedule', 'manual')")
    op.create_index(op.f("ix_job_runs_job_name_status"), "job_runs", ["job_name", "status"])
    running = sa.text("status = 'running'")
    op.create_index(
        "uq_job_runs_one_running", "job_runs", ["job_name"], unique=True, postgresql_where=running, sqlite_where=running
    )
    op.create_table(
        "job_states",
        sa.Column("job_name", sa.String(100), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("paused_by", sa.String(32)),
        sa.Column("paused_reason", sa.Text()),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("job_name", name=op.f("pk_job_states")),
    )
    op.create_table(
        "scheduler_leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("expires_at", When, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_scheduler_leases")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_leases")
    op.drop_table("job_states")
    op.drop_index("uq_job_runs_one_running", table_name="job_runs")
    op.drop_index(op.f("ix_job_runs_job_name_status"), table_name="job_runs")
    op.execute("DELETE FROM job_runs WHERE status IN ('skipped', 'missed')")
    with op.batch_alter_table("job_runs") as batch:
        batch.drop_constraint(op.f("ck_job_runs_trigger"), type_="check")
        batch.drop_constraint(op.f("ck_job_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_job_runs_status"), OLD_STATES)
        for column in ("pushed_branch", "error", "root_ts", "channel_id", "requested_by", "trigger"):
            batch.drop_column(column)
