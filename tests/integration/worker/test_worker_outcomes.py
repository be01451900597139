"""Outcomes the database refuses, runners that crash, passing errors, a claim loop that
raises: every run still ends exactly once, in bounded time, and no loop dies."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy import exc as sa

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import ContainerState, RunStatus
from runyard.queue import ClaimedJob, JobQueue
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import wait_until
from tests.integration.worker.test_worker_loop import enqueue
from worker.service import Worker, WorkerConfig


def outcome_row(engine: Engine, run_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                """
                SELECT CAST(status AS text) AS status, error_code, error, result, exit_code,
                       stdout, stderr, stdout_truncated,
                       (SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id
                          AND e.type = 'status' AND e.data->>'status' <> 'queued'
                          AND e.data->>'status' <> 'running') AS finals
                FROM tool_runs r WHERE id = :id
                """
            ),
            {"id": run_id},
        ).one()


def run_one(engine: Engine, runner: FakeRunner, queue: JobQueue | None = None) -> Any:
    queue = queue or JobQueue(engine)
    run_id = enqueue(queue)
    worker = Worker(queue, runner, WorkerConfig(worker_id="w"))
    try:
        worker.run_once()
        assert worker.wait_idle(timeout=30)
    finally:
        worker.close()
    return outcome_row(engine, run_id)


def returning(**fields: Any) -> FakeRunner:
    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        return AttemptResult(**{"status": RunStatus.SUCCEEDED, "exit_code": 0, **fields})

    return FakeRunner(handler)


UNSTORABLE_RESULTS = {
    "nan": {"x": float("nan")},
    "infinity": {"x": 1e400},
    "nul-escape": {"x": "\u0000"},
    "lone-surrogate": {"x": "\ud800"},
    "not-json": {"x": {1, 2}},
}


@pytest.mark.parametrize("result", UNSTORABLE_RESULTS.values(), ids=UNSTORABLE_RESULTS.keys())
def test_worker__an_unstorable_result_fails_the_run_once_with_the_streams_kept(
    engine: Engine, result: Any
):
    row = run_one(engine, returning(result=result, stdout="hello\n", stderr="warn\n"))
    assert (row.status, row.error_code, row.result) == ("failed", "internal_error", None)
    assert row.error.startswith("the outcome could not be stored: ")
    assert (row.stdout, row.stderr, row.exit_code) == ("hello\n", "warn\n", 0)
    assert row.finals == 1


def test_worker__unstorable_streams_are_cleaned(engine: Engine):
    row = run_one(engine, returning(result={"ok": 1}, stdout="a\x00b", stderr="c\ud800"))
    assert (row.status, row.error_code, row.result) == ("failed", "internal_error", None)
    assert row.stdout == "a\ufffdb" and row.stderr == "c\ufffd\ufffd\ufffd"
    assert row.finals == 1


def test_worker__an_unstorable_result_under_run_forever_still_ends_once(engine: Engine):
    queue = JobQueue(engine)
    bad, good = enqueue(queue, input={"x": 1}), enqueue(queue, input={"x": 2})

    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        value = float("nan") if spec.input == {"x": 1} else 2
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"x": value})

    worker = Worker(queue, FakeRunner(handler), WorkerConfig(worker_id="w", concurrency=1))
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.finalized == 2, 30)
    finally:
        worker.stop()
        thread.join(10)
        worker.close()
    assert outcome_row(engine, bad).error_code == "internal_error"
    assert outcome_row(engine, good).status == "succeeded"


@pytest.mark.parametrize(
    "error", [KeyError("State"), RecursionError("maximum recursion depth exceeded")]
)
def test_worker__a_crashing_runner_fails_the_run_instead_of_looping(
    engine: Engine, error: Exception
):
    def crash(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        raise error

    row = run_one(engine, FakeRunner(crash))
    assert (row.status, row.error_code, row.result) == ("failed", "internal_error", None)
    assert row.error.startswith("the attempt could not be run or collected: ")
    assert type(error).__name__ in row.error
    assert row.finals == 1


def test_worker__a_collection_that_crashes_on_adoption_ends_the_run(engine: Engine):
    queue = JobQueue(engine)
    run_id = enqueue(queue)
    [job] = queue.claim(worker_id="dead", engine_id="fake-engine", limit=1, lease_seconds=30)
    assert queue.mark_container_requested(job.job_id, job.lease_token)
    assert queue.release(job.job_id, job.lease_token)

    def crash(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        raise KeyError("ExitCode")

    runner = FakeRunner(crash)
    runner.containers[(run_id, 1)] = ContainerState.EXITED
    worker = Worker(queue, runner, WorkerConfig(worker_id="w"))
    try:
        assert worker.run_once().adopted == 1
        assert worker.wait_idle(timeout=10)
    finally:
        worker.close()
    row = outcome_row(engine, run_id)
    assert (row.status, row.error_code, row.finals) == ("failed", "internal_error", 1)


def test_worker__a_crash_while_adopting_ends_the_run(engine: Engine):
    queue = JobQueue(engine)
    run_id = enqueue(queue)
    [job] = queue.claim(worker_id="dead", engine_id="fake-engine", limit=1, lease_seconds=30)
    assert queue.release(job.job_id, job.lease_token)

    class BrokenState(FakeRunner):
        def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
            raise ValueError("unexpected engine answer")

    worker = Worker(queue, BrokenState(), WorkerConfig(worker_id="w"))
    try:
        assert worker.run_once().adopted == 1
        assert worker.wait_idle(timeout=10)
    finally:
        worker.close()
    row = outcome_row(engine, run_id)
    assert (row.status, row.error_code, row.finals) == ("failed", "internal_error", 1)
    assert "ValueError" in row.error


class Flaky(JobQueue):
    """``finalize`` fails with a passing error the first ``failures`` times."""

    def __init__(self, engine: Engine, error: Exception, failures: int) -> None:
        super().__init__(engine)
        self.error = error
        self.left = failures

    def finalize(self, *args: Any, **kw: Any) -> bool:
        if self.left > 0:
            self.left -= 1
            raise self.error
        return super().finalize(*args, **kw)


@pytest.mark.parametrize(
    "error",
    [
        sa.OperationalError("UPDATE", {}, Exception("server closed the connection")),
        sa.TimeoutError("QueuePool limit reached"),
    ],
    ids=["connection-lost", "pool-checkout-timeout"],
)
def test_worker__passing_finalize_errors_are_retried(engine: Engine, error: Exception):
    queue = Flaky(engine, error, failures=2)
    row = run_one(engine, returning(result={"ok": True}), queue)
    assert (row.status, row.result, row.finals) == ("succeeded", {"ok": True}, 1)
    assert queue.left == 0


class NoStartMark(JobQueue):
    """The start mark keeps failing with a passing error."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.tries = 0

    def mark_container_requested(self, *args: Any, **kw: Any) -> bool:
        self.tries += 1
        raise sa.OperationalError("UPDATE", {}, Exception("connection reset"))


