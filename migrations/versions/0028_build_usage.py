"""Metered builds: ``build_usage`` holds what each build of an image consumed, one row per
build (a build row and the first claim of its round: an admin's rebuild is a round of its
own), written under the build's lease before it is recorded ready or failed.

``tool_builds.first_started_at`` is the first claim of the round (kept when a worker dies and
another takes the build over, cleared by a rebuild): a build's wall time runs from it. Rows
name the tenant the build is charged to (that of the oldest run waiting for it; none: a
platform-level build no run waited for) and are not tied to the build by a foreign key.

``tool_builds.traceparent`` is the span of the build that made the image ready (when the
worker traced it): the attempts that waited for it link their wait's span to it.

Revision ID: 0028
Revises: 0026
Create Date: 2026-11-27 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0028"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "tool_builds", sa.Column("first_started_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("tool_builds", sa.Column("traceparent", sa.Text(), nullable=True))
    op.create_table(
        "build_usage",
        sa.Column("build_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tag", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("engine_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=True),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.Column("cpu_seconds", sa.Float(), nullable=True),
        sa.Column("memory_peak_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("build_id", "started_at", name=op.f("pk_build_usage")),
    )
    op.create_index("ix_build_usage_tenant_recorded", "build_usage", ["tenant", "recorded_at"])
    op.create_index("ix_build_usage_recorded", "build_usage", ["recorded_at"])


def downgrade() -> None:
    op.drop_table("build_usage")
    op.drop_column("tool_builds", "traceparent")
    op.drop_column("tool_builds", "first_started_at")
