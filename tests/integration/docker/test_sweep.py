"""The sweep removes what the database no longer needs, deleted runs' leftovers included,
and only reports strays."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import docker
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import ContainerState, RunStatus
from runyard.maintenance.retention import Deleted, delete_run, prune_expired
from runyard.maintenance.sweep import Sweeper
from runyard.queue import JobQueue, NewRun
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl, RunnerUnavailable
from runyard.runners.docker.runner import DockerRunner
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import bearer, make_app
from worker.service import Worker, WorkerConfig

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def enqueue(queue: JobQueue, **kw: object) -> uuid.UUID:
    fields: dict[str, object] = {"tenant": "t", "tool": "echo", "spec": {}, "input": {}}
    fields.update(kw)
    return queue.enqueue(NewRun(**fields), now=T0).run_id  # type: ignore[arg-type]


def test_sweep__removes_terminal_after_grace_and_superseded(queue: JobQueue, engine: Engine):
    done = enqueue(queue)
    moved_on = enqueue(queue, max_attempts=2)
    live = enqueue(queue)
    stray = uuid.uuid4()
    jobs = {
        j.run_id: j
        for j in queue.claim(worker_id="w", engine_id="e", limit=3, lease_seconds=30, now=T0)
    }
    ok = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
    queue.finalize(jobs[done].job_id, jobs[done].lease_token, ok, now=T0)
    j = jobs[moved_on]
    queue.requeue(j.job_id, j.lease_token, error_code="container_lost", error="x", now=T0)
    queue.claim(
        worker_id="w", engine_id="e", limit=1, lease_seconds=30, now=T0 + timedelta(hours=1)
    )

    runner = FakeRunner()
    for key in [(done, 1), (moved_on, 1), (moved_on, 2), (live, 1), (stray, 1)]:
        runner.containers[key] = ContainerState.EXITED
    sweeper = Sweeper(engine, runner, grace_seconds=60)

    early = sweeper.run_once(now=T0 + timedelta(seconds=30))
    assert early.removed == 1 and early.unknown == 1  # only the superseded attempt
    assert (moved_on, 1) in runner.discarded and (done, 1) not in runner.discarded

    later = sweeper.run_once(now=T0 + timedelta(seconds=61))
    assert later.removed == 1 and (done, 1) in runner.discarded
    assert set(runner.containers) == {(moved_on, 2), (live, 1), (stray, 1)}


@pytest.mark.docker
def test_sweep__with_docker_removes_container_and_volume(
    queue: JobQueue,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
):
    run_id = enqueue(queue, spec=registry.get("echo").snapshot())  # type: ignore[union-attr]
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30, now=T0)
    runner = DockerRunner(docker_client)
    spec = AttemptSpec(run_id, 1, job.spec, {"a": 1}, datetime.now(UTC) + timedelta(seconds=30))
    outcome = runner.run(spec, AttemptControl())
    assert queue.finalize(job.job_id, job.lease_token, outcome, now=T0)
    assert runner.state(run_id, 1) is ContainerState.EXITED
    result = Sweeper(engine, runner, grace_seconds=0).run_once(now=T0 + timedelta(seconds=1))
    assert result.removed == 1
    assert runner.state(run_id, 1) is ContainerState.MISSING
    assert not docker_client.volumes.list(filters={"name": spec.container_name})


@pytest.mark.docker
def test_sweep__with_docker_removes_a_deleted_runs_container_and_volume(
    queue: JobQueue,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
):
    run_id = enqueue(queue, spec=registry.get("echo").snapshot())  # type: ignore[union-attr]
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30, now=T0)
    runner = DockerRunner(docker_client)
    spec = AttemptSpec(run_id, 1, job.spec, {"a": 1}, datetime.now(UTC) + timedelta(seconds=30))
    outcome = runner.run(spec, AttemptControl())
    assert queue.finalize(job.job_id, job.lease_token, outcome, now=T0)
    # The worker's removal never happened (its engine was down then); the run is deleted.
    assert delete_run(engine, run_id, None)[0] is Deleted.DELETED
    result = Sweeper(engine, runner, grace_seconds=3600).run_once()
    assert result.removed == 1
    assert runner.state(run_id, 1) is ContainerState.MISSING
    assert not docker_client.volumes.list(filters={"name": spec.container_name})


class StuckRunner(FakeRunner):
    """A fake engine whose removals fail while ``stuck`` is set (it did not answer then)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = threading.Event()

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        if self.stuck.is_set():
            raise RunnerUnavailable("the fake engine does not answer")
        super().discard(run_id, attempt)


