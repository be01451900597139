"""The attempt owner's give-up and fallback rules, one row per case and policy: the fake
runner stands in for the engine, the run and its job are real rows in Postgres."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy import exc as sa

from runyard.attempts.flight import Flight, LeaseClock
from runyard.attempts.owner import AttemptOwner
from runyard.attempts.policy import OwnerPolicy
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import ContainerState, RunStatus
from runyard.queue import ClaimedJob, JobQueue
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptAbandoned, AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.worker.test_worker_loop import enqueue

LEASE = 30.0
# The lease of the rows that wait out the retry budget (one lease, by the one rule).
SHORT_LEASE = 1.5
PASSING = sa.OperationalError("UPDATE", {}, Exception("server closed the connection"))


class FaultyQueue(JobQueue):
    """The real queue, whose finalize fails with a passing error the first ``failures``
    times (-1: always)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, backoff_base_seconds=0.0, backoff_max_seconds=0.0)
        self.failures = 0
        self.finalize_calls = 0

    def finalize(self, *args: Any, **kw: Any) -> bool:
        self.finalize_calls += 1
        if self.failures != 0:
            self.failures -= 1
            raise PASSING
        return super().finalize(*args, **kw)


@dataclass
class Scene:
    """One case's world: the queue, the fake engine, the run, and the flight once held."""

    engine: Engine
    queue: FaultyQueue
    runner: FakeRunner
    run_id: uuid.UUID
    flight: Flight | None = None
    # Called inside the tool while it runs.
    during: Callable[[Scene, AttemptControl], None] | None = None
    result: dict[str, Any] = field(default_factory=lambda: {"ok": True})


@dataclass(frozen=True)
class Expect:
    """The run's state after the owner is done with the attempt."""

    status: str
    error_code: str | None = None
    # Terminal status events written (exactly one for an ended run, none otherwise).
    finals: int = 0
    # The lease given back: the job still running, with no lease (a ``released`` event).
    released: bool = False
    # A container started anew for the attempt.
    started: bool = True
    # Ended by the owner's finalize (not by a put-back's statement).
    finalized: bool = True


def _take_lease_away(scene: Scene) -> None:
    with scene.engine.begin() as conn:
        conn.execute(
            text("UPDATE tool_run_jobs SET lease_token = gen_random_uuid() WHERE run_id = :id"),
            {"id": scene.run_id},
        )


def finalize_fails_once(scene: Scene) -> None:
    scene.queue.failures = 1


def finalize_keeps_failing_while_renewed(scene: Scene) -> None:
    scene.queue.failures = -1

    def renewed(scene: Scene, control: AttemptControl) -> None:
        # As the renewals would: the lease clock holds, only the retry budget ends the retries.
        assert scene.flight is not None
        scene.flight.lease_valid_until = time.monotonic() + 3600

    scene.during = renewed


def lease_lost_before_finalize(scene: Scene) -> None:
    scene.during = lambda scene, control: _take_lease_away(scene)


def ownership_lost_mid_run(scene: Scene) -> None:
    def lost(scene: Scene, control: AttemptControl) -> None:
        _take_lease_away(scene)
        assert not control.still_owner()

    scene.during = lost


def engine_lost_on_a_fresh_attempt(scene: Scene) -> None:
    scene.runner.unreachable.set()


def cancel_before_start(scene: Scene) -> None:
    assert scene.flight is not None
    scene.flight.control.cancel.set()  # as a heartbeat or a notification would


def adopted_container_exited(scene: Scene) -> None:
    scene.runner.containers[(scene.run_id, 1)] = ContainerState.EXITED


def adopted_container_missing(scene: Scene) -> None:
    pass  # the engine knows no container of the attempt


def passing_error_under_the_runner(scene: Scene) -> None:
    def fails(scene: Scene, control: AttemptControl) -> None:
        raise PASSING

    scene.during = fails


def outcome_refused(scene: Scene) -> None:
    scene.result = {"x": float("nan")}


Setup = Callable[[Scene], None]
# Cases whose attempt is adopted from an owner that died after asking for its container.
ADOPTED = {adopted_container_exited, adopted_container_missing}
GAVE_UP = Expect("running", released=True)
LOST = Expect("running")
SUCCEEDED = Expect("succeeded", finals=1)
CANCELLED = Expect("cancelled", "cancelled", finals=1, started=False)
COLLECTED = Expect("succeeded", finals=1, started=False)
INTERNAL = Expect("failed", "internal_error", finals=1)

