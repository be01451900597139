"""Each tenant's own circuit breaker per webhook destination: ``webhook_destinations`` is keyed
by ``(tenant, destination)``.

A breaker per destination alone was shared by every tenant that delivers there, so one
tenant's failures (a path of a shared receiver that never answers) held back every other
tenant's deliveries to it. Breaker states are a cache of recent failures: the rows there are
dropped, and every destination starts closed for every tenant (at worst a few more attempts
to a receiver that is still down before its breaker opens again). The downgrade drops them
too.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-09 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM webhook_destinations")
    op.add_column("webhook_destinations", sa.Column("tenant", sa.Text(), nullable=False))
    op.drop_constraint("pk_webhook_destinations", "webhook_destinations", type_="primary")
    op.create_primary_key(
        "pk_webhook_destinations", "webhook_destinations", ["tenant", "destination"]
    )


def downgrade() -> None:
    op.execute("DELETE FROM webhook_destinations")
    op.drop_constraint("pk_webhook_destinations", "webhook_destinations", type_="primary")
    op.drop_column("webhook_destinations", "tenant")
    op.create_primary_key("pk_webhook_destinations", "webhook_destinations", ["destination"])
