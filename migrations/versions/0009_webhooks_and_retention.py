"""Completion webhooks (a run's own callback URL, a tenant's default and secret, an outbox of
deliveries filled by a trigger) and the index retention deletes by.

A run that becomes terminal gets its delivery row in the same transaction as the status
change, written by a trigger on ``tool_runs``: no finalize statement names webhooks, and no
callback is lost to a crash between the two. The trigger's WHEN clause is evaluated without
calling the function, so runs that do not become terminal cost nothing more.

The index of terminal runs by ``finished_at`` is built CONCURRENTLY, outside the migration's
transaction, so a large ``tool_runs`` keeps taking writes while it builds.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TERMINAL = "('succeeded', 'failed', 'timed_out', 'cancelled')"


def upgrade() -> None:
    op.add_column("tool_runs", sa.Column("callback_url", sa.Text(), nullable=True))
    op.create_table(
        "tenant_settings",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("webhook_secret", sa.Text(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_tenant_settings")),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("run_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_token", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')",
            name=op.f("ck_webhook_deliveries_status_known"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["tool_runs.id"],
            name=op.f("fk_webhook_deliveries_run_id_tool_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        op.f("ix_webhook_deliveries_run_id"), "webhook_deliveries", ["run_id"], unique=False
    )
    # The delivery's clock is the run's: finalize statements take an injected ``now`` and
    # write it as finished_at.
    op.execute(
        """
        CREATE FUNCTION runyard_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
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
    )
    op.execute(
        "CREATE TRIGGER tool_runs_webhook_update AFTER UPDATE OF status ON tool_runs "
        f"FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN {TERMINAL}) "
        "EXECUTE FUNCTION runyard_webhook_outbox()"
    )
    op.execute(
        "CREATE TRIGGER tool_runs_webhook_insert AFTER INSERT ON tool_runs "
        f"FOR EACH ROW WHEN (NEW.status IN {TERMINAL}) "
        "EXECUTE FUNCTION runyard_webhook_outbox()"
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_runs_finished_terminal",
            "tool_runs",
            ["finished_at"],
            unique=False,
            postgresql_where=sa.text(f"status IN {TERMINAL}"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_tool_runs_finished_terminal",
            table_name="tool_runs",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.execute("DROP TRIGGER IF EXISTS tool_runs_webhook_insert ON tool_runs")
    op.execute("DROP TRIGGER IF EXISTS tool_runs_webhook_update ON tool_runs")
    op.execute("DROP FUNCTION IF EXISTS runyard_webhook_outbox()")
    op.drop_index(op.f("ix_webhook_deliveries_run_id"), table_name="webhook_deliveries")
    op.drop_index(
        "ix_webhook_deliveries_due",
        table_name="webhook_deliveries",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_table("webhook_deliveries")
    op.drop_table("tenant_settings")
    op.drop_column("tool_runs", "callback_url")
