"""Builds: tools built from source, per engine, with runs that wait for their build.

``tool_build_contexts`` keeps the source of each digest (a tar of the context, with its
Dockerfile, args, network and timeout) so a worker on any host can build it. ``tool_builds``
has one row per digest and engine, leased to a worker of that engine like a job.
``tool_run_jobs.build_tag`` names the build a run needs ('' for none); the per-tenant claim
index gains it as its third column, so the claim skips the runs of a build that is not ready
on its engine a group at a time, and ``ix_tool_run_jobs_queued_build`` lists the builds that
queued runs wait for.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tool_build_contexts",
        sa.Column("tag", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("dockerfile", sa.Text(), nullable=False),
        sa.Column(
            "args",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("network", sa.Text(), server_default="none", nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("context", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tag", name=op.f("pk_tool_build_contexts")),
    )
    op.create_table(
        "tool_builds",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("tag", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("engine_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="queued", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="3", nullable=False),
        sa.Column(
            "available_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("log", sa.Text(), server_default="", nullable=False),
        sa.Column("log_size", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("image_id", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'building', 'ready', 'failed')",
            name=op.f("ck_tool_builds_status_known"),
        ),
        sa.ForeignKeyConstraint(
            ["tag"],
            ["tool_build_contexts.tag"],
            name=op.f("fk_tool_builds_tag_tool_build_contexts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_builds")),
        sa.UniqueConstraint("tag", "engine_id", name="uq_tool_builds_tag_engine_id"),
    )
    op.create_index(
        "ix_tool_builds_open",
        "tool_builds",
        ["engine_id", "created_at"],
        postgresql_where=sa.text("status IN ('queued', 'building')"),
    )
    op.add_column(
        "tool_run_jobs", sa.Column("build_tag", sa.Text(), server_default="", nullable=False)
    )
    op.drop_index("ix_tool_run_jobs_queued_tenant", table_name="tool_run_jobs")
    op.create_index(
        "ix_tool_run_jobs_queued_tenant",
        "tool_run_jobs",
        ["queue", "tenant", "build_tag", sa.literal_column("priority DESC"), "created_at"],
        postgresql_where=sa.text("status = 'queued' AND waiting_on = 0"),
    )
    op.create_index(
        "ix_tool_run_jobs_queued_build",
        "tool_run_jobs",
        ["build_tag", "queue"],
        postgresql_where=sa.text("status = 'queued' AND build_tag <> ''"),
    )


def downgrade() -> None:
    op.drop_index("ix_tool_run_jobs_queued_build", table_name="tool_run_jobs")
    op.drop_index("ix_tool_run_jobs_queued_tenant", table_name="tool_run_jobs")
    op.create_index(
        "ix_tool_run_jobs_queued_tenant",
        "tool_run_jobs",
        ["queue", "tenant", sa.literal_column("priority DESC"), "created_at"],
        postgresql_where=sa.text("status = 'queued' AND waiting_on = 0"),
    )
    op.drop_column("tool_run_jobs", "build_tag")
    op.drop_index("ix_tool_builds_open", table_name="tool_builds")
    op.drop_table("tool_builds")
    op.drop_table("tool_build_contexts")
