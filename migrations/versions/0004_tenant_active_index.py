"""Partial index of queued and running runs per tenant: admission counts read only those.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 02:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_tool_runs_tenant_active",
        "tool_runs",
        ["tenant", "status"],
        unique=False,
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )


def downgrade() -> None:
    op.drop_index("ix_tool_runs_tenant_active", table_name="tool_runs")
