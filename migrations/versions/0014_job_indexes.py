"""No index of ``tool_run_jobs`` leads with ``status``: fenced writes find their row by its
primary key.

Every fenced statement (heartbeat, finalize, requeue, release, ...) finds its job by
``id = :job_id AND lease_token = :token AND status = 'running'``. With indexes on
``(status, locked_until)`` and ``(status, available_at, priority)`` the planner could take
one of them for the ``status`` term instead of the primary key (its generic plan rates both
as one row); every job that passed through ``running`` leaves an entry there until vacuum,
so each such write read hundreds of dead entries, more with every round of jobs (measured:
about 1,300 index tuples read per scan after 20,000 jobs, and the same through the other
index once the first was gone). The first becomes a partial index for its only reader, the
reaper's expiry scan (``status = 'running' AND locked_until < now``, which implies
``locked_until IS NOT NULL``, a predicate the fenced writes do not imply). The second goes:
its readers (the oldest due queued job, for the dashboard and the metrics) read the queued
jobs' partial index instead, and a partial index on ``available_at`` of queued jobs would
lure the claim's per-tenant probes away from theirs (measured too).

Built CONCURRENTLY, outside the migration's transaction, so a large ``tool_run_jobs`` keeps
taking writes meanwhile.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_run_jobs_lease_expiry",
            "tool_run_jobs",
            ["locked_until"],
            unique=False,
            postgresql_where=sa.text("status = 'running' AND locked_until IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        for old in (
            "ix_tool_run_jobs_status_locked_until",
            "ix_tool_run_jobs_status_available_priority",
        ):
            op.drop_index(
                old, table_name="tool_run_jobs", postgresql_concurrently=True, if_exists=True
            )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_run_jobs_status_available_priority",
            "tool_run_jobs",
            ["status", "available_at", "priority"],
            unique=False,
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.create_index(
            "ix_tool_run_jobs_status_locked_until",
            "tool_run_jobs",
            ["status", "locked_until"],
            unique=False,
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_tool_run_jobs_lease_expiry",
            table_name="tool_run_jobs",
            postgresql_concurrently=True,
            if_exists=True,
        )
