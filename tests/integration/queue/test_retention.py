"""Retention against real Postgres: whole terminal runs go, of either mode, with everything
that belongs to them; live runs, recent runs and runs whose webhook is still being retried
stay; the per-tenant counts stay exact."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import Engine, text

from runyard.maintenance.retention import Deleted, delete_run, prune_expired, retention_seconds
from runyard.platform.db import autocommit
from runyard.queue import JobQueue
from runyard.webhooks.sql import SETTLE_DELIVERY
from runyard.webhooks.tenant import TenantWebhooks
from tests.integration.queue.test_admission import counted, real
from tests.integration.queue.test_queue import T0, claim, new_run
from tests.integration.queue.test_webhooks import claim_deliveries, finish

DAY = 86400.0

SYNC_RUN = text(
    """
    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                           started_at, finished_at, attempts, max_attempts)
    VALUES (:id, 'acme', 'echo', '{}', '{}', 'succeeded', 'sync', :at, :at, :at, 1, 1)
    """
)


def run_ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT id FROM tool_runs")).scalars())


def rows_of(engine: Engine, run_id: uuid.UUID) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table: int(
                conn.execute(
                    text(f"SELECT count(*) FROM {table} WHERE run_id = :id"), {"id": run_id}
                ).scalar_one()
            )
            for table in ("tool_run_jobs", "tool_run_events", "webhook_deliveries")
        }


def test_prune_expired__deletes_old_terminal_runs_of_both_modes_whole(
    queue: JobQueue, engine: Engine
):
    TenantWebhooks(engine).configure("acme", "https://hooks.example/d")
    old_queue_run = finish(queue)
    old_sync_run = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(SYNC_RUN, {"id": old_sync_run, "at": T0})
        conn.execute(
            text("UPDATE webhook_deliveries SET status = 'delivered' WHERE run_id = ANY(:ids)"),
            {"ids": [old_queue_run, old_sync_run]},
        )
    assert rows_of(engine, old_queue_run) == {
        "tool_run_jobs": 1,
        "tool_run_events": 4,
        "webhook_deliveries": 1,
    }
    recent = finish(queue, now=T0 + timedelta(days=6))
    queued = queue.enqueue(new_run(), now=T0).run_id
    running = queue.enqueue(new_run(), now=T0).run_id
    claim(queue, limit=1)  # the older of the two live runs (queued first) is now running
    before = counted(engine)

    pruned = prune_expired(queue, retention_seconds=7 * DAY, batch=1, now=T0 + timedelta(days=8))

    assert pruned == 2
    assert run_ids(engine) == {recent, queued, running}
    for gone in (old_queue_run, old_sync_run):
        assert rows_of(engine, gone) == {
            "tool_run_jobs": 0,
            "tool_run_events": 0,
            "webhook_deliveries": 0,
        }
    assert counted(engine) == real(engine) == before


def test_prune_expired__waits_for_a_webhook_still_being_retried(queue: JobQueue, engine: Engine):
    run_id = finish(queue, callback_url="https://hooks.example/x")
    later = T0 + timedelta(days=2)
    assert prune_expired(queue, retention_seconds=DAY, batch=10, now=later) == 0
    assert run_ids(engine) == {run_id}
    [row] = claim_deliveries(engine, later, batch=1, owner="p")
    params = {
        "id": row.id,
        "token": row.lease_token,
        "delivered": True,
        "delay": 1.0,
        "window": DAY,
        "status_code": 200,
        "error": None,
        "now": later,
    }
    assert autocommit(engine, SETTLE_DELIVERY, params)[0].status == "delivered"
    assert prune_expired(queue, retention_seconds=DAY, batch=10, now=later) == 1
    assert run_ids(engine) == set()


def test_prune_expired__zero_days_keeps_everything(queue: JobQueue, engine: Engine):
    run_id = finish(queue)
    assert retention_seconds(0) is None and retention_seconds(0.5) == DAY / 2
    far = T0 + timedelta(days=3650)
    assert prune_expired(queue, retention_seconds=None, batch=10, now=far) == 0
    assert run_ids(engine) == {run_id}


def test_delete_run__terminal_only_and_tenant_scoped(queue: JobQueue, engine: Engine):
    done = finish(queue)
    live = queue.enqueue(new_run(), now=T0).run_id
    assert delete_run(engine, live, "acme") == (Deleted.NOT_TERMINAL, "queued")
    assert delete_run(engine, done, "globex") == (Deleted.NOT_FOUND, None)
    assert delete_run(engine, done, None) == (Deleted.DELETED, "succeeded")
    assert delete_run(engine, done, None) == (Deleted.NOT_FOUND, None)
    assert run_ids(engine) == {live}
    assert counted(engine) == real(engine)
