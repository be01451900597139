"""Index of runs by start time: the dashboard's wait-time percentiles read the last hour.

Built CONCURRENTLY, outside the migration's transaction, so a large ``tool_runs`` keeps
taking writes while it builds.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 02:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_runs_started_at",
            "tool_runs",
            ["started_at"],
            unique=False,
            postgresql_where=sa.text("started_at IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_tool_runs_started_at",
            table_name="tool_runs",
            postgresql_concurrently=True,
            if_exists=True,
        )
