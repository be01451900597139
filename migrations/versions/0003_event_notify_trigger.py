"""Every new tool_run_events row NOTIFYs runyard_events with its run id (live SSE).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 23:20:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION runyard_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('runyard_events', NEW.run_id::text);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER tool_run_events_notify AFTER INSERT ON tool_run_events "
        "FOR EACH ROW EXECUTE FUNCTION runyard_notify_event()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tool_run_events_notify ON tool_run_events")
    op.execute("DROP FUNCTION IF EXISTS runyard_notify_event()")
