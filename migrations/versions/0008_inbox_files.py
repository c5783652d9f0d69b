"""The files a Slack message carried, kept with it in the inbox for the worker to download.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inbox") as batch:
        batch.add_column(sa.Column("files", sa.JSON()))


def downgrade() -> None:
    with op.batch_alter_table("inbox") as batch:
        batch.drop_column("files")
