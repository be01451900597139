"""RECORD_USAGE and the reads of the ledger: once per attempt, under the lease, by tenant."""

from __future__ import annotations

import uuid
from datetime import date, timedelta

from sqlalchemy import Engine, text

from runyard.domain.states import ErrorCode
from runyard.domain.usage import AttemptUsage, GroupBy, report_window
from runyard.queue import JobQueue
from runyard.usage.ledger import Recorded, UsageLedger
from tests.integration.queue.test_queue import T0, claim, enqueue_many

USAGE = AttemptUsage(
    cpu_seconds=2.0,
    memory_peak_bytes=1000,
    memory_avg_bytes=500,
    wall_seconds=4.0,
    disk_bytes=10,
    net_rx_bytes=7,
    net_tx_bytes=3,
)
WINDOW = report_window(T0.date(), T0.date(), today=T0.date())


def records(engine: Engine, run_id: uuid.UUID) -> list[tuple[int, float]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT attempt, cpu_seconds FROM attempt_usage WHERE run_id = :id ORDER BY 1"),
            {"id": run_id},
        )
        return [(row.attempt, row.cpu_seconds) for row in rows]


def test_record_usage__once_per_attempt_whoever_records_it(queue: JobQueue, engine: Engine):
    ledger = UsageLedger(engine)
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    assert ledger.record(job.job_id, job.lease_token, USAGE, now=T0) is Recorded.RECORDED
    # The owner died before its finalize; its adopter reads the container again.
    assert queue.release(job.job_id, job.lease_token, now=T0)
    [adopted] = claim(queue, worker="w2")
    twice = AttemptUsage(4.0, 1, 1, 1.0)
    assert ledger.record(adopted.job_id, adopted.lease_token, twice, now=T0) is Recorded.ALREADY
    assert records(engine, run_id) == [(1, 2.0)]
    [totals] = ledger.totals()
    assert (totals.tenant, totals.attempts, totals.cpu_seconds) == ("acme", 1, 2.0)
    assert totals.memory_byte_seconds == 500 * 4.0 and totals.net_bytes == 10


def test_record_usage__nothing_without_the_lease(queue: JobQueue, engine: Engine):
    ledger = UsageLedger(engine)
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    assert queue.release(job.job_id, job.lease_token, now=T0)
    assert ledger.record(job.job_id, job.lease_token, USAGE, now=T0) is Recorded.LEASE_LOST
    assert records(engine, run_id) == [] and ledger.totals() == []


def test_record_usage__a_retry_is_an_attempt_of_its_own(queue: JobQueue, engine: Engine):
    ledger = UsageLedger(engine)
    [run_id] = enqueue_many(queue, 1, max_attempts=2)
    [job] = claim(queue)
    assert ledger.record(job.job_id, job.lease_token, USAGE, now=T0) is Recorded.RECORDED
    queue.requeue(
        job.job_id, job.lease_token, error_code=ErrorCode.CONTAINER_LOST, error="lost", now=T0
    )
    [retry] = claim(queue, now=T0 + timedelta(hours=1))
    assert retry.attempt == 2
    assert ledger.record(retry.job_id, retry.lease_token, USAGE, now=T0) is Recorded.RECORDED
    assert records(engine, run_id) == [(1, 2.0), (2, 2.0)]


def test_report__grouped_and_limited_to_the_tenant(queue: JobQueue, engine: Engine):
    ledger = UsageLedger(engine)
    enqueue_many(queue, 2, tenant="acme", tool="echo")
    enqueue_many(queue, 1, tenant="acme", tool="sleep")
    enqueue_many(queue, 1, tenant="other", tool="echo")
    for job in claim(queue, limit=4):
        assert ledger.record(job.job_id, job.lease_token, USAGE, now=T0) is Recorded.RECORDED
    by_tool = ledger.report(WINDOW, GroupBy.TOOL, "acme")
    assert [(line.key, line.runs, line.cpu_seconds) for line in by_tool] == [
        ("echo", 2, 4.0),
        ("sleep", 1, 2.0),
    ]
    everyone = ledger.report(WINDOW, GroupBy.TENANT, None)
    assert [(line.key, line.attempts) for line in everyone] == [("acme", 3), ("other", 1)]
    [day] = ledger.report(WINDOW, GroupBy.DAY, "other")
    assert (day.key, day.net_rx_bytes, day.memory_peak_bytes) == (T0.date().isoformat(), 7, 1000)
    later = report_window(date(2031, 1, 1), None, today=date(2031, 1, 2))
    assert ledger.report(later, GroupBy.TOOL, None) == []
    assert ledger.report(WINDOW, GroupBy.TOOL, "nobody") == []


def test_cpu_seconds_today__counts_the_tenants_day_only(queue: JobQueue, engine: Engine):
    ledger = UsageLedger(engine)
    enqueue_many(queue, 2, tenant="acme")
    first, second = claim(queue, limit=2)
    yesterday = T0 - timedelta(minutes=1)
    assert ledger.record(first.job_id, first.lease_token, USAGE, now=yesterday)
    assert ledger.record(second.job_id, second.lease_token, USAGE, now=T0)
    assert ledger.cpu_seconds_today("acme", now=T0 + timedelta(hours=3)) == 2.0
    assert ledger.cpu_seconds_today("other", now=T0) == 0.0
