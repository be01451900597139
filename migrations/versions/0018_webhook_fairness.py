"""Fair webhook delivery: each destination's circuit breaker, and the indexes of a claim that
takes turns between tenants.

``webhook_destinations`` holds the breaker of every destination (``host:port``) that has
failed lately: consecutive attempts without an answer, and until when it is open. A closed
destination has no row. The claim finds the tenants with pending deliveries by a skip scan of
``(tenant, next_attempt_at)`` and reads each one's oldest due ones from the same index; it
replaces the index on ``next_attempt_at`` alone, which only the old oldest-first claim used.
Attempts in flight (leased rows) are counted per tenant and destination from a partial index
that holds only them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_destinations",
        sa.Column("destination", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("open_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("destination", name=op.f("pk_webhook_destinations")),
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_webhook_deliveries_tenant_due",
            "webhook_deliveries",
            ["tenant", "next_attempt_at"],
            unique=False,
            postgresql_where=sa.text("status = 'pending'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.create_index(
            "ix_webhook_deliveries_leased",
            "webhook_deliveries",
            ["next_attempt_at"],
            unique=False,
            postgresql_where=sa.text("status = 'pending' AND lease_token IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_webhook_deliveries_due",
            table_name="webhook_deliveries",
            postgresql_concurrently=True,
            if_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_webhook_deliveries_due",
            "webhook_deliveries",
            ["next_attempt_at"],
            unique=False,
            postgresql_where=sa.text("status = 'pending'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_webhook_deliveries_leased",
            table_name="webhook_deliveries",
            postgresql_concurrently=True,
            if_exists=True,
        )
        op.drop_index(
            "ix_webhook_deliveries_tenant_due",
            table_name="webhook_deliveries",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.drop_table("webhook_destinations")
