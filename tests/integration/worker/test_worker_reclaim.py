"""A lost lease re-claimed by the same worker before the old attempt has left its slot."""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptAbandoned, AttemptControl
from runyard.runners.fake import FakeRunner
from runyard.submission.request import prepare_run
from tests.integration.api.test_api_helpers import run_status
from worker.service import InFlight, Worker, WorkerConfig


def test_reclaim__the_old_attempts_exit_keeps_the_new_attempts_heartbeat_and_cancel(
    engine: Engine, registry: ToolRegistry
):
    queue = JobQueue(engine, backoff_base_seconds=0.0, backoff_max_seconds=0.0)
    first_running, let_first_leave, first_left = (threading.Event() for _ in range(3))
    second_running, second_cancelled = threading.Event(), threading.Event()

    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        if spec.attempt == 1:
            first_running.set()
            assert control.abandon.wait(20)
            assert let_first_leave.wait(20)
            first_left.set()
            raise AttemptAbandoned()
        second_running.set()
        if control.cancel.wait(20):
            second_cancelled.set()
            return AttemptResult(status=RunStatus.CANCELLED, exit_code=None)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    run = prepare_run(registry, tenant="t", tool_name="sleep", input_value={"seconds": 1})
    run_id = queue.enqueue(run).run_id
    worker = Worker(queue, FakeRunner(handler), WorkerConfig(worker_id="w", concurrency=2))
    first_freed_its_slot = threading.Event()
    leave = worker._leave

    def leave_and_tell(flight: InFlight) -> InFlight | None:
        try:
            return leave(flight)
        finally:
            if flight.job.attempt == 1:
                first_freed_its_slot.set()

    worker._leave = leave_and_tell  # type: ignore[method-assign]
    try:
        assert worker.run_once().claimed == 1
        assert first_running.wait(20)
        # The lease is taken away (as the reaper would); this worker claims attempt 2.
        [(job_id, token)] = _job(engine, run_id)
        assert queue.requeue(job_id, token, error_code="test", error="taken away").owned
        worker.heartbeat_once()
        assert worker.run_once().claimed == 1
        let_first_leave.set()
        assert first_left.wait(20) and first_freed_its_slot.wait(20)
        assert worker.free_slots() == 1  # attempt 2 still holds its slot

        # Attempt 2 still has its slot: heartbeats renew it and a cancel reaches it (once
        # its tool runs: a cancel that comes sooner ends it before the start, no tool run).
        assert second_running.wait(20)
        queue.cancel(run_id)
        worker.heartbeat_once()
        assert second_cancelled.wait(10)
        assert worker.wait_idle(timeout=20)
        assert run_status(engine, run_id) == "cancelled"
    finally:
        let_first_leave.set()
        worker.close()


def _job(engine: Engine, run_id: uuid.UUID) -> list[tuple[uuid.UUID, uuid.UUID]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, lease_token FROM tool_run_jobs WHERE run_id = :id"), {"id": run_id}
        ).all()
    return [(row.id, row.lease_token) for row in rows]
