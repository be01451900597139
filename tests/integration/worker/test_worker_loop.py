"""The worker loop with the fake runner and real Postgres: finalize once, fencing, cancel."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import ContainerState, RunStatus
from runyard.queue import ClaimedJob, JobQueue, NewRun
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import wait_until
from worker.service import Worker, WorkerConfig


def enqueue(queue: JobQueue, **kw: object) -> uuid.UUID:
    fields: dict[str, object] = {
        "tenant": "acme",
        "tool": "echo",
        "spec": {"name": "echo"},
        "input": {"v": 1},
    }
    fields.update(kw)
    return queue.enqueue(NewRun(**fields)).run_id  # type: ignore[arg-type]


def status(engine: Engine, run_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT status FROM tool_runs WHERE id = :id"), {"id": run_id}
            ).scalar_one()
        )


def make_worker(queue: JobQueue, runner: FakeRunner, **kw: object) -> Worker:
    config = WorkerConfig(worker_id=str(kw.pop("worker_id", "w1")), **kw)  # type: ignore[arg-type]
    return Worker(queue, runner, config)


def test_worker__runs_and_finalizes_then_discards(queue: JobQueue, engine: Engine):
    run_ids = [enqueue(queue) for _ in range(3)]
    runner = FakeRunner()
    worker = make_worker(queue, runner, concurrency=4)
    assert worker.run_once().claimed == 3
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert all(status(engine, r) == "succeeded" for r in run_ids)
    assert sorted(runner.discarded) == sorted((r, 1) for r in run_ids)
    assert worker.finalized == 3


class SlowRemovalRunner(FakeRunner):
    """A fake engine whose container removal blocks until ``removable`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.removable = threading.Event()
        self.removing = threading.Event()

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        self.removing.set()
        assert self.removable.wait(10)
        super().discard(run_id, attempt)


def test_worker__slot_takes_next_job_while_the_last_container_is_removed(
    queue: JobQueue, engine: Engine
):
    first = enqueue(queue)
    runner = SlowRemovalRunner()
    worker = make_worker(queue, runner, concurrency=1)
    assert worker.run_once().claimed == 1
    assert runner.removing.wait(10)
    assert status(engine, first) == "succeeded"
    second = enqueue(queue)
    deadline = time.monotonic() + 10
    while worker.run_once().claimed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    while status(engine, second) != "succeeded" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert status(engine, second) == "succeeded"
    assert runner.discarded == []
    assert not worker.wait_idle(timeout=0.1)
    runner.removable.set()
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert sorted(runner.discarded) == sorted([(first, 1), (second, 1)])


def test_worker__close_finishes_queued_removals(queue: JobQueue):
    run_id = enqueue(queue)
    runner = SlowRemovalRunner()
    worker = make_worker(queue, runner, concurrency=1)
    assert worker.run_once().claimed == 1
    assert runner.removing.wait(10)
    threading.Timer(0.2, runner.removable.set).start()
    worker.close()
    assert runner.discarded == [(run_id, 1)]


def test_worker__claims_only_for_free_slots(queue: JobQueue):
    for _ in range(5):
        enqueue(queue)
    release = threading.Event()

    def slow(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        release.wait(10)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    worker = make_worker(queue, FakeRunner(slow), concurrency=2)
    assert worker.run_once().claimed == 2
    assert worker.run_once().claimed == 0
    release.set()
    assert worker.wait_idle(timeout=10)
    worker.close()


def test_worker__lost_lease_means_no_finalize(queue: JobQueue, engine: Engine):
    run_id = enqueue(queue)
    started = threading.Event()

    def wait_for_abandon(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        started.set()
        control.abandon.wait(10)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    runner = FakeRunner(wait_for_abandon)
    worker = make_worker(queue, runner, lease_seconds=30, heartbeat_seconds=3600)
    worker.run_once()
    assert started.wait(5)
    later = datetime.now(UTC) + timedelta(seconds=31)
    assert queue.clear_expired(queue.select_expired(batch=10, now=later), now=later)
    worker.heartbeat_once()  # finds the lease gone
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert status(engine, run_id) == "running"
    assert worker.finalized == 0 and runner.discarded == []


def test_worker__cancel_reaches_attempt_through_heartbeat(queue: JobQueue, engine: Engine):
    run_id = enqueue(queue)
    started = threading.Event()

    def until_cancel(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        started.set()
        assert control.cancel.wait(10)
        return AttemptResult(status=RunStatus.CANCELLED, error_code="cancelled")

    worker = make_worker(queue, FakeRunner(until_cancel), heartbeat_seconds=3600)
    worker.run_once()
    assert started.wait(5)
    assert queue.cancel(run_id).requested
    worker.heartbeat_once()
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert status(engine, run_id) == "cancelled"


def test_worker__adopted_job_with_missing_container_is_requeued(queue: JobQueue, engine: Engine):
    run_id = enqueue(queue, max_attempts=2)
    [job] = queue.claim(worker_id="dead", engine_id="fake-engine", limit=1, lease_seconds=30)
    assert queue.release(job.job_id, job.lease_token)
    runner = FakeRunner()
    worker = make_worker(queue, runner)
    assert worker.run_once().adopted == 1
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert status(engine, run_id) == "queued"
    assert runner.started == []


def test_worker__adopted_job_with_exited_container_finalizes_once(queue: JobQueue, engine: Engine):
    run_id = enqueue(queue)
    [job] = queue.claim(worker_id="dead", engine_id="fake-engine", limit=1, lease_seconds=30)
    assert queue.release(job.job_id, job.lease_token)
    runner = FakeRunner()
    runner.containers[(run_id, 1)] = ContainerState.EXITED
    worker = make_worker(queue, runner)
    assert worker.run_once().adopted == 1
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert status(engine, run_id) == "succeeded"
    assert runner.started == []  # adopted, never started again
    with engine.connect() as conn:
        finals = conn.execute(
            text(
                "SELECT count(*) FROM tool_run_events WHERE run_id = :id AND type = 'status'"
                " AND data->>'status' = 'succeeded'"
            ),
            {"id": run_id},
        ).scalar_one()
    assert finals == 1


def test_worker__hand_over_releases_leases_and_leaves_attempts(queue: JobQueue, engine: Engine):
    run_id = enqueue(queue)
    started = threading.Event()

    def long(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        started.set()
        control.abandon.wait(10)
        from runyard.runner import AttemptAbandoned

        raise AttemptAbandoned("handed over")

    worker = make_worker(queue, FakeRunner(long))
    worker.run_once()
    assert started.wait(5)
    assert worker.hand_over() == 1
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, locked_until FROM tool_run_jobs WHERE run_id = :id"),
            {"id": run_id},
        ).one()
    assert row.status == "running" and row.locked_until is None


def test_worker__heartbeat_after_finalize_is_not_a_lost_lease(queue: JobQueue, engine: Engine):
    enqueue(queue)
    in_cleanup = threading.Event()
    release = threading.Event()

    class SlowCleanup(FakeRunner):
        def discard(self, run_id: uuid.UUID, attempt: int) -> None:
            in_cleanup.set()
            release.wait(10)
            super().discard(run_id, attempt)

    from runyard.reads.metrics import Metrics

    metrics = Metrics()
    worker = Worker(
        queue, SlowCleanup(), WorkerConfig(worker_id="w1", heartbeat_seconds=3600), metrics=metrics
    )
    worker.run_once()
    assert in_cleanup.wait(10)  # finalized, container still being removed
    worker.heartbeat_once()
    release.set()
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert metrics.leases_lost._value.get() == 0


def test_worker__slots_claim_their_next_job_as_they_finalize(queue: JobQueue, engine: Engine):
    run_ids = [enqueue(queue) for _ in range(6)]
    worker = make_worker(queue, FakeRunner(), concurrency=2, poll_seconds=60)
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        # One poll claims two; the other four come with the finalizes, not with a poll.
        deadline = time.monotonic() + 10
        while worker.finalized < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert worker.finalized == 6
    finally:
        worker.stop()
        thread.join(timeout=10)
        worker.close()
    assert all(status(engine, r) == "succeeded" for r in run_ids)


class CountedClaims(JobQueue):
    """A queue that counts the worker's claim rounds that reach the database."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.claims = 0

    def claim(self, *args: Any, **kw: Any) -> list[ClaimedJob]:
        self.claims += 1
        return super().claim(*args, **kw)


def test_worker__no_claim_round_after_a_finalize_whose_claim_found_nothing(engine: Engine):
    queue = CountedClaims(engine)
    first = enqueue(queue)
    worker = make_worker(queue, FakeRunner(), concurrency=1, poll_seconds=60)
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: worker.finalized == 1, timeout=10)
        assert worker.wait_idle(timeout=10)
        time.sleep(0.3)  # a woken loop would have claimed by now
        assert queue.claims == 1  # the first poll's; the finalize looked for the next
        # A new job's notification still wakes the loop at once.
        second = enqueue(queue)
        worker.notify_job()
        assert wait_until(lambda: worker.finalized == 2, timeout=10)
    finally:
        worker.stop()
        thread.join(timeout=10)
        worker.close()
    assert status(engine, first) == status(engine, second) == "succeeded"


def test_worker__job_claimed_by_a_finalize_as_the_worker_stops_goes_back(
    queue: JobQueue, engine: Engine
):
    first, second = enqueue(queue), enqueue(queue)

    class StopsDuringFinalize(JobQueue):
        def finalize_and_claim(self, *args: Any, **kw: Any) -> tuple[bool, list[ClaimedJob]]:
            done = super().finalize_and_claim(*args, **kw)
            worker.stop()  # SIGTERM lands while the statement runs
            return done

    worker = make_worker(StopsDuringFinalize(engine), FakeRunner(), concurrency=1, poll_seconds=60)
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert worker.wait_idle(timeout=10)
    released = worker.hand_over()
    assert released == 0
    assert status(engine, first) == "succeeded"
    with engine.connect() as conn:
        job = conn.execute(
            text("SELECT status, attempts, lease_token FROM tool_run_jobs WHERE run_id = :id"),
            {"id": second},
        ).one()
    assert (job.status, job.attempts, job.lease_token) == ("queued", 0, None)


def test_worker__heartbeat_racing_the_finalize_commit_is_not_a_lost_lease(
    queue: JobQueue, engine: Engine
):
    run_id = enqueue(queue)

    class BeatDuringFinalize(JobQueue):
        def finalize(self, *args: Any, **kw: Any) -> bool:
            done = super().finalize(*args, **kw)
            worker.heartbeat_once()  # committed, but the slot has not heard back yet
            return done

    from runyard.reads.metrics import Metrics

    metrics = Metrics()
    worker = Worker(
        BeatDuringFinalize(engine),
        FakeRunner(),
        WorkerConfig(worker_id="w1", heartbeat_seconds=3600),
        metrics=metrics,
    )
    worker.run_once()
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert status(engine, run_id) == "succeeded"
    assert metrics.leases_lost._value.get() == 0


def test_worker__started_twice_runs_one_heartbeat_loop(queue: JobQueue):
    # `python -m worker` starts the worker to fail early, then run_forever starts it again.
    def loops() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "runyard-heartbeat")

    before = loops()
    worker = make_worker(queue, FakeRunner(), concurrency=1)
    try:
        worker.start()
        worker.start()
        assert loops() == before + 1
    finally:
        worker.stop()
        worker.close()