def test_worker__a_cancel_ends_the_retries_of_the_start_mark(engine: Engine):
    queue = NoStartMark(engine)
    run_id = enqueue(queue)
    runner = FakeRunner()
    worker = Worker(queue, runner, WorkerConfig(worker_id="w", heartbeat_seconds=3600))
    try:
        worker.run_once()
        wait_until(lambda: queue.tries >= 2, 10)
        assert queue.cancel(run_id).requested
        worker.heartbeat_once()  # the cancel reaches the slot
        assert worker.wait_idle(timeout=10)
    finally:
        worker.close()
    row = outcome_row(engine, run_id)
    assert (row.status, row.error, row.finals) == ("cancelled", "cancelled before it started", 1)
    assert runner.started == []


class ClaimsThatRaise(JobQueue):
    """``claim`` raises a non-database error the first ``failures`` times."""

    def __init__(self, engine: Engine, failures: int) -> None:
        super().__init__(engine)
        self.left = failures

    def claim(self, **kw: Any) -> list[ClaimedJob]:
        if self.left > 0:
            self.left -= 1
            raise RuntimeError("a bug in the claim path")
        return super().claim(**kw)


def test_worker__the_claim_loop_survives_unexpected_errors(engine: Engine):
    queue = ClaimsThatRaise(engine, failures=2)
    run_id = enqueue(queue)
    metrics = Metrics()
    worker = Worker(
        queue, FakeRunner(), WorkerConfig(worker_id="w", poll_seconds=0.05), metrics=metrics
    )
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.finalized == 1, 30)
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(10)
        worker.close()
    assert outcome_row(engine, run_id).status == "succeeded"
    assert metrics.loop_errors.labels(loop="claim")._value.get() == 2
