"""Sync fallback mode (RUNYARD_QUEUE_ENABLED=false): inline runs under a global cap, each a
job its API process claims at the insert, and adopted by another of its engine's API
processes when its own is gone.

The fake runner makes the cap and cancel races deterministic; the tests marked ``docker``
run the same paths with the real Docker runner.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import docker
import httpx2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from reaper.service import Reaper, ReaperConfig
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import ContainerState, RunStatus
from runyard.queue import AdmissionCaps, ApiQueue, ClaimedJob, InlineClaim, NewRun
from runyard.queue.workers import WorkerRegistry
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptAbandoned, AttemptControl, Runner
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.fake import FakeRunner, Handler, succeed_with_input
from runyard.sync.executor import SyncExecutor
from tests.integration.api.test_api_helpers import (
    bearer,
    count,
    live_server,
    make_app,
    run_status,
    wait_until,
)
from tests.integration.queue.test_sync_jobs import adopt

SYNC = {"queue_enabled": False}


def _run_row(engine: Engine, run_id: str | uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT * FROM tool_runs WHERE id = :id"), {"id": run_id}).one()


def _job_row(engine: Engine, run_id: str | uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM tool_run_jobs WHERE run_id = :id"), {"id": run_id}
        ).one()


def _event_types(engine: Engine, run_id: str | uuid.UUID) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT type, data FROM tool_run_events WHERE run_id = :id ORDER BY id"),
            {"id": run_id},
        ).all()
    return [
        f"{row.type}:{row.data['status']}" if row.type == "status" else row.type for row in rows
    ]


class Gate:
    """A fake tool that blocks until released (or cancelled)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        self.started.release()
        assert control.logs is not None
        control.logs.write("stdout", "working\n", "2026-01-01T00:00:00.000000000Z")
        while not self.release.wait(0.02):
            if control.abandon.is_set():
                raise AttemptAbandoned("the test walked away")
            if control.cancel.is_set():
                return AttemptResult(status=RunStatus.CANCELLED, error_code="cancelled")
        return AttemptResult(
            status=RunStatus.SUCCEEDED, exit_code=0, result=spec.input, stdout="working\n"
        )


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


# --- the cap ---


