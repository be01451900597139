"""Workflows: runs that depend on runs, batches, scheduled runs, re-runs.

``tool_run_deps`` holds the edges (a run and a run it waits for). A job counts in
``waiting_on`` the dependencies that have not succeeded yet; the claim takes only jobs at 0,
and the queued-by-tenant index the claim reads leaves the others out, so blocked runs cost
the claim nothing. A trigger on ``tool_runs`` settles the dependents of a run that ends, in
the transaction that ends it, whichever statement that is (a finalize, a requeue that fails
the run, a cancel, the reaper's settling): a success takes one off each dependent's count; any
other end fails every queued dependent, and theirs, with ``dependency_failed``. The trigger's
WHEN clause reads ``has_dependents``, so runs nobody waits for cost nothing more.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TERMINAL = "('succeeded', 'failed', 'timed_out', 'cancelled')"

# A success: each queued dependent waits for one dependency fewer; those at 0 become
# claimable now, and their queues' workers are woken. Any other end: the queued dependents
# fail, then theirs, level by level in this one call (the failures it writes fire this
# trigger again, and those nested calls return at once: the loop already covers them, and a
# chain of a thousand runs must not nest a thousand calls deep).
SETTLE_DEPENDENTS = """
CREATE FUNCTION runyard_settle_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    settled_at timestamptz := coalesce(NEW.finished_at, now());
    frontier uuid[] := ARRAY[NEW.id];
    woken integer;
