"""Per-tenant counts of queued and running runs, kept exact by triggers on tool_runs.

Admission reads a tenant's few count rows (O(1)) instead of counting its active runs. Every
statement that inserts, deletes or changes the status of runs adds its net change per tenant
to one of ``SHARDS`` rows of the tenant, in the statement's own transaction. Inserts (the
submits) go to row 0, the row an admitted submit locks (``runyard.queue.sql.SUBMIT``); every
other statement picks one of the other rows at random, so workers moving one tenant's runs
rarely wait on the same row, nor on submits. The sum over a tenant's rows is exact. One
statement writes its rows in tenant order, so statements never deadlock on them.

The backfill runs after the triggers exist, in the same transaction: CREATE TRIGGER waits
for every open write to ``tool_runs`` and holds further writes off until the commit, so the
backfill counts a table that no one else changes and no transition is counted twice or lost.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 04:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SHARDS = 16


def upgrade() -> None:
    op.create_table(
        "tenant_run_counts",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("queued", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("running", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant", "shard", name=op.f("pk_tenant_run_counts")),
    )
    op.execute(
        f"""
        CREATE FUNCTION runyard_count_runs() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            pick smallint := CASE WHEN TG_OP = 'INSERT' THEN 0
                                  ELSE 1 + floor(random() * {SHARDS - 1}) END;
        BEGIN
            IF TG_OP = 'TRUNCATE' THEN
                DELETE FROM tenant_run_counts;
            ELSIF TG_OP = 'INSERT' THEN
                INSERT INTO tenant_run_counts AS c (tenant, shard, queued, running)
                SELECT tenant, pick, count(*) FILTER (WHERE status = 'queued'),
                       count(*) FILTER (WHERE status = 'running')
                FROM new_runs WHERE status IN ('queued', 'running')
                GROUP BY tenant ORDER BY tenant
                ON CONFLICT (tenant, shard) DO UPDATE
                SET queued = c.queued + excluded.queued, running = c.running + excluded.running;
            ELSIF TG_OP = 'DELETE' THEN
                INSERT INTO tenant_run_counts AS c (tenant, shard, queued, running)
                SELECT tenant, pick, -count(*) FILTER (WHERE status = 'queued'),
                       -count(*) FILTER (WHERE status = 'running')
                FROM old_runs WHERE status IN ('queued', 'running')
                GROUP BY tenant ORDER BY tenant
                ON CONFLICT (tenant, shard) DO UPDATE
                SET queued = c.queued + excluded.queued, running = c.running + excluded.running;
            ELSE
                INSERT INTO tenant_run_counts AS c (tenant, shard, queued, running)
                SELECT tenant, pick, sum(queued), sum(running)
                FROM (SELECT tenant, CAST(status = 'queued' AS int) AS queued,
                             CAST(status = 'running' AS int) AS running
                      FROM new_runs WHERE status IN ('queued', 'running')
                      UNION ALL
                      SELECT tenant, -CAST(status = 'queued' AS int),
                             -CAST(status = 'running' AS int)
                      FROM old_runs WHERE status IN ('queued', 'running')) d
                GROUP BY tenant HAVING sum(queued) <> 0 OR sum(running) <> 0 ORDER BY tenant
                ON CONFLICT (tenant, shard) DO UPDATE
                SET queued = c.queued + excluded.queued, running = c.running + excluded.running;
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER tool_runs_count_insert AFTER INSERT ON tool_runs "
        "REFERENCING NEW TABLE AS new_runs "
        "FOR EACH STATEMENT EXECUTE FUNCTION runyard_count_runs()"
    )
    op.execute(
        "CREATE TRIGGER tool_runs_count_update AFTER UPDATE ON tool_runs "
        "REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs "
        "FOR EACH STATEMENT EXECUTE FUNCTION runyard_count_runs()"
    )
    op.execute(
        "CREATE TRIGGER tool_runs_count_delete AFTER DELETE ON tool_runs "
        "REFERENCING OLD TABLE AS old_runs "
        "FOR EACH STATEMENT EXECUTE FUNCTION runyard_count_runs()"
    )
    op.execute(
        "CREATE TRIGGER tool_runs_count_truncate AFTER TRUNCATE ON tool_runs "
        "FOR EACH STATEMENT EXECUTE FUNCTION runyard_count_runs()"
    )
    op.execute(
        """
        INSERT INTO tenant_run_counts (tenant, shard, queued, running)
        SELECT tenant, 0, count(*) FILTER (WHERE status = 'queued'),
               count(*) FILTER (WHERE status = 'running')
        FROM tool_runs WHERE status IN ('queued', 'running')
        GROUP BY tenant
        """
    )


def downgrade() -> None:
    for name in ("insert", "update", "delete", "truncate"):
        op.execute(f"DROP TRIGGER IF EXISTS tool_runs_count_{name} ON tool_runs")
    op.execute("DROP FUNCTION IF EXISTS runyard_count_runs()")
    op.drop_table("tenant_run_counts")
