"""Retention under churn: 20,000 runs end in four waves while ``python -m reaper`` keeps a
one-second retention; every table's rows and size stay bounded, and a running and a queued
run (made through the real queue) are not touched."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.queue import NewRun
from tests.acceptance.cluster import Cluster
from tests.integration.api.test_api_helpers import make_app
from tests.integration.queue.test_admission import counted, real

WAVES = 4
RUNS_PER_WAVE = 5_000
TABLES = ("tool_runs", "tool_run_jobs", "tool_run_events", "webhook_deliveries")
# Run-shaped rows that ended now: a job (queue mode), four events, a delivered webhook.
ENDED_RUNS = text(
    """
    WITH runs AS (
        INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                               started_at, finished_at, attempts, max_attempts, exit_code,
                               result, stdout, stderr)
        SELECT gen_random_uuid(), 'churn-' || (g % 5), 'echo',
               '{"image": "runyard/toolbox:latest", "command": ["true"]}',
               jsonb_build_object('i', g), 'succeeded',
               CASE WHEN g % 10 = 0 THEN 'sync' ELSE 'queue' END,
               now(), now(), now(), 1, 1, 0, jsonb_build_object('i', g), repeat('x', 200), ''
        FROM generate_series(1, :n) g
        RETURNING id, mode, tenant
    ), jobs AS (
        INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, attempts, max_attempts,
                                   timeout_seconds, available_at, created_at, updated_at,
                                   started_at, finished_at)
        SELECT gen_random_uuid(), id, 'succeeded', 'default', tenant, 1, 1, 30, now(), now(),
               now(), now(), now()
        FROM runs WHERE mode = 'queue'
    ), events AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT id, now(), e.type, e.data FROM runs CROSS JOIN (VALUES
            ('status', '{"status": "queued"}'::jsonb), ('claimed', '{"attempt": 1}'::jsonb),
            ('stdout', '{"text": "hello\\n", "attempt": 1}'::jsonb),
            ('status', '{"status": "succeeded"}'::jsonb)) AS e(type, data)
    ), deliveries AS (
        INSERT INTO webhook_deliveries (id, run_id, tenant, url, status, attempts, created_at,
                                        next_attempt_at, finished_at, last_status_code)
        SELECT gen_random_uuid(), id, tenant, 'https://hooks.example/x', 'delivered', 1, now(),
               now(), now(), 200
        FROM runs
    )
    SELECT count(*) FROM runs
    """
)


# Other sessions of the database holding a snapshot (the reaper between its batches): rows
# they may still see are not VACUUM's to free.
OLDER_SNAPSHOTS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
)


def figures(engine: Engine, *, vacuum: bool = True) -> dict[str, tuple[int, int]]:
    """Rows and total size (table, indexes, TOAST) of each table, after a VACUUM that no
    other session's snapshot holds back (waited for, 10 s at most)."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        if vacuum:
            deadline = time.monotonic() + 10
            while conn.execute(OLDER_SNAPSHOTS).scalar_one() and time.monotonic() < deadline:
                time.sleep(0.05)
        for table in TABLES if vacuum else ():
            conn.execute(text(f"VACUUM {table}"))
        return {
            table: (
                int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()),
                int(
                    conn.execute(
                        text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": table}
                    ).scalar_one()
                ),
            )
            for table in TABLES
        }


def live_rows(engine: Engine, run_ids: list[Any]) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.*, j.* FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id "
                "WHERE r.id = ANY(:ids) ORDER BY r.id"
            ),
            {"ids": run_ids},
        ).all()
        events = conn.execute(
            text("SELECT count(*) FROM tool_run_events WHERE run_id = ANY(:ids)"),
            {"ids": run_ids},
        ).scalar_one()
    return [*(dict(r._mapping) for r in rows), {"events": events}]


def churn_left(engine: Engine) -> int:
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM tool_runs WHERE tenant LIKE 'churn-%'")
        ).scalar_one()
    return int(left)


def test_retention__churn_keeps_every_table_bounded_and_live_runs_untouched(
    cluster: Cluster, engine: Engine, database_url: str
):
    queue = cluster.queue
    running = queue.enqueue(NewRun(tenant="live", tool="echo", spec={}, input={})).run_id
    [job] = queue.claim(worker_id="busy", engine_id="e", limit=1, lease_seconds=3600)
    assert job.run_id == running
    queued = queue.enqueue(NewRun(tenant="live", tool="echo", spec={}, input={})).run_id
    before = live_rows(engine, [running, queued])
    cluster.start_reaper(
        "reaper",
        RUNYARD_RETENTION_DAYS=str(1 / 86400),
        RUNYARD_REAPER_INTERVAL_SECONDS="0.3",
        RUNYARD_REAPER_BATCH_SIZE="500",
    )

    after_wave = []
    for wave in range(WAVES):
        with engine.begin() as conn:
            assert conn.execute(ENDED_RUNS, {"n": RUNS_PER_WAVE}).scalar_one() == RUNS_PER_WAVE
        if wave == 0:
            one_wave = figures(engine, vacuum=False)
        cluster.wait_for(lambda: churn_left(engine) == 0, 40, f"wave {wave} to be deleted")
        after_wave.append(figures(engine))

    # Measured here: after each wave was deleted every table held its live rows only, and
    # its size (a VACUUM lets freed space be used again) stayed under what one wave of 5,000
    # runs takes (runs 3.0 MB, jobs 1.2 MB, events 4.0 MB, deliveries 1.2 MB), flat from the
    # second wave on.
    expected_rows = {"tool_runs": 2, "tool_run_jobs": 2, "tool_run_events": 4}
    for table in TABLES:
        context = (table, one_wave, after_wave)
        assert [rows for rows, _ in (f[table] for f in after_wave)] == [
            expected_rows.get(table, 0)
        ] * WAVES, context
        assert all(f[table][1] <= one_wave[table][1] * 1.25 for f in after_wave), context
        assert after_wave[-1][table][1] <= after_wave[1][table][1] * 1.1 + 128 * 1024, context
    assert live_rows(engine, [running, queued]) == before
    assert counted(engine) == real(engine) == {"live": (1, 1)}
    app = make_app(database_url, engine, cluster.registry, auth_disabled=True)
    with TestClient(app) as client:
        metrics = client.get("/metrics").text
    assert 'runyard_runs{status="queued",mode="queue"} 1' in metrics
    assert 'runyard_runs{status="running",mode="queue"} 1' in metrics
    assert "reaper pass failed" not in cluster.log_of("reaper")
