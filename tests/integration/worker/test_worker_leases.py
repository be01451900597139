"""Leases the worker cannot renew (a failing heartbeat thread, a black-holed connection), and
the owner hooks it gives each attempt: ``still_owner``, the database clock, ``note``."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy import exc as sa
from sqlalchemy.engine import make_url

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.platform.db import autocommit, make_engine
from runyard.queue import Heartbeat, JobQueue
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptAbandoned, AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import run_status, wait_until
from tests.integration.worker.test_worker_loop import enqueue
from tests.tcp_proxy import BlackHoleProxy
from worker.__main__ import worker_engines
from worker.connection_watch import ConnectionWatch
from worker.service import Worker, WorkerConfig

LEASE, BEAT = 2.0, 0.4


class Attempts:
    """A fake runner's handler: the first attempt waits to be abandoned, later ones succeed."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.abandoned = threading.Event()
        self.abandoned_at = 0.0
        self.control: AttemptControl | None = None
        self.calls = 0

    def __call__(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        self.calls += 1
        if self.calls > 1:
            return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
        self.control = control
        self.running.set()
        if control.abandon.wait(30):
            self.abandoned_at = time.monotonic()
            self.abandoned.set()
        raise AttemptAbandoned(spec.container_name)


class FailingHeartbeats(JobQueue):
    """Heartbeats that raise ``error`` while ``failing`` is set."""

    def __init__(self, engine: Engine, error: BaseException) -> None:
        super().__init__(engine)
        self.error = error
        self.failing = threading.Event()

    def heartbeat(self, *args: Any, **kw: Any) -> Heartbeat:
        if self.failing.is_set():
            raise self.error
        return super().heartbeat(*args, **kw)


class FailingRegistry(WorkerRegistry):
    """A worker's liveness writes, failing with the heartbeats: a database that cannot renew a
    lease cannot record liveness either (every deployed worker has a registry)."""

    def __init__(self, engine: Engine, heartbeats: FailingHeartbeats) -> None:
        super().__init__(engine)
        self._heartbeats = heartbeats

    def seen(self, worker_id: str, *, now: datetime | None = None) -> datetime | None:
        if self._heartbeats.failing.is_set():
            raise self._heartbeats.error
        return super().seen(worker_id, now=now)


def event_types(engine: Engine, run_id: uuid.UUID) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT type FROM tool_run_events WHERE run_id = :id ORDER BY id"),
                {"id": run_id},
            ).scalars()
        )


def leased(engine: Engine, run_id: uuid.UUID) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT locked_until IS NOT NULL FROM tool_run_jobs WHERE run_id = :id"),
                {"id": run_id},
            ).scalar_one()
        )


@pytest.mark.parametrize(
    "error",
    [RuntimeError("a bug in the heartbeat"), sa.TimeoutError("QueuePool limit reached")],
    ids=["not-a-database-error", "pool-checkout-timeout"],
)
@pytest.mark.slow  # sits out failing heartbeats
def test_worker__a_heartbeat_that_keeps_failing_hands_over_and_pauses_claims(
    engine: Engine, error: BaseException
):
    queue = JobQueue(engine)
    heartbeats = FailingHeartbeats(engine, error)
    attempts, metrics = Attempts(), Metrics()
    config = WorkerConfig(worker_id="w", lease_seconds=LEASE, heartbeat_seconds=BEAT)
    # Without a registry a round with no lease left to renew asks the database nothing, so it
    # would count as answered and resume claims at once, whatever the database does.
    worker = Worker(
        queue,
        FakeRunner(attempts),
        config,
        FailingRegistry(engine, heartbeats),
        heartbeat_queue=heartbeats,
        metrics=metrics,
    )
    run_id = enqueue(queue)
    try:
        assert worker.run_once().claimed == 1
        assert attempts.running.wait(10)
        heartbeats.failing.set()
        assert attempts.abandoned.wait(10)
        # Handed over: released at once (not left to expire), and no new claims meanwhile.
        wait_until(lambda: "released" in event_types(engine, run_id), 10)
        assert run_status(engine, run_id) == "running" and not leased(engine, run_id)
        assert metrics.handovers._value.get() == 1
        assert metrics.claiming._value.get() == 0
        assert metrics.heartbeat_failures._value.get() >= 1
        assert worker.run_once().claimed + worker.run_once().adopted == 0

        heartbeats.failing.clear()
        wait_until(lambda: metrics.claiming._value.get() == 1, 10)
        assert worker.run_once().adopted == 1
        assert worker.wait_idle(timeout=10)
        assert run_status(engine, run_id) == "succeeded"
    finally:
        worker.stop()
        worker.close()


@pytest.mark.slow  # sits out a silent connection
def test_worker__a_black_holed_heartbeat_connection_is_cut_and_the_owner_steps_down(
    database_url: str, engine: Engine
):
    url = make_url(database_url)
    assert url.host is not None and url.port is not None
    proxy = BlackHoleProxy(url.host, url.port)
    config = WorkerConfig(worker_id="w", lease_seconds=LEASE, heartbeat_seconds=BEAT)
    # The heartbeat's engine as a worker process makes it (timeouts included), via the proxy.
    main, proxied = worker_engines(
        url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
        1,
        heartbeat_timeout=config.heartbeat_timeout,
    )
    main.dispose()
    queue = JobQueue(engine)
    attempts, metrics = Attempts(), Metrics()
    worker = Worker(
        queue, FakeRunner(attempts), config, heartbeat_queue=JobQueue(proxied), metrics=metrics
    )
    run_id = enqueue(queue)
    try:
        worker.start()
        assert worker.run_once().claimed == 1
        assert attempts.running.wait(10)
        wait_until(lambda: worker.heartbeat_once(), 10)  # a renewal through the proxy
        proxy.black_hole()
        holed_at = time.monotonic()
        assert attempts.abandoned.wait(10)
        # Within lease + heartbeat interval of the last renewal (which came before the hole).
        assert attempts.abandoned_at - holed_at <= LEASE + BEAT
        assert metrics.connections_cut._value.get() >= 1
        assert run_status(engine, run_id) == "running"  # nothing finalized
        assert worker.wait_idle(timeout=10)  # the slot left

        proxy.heal()
        wait_until(lambda: metrics.claiming._value.get() == 1, 20)
        assert metrics.handovers._value.get() == 1
    finally:
        worker.stop()
        worker.close()
        proxied.dispose()
        proxy.close()


