"""Initial schema: runs, jobs, events, workers, API keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-25 21:41:30.056464
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column(
            "scopes",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_table(
        "tool_runs",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("image_digest", sa.Text(), nullable=True),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "timed_out",
                "cancelled",
                name="run_status",
            ),
            server_default="queued",
            nullable=False,
        ),
        sa.Column("mode", sa.Text(), server_default="queue", nullable=False),
        sa.Column(
            "requested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("stdout", sa.Text(), nullable=True),
        sa.Column("stderr", sa.Text(), nullable=True),
        sa.Column(
            "stdout_truncated", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column(
            "stderr_truncated", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column("sync_owner", sa.Text(), nullable=True),
        sa.Column("sync_owner_until", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("mode IN ('queue', 'sync')", name=op.f("ck_tool_runs_mode_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_runs")),
        sa.UniqueConstraint(
            "tenant", "idempotency_key", name="uq_tool_runs_tenant_idempotency_key"
        ),
    )
    op.create_index("ix_tool_runs_status_mode", "tool_runs", ["status", "mode"], unique=False)
    op.create_index(
        "ix_tool_runs_tenant_requested",
        "tool_runs",
        ["tenant", sa.literal_column("requested_at DESC"), sa.literal_column("id DESC")],
        unique=False,
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("engine_id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), server_default="1", nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_index(
        "ix_workers_engine_id_last_seen_at", "workers", ["engine_id", "last_seen_at"], unique=False
    )
    op.create_table(
        "tool_run_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column(
            "data",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_tool_run_events_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_run_events")),
    )
    op.create_index(
        "ix_tool_run_events_run_id_id", "tool_run_events", ["run_id", "id"], unique=False
    )
    op.create_table(
        "tool_run_jobs",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "timed_out",
                "cancelled",
                name="run_status",
            ),
            server_default="queued",
            nullable=False,
        ),
        sa.Column("queue", sa.Text(), server_default="default", nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=False),
        sa.Column(
            "available_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", sa.UUID(), nullable=True),
        sa.Column("engine_id", sa.Text(), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_tool_run_jobs_attempts_non_negative")),
        sa.CheckConstraint(
            "max_attempts >= 1", name=op.f("ck_tool_run_jobs_max_attempts_positive")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_tool_run_jobs_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_run_jobs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_tool_run_jobs_run_id")),
    )
    op.create_index(
        "ix_tool_run_jobs_adoptable",
        "tool_run_jobs",
        ["engine_id", sa.literal_column("priority DESC"), "created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'running' AND locked_until IS NULL"),
    )
    op.create_index(
        "ix_tool_run_jobs_queued",
        "tool_run_jobs",
        ["queue", sa.literal_column("priority DESC"), "created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "ix_tool_run_jobs_status_available_priority",
        "tool_run_jobs",
        ["status", "available_at", "priority"],
        unique=False,
    )
    op.create_index(
        "ix_tool_run_jobs_status_locked_until",
        "tool_run_jobs",
        ["status", "locked_until"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_tool_run_jobs_status_locked_until", table_name="tool_run_jobs")
    op.drop_index("ix_tool_run_jobs_status_available_priority", table_name="tool_run_jobs")
    op.drop_index(
        "ix_tool_run_jobs_queued",
        table_name="tool_run_jobs",
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.drop_index(
        "ix_tool_run_jobs_adoptable",
        table_name="tool_run_jobs",
        postgresql_where=sa.text("status = 'running' AND locked_until IS NULL"),
    )
    op.drop_table("tool_run_jobs")
    op.drop_index("ix_tool_run_events_run_id_id", table_name="tool_run_events")
    op.drop_table("tool_run_events")
    op.drop_index("ix_workers_engine_id_last_seen_at", table_name="workers")
    op.drop_table("workers")
    op.drop_index("ix_tool_runs_tenant_requested", table_name="tool_runs")
    op.drop_index("ix_tool_runs_status_mode", table_name="tool_runs")
    op.drop_table("tool_runs")
    op.drop_table("api_keys")
    sa.Enum(name="run_status").drop(op.get_bind(), checkfirst=True)
