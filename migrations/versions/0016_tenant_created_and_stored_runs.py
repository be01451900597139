"""Per-tenant counts of runs created in the current window and of runs stored; an index on
``tool_runs.rerun_of``.

The triggers of migration 0006 now count, besides queued and running runs, every run
inserted (``window_created``, added to the tenant's row 0 like every insert) and every run
kept (``stored``: +1 per insert, -1 per delete, whatever the run's status). A run written
failed or cancelled by its submit counts as much as a queued one: making runs that fail on
purpose costs the caller its caps too. ``window_started_at`` is when row 0's window began:
the admission statement (``runyard.queue.sql.TENANT_COUNTS_CTES``) starts a new window, with
``window_created`` at 0, once the last one has passed, under the row lock every admission
already takes; the triggers only add.

The backfill of ``stored`` runs with ``tool_runs`` locked against writes (reads go on), after
the new function is in place, in the same transaction: no insert or delete is counted twice
or lost. It counts the whole table once.

Both tables are locked before anything else, ``tenant_run_counts`` first (``ACCESS
EXCLUSIVE``, for its new columns), then ``tool_runs`` (``SHARE ROW EXCLUSIVE``: writes wait,
reads go on), each wait bounded by a short ``lock_timeout``. Live transactions take the two in
both orders (a submit locks its tenant's counts and then inserts its run; a finalize updates
its run and its trigger then writes the counts), so no order alone rules out a deadlock with
them: a wait that runs out gives back what this migration took (a savepoint) and it tries
again after a pause, never holding one table while others queue behind it for longer than
Postgres waits before it looks for deadlocks (1 s by default). Past ``LOCK_GIVE_UP_SECONDS`` it
stops with an error saying so, and nothing has changed.

A batch's retry asks whether any run re-runs the runs it replaces
(``LOCK_BATCH_FOR_RETRY``): without an index on ``rerun_of`` that read every run. Partial
(only re-runs have one), built CONCURRENTLY after the rest has committed.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SHARDS = 16

logger = logging.getLogger(__name__)

# How long each lock may be waited for, per try (well under Postgres's deadlock_timeout, 1 s by
# default, so a wait this migration is part of ends before anyone reports a deadlock), the
# pause between tries, and when to give up.
LOCK_WAIT_MS = 200
LOCK_PAUSE_SECONDS = 0.5
LOCK_GIVE_UP_SECONDS = 60.0
_LOCKS = (
    "LOCK TABLE tenant_run_counts IN ACCESS EXCLUSIVE MODE",
    "LOCK TABLE tool_runs IN SHARE ROW EXCLUSIVE MODE",
)
# lock_not_available (a lock_timeout ran out), deadlock_detected.
_LOCK_FAILURES = frozenset({"55P03", "40P01"})

_COUNT_RUNS = """
CREATE OR REPLACE FUNCTION runyard_count_runs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    pick smallint := CASE WHEN TG_OP = 'INSERT' THEN 0
                          ELSE 1 + floor(random() * {others}) END;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM tenant_run_counts;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO tenant_run_counts AS c (tenant, shard, queued, running{new_columns})
        SELECT tenant, pick, count(*) FILTER (WHERE status = 'queued'),
               count(*) FILTER (WHERE status = 'running'){inserted}
        FROM new_runs {only_active}
        GROUP BY tenant ORDER BY tenant
        ON CONFLICT (tenant, shard) DO UPDATE
        SET queued = c.queued + excluded.queued, running = c.running + excluded.running{added};
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tenant_run_counts AS c (tenant, shard, queued, running{new_columns})
        SELECT tenant, pick, -count(*) FILTER (WHERE status = 'queued'),
               -count(*) FILTER (WHERE status = 'running'){deleted}
        FROM old_runs {only_active}
        GROUP BY tenant ORDER BY tenant
        ON CONFLICT (tenant, shard) DO UPDATE
        SET queued = c.queued + excluded.queued, running = c.running + excluded.running{added};
    ELSE
        INSERT INTO tenant_run_counts AS c (tenant, shard, queued, running)
        SELECT tenant, pick, sum(queued), sum(running)
        FROM (SELECT tenant, CAST(status = 'queued' AS int) AS queued,
                     CAST(status = 'running' AS int) AS running
              FROM new_runs WHERE status IN ('queued', 'running')
              UNION ALL
              SELECT tenant, -CAST(status = 'queued' AS int),
                     -CAST(status = 'running' AS int)
              FROM old_runs WHERE status IN ('queued', 'running')) d
        GROUP BY tenant HAVING sum(queued) <> 0 OR sum(running) <> 0 ORDER BY tenant
        ON CONFLICT (tenant, shard) DO UPDATE
        SET queued = c.queued + excluded.queued, running = c.running + excluded.running;
    END IF;
    RETURN NULL;
