"""Many Slack workspaces: slack_sdk's installations, bots and OAuth states, and the workspace and org of a session.

The three tables are slack_sdk's (SQLAlchemyInstallationStore, SQLAlchemyOAuthStateStore), written out here as
they stand in slack_sdk 3.x so that this revision never changes with the library.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _owner_columns() -> list[sa.Column]:
    """The columns the installations and the bots share, in slack_sdk's order."""
    return [
        sa.Column("id", sa.Integer(), nullable=False, autoincrement=True),
        sa.Column("client_id", sa.String(32), nullable=False),
        sa.Column("app_id", sa.String(32), nullable=False),
        sa.Column("enterprise_id", sa.String(32)),
        sa.Column("enterprise_name", sa.String(200)),
    ]


def _bot_columns() -> list[sa.Column]:
    return [
        sa.Column("bot_token", sa.String(200)),
        sa.Column("bot_id", sa.String(32)),
        sa.Column("bot_user_id", sa.String(32)),
        sa.Column("bot_scopes", sa.String(1000)),
        sa.Column("bot_refresh_token", sa.String(200)),
        sa.Column("bot_token_expires_at", sa.DateTime()),
    ]


def upgrade() -> None:
    op.create_table(
        "slack_installations",
        *_owner_columns(),
        sa.Column("enterprise_url", sa.String(200)),
        sa.Column("team_id", sa.String(32)),
        sa.Column("team_name", sa.String(200)),
        *_bot_columns(),
        sa.Column("user_id", sa.String(32), nullable=False),
        sa.Column("user_token", sa.String(200)),
        sa.Column("user_scopes", sa.String(1000)),
        sa.Column("user_refresh_token", sa.String(200)),
        sa.Column("user_token_expires_at", sa.DateTime()),
        sa.Column("incoming_webhook_url", sa.String(200)),
        sa.Column("incoming_webhook_channel", sa.String(200)),
        sa.Column("incoming_webhook_channel_id", sa.String(200)),
        sa.Column("incoming_webhook_configuration_url", sa.String(200)),
        sa.Column("is_enterprise_install", sa.Boolean(), nullable=False),
        sa.Column("token_type", sa.String(32)),
        sa.Column("installed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slack_installations")),
    )
    op.create_index(
        "slack_installations_idx",
        "slack_installations",
        ["client_id", "enterprise_id", "team_id", "user_id", "installed_at"],
    )
    op.create_table(
        "slack_bots",
        *_owner_columns(),
        sa.Column("team_id", sa.String(32)),
        sa.Column("team_name", sa.String(200)),
        *_bot_columns(),
        sa.Column("is_enterprise_install", sa.Boolean(), nullable=False),
        sa.Column("installed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slack_bots")),
    )
    op.create_index("slack_bots_idx", "slack_bots", ["client_id", "enterprise_id", "team_id", "installed_at"])
    op.create_table(
        "slack_oauth_states",
        sa.Column("id", sa.Integer(), nullable=False, autoincrement=True),
        sa.Column("state", sa.String(200), nullable=False),
        sa.Column("expire_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slack_oauth_states")),
    )
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("slack_team_id", sa.String(32)))
        batch.add_column(sa.Column("enterprise_id", sa.String(32)))
    # A session recorded before: the workspace of its requester, the only one a single-token install had. Without it,
    # a workspace added later would see the old threads as its own (chatops.teams counts an unknown side as any).
    op.execute("UPDATE sessions SET slack_team_id = team_id WHERE slack_team_id IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("enterprise_id")
        batch.drop_column("slack_team_id")
    op.drop_table("slack_oauth_states")
    op.drop_index("slack_bots_idx", table_name="slack_bots")
    op.drop_table("slack_bots")
    op.drop_index("slack_installations_idx", table_name="slack_installations")
    op.drop_table("slack_installations")
