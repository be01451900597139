"""Recurring schedules (``schedules``, and each run a schedule makes named by its slot) and
flow control (a run's ``concurrency_key``, its job's ``flow_scopes``, ``flow_counters``).

A schedule holds its tool, input and cadence (a cron expression in a time zone, or a period in
seconds), what a pass does with missed slots (``catch_up``), whether it is paused, and its
cursor ``next_slot_at``: the first slot not yet decided (NULL once it has no slot left). A run
a schedule made carries ``schedule_id`` and ``schedule_slot``; the unique index on the pair is
what makes a slot fire at most once whatever the schedulers do, and the run is written in the
transaction that moves the cursor past its slot, so a slot never goes unfired either. The
index is built concurrently: ``tool_runs`` keeps taking writes meanwhile.

A job under flow limits names its scopes (``tool:…``, ``tenant:…``, ``key:…``) and waits held
(``available_at`` infinity, which no claim takes) until a gate releases it under its scopes'
limits; ``flow_counters`` holds one row per scope: the lock that orders the gates of one scope,
its jobs in flight (released or running: the gate adds those it releases, a trigger takes
away each that ends), its token bucket, and the limits the last gate applied (so a gate can
pass over the held jobs of scopes that are full). The partial index serves the gate: the held
jobs in claim order.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-11 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# A released or running job that ends leaves its scopes, their rows locked in scope order as
# every writer of them locks them, so two ends (or an end and a gate) never deadlock.
FLOW_JOB_ENDED = """
CREATE OR REPLACE FUNCTION runyard_flow_job_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM flow_counters WHERE scope = ANY(OLD.flow_scopes) ORDER BY scope FOR UPDATE;
    UPDATE flow_counters SET in_flight = GREATEST(in_flight - 1, 0)
    WHERE scope = ANY(OLD.flow_scopes);
    RETURN NULL;
END
$$
"""

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("every_seconds", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("catch_up", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("next_slot_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fired", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("skipped", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_slot_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "(cron IS NULL) <> (every_seconds IS NULL)",
            name=op.f("ck_schedules_one_cadence"),
        ),
        sa.CheckConstraint(
            "catch_up IN ('none', 'one', 'all')", name=op.f("ck_schedules_catch_up_known")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
    )
    op.create_index(
        "ix_schedules_tenant_created",
        "schedules",
        ["tenant", sa.text("created_at DESC"), sa.text("id DESC")],
        unique=False,
    )
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["next_slot_at"],
        unique=False,
        postgresql_where=sa.text("NOT paused AND next_slot_at IS NOT NULL"),
    )
    op.add_column(
        "tool_runs", sa.Column("schedule_id", postgresql.UUID(as_uuid=True), nullable=True)
    )
    op.add_column(
        "tool_runs", sa.Column("schedule_slot", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("tool_runs", sa.Column("concurrency_key", sa.Text(), nullable=True))
    op.add_column(
        "tool_run_jobs", sa.Column("flow_scopes", postgresql.ARRAY(sa.Text()), nullable=True)
    )
    op.create_table(
        "flow_counters",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("in_flight", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("per_second", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column("refilled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_flow_counters")),
    )
    op.execute(FLOW_JOB_ENDED)
    op.execute(
        "CREATE TRIGGER tool_run_jobs_flow_ended AFTER UPDATE OF status ON tool_run_jobs "
        "FOR EACH ROW WHEN (OLD.flow_scopes IS NOT NULL "
        "AND OLD.status IN ('queued', 'running') AND NEW.status NOT IN ('queued', 'running') "
        "AND OLD.available_at < 'infinity') EXECUTE FUNCTION runyard_flow_job_ended()"
    )
    with op.get_context().autocommit_block():
        # The claim's per-tenant probe leaves held jobs out: a claim never steps over them.
        op.create_index(
            "ix_tool_run_jobs_queued_tenant_0021",
            "tool_run_jobs",
            ["queue", "tenant", "build_tag", sa.literal_column("priority DESC"), "created_at"],
            postgresql_where=sa.text(
                "status = 'queued' AND waiting_on = 0 AND available_at < 'infinity'"
            ),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_tool_run_jobs_queued_tenant",
            table_name="tool_run_jobs",
            postgresql_concurrently=True,
            if_exists=True,
        )
        op.execute(
            "ALTER INDEX ix_tool_run_jobs_queued_tenant_0021"
            " RENAME TO ix_tool_run_jobs_queued_tenant"
        )
        op.create_index(
            "ix_tool_run_jobs_flow_held",
            "tool_run_jobs",
            [sa.text("priority DESC"), "created_at"],
            unique=False,
            postgresql_where=sa.text(
                "status = 'queued' AND available_at = 'infinity' AND flow_scopes IS NOT NULL"
            ),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.create_index(
            "uq_tool_runs_schedule_slot",
            "tool_runs",
            ["schedule_id", "schedule_slot"],
            unique=True,
            postgresql_where=sa.text("schedule_id IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index("ix_tool_run_jobs_queued_tenant", table_name="tool_run_jobs")
    op.create_index(
        "ix_tool_run_jobs_queued_tenant",
        "tool_run_jobs",
        ["queue", "tenant", "build_tag", sa.literal_column("priority DESC"), "created_at"],
        postgresql_where=sa.text("status = 'queued' AND waiting_on = 0"),
    )
    op.execute("DROP TRIGGER IF EXISTS tool_run_jobs_flow_ended ON tool_run_jobs")
    op.execute("DROP FUNCTION IF EXISTS runyard_flow_job_ended()")
    op.drop_index("ix_tool_run_jobs_flow_held", table_name="tool_run_jobs")
    op.drop_table("flow_counters")
    op.drop_column("tool_run_jobs", "flow_scopes")
    op.drop_column("tool_runs", "concurrency_key")
    op.drop_index(
        "uq_tool_runs_schedule_slot",
        table_name="tool_runs",
        postgresql_where=sa.text("schedule_id IS NOT NULL"),
    )
    op.drop_column("tool_runs", "schedule_slot")
    op.drop_column("tool_runs", "schedule_id")
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_index("ix_schedules_tenant_created", table_name="schedules")
    op.drop_table("schedules")
