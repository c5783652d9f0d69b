"""Pull requests: the one a thread or a job keeps on its forge, recorded with what the forge is still to be told.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
OPEN = sa.text("state IN ('pending', 'open')")


def upgrade() -> None:
    op.create_table(
        "pull_requests",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("session_id", sa.String(36)),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("repo", sa.String(500), nullable=False),
        sa.Column("branch", sa.String(255), nullable=False),
        sa.Column("base", sa.String(255), nullable=False),
        sa.Column("number", sa.Integer()),
        sa.Column("url", sa.Text()),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("draft", sa.Boolean(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("head_sha", sa.String(64), nullable=False),
        sa.Column("pushing_sha", sa.String(64)),
        sa.Column("requested_by", sa.String(32)),
        sa.Column("needs_sync", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("retry_at", When),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("follow_until", When),
        sa.Column("checks_said", sa.String(64)),
        sa.Column("created_at", When, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pull_requests")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_pull_requests_session_id_sessions"), ondelete="SET NULL"
        ),
        sa.CheckConstraint("state IN ('pending', 'open', 'closed', 'merged')", name=op.f("ck_pull_requests_state")),
    )
    op.create_index(
        "uq_pull_requests_one_open", "pull_requests", ["owner"], unique=True, postgresql_where=OPEN, sqlite_where=OPEN
    )
    op.create_index(op.f("ix_pull_requests_session_id"), "pull_requests", ["session_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_pull_requests_session_id"), table_name="pull_requests")
    op.drop_index("uq_pull_requests_one_open", table_name="pull_requests")
    op.drop_table("pull_requests")
