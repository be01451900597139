"""The end of a sandbox is reported as ``sandbox.ended``: a sandbox is a run (migration 0020),
so its end went out as ``run.completed``; now the completion trigger names it by what it was,
adds the sandbox's id, and a tenant takes it like any other event.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-27 07:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

EVENTS = "('run.completed', 'run.started', 'run.deadline_approaching', 'sandbox.ended')"
EVENTS_BEFORE = "('run.completed', 'run.started', 'run.deadline_approaching')"

# The URL a run's deliveries go to and whether its tenant takes the event: TG_ARGV[0], except
# that the end of a sandbox's run is ``sandbox.ended``.
_OUTBOX = """
CREATE OR REPLACE FUNCTION runyard_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted text[];
    default_url text;
    at timestamptz;
    event text := TG_ARGV[0];
    data jsonb;
BEGIN
{sandbox_end}    SELECT s.webhook_events, s.webhook_url INTO wanted, default_url
    FROM tenant_settings s WHERE s.tenant = NEW.tenant;
    IF NOT (event = ANY(coalesce(wanted, ARRAY['run.completed']))) THEN
        RETURN NULL;
    END IF;
    IF coalesce(NEW.callback_url, default_url) IS NULL THEN
        RETURN NULL;
    END IF;
    -- The statement's clock (an injected one in tests): the end it wrote, or the start of
    -- the attempt its job row now holds (an AFTER trigger sees the whole statement's writes).
    IF TG_ARGV[0] = 'run.completed' THEN
        at := NEW.finished_at;
    ELSE
        SELECT j.started_at INTO at FROM tool_run_jobs j WHERE j.run_id = NEW.id;
    END IF;
    at := coalesce(at, now());
    INSERT INTO webhook_deliveries (id, run_id, tenant, url, created_at, next_attempt_at,
                                    event, attempt, data)
    VALUES (gen_random_uuid(), NEW.id, NEW.tenant, coalesce(NEW.callback_url, default_url),
            at, at, event,
            CASE WHEN TG_ARGV[0] = 'run.completed' THEN NULL ELSE NEW.attempts END, data)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$
"""
_SANDBOX_END = """    IF event = 'run.completed' AND EXISTS (SELECT 1 FROM sandboxes WHERE run_id = NEW.id) THEN
        event := 'sandbox.ended';
        data := jsonb_build_object('sandbox_id', NEW.id);
    END IF;
"""


def _events(allowed: str) -> None:
    op.drop_constraint(
        op.f("ck_webhook_deliveries_event_known"), "webhook_deliveries", type_="check"
    )
    op.create_check_constraint(
        op.f("ck_webhook_deliveries_event_known"), "webhook_deliveries", f"event IN {allowed}"
    )


def upgrade() -> None:
    _events(EVENTS)
    op.execute(_OUTBOX.replace("{sandbox_end}", _SANDBOX_END))


def downgrade() -> None:
    op.execute("DELETE FROM webhook_deliveries WHERE event = 'sandbox.ended'")
    op.execute(
        "UPDATE tenant_settings "
        "SET webhook_events = array_remove(webhook_events, 'sandbox.ended') "
        "WHERE 'sandbox.ended' = ANY(webhook_events)"
    )
    _events(EVENTS_BEFORE)
    # Without the sandbox's case it does what migration 0024's did.
    op.execute(_OUTBOX.replace("{sandbox_end}", ""))
