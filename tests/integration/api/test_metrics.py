"""Metrics: a worker's series count what happened; the queue gauges read the database."""

from __future__ import annotations

import uuid

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue, NewRun
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from worker.service import Worker, WorkerConfig


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def enqueue(queue: JobQueue, n: int) -> list[uuid.UUID]:
    return [
        queue.enqueue(NewRun(tenant="t", tool="echo", spec={}, input={"i": i})).run_id
        for i in range(n)
    ]


def test_worker_metrics__count_claims_outcomes_and_slots(queue: JobQueue, engine: Engine):
    enqueue(queue, 3)

    def half_fail(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        if spec.input["i"] == 0:
            return AttemptResult(status=RunStatus.FAILED, exit_code=2, error_code="tool_failed")
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    metrics = Metrics()
    worker = Worker(
        queue, FakeRunner(half_fail), WorkerConfig(worker_id="m", concurrency=4), metrics=metrics
    )
    worker.run_once()
    assert worker.wait_idle(timeout=10)
    worker.close()
    got = samples(metrics)
    assert got[("runyard_claims_total", ())] == 3
    assert got[("runyard_runs_finished_total", (("error_code", ""), ("status", "succeeded")))] == 2
    assert (
        got[("runyard_runs_finished_total", (("error_code", "tool_failed"), ("status", "failed")))]
        == 1
    )
    assert got[("runyard_job_wait_seconds_count", ())] == 3
    assert got[("runyard_run_duration_seconds_count", ())] == 3
    assert got[("runyard_worker_slots_busy", ())] == 0
    assert got[("runyard_worker_slots", ())] == 4


def test_queue_gauges__depth_by_status(queue: JobQueue, engine: Engine):
    enqueue(queue, 5)
    queue.claim(worker_id="w", engine_id="e", limit=2, lease_seconds=30)
    metrics = Metrics()
    metrics.watch_queue(engine)
    got = samples(metrics)
    assert got[("runyard_queue_depth", (("queue", "default"), ("status", "queued")))] == 3
    assert got[("runyard_queue_depth", (("queue", "default"), ("status", "running")))] == 2
    assert got[("runyard_queue_oldest_due_seconds", (("queue", "default"),))] >= 0