BEGIN
    IF NEW.status = 'succeeded' THEN
        WITH ready AS (
            UPDATE tool_run_jobs j
            SET waiting_on = j.waiting_on - 1, updated_at = settled_at
            FROM tool_run_deps d
            WHERE d.depends_on = NEW.id AND j.run_id = d.run_id AND j.status = 'queued'
            RETURNING j.run_id, j.queue, j.waiting_on
        ), ready_event AS (
            INSERT INTO tool_run_events (run_id, at, type, data)
            SELECT run_id, settled_at, 'dependencies_met', '{}'::jsonb
            FROM ready WHERE waiting_on = 0
        )
        SELECT count(*) INTO woken
        FROM (SELECT pg_notify('runyard_jobs', q.queue)
              FROM (SELECT DISTINCT queue FROM ready WHERE waiting_on = 0) q) n;
        RETURN NULL;
    END IF;
    IF current_setting('runyard.settling_dependents', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('runyard.settling_dependents', 'on', true);
    WHILE cardinality(frontier) > 0 LOOP
        WITH cause AS (
            SELECT DISTINCT ON (d.run_id) d.run_id, c.id AS dep_id, c.ref AS dep_ref,
                   CAST(c.status AS text) AS dep_status, c.error_code AS dep_code
            FROM tool_run_deps d JOIN tool_runs c ON c.id = d.depends_on
            WHERE d.depends_on = ANY(frontier)
            ORDER BY d.run_id, d.depends_on
        ), job AS (
            UPDATE tool_run_jobs j
            SET status = 'failed', finished_at = settled_at, updated_at = settled_at,
                last_error = 'dependency_failed'
            FROM cause
            WHERE j.run_id = cause.run_id AND j.status = 'queued'
            RETURNING j.run_id
        ), run AS (
            UPDATE tool_runs r
            SET status = 'failed', finished_at = settled_at, error_code = 'dependency_failed',
                error = format('dependency %s%s ended %s%s', cause.dep_id,
                               CASE WHEN cause.dep_ref IS NOT NULL
                                    THEN format(' (ref %s)', cause.dep_ref) ELSE '' END,
                               cause.dep_status,
                               CASE WHEN cause.dep_code IS NOT NULL
                                         AND cause.dep_code <> cause.dep_status
                                    THEN format(' (%s)', cause.dep_code) ELSE '' END)
            FROM job JOIN cause ON cause.run_id = job.run_id
            WHERE r.id = job.run_id
            RETURNING r.id
        ), run_event AS (
            INSERT INTO tool_run_events (run_id, at, type, data)
            SELECT id, settled_at, 'status',
                   jsonb_build_object('status', 'failed', 'error_code', 'dependency_failed')
            FROM run
        )
        SELECT coalesce(array_agg(n.id), CAST('{}' AS uuid[])) INTO frontier
        FROM (SELECT id, pg_notify('runyard_runs', CAST(id AS text)) FROM run) n;
    END LOOP;
    PERFORM set_config('runyard.settling_dependents', 'off', true);
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_batches_tenant_idempotency_key"),
    )
    op.create_index(
        "ix_batches_tenant_created",
        "batches",
        ["tenant", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
    )
    op.add_column(
        "tool_runs",
        sa.Column(
            "batch_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("batches.id", name=op.f("fk_tool_runs_batch_id_batches")),
            nullable=True,
        ),
    )
    op.add_column("tool_runs", sa.Column("ref", sa.Text(), nullable=True))
    op.add_column("tool_runs", sa.Column("rerun_of", postgresql.UUID(as_uuid=True)))
    op.add_column("tool_runs", sa.Column("run_at", sa.DateTime(timezone=True)))
    op.add_column(
        "tool_runs",
        sa.Column("has_dependents", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_index(
        "ix_tool_runs_batch",
        "tool_runs",
        ["batch_id", "requested_at"],
        postgresql_where=sa.text("batch_id IS NOT NULL"),
    )
    op.create_table(
        "tool_run_deps",
        sa.Column("run_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("depends_on", postgresql.UUID(as_uuid=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_tool_run_deps_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["depends_on"],
            ["tool_runs.id"],
            name=op.f("fk_tool_run_deps_depends_on_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "depends_on", name=op.f("pk_tool_run_deps")),
    )
    op.create_index("ix_tool_run_deps_depends_on", "tool_run_deps", ["depends_on"])
    op.add_column(
        "tool_run_jobs",
        sa.Column("waiting_on", sa.Integer(), server_default="0", nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_tool_run_jobs_waiting_on_non_negative"), "tool_run_jobs", "waiting_on >= 0"
    )
    op.drop_index("ix_tool_run_jobs_queued_tenant", table_name="tool_run_jobs")
    op.create_index(
        "ix_tool_run_jobs_queued_tenant",
        "tool_run_jobs",
        ["queue", "tenant", sa.literal_column("priority DESC"), "created_at"],
        postgresql_where=sa.text("status = 'queued' AND waiting_on = 0"),
    )
    op.execute(SETTLE_DEPENDENTS)
    op.execute(
        "CREATE TRIGGER tool_runs_settle_dependents AFTER UPDATE OF status ON tool_runs "
        "FOR EACH ROW WHEN (NEW.has_dependents AND OLD.status IS DISTINCT FROM NEW.status "
        f"AND NEW.status IN {TERMINAL}) EXECUTE FUNCTION runyard_settle_dependents()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tool_runs_settle_dependents ON tool_runs")
    op.execute("DROP FUNCTION IF EXISTS runyard_settle_dependents()")
    op.drop_index("ix_tool_run_jobs_queued_tenant", table_name="tool_run_jobs")
    op.create_index(
        "ix_tool_run_jobs_queued_tenant",
        "tool_run_jobs",
        ["queue", "tenant", sa.literal_column("priority DESC"), "created_at"],
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.drop_constraint(op.f("ck_tool_run_jobs_waiting_on_non_negative"), "tool_run_jobs")
    op.drop_column("tool_run_jobs", "waiting_on")
    op.drop_index("ix_tool_run_deps_depends_on", table_name="tool_run_deps")
    op.drop_table("tool_run_deps")
    op.drop_index("ix_tool_runs_batch", table_name="tool_runs")
    for column in ("has_dependents", "run_at", "rerun_of", "ref", "batch_id"):
        op.drop_column("tool_runs", column)
    op.drop_index("ix_batches_tenant_created", table_name="batches")
    op.drop_table("batches")
