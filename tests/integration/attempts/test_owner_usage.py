"""The attempt owner records an attempt's usage under its lease, before its finalize."""

from __future__ import annotations

from sqlalchemy import Engine, text

from runyard.attempts.flight import LeaseClock
from runyard.attempts.owner import AttemptOwner
from runyard.attempts.policy import OwnerPolicy
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.domain.usage import AttemptUsage
from runyard.queue import JobQueue
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.worker.test_worker_loop import enqueue

USAGE = AttemptUsage(cpu_seconds=1.5, memory_peak_bytes=64, memory_avg_bytes=32, wall_seconds=2)


def owner_of(queue: JobQueue, runner: FakeRunner) -> AttemptOwner:
    metrics = Metrics()
    return AttemptOwner(
        queue,
        runner,
        OwnerPolicy.worker(lease_seconds=30, margin_seconds=5),
        owner_id="w",
        clock=LeaseClock(metrics),
        metrics=metrics,
        engine_trouble=lambda why: 0.0,
    )


def usage_rows(engine: Engine) -> list[tuple[int, float]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT attempt, cpu_seconds FROM attempt_usage"))
        return [(row.attempt, row.cpu_seconds) for row in rows]


def test_owner__records_the_usage_then_finalizes(queue: JobQueue, engine: Engine):
    def tool(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, usage=USAGE)

    enqueue(queue)
    owner = owner_of(queue, FakeRunner(tool))
    [job] = queue.claim(worker_id="w", engine_id="fake-engine", limit=1, lease_seconds=30)
    flight = owner.hold(job)
    owner.run(flight)
    assert flight.settled and usage_rows(engine) == [(1, 1.5)]


def test_owner__a_lease_lost_before_the_usage_records_and_finalizes_nothing(
    queue: JobQueue, engine: Engine
):
    def tool(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        with engine.begin() as conn:  # the reaper cleared the lease meanwhile
            conn.execute(text("UPDATE tool_run_jobs SET lease_token = gen_random_uuid()"))
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, usage=USAGE)

    run_id = enqueue(queue)
    owner = owner_of(queue, FakeRunner(tool))
    [job] = queue.claim(worker_id="w", engine_id="fake-engine", limit=1, lease_seconds=30)
    flight = owner.hold(job)
    owner.run(flight)
    assert not flight.settled and usage_rows(engine) == []
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status FROM tool_runs WHERE id = :id"), {"id": run_id})
        assert status.scalar_one() == "running"
