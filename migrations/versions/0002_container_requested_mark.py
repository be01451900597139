"""tool_run_jobs.container_requested_at: tell an attempt that never began from a lost one.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25 22:16:52.815004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "tool_run_jobs",
        sa.Column("container_requested_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("tool_run_jobs", "container_requested_at")
