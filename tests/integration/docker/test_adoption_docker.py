"""Adoption by a worker against real Docker: every container state, one finalize each."""

from __future__ import annotations

import gc
import uuid
import warnings
from datetime import UTC, datetime, timedelta

import docker
import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptSpec
from runyard.domain.states import ContainerState
from runyard.queue import ClaimedJob, JobQueue
from runyard.registry.tools import ToolRegistry, ToolSpec
from runyard.runner import AttemptControl, RunnerUnavailable
from runyard.runners.docker.runner import DockerRunner
from runyard.submission.request import prepare_run
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker


def orphan(queue: JobQueue, registry: ToolRegistry, engine_id: str, tool: str, value: object):
    """A run claimed by a worker that then died: its lease released, adoptable."""
    run_id = queue.enqueue(
        prepare_run(registry, tenant="t", tool_name=tool, input_value=value)
    ).run_id
    [job] = queue.claim(worker_id="dead", engine_id=engine_id, limit=1, lease_seconds=30)
    return run_id, job


def release(queue: JobQueue, job: ClaimedJob) -> None:
    assert queue.release(job.job_id, job.lease_token)


def spec_of(job: ClaimedJob) -> AttemptSpec:
    return AttemptSpec(job.run_id, job.attempt, job.spec, job.input, job.deadline_at)


def adopt_with_new_worker(queue: JobQueue, docker_client: docker.DockerClient) -> Worker:
    worker = Worker(queue, DockerRunner(docker_client), WorkerConfig(worker_id="adopter"))
    assert worker.run_once().adopted == 1
    assert worker.wait_idle(timeout=60)
    worker.close()
    return worker


def run_row(engine: Engine, run_id: uuid.UUID):
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, exit_code, attempts, error_code, "
                "(SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id "
                " AND e.type = 'status' AND e.data->>'status' NOT IN ('queued', 'running'))"
                " AS finals FROM tool_runs r WHERE id = :id"
            ),
            {"id": run_id},
        ).one()


def test_exited_before_finalize__finalized_once_with_real_exit_code(
    queue: JobQueue, engine: Engine, registry: ToolRegistry, docker_client: docker.DockerClient
):
    runner = DockerRunner(docker_client)
    run_id, job = orphan(queue, registry, runner.engine_id(), "fail", {})
    outcome = runner.run(spec_of(job), AttemptControl())  # the dead worker's container ran
    assert outcome.exit_code == 3
    release(queue, job)  # ... and the worker died before finalize
    adopt_with_new_worker(queue, docker_client)
    row = run_row(engine, run_id)
    assert (row.status, row.exit_code, row.attempts, row.finals) == ("failed", 3, 1, 1)


@pytest.mark.parametrize("requested", [False, True])
def test_missing_container__requeued_charged_only_if_it_was_requested(
    queue: JobQueue,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
    requested: bool,
):
    runner = DockerRunner(docker_client)
    run_id = queue.enqueue(
        prepare_run(registry, tenant="t", tool_name="sleep", input_value={"seconds": 0})
    ).run_id
    [job] = queue.claim(worker_id="dead", engine_id=runner.engine_id(), limit=1, lease_seconds=30)
    if requested:  # the dead worker had asked for the container, which is now gone
        assert queue.mark_container_requested(job.job_id, job.lease_token)
    release(queue, job)
    adopt_with_new_worker(queue, docker_client)
    row = run_row(engine, run_id)
    assert row.status == "queued"
    assert row.attempts == (1 if requested else 0)
    with engine.begin() as conn:  # skip the backoff
        conn.execute(
            text("UPDATE tool_run_jobs SET available_at = now() WHERE run_id = :id"),
            {"id": run_id},
        )
    worker = Worker(queue, runner, WorkerConfig(worker_id="w2"))
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=60)
    worker.close()
    row = run_row(engine, run_id)
    assert (row.status, row.attempts, row.finals) == ("succeeded", 2 if requested else 1, 1)


@pytest.mark.parametrize("requested", [True, False])
def test_created_never_started__removed_and_requeued(
    queue: JobQueue,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
    requested: bool,
):
    runner = DockerRunner(docker_client)
    runner.ping()  # the engine answers
    run_id, job = orphan(queue, registry, runner.engine_id(), "echo", {"a": 1})
    if requested:  # as a worker does before it creates the container
        assert queue.mark_container_requested(job.job_id, job.lease_token)
    docker_client.containers.create(
        "runyard/toolbox:latest",
        ["true"],
        name=spec_of(job).container_name,
        labels={"io.runyard.managed": "true"},
    )
    release(queue, job)
    adopt_with_new_worker(queue, docker_client)
    row = run_row(engine, run_id)
    # Charged only if it was requested (the adoption rule); echo has max_attempts = 1.
    assert (row.status, row.attempts) == (("failed", 1) if requested else ("queued", 0))
    assert runner.state(run_id, 1) is ContainerState.MISSING


@pytest.mark.slow  # sits out an unreachable engine
def test_docker_unreachable__decides_nothing():
    # urllib3 leaves the socket of a failed unix-socket connect to the garbage collector;
    # that is the client library's habit, not a leak of ours, so collect it here quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _unreachable_engine_raises()
        gc.collect()


def _unreachable_engine_raises() -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    runner = DockerRunner(client)
    with pytest.raises(RunnerUnavailable):
        runner.ping()
    with pytest.raises(RunnerUnavailable):
        runner.state(uuid.uuid4(), 1)
    with pytest.raises(RunnerUnavailable):
        runner.engine_id()
    spec = AttemptSpec(
        uuid.uuid4(),
        1,
        ToolSpec(name="x", image="i", command=["true"]).snapshot(),
        {},
        datetime.now(UTC) + timedelta(seconds=5),
    )
    with pytest.raises(RunnerUnavailable):
        runner.run(spec, AttemptControl())
    client.close()