END
$$
"""

# Every run inserted or deleted counts (created in the window, stored).
COUNT_EVERY_RUN = _COUNT_RUNS.format(
    others=SHARDS - 1,
    new_columns=", window_created, stored",
    inserted=", count(*), count(*)",
    deleted=", 0, -count(*)",
    only_active="",
    added=(
        ",\n            window_created = c.window_created + excluded.window_created,"
        "\n            stored = c.stored + excluded.stored"
    ),
)

# Migration 0006's function: only queued and running runs count.
COUNT_ACTIVE_RUNS = _COUNT_RUNS.format(
    others=SHARDS - 1,
    new_columns="",
    inserted="",
    deleted="",
    only_active="WHERE status IN ('queued', 'running')",
    added="",
)


class LocksUnavailable(RuntimeError):
    """The two tables could not be locked before ``LOCK_GIVE_UP_SECONDS``."""


def lock_counts_and_runs() -> None:
    """Lock ``tenant_run_counts`` and then ``tool_runs`` for the rest of the transaction,
    trying again while live transactions hold them (see the module's docstring)."""
    if op.get_context().as_sql:
        for statement in _LOCKS:
            op.execute(statement)
        return
    conn = op.get_bind()
    previous = conn.execute(sa.text("SELECT current_setting('lock_timeout')")).scalar_one()
    give_up_at = time.monotonic() + LOCK_GIVE_UP_SECONDS
    tries = 0
    while True:
        tries += 1
        savepoint = conn.begin_nested()
        try:
            conn.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'"))
            for statement in _LOCKS:
                conn.execute(sa.text(statement))
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) not in _LOCK_FAILURES:
                raise
            savepoint.rollback()
            if time.monotonic() + LOCK_PAUSE_SECONDS >= give_up_at:
                raise LocksUnavailable(
                    f"could not lock tenant_run_counts and tool_runs in {LOCK_GIVE_UP_SECONDS:g} s"
                    f" ({tries} tries): runs kept being submitted or finished; nothing was"
                    " changed. Run the upgrade again at a quieter moment, or with the API"
                    " processes and workers stopped."
                ) from exc
            logger.info(
                "tables busy, trying again",
                extra={"migration": revision, "tries": tries, "error": str(exc.orig)},
            )
            time.sleep(LOCK_PAUSE_SECONDS)
            continue
        savepoint.commit()
        # The locks are held until the commit; later statements wait as they did before.
        conn.execute(sa.text("SELECT set_config('lock_timeout', :v, true)"), {"v": previous})
        return


def upgrade() -> None:
    lock_counts_and_runs()
    op.add_column(
        "tenant_run_counts",
        sa.Column("window_started_at", sa.DateTime(timezone=True), nullable=True),
    )
    for column in ("window_created", "stored"):
        op.add_column(
            "tenant_run_counts",
            sa.Column(column, sa.BigInteger(), server_default="0", nullable=False),
        )
    op.execute(COUNT_EVERY_RUN)
    op.execute(
        """
        INSERT INTO tenant_run_counts AS c (tenant, shard, stored)
        SELECT tenant, 0, count(*) FROM tool_runs GROUP BY tenant ORDER BY tenant
        ON CONFLICT (tenant, shard) DO UPDATE SET stored = excluded.stored
        """
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_tool_runs_rerun_of",
            "tool_runs",
            ["rerun_of"],
            unique=False,
            postgresql_where=sa.text("rerun_of IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_tool_runs_rerun_of",
            table_name="tool_runs",
            postgresql_concurrently=True,
            if_exists=True,
        )
    lock_counts_and_runs()
    op.execute(COUNT_ACTIVE_RUNS)
    for column in ("stored", "window_created", "window_started_at"):
        op.drop_column("tenant_run_counts", column)
