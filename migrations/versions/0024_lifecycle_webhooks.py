"""Lifecycle webhooks: a delivery names its event, and a tenant chooses the events it wants.

``webhook_deliveries`` gains ``event`` (``run.completed`` for every row written so far),
``attempt`` (the run's attempt, for the events that come once per attempt), ``seq`` (the
order the deliveries of one run were written in; rows from before have none and come first)
and ``data`` (what the event adds to the run, e.g. the deadline).
``tenant_settings`` gains ``webhook_events`` (the events the tenant's URL and its runs'
callback URLs receive; ``run.completed`` alone, as before, unless the tenant asks for more) and
``deadline_lead_seconds`` (how long before an attempt's deadline ``run.deadline_approaching``
is sent).

The completion trigger now writes a delivery only when the tenant takes ``run.completed`` (all
tenants do until they change it), and a second trigger writes ``run.started`` when a run
becomes running (or is written running, in sync mode), once per attempt. ``run.deadline_approaching`` is written by the delivering
processes (``runyard.webhooks.sql.ENQUEUE_DEADLINE_NOTICES``) from the job's deadline, which an
adopting worker keeps; a unique index makes each attempt's notice exist once whoever writes it.

Adding ``seq`` without a default and setting the default after keeps the table as it is (no
rewrite): only new rows draw numbers.

Revision ID: 0024
Revises: 0022
Create Date: 2026-11-27 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024"
down_revision = "0022"
branch_labels = None
depends_on = None

EVENTS = "('run.completed', 'run.started', 'run.deadline_approaching')"
TERMINAL = "('succeeded', 'failed', 'timed_out', 'cancelled')"

# The URL a run's deliveries go to and whether its tenant takes the event (TG_ARGV[0]).
_OUTBOX = """
CREATE OR REPLACE FUNCTION runyard_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted text[];
    default_url text;
    at timestamptz;
BEGIN
    SELECT s.webhook_events, s.webhook_url INTO wanted, default_url
    FROM tenant_settings s WHERE s.tenant = NEW.tenant;
    IF NOT (TG_ARGV[0] = ANY(coalesce(wanted, ARRAY['run.completed']))) THEN
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
                                    event, attempt)
    VALUES (gen_random_uuid(), NEW.id, NEW.tenant, coalesce(NEW.callback_url, default_url),
            at, at, TG_ARGV[0],
            CASE WHEN TG_ARGV[0] = 'run.completed' THEN NULL ELSE NEW.attempts END)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$
"""

# As migration 0009 wrote it.
_OUTBOX_BEFORE = """
CREATE OR REPLACE FUNCTION runyard_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (id, run_id, tenant, url, created_at, next_attempt_at)
    SELECT gen_random_uuid(), NEW.id, NEW.tenant, target.url,
           coalesce(NEW.finished_at, now()), coalesce(NEW.finished_at, now())
    FROM (SELECT coalesce(NEW.callback_url,
                          (SELECT s.webhook_url FROM tenant_settings s
                           WHERE s.tenant = NEW.tenant)) AS url) target
    WHERE target.url IS NOT NULL;
    RETURN NULL;
END
$$
"""


def _completion_triggers(argument: str) -> None:
    op.execute("DROP TRIGGER IF EXISTS tool_runs_webhook_update ON tool_runs")
    op.execute("DROP TRIGGER IF EXISTS tool_runs_webhook_insert ON tool_runs")
    op.execute(
        "CREATE TRIGGER tool_runs_webhook_update AFTER UPDATE OF status ON tool_runs "
        f"FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN {TERMINAL}) "
        f"EXECUTE FUNCTION runyard_webhook_outbox({argument})"
    )
    op.execute(
        "CREATE TRIGGER tool_runs_webhook_insert AFTER INSERT ON tool_runs "
        f"FOR EACH ROW WHEN (NEW.status IN {TERMINAL}) "
        f"EXECUTE FUNCTION runyard_webhook_outbox({argument})"
    )


def upgrade() -> None:
    op.add_column(
        "webhook_deliveries",
        sa.Column("event", sa.Text(), server_default="run.completed", nullable=False),
    )
    op.add_column("webhook_deliveries", sa.Column("attempt", sa.Integer(), nullable=True))
    op.add_column("webhook_deliveries", sa.Column("seq", sa.BigInteger(), nullable=True))
    op.add_column("webhook_deliveries", sa.Column("data", postgresql.JSONB(), nullable=True))
    op.execute("CREATE SEQUENCE webhook_deliveries_seq_seq OWNED BY webhook_deliveries.seq")
    op.execute(
        "ALTER TABLE webhook_deliveries "
        "ALTER COLUMN seq SET DEFAULT nextval('webhook_deliveries_seq_seq')"
    )
    op.create_check_constraint(
        op.f("ck_webhook_deliveries_event_known"), "webhook_deliveries", f"event IN {EVENTS}"
    )
    op.create_index(
        "uq_webhook_deliveries_run_event_attempt",
        "webhook_deliveries",
        ["run_id", "event", "attempt"],
        unique=True,
        postgresql_where=sa.text("event <> 'run.completed'"),
    )
    op.add_column(
        "tenant_settings",
        sa.Column(
            "webhook_events",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("ARRAY['run.completed']"),
            nullable=False,
        ),
    )
    op.add_column(
        "tenant_settings",
        sa.Column("deadline_lead_seconds", sa.Integer(), server_default="60", nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_tenant_settings_deadline_lead_positive"),
        "tenant_settings",
        "deadline_lead_seconds > 0",
    )
    op.execute(_OUTBOX)
    _completion_triggers("'run.completed'")
    op.execute(
        "CREATE TRIGGER tool_runs_webhook_started AFTER UPDATE OF status ON tool_runs "
        "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status = 'running') "
        "EXECUTE FUNCTION runyard_webhook_outbox('run.started')"
    )
    # A sync-mode run is written running.
    op.execute(
        "CREATE TRIGGER tool_runs_webhook_started_insert AFTER INSERT ON tool_runs "
        "FOR EACH ROW WHEN (NEW.status = 'running') "
        "EXECUTE FUNCTION runyard_webhook_outbox('run.started')"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tool_runs_webhook_started_insert ON tool_runs")
    op.execute("DROP TRIGGER IF EXISTS tool_runs_webhook_started ON tool_runs")
    op.execute("DELETE FROM webhook_deliveries WHERE event <> 'run.completed'")
    _completion_triggers("")
    op.execute(_OUTBOX_BEFORE)
    op.drop_constraint(
        op.f("ck_tenant_settings_deadline_lead_positive"), "tenant_settings", type_="check"
    )
    op.drop_column("tenant_settings", "deadline_lead_seconds")
    op.drop_column("tenant_settings", "webhook_events")
    op.drop_index("uq_webhook_deliveries_run_event_attempt", table_name="webhook_deliveries")
    op.drop_constraint(
        op.f("ck_webhook_deliveries_event_known"), "webhook_deliveries", type_="check"
    )
    op.drop_column("webhook_deliveries", "data")
    op.drop_column("webhook_deliveries", "seq")
    op.drop_column("webhook_deliveries", "attempt")
    op.drop_column("webhook_deliveries", "event")