def tombstones(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT run_id FROM deleted_runs")).scalars())


def test_sweep__removes_the_container_of_a_run_deleted_while_the_engine_could_not(
    database_url: str, queue: JobQueue, engine: Engine, registry: ToolRegistry
):
    runner = StuckRunner()
    runner.stuck.set()
    worker = Worker(queue, runner, WorkerConfig(worker_id="w-stuck"))
    new = NewRun(tenant="acme", tool="echo", spec={}, input={})
    run_id = queue.enqueue(new).run_id
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=10)
    worker.close()  # its cleanup failed: deferred to the sweep
    assert runner.containers == {(run_id, 1): ContainerState.EXITED}
    stray = uuid.uuid4()  # another stack's attempt on the same engine
    runner.containers[(stray, 1)] = ContainerState.EXITED

    with TestClient(make_app(database_url, engine, registry)) as client:
        deleted = client.delete(f"/v1/runs/{run_id}", headers=bearer(engine, "acme"))
    assert deleted.status_code == 204
    assert tombstones(engine) == {run_id}

    sweeper = Sweeper(engine, runner, grace_seconds=60)
    assert sweeper.run_once().kept == 1  # still stuck: kept for the next pass
    runner.stuck.clear()
    swept = sweeper.run_once()
    assert (swept.removed, swept.unknown) == (1, 1)
    assert set(runner.containers) == {(stray, 1)}  # never known: never touched


def test_sweep__removes_the_containers_of_runs_retention_deleted(queue: JobQueue, engine: Engine):
    done = enqueue(queue)
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30, now=T0)
    ok = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
    assert queue.finalize(job.job_id, job.lease_token, ok, now=T0)
    never_started = enqueue(queue)
    queue.cancel(never_started, now=T0)
    runner = FakeRunner()
    runner.containers[(done, 1)] = ContainerState.EXITED
    pruned = prune_expired(queue, retention_seconds=60, batch=10, now=T0 + timedelta(seconds=61))
    assert pruned == 2
    # A run that never started had no container: no tombstone for it.
    assert tombstones(engine) == {done}
    assert Sweeper(engine, runner).run_once().removed == 1
    assert runner.containers == {}


def test_sweep__forgets_a_tombstone_after_its_time_and_then_leaves_the_container(
    queue: JobQueue, engine: Engine
):
    run_id = enqueue(queue)
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30, now=T0)
    ok = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
    assert queue.finalize(job.job_id, job.lease_token, ok, now=T0)
    assert delete_run(engine, run_id, None)[0] is Deleted.DELETED
    with engine.begin() as conn:
        conn.execute(text("UPDATE deleted_runs SET deleted_at = now() - interval '8 days'"))
    runner = FakeRunner()
    runner.containers[(run_id, 1)] = ContainerState.EXITED
    swept = Sweeper(engine, runner).run_once()
    assert (swept.forgotten, swept.removed, swept.unknown) == (1, 0, 1)
    assert tombstones(engine) == set() and (run_id, 1) in runner.containers


def test_sweep__names_each_stray_once_while_it_stays(
    engine: Engine, caplog: pytest.LogCaptureFixture
):
    runner = FakeRunner()
    first, second = uuid.uuid4(), uuid.uuid4()
    sweeper = Sweeper(engine, runner, grace_seconds=60)
    stray = "labelled container of a run the database does not know"

    def logged() -> list[tuple[str, str]]:
        lines = [(r.getMessage(), getattr(r, "run_id", "")) for r in caplog.records]
        caplog.clear()
        return lines

    caplog.set_level("INFO", logger="runyard.maintenance.sweep")
    runner.containers[(first, 1)] = ContainerState.EXITED
    assert sweeper.run_once(now=T0).unknown == 1
    assert logged() == [(stray, str(first)), ("sweep", "")]
    assert sweeper.run_once(now=T0).unknown == 1  # still there: counted, nothing logged
    assert logged() == []
    runner.containers[(second, 1)] = ContainerState.EXITED
    assert sweeper.run_once(now=T0).unknown == 2
    assert logged() == [(stray, str(second)), ("sweep", "")]
    del runner.containers[(first, 1)]
    assert sweeper.run_once(now=T0).unknown == 1
    runner.containers[(first, 1)] = ContainerState.EXITED  # gone, then back: named again
    assert sweeper.run_once(now=T0).unknown == 2
    assert logged() == [(stray, str(first)), ("sweep", "")]
