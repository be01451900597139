"""Sandboxes: long-lived containers with exec, held as runs of their tool.

A sandbox is a run (its job, lease, claim, quotas and adoption are the run's), and
``sandboxes`` holds what only a sandbox has: its idle timeout, how many commands may run at
once, when a caller last used it, and when its container was first ready. ``sandbox_execs`` are the commands asked of a sandbox,
which its owner picks up, and ``sandbox_exec_chunks`` their output, keyed by exec, stream and
byte offset so that whoever owns the sandbox appends each byte once. All go with their run.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 06:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("run_id", postgresql.UUID(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("idle_timeout_seconds", sa.Integer(), nullable=False),
        sa.Column("max_execs", sa.Integer(), nullable=False),
        sa.Column(
            "last_active_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exec_count", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_sandboxes_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_sandboxes")),
    )
    op.create_index("ix_sandboxes_tenant_created", "sandboxes", ["tenant", "created_at"])
    op.create_table(
        "sandbox_execs",
        sa.Column("id", postgresql.UUID(), nullable=False),
        sa.Column("run_id", postgresql.UUID(), nullable=False),
        sa.Column("command", postgresql.JSONB(), nullable=False),
        sa.Column("stdin", sa.LargeBinary(), server_default=sa.text("''::bytea"), nullable=False),
        sa.Column("env", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("timed_out", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("stdout_end", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("stderr_end", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("truncated", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'finished')",
            name=op.f("ck_sandbox_execs_status_known"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["sandboxes.run_id"],
            name=op.f("fk_sandbox_execs_run_id_sandboxes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandbox_execs")),
    )
    op.create_index("ix_sandbox_execs_run", "sandbox_execs", ["run_id", "created_at"])
    op.create_index(
        "ix_sandbox_execs_open",
        "sandbox_execs",
        ["run_id", "created_at"],
        postgresql_where=sa.text("status <> 'finished'"),
    )
    op.create_table(
        "sandbox_exec_chunks",
        sa.Column("exec_id", postgresql.UUID(), nullable=False),
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.CheckConstraint(
            "stream IN ('stdout', 'stderr')", name=op.f("ck_sandbox_exec_chunks_stream_known")
        ),
        sa.ForeignKeyConstraint(
            ["exec_id"],
            ["sandbox_execs.id"],
            name=op.f("fk_sandbox_exec_chunks_exec_id_sandbox_execs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("exec_id", "stream", "offset", name=op.f("pk_sandbox_exec_chunks")),
    )


def downgrade() -> None:
    op.drop_table("sandbox_exec_chunks")
    op.drop_table("sandbox_execs")
    op.drop_table("sandboxes")
