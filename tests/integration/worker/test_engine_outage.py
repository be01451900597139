"""A worker whose engine stops answering, with the fake runner and real Postgres."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import pytest
from sqlalchemy import Engine, text

from reaper.service import Reaper, ReaperConfig
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue, NewRun
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptControl, RunnerUnavailable
from runyard.runners.fake import FakeRunner
from worker.service import ClaimRound, Worker, WorkerConfig


def config(worker_id: str) -> WorkerConfig:
    """Quick polls and backoff; heartbeats only when the test beats by hand."""
    return WorkerConfig(
        worker_id=worker_id,
        poll_seconds=0.01,
        heartbeat_seconds=3600.0,
        engine_backoff_base_seconds=0.02,
        engine_backoff_max_seconds=0.1,
    )


def enqueue(queue: JobQueue, **kw: object) -> uuid.UUID:
    fields: dict[str, object] = {"tenant": "acme", "tool": "echo", "spec": {}, "input": {"v": 1}}
    fields.update(kw)
    return queue.enqueue(NewRun(**fields)).run_id  # type: ignore[arg-type]


def job(engine: Engine, run_id: uuid.UUID) -> tuple[str, int]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT CAST(status AS text), attempts FROM tool_runs WHERE id = :id"),
            {"id": run_id},
        ).one()
    return str(found[0]), int(found[1])


def event_types(engine: Engine, run_id: uuid.UUID) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT type FROM tool_run_events WHERE run_id = :id ORDER BY id"),
                {"id": run_id},
            ).scalars()
        )


def seen_seconds_ago(engine: Engine, worker_id: str) -> float:
    with engine.connect() as conn:
        return float(
            conn.execute(
                text("SELECT extract(epoch FROM now() - last_seen_at) FROM workers WHERE id = :id"),
                {"id": worker_id},
            ).scalar_one()
        )


def age(engine: Engine, seconds: int) -> None:
    """Move every worker's liveness and every job's last change ``seconds`` into the past."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE workers SET last_seen_at = now() - make_interval(secs => :s)"),
            {"s": seconds},
        )
        conn.execute(
            text("UPDATE tool_run_jobs SET updated_at = now() - make_interval(secs => :s)"),
            {"s": seconds},
        )


class SeenRecorded(WorkerRegistry):
    """A registry that tells when a worker's liveness has been recorded."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.recorded = threading.Event()

    def seen(self, worker_id: str, *, now: datetime | None = None) -> datetime | None:
        try:
            return super().seen(worker_id, now=now)
        finally:
            self.recorded.set()


def make(queue: JobQueue, runner: FakeRunner, worker_id: str = "w1") -> Worker:
    return Worker(queue, runner, config(worker_id))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def dying_engine(engine_id: str = "fake-engine") -> FakeRunner:
    """A fake engine that stops answering during its first attempt; later ones succeed."""
    lost = threading.Event()
    calls: list[int] = []

    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        calls.append(spec.attempt)
        if len(calls) == 1:
            lost.set()
            raise RunnerUnavailable("lost the Docker engine")
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result=spec.input)

    runner = FakeRunner(handler, engine_id=engine_id)
    runner.unreachable = lost
    return runner


def test_worker__engine_down_claims_nothing_charges_nothing_and_withholds_liveness(
    queue: JobQueue, engine: Engine
):
    run_ids = [enqueue(queue) for _ in range(3)]
    runner = FakeRunner()
    worker = Worker(queue, runner, config("w-sick"), WorkerRegistry(engine))
    worker.start()
    runner.unreachable.set()
    assert worker.run_once() == ClaimRound(claimed=0, adopted=0, free_slots=4)
    # The heartbeat thread's first round (at its start, while the engine still answered)
    # may still be writing the worker's liveness: let it land before the clock moves.
    time.sleep(0.5)
    age(engine, 300)
    worker.heartbeat_once()
    assert not worker.engine_healthy
    assert seen_seconds_ago(engine, "w-sick") >= 299  # no liveness while the engine is down
    assert all(job(engine, r) == ("queued", 0) for r in run_ids)  # nothing charged

    runner.unreachable.clear()
    assert worker.run_once().claimed == 3
    assert worker.engine_healthy
    assert seen_seconds_ago(engine, "w-sick") < 60  # seen again at once, not a heartbeat later
    assert worker.wait_idle(timeout=10)
    worker.close()
    assert all(job(engine, r) == ("succeeded", 1) for r in run_ids)


@pytest.mark.slow  # sits out the engine's retries
def test_worker__run_on_a_dying_engine_is_released_once_and_resumed_when_it_answers(
    queue: JobQueue, engine: Engine
):
    run_id = enqueue(queue)
    runner = dying_engine()
    metrics = Metrics()
    # Backoff steps long enough that a claim round which found the engine healthy just before
    # the failure cannot reach the released run within one step, however slow the machine.
    steady = dataclasses.replace(
        config("w1"), engine_backoff_base_seconds=0.5, engine_backoff_max_seconds=0.5
    )
    worker = Worker(queue, runner, steady, metrics=metrics)
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        wait_until(lambda: "released" in event_types(engine, run_id), "the release")
        # Many backoff steps and wake-ups pass while the engine is down ...
        for _ in range(20):
            worker.notify_job()
            time.sleep(0.005)
        wait_until(
            lambda: metrics.engine_probe_failures._value.get() >= 10, "ten probes", timeout=30
        )
        # ... and the run is neither adopted again nor charged meanwhile.
        assert event_types(engine, run_id) == ["status", "claimed", "status", "released"]
        assert job(engine, run_id) == ("running", 1)

        runner.unreachable.clear()
        wait_until(lambda: job(engine, run_id)[0] == "succeeded", "the run to finish")
    finally:
        worker.stop()
        thread.join(timeout=10)
        worker.close()
    assert job(engine, run_id) == ("succeeded", 1)
    assert event_types(engine, run_id).count("adopted") == 1
    assert runner.started == [(run_id, 1)]  # resumed on the same container, not restarted


class DiesAtCreate(FakeRunner):
    """Answers the worker's probe before the claim, then nothing: the create fails."""

    def ping(self) -> None:
        super().ping()
        self.unreachable.set()


