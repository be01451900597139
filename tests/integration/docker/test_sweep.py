"""The sweep removes what the database no longer needs and only reports strays."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import docker
import pytest
from sqlalchemy import Engine

from runyard.docker.runner import DockerRunner
from runyard.models import RunStatus
from runyard.queue import JobQueue, NewRun
from runyard.runner import AttemptControl, AttemptResult, AttemptSpec, ContainerState
from runyard.sweep import Sweeper
from runyard.testing import FakeRunner
from runyard.tools import ToolRegistry

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
