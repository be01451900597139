"""Worker pools and fair tenants: a job's tenant, a worker's queues, a key's top priority.

``tool_run_jobs.tenant`` (copied from the run) lets the claim read each tenant's oldest
queued jobs of a queue from the new partial index ``ix_tool_run_jobs_queued_tenant``, one
probe per tenant with work, so it interleaves tenants without reading the backlog.
``workers.queues`` records which queues a worker serves (metrics, the dashboard and the run
resource tell a queue no live worker serves). ``api_keys.max_priority`` bounds the priority
a tenant key may ask for (default 0).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tool_run_jobs", sa.Column("tenant", sa.Text(), nullable=True))
    op.execute(
        "UPDATE tool_run_jobs j SET tenant = r.tenant FROM tool_runs r WHERE r.id = j.run_id"
    )
    op.alter_column("tool_run_jobs", "tenant", nullable=False)
    op.create_index(
        "ix_tool_run_jobs_queued_tenant",
        "tool_run_jobs",
        ["queue", "tenant", sa.literal_column("priority DESC"), "created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.add_column(
        "workers",
        sa.Column(
            "queues",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{default}'::text[]"),
            nullable=False,
        ),
    )
    op.add_column(
        "api_keys",
        sa.Column("max_priority", sa.Integer(), server_default="0", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("api_keys", "max_priority")
    op.drop_column("workers", "queues")
    op.drop_index("ix_tool_run_jobs_queued_tenant", table_name="tool_run_jobs")
    op.drop_column("tool_run_jobs", "tenant")
