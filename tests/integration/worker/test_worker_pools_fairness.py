"""Worker pools and fair tenants with real workers, the fake runner and real Postgres."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue, NewRun
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import wait_until
from tests.integration.worker.test_worker_loop import enqueue, make_worker, status


class GatedRunner(FakeRunner):
    """Each attempt records its start, then waits until its run is let go."""

    def __init__(self) -> None:
        super().__init__(self._handle)
        self.order: list[uuid.UUID] = []
        self._gates: dict[uuid.UUID, threading.Event] = {}
        self._guard = threading.Lock()

    def _gate(self, run_id: uuid.UUID) -> threading.Event:
        with self._guard:
            return self._gates.setdefault(run_id, threading.Event())

    def _handle(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        with self._guard:
            self.order.append(spec.run_id)
        assert self._gate(spec.run_id).wait(30)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result=None)

    def let_go(self, run_id: uuid.UUID) -> None:
        self._gate(run_id).set()

    def let_all_go(self) -> None:
        with self._guard:
            started = list(self.order)
        for run_id in started:
            self.let_go(run_id)


@pytest.fixture
def gated() -> Iterator[GatedRunner]:
    runner = GatedRunner()
    yield runner
    runner.let_all_go()


def flood(engine: Engine, tenant: str, n: int) -> None:
    """``n`` queued runs of ``tenant`` in one statement (the tenant counts' triggers fire)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                WITH runs AS (
                    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode,
                                           requested_at)
                    SELECT gen_random_uuid(), :tenant, 'echo', '{"name": "echo"}', '{}',
                           'queued', 'queue', now() - interval '1 minute'
                    FROM generate_series(1, :n)
                    RETURNING id
                )
                INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, timeout_seconds,
                                           available_at, created_at)
                SELECT gen_random_uuid(), id, 'queued', 'default', :tenant, 60,
                       now() - interval '1 minute', now() - interval '1 minute'
                FROM runs
                """
            ),
            {"tenant": tenant, "n": n},
        )


def test_fairness__a_single_run_starts_within_one_slot_turnover_of_a_flood(
    queue: JobQueue, engine: Engine, gated: GatedRunner
):
    flood(engine, "flood", 2000)
    worker = make_worker(queue, gated, concurrency=2)
    try:
        assert worker.run_once().claimed == 2
        wait_until(lambda: len(gated.order) == 2)
        single = enqueue(queue, tenant="single")

        gated.let_go(gated.order[0])  # one slot turns over
        wait_until(lambda: worker.run_once().claimed == 1)
        wait_until(lambda: len(gated.order) == 3)
        assert gated.order[2] == single
    finally:
        gated.let_all_go()
        worker.wait_idle(timeout=10)
        worker.close()


def test_pools__a_gpu_worker_never_takes_default_runs_and_vice_versa(
    queue: JobQueue, engine: Engine
):
    gpu_runs = [
        queue.enqueue(
            NewRun(tenant="acme", tool="echo", spec={"name": "echo"}, input={}, queue="gpu")
        ).run_id
        for _ in range(3)
    ]
    default_runs = [enqueue(queue) for _ in range(3)]
    gpu_runner, default_runner = FakeRunner(), FakeRunner(engine_id="engine-b")
    gpu_worker = make_worker(queue, gpu_runner, worker_id="w-gpu", concurrency=8, queues=("gpu",))
    default_worker = make_worker(queue, default_runner, worker_id="w-default", concurrency=8)
    try:
        assert gpu_worker.run_once().claimed == 3
        assert gpu_worker.wait_idle(timeout=10)
        assert all(status(engine, r) == "queued" for r in default_runs)
        assert default_worker.run_once().claimed == 3
        assert default_worker.wait_idle(timeout=10)
        assert gpu_worker.run_once().claimed == 0
    finally:
        gpu_worker.close()
        default_worker.close()
    assert {run_id for run_id, _ in gpu_runner.started} == set(gpu_runs)
    assert {run_id for run_id, _ in default_runner.started} == set(default_runs)
    assert all(status(engine, r) == "succeeded" for r in gpu_runs + default_runs)
