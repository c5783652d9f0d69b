"""Approvals from Slack and thread commands: an approval's display line and its "approve all", and inbox rows
that carry a thread command (new, compact, ask, yolo) in order with the messages.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("title", sa.Text()))
        batch.add_column(sa.Column("approve_all", sa.Boolean(), nullable=False, server_default=sa.false()))
        # Every author of the turn's messages, not only the first: none of them may approve alone.
        batch.alter_column("requested_by", type_=sa.Text(), existing_type=sa.String(64))
    with op.batch_alter_table("inbox") as batch:
        batch.add_column(sa.Column("command", sa.String(16)))
    op.create_index(op.f("ix_inbox_user_id"), "inbox", ["user_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_inbox_user_id"), table_name="inbox")
    with op.batch_alter_table("inbox") as batch:
        batch.drop_column("command")
    with op.batch_alter_table("approvals") as batch:
        batch.alter_column("requested_by", type_=sa.String(64), existing_type=sa.Text())
        batch.drop_column("approve_all")
        batch.drop_column("title")