CASES: list[tuple[str, Setup, str, Expect]] = [
    ("finalize-fails-once", finalize_fails_once, "worker", SUCCEEDED),
    ("finalize-fails-once", finalize_fails_once, "sync", SUCCEEDED),
    # The one give-up rule: a lease after the first try, though the lease still holds.
    ("finalize-past-budget", finalize_keeps_failing_while_renewed, "worker", GAVE_UP),
    ("finalize-past-budget", finalize_keeps_failing_while_renewed, "sync", GAVE_UP),
    ("lease-lost-before-finalize", lease_lost_before_finalize, "worker", LOST),
    ("lease-lost-before-finalize", lease_lost_before_finalize, "sync", LOST),
    ("ownership-lost-mid-run", ownership_lost_mid_run, "worker", LOST),
    ("ownership-lost-mid-run", ownership_lost_mid_run, "sync", LOST),
    # Its start never asked for: back to the queue uncharged, for another worker.
    (
        "engine-lost-fresh",
        engine_lost_on_a_fresh_attempt,
        "worker",
        Expect("queued", started=False),
    ),
    # The caller waits: the run ends now.
    (
        "engine-lost-fresh",
        engine_lost_on_a_fresh_attempt,
        "sync",
        Expect("failed", "infrastructure_error", finals=1, started=False),
    ),
    ("cancel-before-start", cancel_before_start, "worker", CANCELLED),
    ("cancel-before-start", cancel_before_start, "sync", CANCELLED),
    ("adopted-exited", adopted_container_exited, "worker", COLLECTED),
    ("adopted-exited", adopted_container_exited, "sync", COLLECTED),
    (
        "adopted-missing",
        adopted_container_missing,
        "worker",
        Expect("failed", "container_lost", finals=1, started=False, finalized=False),
    ),
    (
        "adopted-missing",
        adopted_container_missing,
        "sync",
        Expect("failed", "api_lost", finals=1, started=False, finalized=False),
    ),
    # A passing database error under the runner: the next owner collects, unless one waits.
    ("passing-error-in-runner", passing_error_under_the_runner, "worker", GAVE_UP),
    ("passing-error-in-runner", passing_error_under_the_runner, "sync", INTERNAL),
    ("outcome-refused", outcome_refused, "worker", INTERNAL),
    ("outcome-refused", outcome_refused, "sync", INTERNAL),
]


def _policy(kind: str, lease: float) -> OwnerPolicy:
    if kind == "worker":
        return OwnerPolicy.worker(lease_seconds=lease, margin_seconds=lease / 6)
    return OwnerPolicy.sync(lease_seconds=lease)


def _claim(queue: JobQueue, worker_id: str) -> ClaimedJob:
    [job] = queue.claim(worker_id=worker_id, engine_id="fake-engine", limit=1, lease_seconds=LEASE)
    return job


def _orphaned(queue: JobQueue) -> ClaimedJob:
    """Claimed, its container asked for, and given back by an owner that died."""
    job = _claim(queue, "dead")
    assert queue.mark_container_requested(job.job_id, job.lease_token)
    assert queue.release(job.job_id, job.lease_token)
    adopted = _claim(queue, "w")
    assert adopted.adopted
    return adopted


def _row(engine: Engine, run_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                """
                SELECT CAST(r.status AS text) AS status, r.error_code, j.lease_token,
                       CAST(j.status AS text) AS job_status,
                       (SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id
                          AND e.type = 'status'
                          AND e.data->>'status' NOT IN ('queued', 'running')) AS finals,
                       (SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id
                          AND e.type = 'released') AS releases
                FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id WHERE r.id = :id
                """
            ),
            {"id": run_id},
        ).one()


@pytest.mark.parametrize(
    ("setup", "kind", "expect"),
    [pytest.param(setup, kind, expect, id=f"{name}-{kind}") for name, setup, kind, expect in CASES],
)
def test_attempt_owner__gives_up_and_falls_back_by_its_policy(
    engine: Engine, setup: Setup, kind: str, expect: Expect
):
    queue = FaultyQueue(engine)
    scene = Scene(engine, queue, FakeRunner(), enqueue(queue))

    def tool(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        if scene.during is not None:
            scene.during(scene, control)
        if control.abandon.is_set():
            raise AttemptAbandoned(spec.container_name)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result=scene.result)

    scene.runner = FakeRunner(tool)
    job = _orphaned(queue) if setup in ADOPTED else _claim(queue, "w")
    lease = SHORT_LEASE if setup is finalize_keeps_failing_while_renewed else LEASE
    metrics = Metrics()
    owner = AttemptOwner(
        queue,
        scene.runner,
        _policy(kind, lease),
        owner_id="w",
        clock=LeaseClock(metrics),
        metrics=metrics,
        engine_trouble=lambda why: 0.0,
    )
    scene.flight = owner.hold(job)
    setup(scene)
    began = time.monotonic()
    owner.run(scene.flight)
    assert time.monotonic() - began < lease + 5  # never stuck retrying

    row = _row(engine, scene.run_id)
    assert (row.status, row.error_code, row.finals) == (
        expect.status,
        expect.error_code,
        expect.finals,
    )
    released = row.job_status == "running" and row.lease_token is None
    assert released == expect.released
    if released:
        assert row.releases == (2 if setup in ADOPTED else 1)
    assert bool(scene.runner.started) == expect.started
    committed = bool(expect.finals) and expect.finalized
    assert scene.flight.settled == committed
    assert owner.finalized == int(committed)