def test_connection_watch__cuts_a_connection_whose_peer_went_silent(database_url: str):
    url = make_url(database_url)
    assert url.host is not None and url.port is not None
    proxy = BlackHoleProxy(url.host, url.port)
    engine = make_engine(
        url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
        pool_size=1,
        max_overflow=0,
        pre_ping=False,
    )
    watch = ConnectionWatch(engine)
    errors: list[BaseException] = []
    try:
        autocommit(engine, text("SELECT 1"), {})  # the pooled connection exists
        proxy.black_hole()

        def stuck() -> None:
            try:
                autocommit(engine, text("SELECT 1"), {})
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=stuck, daemon=True)
        thread.start()
        wait_until(lambda: watch.cut(older_than=0.2), 10)
        thread.join(10)
        assert not thread.is_alive()
        assert isinstance(errors[0], sa.OperationalError)
        proxy.heal()
        assert autocommit(engine, text("SELECT 1"), {})[0][0] == 1  # a fresh connection
    finally:
        engine.dispose()
        proxy.close()


def _take_lease_away(engine: Engine, run_id: uuid.UUID) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE tool_run_jobs SET lease_token = gen_random_uuid() WHERE run_id = :id"),
            {"id": run_id},
        )


class ShiftedClock(JobQueue):
    """A database whose clock runs an hour ahead of this host's."""

    def heartbeat(self, *args: Any, **kw: Any) -> Heartbeat:
        beat = super().heartbeat(*args, **kw)
        if beat.db_now is None:
            return beat
        shifted = beat.db_now + timedelta(hours=1)
        return Heartbeat(beat.owned, beat.locked_until, beat.cancel_requested, shifted)


class UnsureLeases(JobQueue):
    """A database that cannot answer whether a lease is held."""

    def lease_held(self, *args: Any, **kw: Any) -> bool:
        raise sa.OperationalError("SELECT", {}, Exception("connection reset"))


class CountedLeaseChecks(JobQueue):
    """A database that counts the lease checks asked of it."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.checks = 0

    def lease_held(self, *args: Any, **kw: Any) -> bool:
        self.checks += 1
        return super().lease_held(*args, **kw)


def test_worker__the_start_record_answers_the_check_before_the_create(engine: Engine):
    queue = CountedLeaseChecks(engine)
    runner = FakeRunner()
    worker = Worker(queue, runner, WorkerConfig(worker_id="w", heartbeat_seconds=3600))
    run_id = enqueue(queue)
    try:
        worker.run_once()
        assert worker.wait_idle(timeout=10)
    finally:
        worker.close()
    assert run_status(engine, run_id) == "succeeded"
    # The fake runner asks before the create and before the start: the database is asked once.
    assert len(runner.started) == 1 and queue.checks == 1


def test_worker__owner_hooks_follow_the_lease_and_the_database_clock(engine: Engine):
    queue = JobQueue(engine)
    attempts = Attempts()
    config = WorkerConfig(worker_id="w", lease_seconds=30, heartbeat_seconds=3600)
    worker = Worker(queue, FakeRunner(attempts), config, heartbeat_queue=ShiftedClock(engine))
    run_id = enqueue(queue)
    try:
        worker.run_once()
        assert attempts.running.wait(10)
        control = attempts.control
        assert control is not None and control.logs is not None
        assert worker.heartbeat_once()
        ahead = (control.clock() - datetime.now(UTC)).total_seconds()
        assert 3590 < ahead < 3610
        assert control.still_owner()
        control.note("stale", {"seconds": 3})
        assert control.logs.write("stdout", "hello\n", "2030-01-01T00:00:00Z")

        _take_lease_away(engine, run_id)
        assert not control.still_owner()
        assert control.abandon.is_set()  # the attempt stops acting at once
        control.note("stale", {"seconds": 4})
        assert not control.logs.write("stdout", "late\n", "2030-01-01T00:00:01Z")
        assert attempts.abandoned.wait(10)
        assert worker.wait_idle(timeout=10)
    finally:
        worker.close()
    types = event_types(engine, run_id)
    assert types.count("stale") == 1 and types.count("stdout") == 1
    assert run_status(engine, run_id) == "running"


def test_worker__still_owner_trusts_the_lease_clock_when_the_database_cannot_answer(
    engine: Engine,
):
    attempts = Attempts()
    config = WorkerConfig(worker_id="w", lease_seconds=30, heartbeat_seconds=3600)
    worker = Worker(UnsureLeases(engine), FakeRunner(attempts), config)
    enqueue(worker._queue)
    try:
        worker.run_once()
        assert attempts.running.wait(10)
        control = attempts.control
        assert control is not None
        assert control.still_owner()  # unconfirmed, but the lease has not run out
        [flight] = worker._in_flight.values()
        flight.lease_valid_until = time.monotonic() - 1
        assert not control.still_owner()  # run out: never the owner, whatever the database
        control.abandon.set()
        assert worker.wait_idle(timeout=10)
    finally:
        worker.close()
