"""A container the real engine refuses for the run's own settings ends that run at once, as
``container_refused`` with the engine's words, and the worker keeps claiming."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import docker
import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptSpec
from runyard.domain.states import ContainerState, ErrorCode, RunStatus
from runyard.queue import JobQueue, NewRun
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.runner import DockerRunner
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker

# More CPUs than the host has: within the platform's bounds (and an operator's maxima may
# allow it), but the engine refuses the create ("Range of CPUs is from 0.01 to ...").
TOO_MANY_CPUS = float((os.cpu_count() or 1) + 1)


def echo_spec(registry: ToolRegistry, **changes: Any) -> dict[str, Any]:
    tool = registry.get("echo")
    assert tool is not None
    return {**tool.snapshot(), **changes}


def outcome(engine: Engine, run_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT CAST(status AS text) AS status, error_code, error, attempts"
                " FROM tool_runs WHERE id = :id"
            ),
            {"id": run_id},
        ).one()


@pytest.mark.parametrize(
    ("changes", "engine_says"),
    [
        # Refused at the create (400): no container is left.
        ({"cpus": TOO_MANY_CPUS}, "Range of CPUs is from 0.01"),
        # Refused at the start (500): a numeric user past the kernel's range (the registry
        # refuses it now; a snapshot stored before that still meets the engine).
        ({"user": "9999999999:9999999999"}, "uids and gids must be in range"),
        # Refused at the start (500) by the runtime: an rlimit above the engine's own, which
        # the registry's bounds would never let through (driven here with a raw snapshot).
        ({"nofile_limit": 1 << 30}, "error setting rlimit"),
    ],
)
def test_runner__a_container_the_engine_refuses_fails_the_run_with_its_words(
    docker_runner: DockerRunner, registry: ToolRegistry, changes: dict[str, Any], engine_says: str
):
    spec = AttemptSpec(
        uuid.uuid4(), 1, echo_spec(registry, **changes), {}, datetime.now(UTC) + timedelta(30)
    )
    result = docker_runner.run(spec, AttemptControl())
    assert result.status is RunStatus.FAILED, result
    assert result.error_code == ErrorCode.CONTAINER_REFUSED
    assert result.error is not None and engine_says in result.error
    assert result.error.startswith("the Docker engine refused")
    docker_runner.discard(spec.run_id, 1)
    assert docker_runner.state(spec.run_id, 1) is ContainerState.MISSING


def test_worker__a_refused_run_fails_at_once_and_the_next_run_succeeds_right_after(
    queue: JobQueue,
    engine: Engine,
    registry: ToolRegistry,
    docker_client: docker.DockerClient,
):
    worker = Worker(queue, DockerRunner(docker_client), WorkerConfig(worker_id="w-refusals"))
    refused = queue.enqueue(
        NewRun(
            tenant="acme",
            tool="echo",
            spec=echo_spec(registry, cpus=TOO_MANY_CPUS),
            input={},
            max_attempts=3,
        )
    ).run_id
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=60)
    row = outcome(engine, refused)
    assert (row.status, row.error_code, row.attempts) == ("failed", "container_refused", 1)
    assert "Range of CPUs is from 0.01" in row.error
    # Not engine trouble: claims go on without a pause or a backoff.
    assert worker.engine_healthy

    good = queue.enqueue(
        NewRun(tenant="acme", tool="echo", spec=echo_spec(registry), input={"ok": True})
    ).run_id
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=60)
    worker.close()
    assert outcome(engine, good).status == "succeeded"