def test_worker__engine_lost_between_claim_and_start__attempt_given_back_uncharged(
    queue: JobQueue, engine: Engine
):
    run_id = enqueue(queue, max_attempts=1)
    runner = DiesAtCreate()
    worker = make(queue, runner)
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=10)
    assert not worker.engine_healthy
    assert job(engine, run_id) == ("queued", 0)  # the tool never ran: nothing charged
    assert event_types(engine, run_id)[-2:] == ["requeued", "status"]

    plain = FakeRunner()
    healthy = make(queue, plain)
    wait_until(lambda: healthy.run_once().claimed == 1, "the run to be due again")
    assert healthy.wait_idle(timeout=10)
    healthy.close()
    worker.close()
    assert job(engine, run_id) == ("succeeded", 1)
    assert plain.started == [(run_id, 1)]


def test_reaper__a_sick_workers_runs_go_to_a_healthy_engine_charged_only_if_begun(
    engine: Engine,
):
    queue = JobQueue(engine, backoff_base_seconds=0.05, backoff_max_seconds=0.1)
    registry = WorkerRegistry(engine)
    # Claimed on engine A and given back before its container was asked for.
    unstarted = enqueue(queue)
    [held] = queue.claim(worker_id="w-a", engine_id="engine-a", limit=1, lease_seconds=30)
    queue.release_later(held.job_id, held.lease_token, delay_seconds=3600, reason="engine_down")
    # Running on engine A when A stops answering.
    begun = enqueue(queue, max_attempts=2)
    runner_a = dying_engine("engine-a")
    # Its first heartbeat round starts with it and records liveness: that must land before
    # the engine goes away, or on a slow machine it could land after the ageing below.
    sick_registry = SeenRecorded(engine)
    sick = Worker(queue, runner_a, config("w-a"), sick_registry)
    sick.start()
    assert sick_registry.recorded.wait(timeout=10)
    assert sick.run_once().claimed == 1
    assert sick.wait_idle(timeout=10) and not sick.engine_healthy
    fresh = enqueue(queue)
    assert sick.run_once().claimed == 0  # a sick worker is no black hole for new work

    runner_b = FakeRunner(engine_id="engine-b")
    healthy = Worker(queue, runner_b, config("w-b"), registry)
    healthy.start()
    age(engine, 300)
    sick.heartbeat_once()
    healthy.heartbeat_once()
    result = Reaper(queue, ReaperConfig(engine_dead_after_seconds=120)).run_once()
    assert (result.requeued, result.failed) == (2, 0)
    assert job(engine, unstarted) == ("queued", 0)  # never began: not charged
    assert job(engine, begun) == ("queued", 1)  # its container may have run: charged

    def drained() -> bool:
        healthy.run_once()
        return all(job(engine, r)[0] == "succeeded" for r in (unstarted, begun, fresh))

    wait_until(drained, "engine B to run all three")
    assert healthy.wait_idle(timeout=10)
    healthy.close()
    sick.close()
    assert job(engine, unstarted) == ("succeeded", 1)
    assert job(engine, begun) == ("succeeded", 2)
    assert job(engine, fresh) == ("succeeded", 1)
    assert sorted(runner_b.started) == sorted([(unstarted, 1), (begun, 2), (fresh, 1)])
    assert runner_a.started == [(begun, 1)]
