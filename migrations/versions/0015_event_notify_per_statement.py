"""New tool_run_events NOTIFY runyard_events once per statement: the distinct run ids, up to
200 comma-separated per notification (one id, as before, when the statement wrote one run's
events).

A batch writes 1,000-2,000 events in one statement; one notification per row cost the
database a trigger call and a queue entry each, and every API process a wake-up each, for
runs no one could be waiting on yet. Listeners split the payload on commas. 200 ids of 36
characters plus commas stay under the 8,000-byte payload limit.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

IDS_PER_NOTIFICATION = 200


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION runyard_notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('runyard_events', string_agg(run_id::text, ',' ORDER BY run_id))
            FROM (SELECT run_id,
                         (row_number() OVER (ORDER BY run_id) - 1) / {IDS_PER_NOTIFICATION}
                             AS chunk
                  FROM (SELECT DISTINCT run_id FROM new_events) ids) numbered
            GROUP BY chunk;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute("DROP TRIGGER tool_run_events_notify ON tool_run_events")
    op.execute(
        "CREATE TRIGGER tool_run_events_notify AFTER INSERT ON tool_run_events "
        "REFERENCING NEW TABLE AS new_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION runyard_notify_events()"
    )
    op.execute("DROP FUNCTION runyard_notify_event()")


def downgrade() -> None:
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
    op.execute("DROP TRIGGER tool_run_events_notify ON tool_run_events")
    op.execute(
        "CREATE TRIGGER tool_run_events_notify AFTER INSERT ON tool_run_events "
        "FOR EACH ROW EXECUTE FUNCTION runyard_notify_event()"
    )
    op.execute("DROP FUNCTION runyard_notify_events()")