def test_sync__burst_of_3c_gets_c_runs_and_the_rest_429_at_once(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    cap = 3
    gate = Gate()
    app = make_app(
        database_url, engine, registry, FakeRunner(gate), sync_max_concurrency=cap, **SYNC
    )
    barrier = threading.Barrier(3 * cap)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:

        def post(n: int) -> tuple[httpx2.Response, float]:
            barrier.wait()
            started = time.monotonic()
            response = http.post("/v1/runs", json={"tool": "echo", "input": {"n": n}}, headers=acme)
            return response, time.monotonic() - started

        with ThreadPoolExecutor(3 * cap) as pool:
            futures = [pool.submit(post, n) for n in range(3 * cap)]
            # Every refusal comes back while the admitted runs are still blocked.
            try:
                wait_until(lambda: sum(f.done() for f in futures) == 2 * cap, timeout=10)
                for _ in range(cap):
                    assert gate.started.acquire(timeout=10)
                running = "SELECT count(*) FROM tool_runs WHERE status = 'running'"
                assert count(engine, running) == cap
            finally:
                gate.release.set()
            results = [f.result(timeout=20) for f in futures]
    refused = [r for r, _ in results if r.status_code == 429]
    admitted = [r for r, _ in results if r.status_code == 200]
    assert len(admitted) == cap and len(refused) == 2 * cap
    for response in refused:
        assert response.json()["code"] == "sync_capacity_full"
        assert int(response.headers["retry-after"]) >= 1
        assert response.headers["content-type"].startswith("application/problem+json")
    assert all(r.json()["status"] == "succeeded" and r.json()["mode"] == "sync" for r in admitted)
    assert count(engine, "SELECT count(*) FROM tool_runs") == cap
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE status IN ('queued','running')") == 0
    # Each admitted run was a job of the sync queue, claimed at once; nothing ever queued.
    assert count(engine, "SELECT count(*) FROM tool_run_jobs WHERE queue = 'sync'") == cap
    assert count(engine, "SELECT count(*) FROM tool_run_events WHERE type = 'requeued'") == 0


# --- every route ---


def test_sync__every_route_with_truthful_timestamps_and_its_job_row(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    gate.release.set()
    app = make_app(database_url, engine, registry, FakeRunner(gate), **SYNC)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        assert client.get("/v1/tools", headers=acme).status_code == 200
        assert "runyard_sync_slots 4" in client.get("/metrics").text

        response = client.post("/v1/runs", json={"tool": "echo", "input": {"k": "v"}}, headers=acme)
        assert response.status_code == 200, response.text
        run = response.json()
        assert response.headers["location"] == f"/v1/runs/{run['id']}"
        assert run["mode"] == "sync" and run["status"] == "succeeded"
        assert run["result"] == {"k": "v"} and run["attempts"] == 1 and run["max_attempts"] == 1
        assert run["requested_at"] <= run["started_at"] <= run["finished_at"]

        assert client.get(f"/v1/runs/{run['id']}", headers=acme).json() == run
        listed = client.get("/v1/runs", params={"mode": "sync"}, headers=acme).json()["items"]
        assert [item["id"] for item in listed] == [run["id"]]
        assert client.get(f"/v1/runs/{run['id']}/logs", headers=acme).text == "working\n"
        stream = client.get(f"/v1/runs/{run['id']}/events", headers=acme)
        assert stream.status_code == 200 and '"status": "succeeded"' in stream.text
        finished = client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
        assert finished.status_code == 409 and finished.json()["run_status"] == "succeeded"

    assert _event_types(engine, run["id"]) == [
        "status:queued",
        "claimed",
        "status:running",
        "stdout",
        "status:succeeded",
    ]
    job = _job_row(engine, run["id"])
    assert (job.status, job.queue, job.attempts, job.max_attempts) == ("succeeded", "sync", 1, 1)
    assert job.lease_token is None and job.locked_until is None and job.engine_id == "fake-engine"
    assert job.finished_at is not None
    with engine.connect() as conn:
        claimed = conn.execute(
            text("SELECT data FROM tool_run_events WHERE run_id = :id AND type = 'claimed'"),
            {"id": run["id"]},
        ).scalar_one()
    assert claimed["worker_id"].startswith("api-") and claimed["engine_id"] == "fake-engine"


def test_sync__idempotent_retry_does_not_run_the_tool_again(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    gate.release.set()
    runner = FakeRunner(gate)
    app = make_app(database_url, engine, registry, runner, **SYNC)
    headers = {**acme, "Idempotency-Key": "once"}
    with TestClient(app) as client:
        first = client.post("/v1/runs", json={"tool": "echo"}, headers=headers)
        again = client.post("/v1/runs", json={"tool": "echo"}, headers=headers)
        other = client.post("/v1/runs", json={"tool": "echo", "input": {"x": 1}}, headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert other.status_code == 409
    assert len(runner.started) == 1


def test_sync__tenant_caps_apply_too(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    app = make_app(database_url, engine, registry, FakeRunner(gate), tenant_max_running=1, **SYNC)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=20) as http:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(http.post, "/v1/runs", json={"tool": "echo"}, headers=acme)
            assert gate.started.acquire(timeout=10)
            second = http.post("/v1/runs", json={"tool": "echo"}, headers=acme)
            gate.release.set()
            assert first.result(timeout=10).status_code == 200
    assert second.status_code == 429 and second.json()["code"] == "tenant_running_limit"


# --- cancel ---


def test_sync__cancel_request_stops_the_inline_run(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    app = make_app(database_url, engine, registry, FakeRunner(gate), **SYNC)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=20) as http:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(http.post, "/v1/runs", json={"tool": "echo"}, headers=acme)
            assert gate.started.acquire(timeout=10)
            (run_id,) = [r["id"] for r in http.get("/v1/runs", headers=acme).json()["items"]]

            # Logs are read below the server's transaction horizon: a transaction open in
            # any database of the server (another test's clone, say) may hold them back a moment.
            def logs_once_written() -> httpx2.Response | None:
                logs = http.get(f"/v1/runs/{run_id}/logs", headers=acme)
                return logs if logs.text else None

            live_logs = wait_until(logs_once_written, timeout=10)
            assert live_logs.text == "working\n"
            assert live_logs.headers["x-runyard-run-status"] == "running"
            cancel = http.post(f"/v1/runs/{run_id}/cancel", headers=acme)
            assert cancel.status_code == 202
            response = pending.result(timeout=10)
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert "cancel_requested" in _event_types(engine, run_id)


def test_sync__client_that_disconnects_cancels_its_run(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    app = make_app(database_url, engine, registry, FakeRunner(gate), **SYNC)
    with live_server(app) as url:
        with httpx2.Client(base_url=url, timeout=0.5) as impatient:
            with pytest.raises(httpx2.ReadTimeout):
                impatient.post("/v1/runs", json={"tool": "echo"}, headers=acme)
        run_id = wait_until(lambda: _only_run_id(engine))
        wait_until(lambda: run_status(engine, run_id) == "cancelled", timeout=10)
    assert not gate.release.is_set()


def _only_run_id(engine: Engine) -> str | None:
    with engine.connect() as conn:
        value = conn.execute(text("SELECT id FROM tool_runs")).scalar_one_or_none()
    return None if value is None else str(value)


def _executor(engine: Engine, runner: Runner, **overrides: Any) -> SyncExecutor:
    values: dict[str, Any] = {"max_concurrency": 2, "registry": WorkerRegistry(engine)}
    values.update(overrides)
    executor = SyncExecutor(ApiQueue(engine), runner, **values)
    executor.start()
    return executor


def test_sync__cancel_from_another_api_process_arrives_on_renewal(engine: Engine):
    gate = Gate()
    executor = _executor(engine, FakeRunner(gate), lease_seconds=300)
    try:
        submitted = executor.claim_new(_new_run(), AdmissionCaps())
        assert submitted.job is not None
        done = executor.start_job(submitted.job)
        assert gate.started.acquire(timeout=10)
        # As another API process would: the job's cancel column, through the one statement.
        assert ApiQueue(engine).cancel(submitted.run_id).requested
        assert run_status(engine, submitted.run_id) == "running"
        executor.heartbeat_once()
        done.result(timeout=10)
    finally:
        gate.release.set()
        executor.stop()
    assert run_status(engine, submitted.run_id) == "cancelled"
    assert _job_row(engine, submitted.run_id).cancel_requested_at is not None


def test_sync__an_owner_that_lost_its_lease_walks_away_and_writes_nothing(engine: Engine):
    gate = Gate()
    executor = _executor(engine, FakeRunner(gate), lease_seconds=300)
    try:
        submitted = executor.claim_new(_new_run(), AdmissionCaps())
        job = submitted.job
        assert job is not None
        done = executor.start_job(job)
        assert gate.started.acquire(timeout=10)
        far = _db_now(engine) + timedelta(seconds=301)
        adopted = adopt(ApiQueue(engine), engine_id="fake-engine", now=far)
        assert [a.run_id for a in adopted] == [submitted.run_id]
        executor.heartbeat_once()
        done.result(timeout=10)  # the attempt was abandoned, not finalized
    finally:
        gate.release.set()
        executor.stop()
    assert run_status(engine, submitted.run_id) == "running"
    lost = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
    assert not ApiQueue(engine).finalize(job.job_id, job.lease_token, lost)
    assert _event_types(engine, submitted.run_id).count("adopted") == 1


# --- orphans: the API process died mid-run ---


def _new_run(**overrides: Any) -> NewRun:
    values: dict[str, Any] = {
        "tenant": "acme",
        "tool": "echo",
        "spec": {"name": "echo", "timeout_seconds": 300},
        "input": {},
        "timeout_seconds": 300,
    }
    values.update(overrides)
    return NewRun(**values)


def _db_now(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def _orphan(
    engine: Engine, *, engine_id: str = "fake-engine", lease: float = 0.01, **run: Any
) -> ClaimedJob:
    """A sync run claimed by an API process that died at once: past a short lease, adoptable."""
    claim = InlineClaim(owner="api-dead", engine_id=engine_id, lease_seconds=lease)
    job = ApiQueue(engine).submit(_new_run(**run), AdmissionCaps(), inline=claim).job
    assert job is not None
    if lease <= 2:
        time.sleep(lease)
    return job


def test_sync_orphan__adopted_by_an_api_of_its_engine_and_settled_by_the_adoption_rule(
    engine: Engine,
):
    runner = FakeRunner(lambda spec, control: AttemptResult(RunStatus.SUCCEEDED, 0, {"done": 1}))
    exited, missing, created, running = (_orphan(engine) for _ in range(4))
    elsewhere = _orphan(engine, engine_id="another-engine")
    runner.containers[(exited.run_id, 1)] = ContainerState.EXITED
    runner.containers[(created.run_id, 1)] = ContainerState.CREATED
    runner.containers[(running.run_id, 1)] = ContainerState.RUNNING
    executor = _executor(engine, runner, max_concurrency=8)
    try:
        assert executor.adopt_once() == 4  # not the other engine's
        wait_until(lambda: executor.busy == 0, timeout=10)
    finally:
        executor.stop()
    assert _run_row(engine, exited.run_id).result == {"done": 1}
    assert run_status(engine, exited.run_id) == "succeeded"
    assert (exited.run_id, 1) in runner.discarded
    for lost in (missing, created):
        row = _run_row(engine, lost.run_id)
        assert (row.status, row.error_code, row.attempts) == ("failed", "api_lost", 1)
        assert row.finished_at is not None
    assert (created.run_id, 1) in runner.discarded
    # A running container is waited on (a slot can), under the same deadline.
    assert run_status(engine, running.run_id) == "succeeded"
    assert runner.started == []  # nothing started anew: every container was there or gone
    assert run_status(engine, elsewhere.run_id) == "running"
    assert _event_types(engine, exited.run_id)[-2:] == ["adopted", "status:succeeded"]


def test_sync__an_engine_that_fails_under_the_run_ends_it_at_once(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    runner = FakeRunner()
    app = make_app(database_url, engine, registry, runner, **SYNC)
    with TestClient(app) as client:
        runner.unreachable.set()
        response = client.post("/v1/runs", json={"tool": "echo"}, headers=acme)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["status"], body["error_code"]) == ("failed", "infrastructure_error")


def test_sync_orphan__an_adopter_whose_engine_fails_looks_again_later(engine: Engine):
    orphan = _orphan(engine)
    runner = FakeRunner()
    runner.unreachable.set()
    executor = _executor(engine, runner, lease_seconds=30)
    try:
        assert executor.adopt_once() == 1
        wait_until(lambda: executor.busy == 0, timeout=10)
        assert executor.adopt_once() == 0  # held back for a while, not adopted per poll
    finally:
        executor.stop()
    job = _job_row(engine, orphan.run_id)
    assert job.status == "running" and job.lease_token is None
    assert job.available_at > _db_now(engine) + timedelta(seconds=20)
    assert _event_types(engine, orphan.run_id)[-2:] == ["adopted", "released"]


def test_sync_orphan__a_live_lease_is_left_alone_and_queued_work_never_adopted(engine: Engine):
    live = _orphan(engine, lease=300)
    ApiQueue(engine).enqueue(_new_run(), now=None)
    executor = _executor(engine, FakeRunner())
    try:
        assert executor.adopt_once() == 0
    finally:
        executor.stop()
    assert run_status(engine, live.run_id) == "running"
    assert count(engine, "SELECT count(*) FROM tool_run_jobs WHERE status = 'queued'") == 1


def test_sync_orphan__the_reaper_settles_one_whose_engine_has_no_live_api(engine: Engine):
    orphan = _orphan(engine)
    reaper = Reaper(ApiQueue(engine), ReaperConfig(engine_dead_after_seconds=60))
    soon = _db_now(engine) + timedelta(seconds=1)
    assert reaper.run_once(now=soon).leases_cleared == 1
    assert run_status(engine, orphan.run_id) == "running"  # adoptable, not yet given up
    late = soon + timedelta(seconds=61)
    assert reaper.run_once(now=late).failed == 1
    row = _run_row(engine, orphan.run_id)
    assert (row.status, row.error_code) == ("failed", "container_lost")
    assert reaper.run_once(now=late) == reaper.run_once(now=late)  # idempotent


def test_sync_orphan__an_api_of_its_engine_keeps_the_reaper_from_giving_it_up(engine: Engine):
    orphan = _orphan(engine)
    registry = WorkerRegistry(engine)
    registry.register("api-live", "fake-engine", 2)
    reaper = Reaper(ApiQueue(engine), ReaperConfig(engine_dead_after_seconds=60))
    soon = _db_now(engine) + timedelta(seconds=1)
    assert reaper.run_once(now=soon).leases_cleared == 1
    late = soon + timedelta(seconds=61)
    registry.seen("api-live", now=late)
    assert reaper.run_once(now=late).failed == 0
    assert run_status(engine, orphan.run_id) == "running"


class SlowEngine(FakeRunner):
    """A fake engine whose answers about one attempt hang until released, or fail."""

    def __init__(self, handler: Handler = succeed_with_input) -> None:
        super().__init__(handler)
        self.broken: uuid.UUID | None = None
        self.asked = threading.Event()
        self.answer = threading.Event()

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        if run_id == self.broken:
            raise RuntimeError("an answer nobody expected")
        self.asked.set()
        assert self.answer.wait(30)
        return super().state(run_id, attempt)


def _locked_until(engine: Engine, run_id: str | uuid.UUID) -> Any:
    return _job_row(engine, run_id).locked_until


def test_sync__a_slow_adoption_never_delays_the_renewal_of_live_runs(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    gate = Gate()
    runner = SlowEngine(gate)
    orphan = _orphan(engine)
    app = make_app(
        database_url,
        engine,
        registry,
        runner,
        lease_seconds=1.5,
        reaper_interval_seconds=0.1,
        **SYNC,
    )
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(http.post, "/v1/runs", json={"tool": "echo"}, headers=acme)
            try:
                assert gate.started.acquire(timeout=10)
                assert runner.asked.wait(10)  # the adopter hangs on the orphan's container
                live = "SELECT id FROM tool_runs WHERE status = 'running' AND id <> :orphan"
                with engine.connect() as conn:
                    run_id = conn.execute(text(live), {"orphan": orphan.run_id}).scalar_one()
                first = wait_until(lambda: _locked_until(engine, run_id))
                wait_until(lambda: _locked_until(engine, run_id) > first, timeout=10)
                assert not runner.answer.is_set()  # renewed while the adoption still hangs
            finally:
                runner.answer.set()
                gate.release.set()
            assert pending.result(timeout=10).json()["status"] == "succeeded"
        wait_until(lambda: run_status(engine, orphan.run_id) == "failed", timeout=10)


def test_sync_orphan__one_that_cannot_be_settled_never_stops_the_others(
    engine: Engine, caplog: pytest.LogCaptureFixture
):
    runner = SlowEngine()
    runner.answer.set()
    bad = _orphan(engine)
    good = [_orphan(engine) for _ in range(2)]
    runner.broken = bad.run_id
    executor = _executor(engine, runner, max_concurrency=4)
    try:
        assert executor.adopt_once() == 3
        wait_until(lambda: executor.busy == 0, timeout=10)
    finally:
        executor.stop()
    assert [_run_row(engine, j.run_id).error_code for j in good] == ["api_lost", "api_lost"]
    # It would crash the same way on every adoption: the run ends instead of looping.
    row = _run_row(engine, bad.run_id)
    assert (row.status, row.error_code) == ("failed", "internal_error")
    assert any(
        r.message.startswith("sync attempt crashed") and r.run_id == str(bad.run_id)  # type: ignore[attr-defined]
        for r in caplog.records
    )


def test_sync__the_api_sweeps_leftover_containers(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    runner = FakeRunner()
    app = make_app(
        database_url,
        engine,
        registry,
        runner,
        sweep_interval_seconds=0.2,
        sweep_grace_seconds=0,
        **SYNC,
    )
    stray = (uuid.uuid4(), 1)
    with TestClient(app) as client:
        run = client.post("/v1/runs", json={"tool": "echo"}, headers=acme).json()
        assert run["status"] == "succeeded"
        # Its container outlived the run (a removal that failed), beside a stranger's.
        leftover = (uuid.UUID(run["id"]), 1)
        # A sweep may already have removed it beside the attempt's own removal: only the
        # removals from here on are the sweep's answer to the leftover.
        before = len(runner.discarded)
        runner.containers[leftover] = ContainerState.EXITED
        runner.containers[stray] = ContainerState.EXITED
        wait_until(lambda: leftover not in runner.containers, timeout=10)
    assert runner.discarded[before:] == [leftover]
    assert stray in runner.containers  # the database does not know it: reported, kept


# --- the same paths with Docker ---


@pytest.mark.slow  # a burst of real containers
@pytest.mark.docker
def test_sync_docker__burst_of_3c_then_nothing_left_running(
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
    acme,
):
    cap = 2
    app = make_app(
        database_url,
        engine,
        registry,
        DockerRunner(docker_client),
        sync_max_concurrency=cap,
        **SYNC,
    )
    barrier = threading.Barrier(3 * cap)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:

        def post(_: int) -> tuple[httpx2.Response, float]:
            barrier.wait()
            started = time.monotonic()
            response = http.post(
                "/v1/runs", json={"tool": "sleep", "input": {"seconds": 1}}, headers=acme
            )
            return response, time.monotonic() - started

        with ThreadPoolExecutor(3 * cap) as pool:
            results = list(pool.map(post, range(3 * cap)))
    admitted = [(r, t) for r, t in results if r.status_code == 200]
    refused = [(r, t) for r, t in results if r.status_code == 429]
    assert len(admitted) == cap and len(refused) == 2 * cap, [r.text for r, _ in results]
    assert all(t < 1.0 for _, t in refused)  # at once, not after a slot freed
    assert all(t >= 1.0 for _, t in admitted)
    for response, _ in admitted:
        body = response.json()
        assert body["status"] == "succeeded" and body["result"] == {"slept": True}
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE status IN ('queued','running')") == 0
    # Only this test's runs: another session may share the engine.
    ours = {str(response.json()["id"]) for response, _ in admitted}
    label = {"label": "io.runyard.managed=true", "status": "running"}
    running = docker_client.containers.list(filters=label)
    assert [c for c in running if c.labels.get("io.runyard.run_id") in ours] == []


@pytest.mark.docker
def test_sync_docker__runs_logs_and_events_with_the_real_runner(
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
    acme,
):
    app = make_app(database_url, engine, registry, DockerRunner(docker_client), **SYNC)
    with TestClient(app) as client:
        script = "echo to-out; echo to-err >&2; exit 4"
        response = client.post(
            "/v1/runs", json={"tool": "shell", "input": {"script": script}}, headers=acme
        )
        assert response.status_code == 200, response.text
        run = response.json()
        assert run["status"] == "failed" and run["exit_code"] == 4
        assert run["error_code"] == "tool_failed" and run["mode"] == "sync"
        logs = f"/v1/runs/{run['id']}/logs"
        assert client.get(logs, params={"stream": "stdout"}, headers=acme).text == "to-out\n"
        assert client.get(logs, params={"stream": "stderr"}, headers=acme).text == "to-err\n"
        events = client.get(f"/v1/runs/{run['id']}/events", headers=acme).text
        assert "event: claimed" in events and '"status": "failed"' in events
    assert docker_client.containers.list(all=True, filters={"name": f"runyard-{run['id']}-1"}) == []


@pytest.mark.docker
def test_sync_docker__client_disconnect_stops_the_container(
    database_url: str,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
    acme,
):
    app = make_app(database_url, engine, registry, DockerRunner(docker_client), **SYNC)
    with live_server(app) as url:
        with httpx2.Client(base_url=url, timeout=1.0) as impatient:
            with pytest.raises(httpx2.ReadTimeout):
                impatient.post(
                    "/v1/runs", json={"tool": "sleep", "input": {"seconds": 60}}, headers=acme
                )
        run_id = wait_until(lambda: _only_run_id(engine))
        wait_until(lambda: run_status(engine, run_id) == "cancelled", timeout=30)
    row = _run_row(engine, run_id)
    assert row.error_code == "cancelled" and row.finished_at is not None
    assert docker_client.containers.list(all=True, filters={"name": f"runyard-{run_id}-1"}) == []


@pytest.mark.slow  # sits out a dead API's orphan grace
@pytest.mark.docker
def test_sync_docker__orphan_of_a_dead_api_is_finalized_from_its_container(
    engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    runner = DockerRunner(docker_client)
    tool = registry.get("sleep")
    assert tool is not None
    job = _orphan(
        engine,
        engine_id=runner.engine_id(),
        lease=2,
        tool="sleep",
        spec=tool.snapshot(),
        input={"seconds": 0.5},
    )
    spec = AttemptSpec(job.run_id, 1, job.spec, job.input, job.deadline_at)
    # The API process ran the container to its end and died before it could finalize.
    runner.run(spec, AttemptControl())
    assert run_status(engine, job.run_id) == "running"
    assert runner.state(job.run_id, 1) is ContainerState.EXITED

    executor = _executor(engine, runner)
    try:
        wait_until(lambda: executor.adopt_once() == 1, timeout=10)  # once its lease ran out
        wait_until(lambda: executor.busy == 0, timeout=20)
    finally:
        executor.stop()
    row = _run_row(engine, job.run_id)
    assert row.status == "succeeded" and row.result == {"slept": True}
    assert "sleeping" in row.stdout
    assert runner.state(job.run_id, 1) is ContainerState.MISSING


@pytest.mark.docker
def test_sync_docker__the_api_sweeps_a_container_its_run_left_behind(
    database_url: str, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    runner = DockerRunner(docker_client)
    tool = registry.get("echo")
    assert tool is not None
    job = _orphan(
        engine, engine_id=runner.engine_id(), lease=30, spec=tool.snapshot(), input={"left": 1}
    )
    spec = AttemptSpec(job.run_id, 1, job.spec, job.input, job.deadline_at)
    outcome = runner.run(spec, AttemptControl())
    # Finalized, and then the process died before it removed the container.
    assert ApiQueue(engine).finalize(job.job_id, job.lease_token, outcome)
    assert runner.state(job.run_id, 1) is ContainerState.EXITED
    app = make_app(
        database_url,
        engine,
        registry,
        runner,
        sweep_interval_seconds=0.2,
        sweep_grace_seconds=0,
        **SYNC,
    )
    with TestClient(app):
        wait_until(lambda: runner.state(job.run_id, 1) is ContainerState.MISSING, timeout=20)
    assert docker_client.volumes.list(filters={"name": spec.container_name}) == []


def test_sync__a_submit_during_an_adoption_pass_finds_its_slot(engine: Engine):
    executor = _executor(engine, FakeRunner(), max_concurrency=1, lease_seconds=300)
    queue = executor._queue
    claim = queue.claim
    in_claim, finish_claim = threading.Event(), threading.Event()

    def slow_claim(**kwargs: Any) -> Any:
        in_claim.set()
        assert finish_claim.wait(10)
        return claim(**kwargs)

    try:
        queue.claim = slow_claim  # type: ignore[method-assign]
        adoption = threading.Thread(target=executor.adopt_once)
        adoption.start()
        assert in_claim.wait(10)
        # The adoption pass is inside its claim: the one slot is still free for a submit.
        submitted = executor.claim_new(_new_run(), AdmissionCaps())
        assert submitted.job is not None
        finish_claim.set()
        adoption.join(10)
        executor.start_job(submitted.job).result(timeout=10)
        assert run_status(engine, submitted.run_id) == "succeeded"
    finally:
        finish_claim.set()
        executor.stop()
