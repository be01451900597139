"""Artifacts: the files a tool leaves under /runyard/out, kept per run in sets.

``run_artifacts`` holds each file's path, size and SHA-256; ``run_artifact_chunks`` its
content in chunks of about a MiB (stored uncompressed: ``substring`` then reads only the
pieces a Range asks for). Both reference the run ON DELETE CASCADE, so retention's delete of
a run takes them. ``tool_runs.artifact_set`` names the set the run's finalize published.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tool_runs", sa.Column("artifact_set", postgresql.UUID(), nullable=True))
    op.create_table(
        "run_artifacts",
        sa.Column("run_id", postgresql.UUID(), nullable=False),
        sa.Column("set_id", postgresql.UUID(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("chunk_size", sa.Integer(), nullable=False),
        sa.CheckConstraint("size >= 0", name=op.f("ck_run_artifacts_size_not_negative")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_run_artifacts_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "set_id", "path", name=op.f("pk_run_artifacts")),
    )
    op.create_table(
        "run_artifact_chunks",
        sa.Column("run_id", postgresql.UUID(), nullable=False),
        sa.Column("set_id", postgresql.UUID(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_run_artifact_chunks_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "set_id", "path", "seq", name=op.f("pk_run_artifact_chunks")
        ),
    )
    # Random or already-compressed content gains nothing from pglz, and compressed values
    # must be read whole before a substring of them.
    op.execute("ALTER TABLE run_artifact_chunks ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("run_artifact_chunks")
    op.drop_table("run_artifacts")
    op.drop_column("tool_runs", "artifact_set")
