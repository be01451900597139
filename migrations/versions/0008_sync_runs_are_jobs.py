"""Sync runs are jobs: the owner columns only the sync mode's own statements used go.

A sync run now has a job row, claimed by its API process in the insert and fenced by the
lease token like every job (docs/decisions/0011-sync-mode-on-the-job-lease.md). Sync runs in
flight at the upgrade get one too: a running one becomes an adoptable job of the engine its
``claimed`` event names (an API process of that engine adopts it, or the reaper settles it
once the engine has no live owner); a queued one never started and fails as ``api_lost``,
as it did when its owner was gone. The downgrade drops the sync runs' job rows and hands the
runs still in flight to the old settler (owner expired).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        WITH lost AS (
            UPDATE tool_runs
            SET status = 'failed', finished_at = now(), error_code = 'api_lost',
                error = 'the API process stopped before the tool started'
            WHERE mode = 'sync' AND status = 'queued'
            RETURNING id
        )
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT id, now(), 'status',
               jsonb_build_object('status', 'failed', 'error_code', 'api_lost')
        FROM lost
        """
    )
    op.execute(
        """
        INSERT INTO tool_run_jobs (id, run_id, status, queue, priority, attempts, max_attempts,
                                   timeout_seconds, available_at, created_at, updated_at,
                                   started_at, engine_id, deadline_at, container_requested_at)
        SELECT gen_random_uuid(), r.id, 'running', 'sync', 0, 1, 1,
               CAST(r.spec->>'timeout_seconds' AS integer), now(), r.requested_at, now(),
               r.started_at,
               (SELECT e.data->>'engine_id' FROM tool_run_events e
                WHERE e.run_id = r.id AND e.type = 'claimed'
                ORDER BY e.xact_id DESC, e.id DESC LIMIT 1),
               r.started_at + make_interval(
                   secs => CAST(r.spec->>'timeout_seconds' AS double precision)),
               r.started_at
        FROM tool_runs r
        WHERE r.mode = 'sync' AND r.status = 'running'
          AND NOT EXISTS (SELECT 1 FROM tool_run_jobs j WHERE j.run_id = r.id)
        """
    )
    op.drop_column("tool_runs", "sync_owner_until")
    op.drop_column("tool_runs", "sync_owner")


def downgrade() -> None:
    op.add_column("tool_runs", sa.Column("sync_owner", sa.Text(), nullable=True))
    op.add_column(
        "tool_runs", sa.Column("sync_owner_until", sa.DateTime(timezone=True), nullable=True)
    )
    op.execute(
        """
        WITH gone AS (
            DELETE FROM tool_run_jobs j USING tool_runs r
            WHERE j.run_id = r.id AND r.mode = 'sync'
            RETURNING r.id
        )
        UPDATE tool_runs r SET sync_owner = 'migration', sync_owner_until = now()
        FROM gone WHERE r.id = gone.id AND r.status IN ('queued', 'running')
        """
    )
