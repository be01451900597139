"""The reaper service: one pass does every step, in batches, with an injected clock."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from reaper.service import Reaper, ReaperConfig, ReapResult
from runyard.platform.db import DbTimeouts, make_engine
from runyard.queue import JobQueue, NewRun
from runyard.reads.metrics import Metrics

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def enqueue(queue: JobQueue, n: int, **kw: object) -> None:
    fields: dict[str, object] = {"tenant": "t", "tool": "echo", "spec": {}, "input": {}}
    fields.update(kw)
    for _ in range(n):
        queue.enqueue(NewRun(**fields), now=T0)  # type: ignore[arg-type]


def statuses(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM tool_runs GROUP BY 1")).all()
    return {str(r[0]): int(r[1]) for r in rows}


def test_run_once__clears_in_batches_then_settles_orphans(queue: JobQueue, engine: Engine):
    enqueue(queue, 7, max_attempts=2)
    queue.claim(worker_id="w", engine_id="e", limit=7, lease_seconds=30, now=T0)
    metrics = Metrics()
    reaper = Reaper(
        queue, ReaperConfig(batch_size=3, engine_dead_after_seconds=60), metrics=metrics
    )

    first = reaper.run_once(now=T0 + timedelta(seconds=31))
    assert first == ReapResult(leases_cleared=7)
    assert reaper.run_once(now=T0 + timedelta(seconds=32)) == ReapResult()  # idempotent

    settled = reaper.run_once(now=T0 + timedelta(seconds=31 + 61))
    assert settled == ReapResult(requeued=7)
    assert statuses(engine) == {"queued": 7}
    actions = metrics.reaper_actions
    assert actions.labels(action="leases_cleared")._value.get() == 7
    assert actions.labels(action="requeued")._value.get() == 7


def test_run_once__prunes_after_retention(queue: JobQueue, engine: Engine):
    enqueue(queue, 2)
    for job in queue.claim(worker_id="w", engine_id="e", limit=2, lease_seconds=30, now=T0):
        queue.cancel(job.run_id, now=T0)
        queue.requeue(job.job_id, job.lease_token, error_code="x", error="x", now=T0)
    assert statuses(engine) == {"cancelled": 2}
    reaper = Reaper(queue, ReaperConfig(retention_seconds=86400))
    assert reaper.run_once(now=T0 + timedelta(hours=23)).pruned == 0
    assert reaper.run_once(now=T0 + timedelta(hours=25)).pruned == 2
    assert statuses(engine) == {}


def test_run_once__keeps_everything_without_a_retention(queue: JobQueue, engine: Engine):
    enqueue(queue, 1)
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30, now=T0)
    queue.cancel(job.run_id, now=T0)
    queue.requeue(job.job_id, job.lease_token, error_code="x", error="x", now=T0)
    reaper = Reaper(queue, ReaperConfig(retention_seconds=None))
    assert reaper.run_once(now=T0 + timedelta(days=3650)).pruned == 0
    assert statuses(engine) == {"cancelled": 1}


@pytest.mark.slow  # ten deletes of 0.3 s each, past statement timeouts
def test_run_once__prune_past_the_statement_timeout_halves_its_batch(
    queue: JobQueue, engine: Engine, database_url: str
):
    enqueue(queue, 10)
    for job in queue.claim(worker_id="w", engine_id="e", limit=10, lease_seconds=30, now=T0):
        queue.cancel(job.run_id, now=T0)
        queue.requeue(job.job_id, job.lease_token, error_code="x", error="x", now=T0)
    with engine.begin() as conn:
        # Each deleted job costs 0.3 s, as a run with a great many events would.
        conn.execute(
            text(
                "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(0.3); RETURN OLD; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE TRIGGER slow BEFORE DELETE ON tool_run_jobs "
                "FOR EACH ROW EXECUTE FUNCTION slow()"
            )
        )
    timed = make_engine(database_url, timeouts=DbTimeouts(statement_seconds=1))
    try:
        reaper = Reaper(JobQueue(timed), ReaperConfig(batch_size=8, retention_seconds=86400))
        assert reaper.run_once(now=T0 + timedelta(hours=25)).pruned == 10
    finally:
        timed.dispose()
    assert statuses(engine) == {}  # the runs went, and their jobs with them
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tool_run_jobs")).scalar_one() == 0


@pytest.mark.slow  # starts the reaper in a process of its own
def test_cli_once__runs_a_pass_and_exits(database_url: str):
    env = {**os.environ, "RUNYARD_DATABASE_URL": database_url}
    done = subprocess.run(
        [sys.executable, "-m", "reaper", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "reaper --once done" in done.stderr
