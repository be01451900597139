"""Metered usage (a run's trace context needs no table: it travels in the run's snapshot).

Metered usage: ``attempt_usage`` holds what each attempt's container consumed, one row per
attempt (its primary key), written under the attempt's lease before its finalize.

Rows name their tenant and tool and are not tied to the run by a foreign key: a run's usage
outlives the run when retention deletes it, so a month's report stays whole. Reports and the
daily quota read a tenant's rows of a time window from ``(tenant, recorded_at)``; an admin's
report of every tenant reads ``recorded_at`` alone. ``tenant_usage_totals`` keeps each
tenant's running sums, added to by the same statement that writes an attempt's row, so the
per-tenant Prometheus counters are one small read per scrape; ``tenant_usage_days`` its sums
of each UTC day, so the daily CPU quota costs a submit one row read.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-12 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_usage",
        sa.Column("run_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("cpu_seconds", sa.Float(), nullable=False),
        sa.Column("memory_peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_avg_bytes", sa.BigInteger(), nullable=False),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.Column("disk_bytes", sa.BigInteger(), nullable=False),
        sa.Column("net_rx_bytes", sa.BigInteger(), nullable=True),
        sa.Column("net_tx_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "attempt", name=op.f("pk_attempt_usage")),
    )
    op.create_index("ix_attempt_usage_tenant_recorded", "attempt_usage", ["tenant", "recorded_at"])
    op.create_index("ix_attempt_usage_recorded", "attempt_usage", ["recorded_at"])
    op.create_table(
        "tenant_usage_totals",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("attempts", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("cpu_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column("wall_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column("memory_byte_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column("disk_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("net_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_tenant_usage_totals")),
    )
    op.create_table(
        "tenant_usage_days",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("attempts", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("cpu_seconds", sa.Float(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant", "day", name=op.f("pk_tenant_usage_days")),
    )


def downgrade() -> None:
    op.drop_table("tenant_usage_days")
    op.drop_table("tenant_usage_totals")
    op.drop_table("attempt_usage")
