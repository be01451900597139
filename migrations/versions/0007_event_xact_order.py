"""Every event row records the transaction that inserted it; readers page in that order.

``xact_id`` is the inserting transaction's 64-bit id (``pg_current_xact_id()``), set by the
column default, so no writer names it. Readers deliver a run's events ordered by
``(xact_id, id)`` and only those whose transaction is older than every transaction still in
progress, so a row that commits late never lands behind a reader's cursor
(docs/decisions/0007-event-delivery-order.md).

Rows already there read as ``xact_id = 0``: a constant default adds the column without
rewriting the table, they keep their id order and come before every later row, and an event
id a client holds from before still resumes where it was. The new index is built
CONCURRENTLY, outside the migration's transaction, before the one it replaces is dropped.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

XACT_ID = "CAST(CAST(pg_current_xact_id() AS text) AS bigint)"


def upgrade() -> None:
    op.add_column(
        "tool_run_events",
        sa.Column("xact_id", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.alter_column("tool_run_events", "xact_id", server_default=sa.text(XACT_ID))
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_run_events_run_id_xact_id_id",
            "tool_run_events",
            ["run_id", "xact_id", "id"],
            unique=False,
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_tool_run_events_run_id_id",
            table_name="tool_run_events",
            postgresql_concurrently=True,
            if_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_run_events_run_id_id",
            "tool_run_events",
            ["run_id", "id"],
            unique=False,
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_tool_run_events_run_id_xact_id_id",
            table_name="tool_run_events",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.drop_column("tool_run_events", "xact_id")
