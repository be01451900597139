"""Tombstones of deleted runs: ``deleted_runs`` remembers, for a while, the id of every run
deleted after it was claimed, so the sweep still removes a container or volume of it that
could not be removed before the delete (the engine was down, say). The sweep never touches an
attempt whose run it has never known (another stack may share the engine); a deleted run is
one it knew.

A trigger on ``tool_runs`` writes them, once per statement, in the delete's own transaction:
``DELETE /v1/runs/{id}``, retention and any other delete are covered without naming the
table, and no tombstone is lost to a crash between the delete and a second statement. Runs
never claimed (no ``started_at``, no attempt) had no container and get none. The sweep prunes
tombstones older than a week (``runyard.maintenance.sweep``).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-08 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deleted_runs",
        sa.Column("run_id", postgresql.UUID(), nullable=False),
        sa.Column(
            "deleted_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_deleted_runs")),
    )
    op.create_index(
        op.f("ix_deleted_runs_deleted_at"), "deleted_runs", ["deleted_at"], unique=False
    )
    op.execute(
        """
        CREATE FUNCTION runyard_remember_deleted_runs() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO deleted_runs (run_id)
            SELECT id FROM gone_runs WHERE started_at IS NOT NULL OR attempts > 0
            ON CONFLICT (run_id) DO NOTHING;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER tool_runs_remember_deleted AFTER DELETE ON tool_runs "
        "REFERENCING OLD TABLE AS gone_runs "
        "FOR EACH STATEMENT EXECUTE FUNCTION runyard_remember_deleted_runs()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tool_runs_remember_deleted ON tool_runs")
    op.execute("DROP FUNCTION IF EXISTS runyard_remember_deleted_runs()")
    op.drop_index(op.f("ix_deleted_runs_deleted_at"), table_name="deleted_runs")
    op.drop_table("deleted_runs")
