"""A worker and the Docker adapter over rootless Podman's Docker-compatible API
(scripts/ensure-podman): the adapter reads a run's result through Podman's archive API, and a
worker refuses the engine where it cannot apply limits (cgroup v1)."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker
import pytest

from runyard.domain.attempt import AttemptSpec
from runyard.domain.states import RunStatus
from runyard.runner import AttemptControl
from runyard.runners.docker.runner import DockerRunner
from tests.acceptance.cluster import ROOT, Cluster

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CGROUP_V2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()


@pytest.fixture(scope="module")
def podman_host() -> str:
    """The rootless Podman engine's DOCKER_HOST, set up by its script (as root)."""
    if os.geteuid() != 0:
        pytest.skip("scripts/ensure-podman sets up a system user: it needs root")
    done = subprocess.run(
        [str(ROOT / "scripts" / "ensure-podman")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_runner_over_podman__a_runs_result_comes_back(podman_host: str):
    client = docker.DockerClient(base_url=podman_host, timeout=60)
    runner = DockerRunner(client)
    spec = AttemptSpec(
        run_id=uuid.uuid4(),
        attempt=1,
        tool={
            "name": "echo",
            "image": "runyard/toolbox:latest",
            "command": ["sh", "-c", "cp /runyard/input.json /runyard/out/result.json"],
            "network": "none",
            "timeout_seconds": 60,
            "memory_mb": 64,
            "cpus": 0.5,
            "pids_limit": 64,
        },
        input={"over": "podman"},
        deadline_at=datetime.now(UTC) + timedelta(seconds=60),
    )
    try:
        result = runner.run(spec, AttemptControl())
    finally:
        runner.discard(spec.run_id, spec.attempt)
        client.close()
    assert (result.status, result.result) == (RunStatus.SUCCEEDED, {"over": "podman"}), result


@pytest.mark.skipif(CGROUP_V2, reason="on cgroup v2 a rootless engine can apply limits")
def test_worker_start__refuses_rootless_podman_on_cgroup_v1(cluster: Cluster, podman_host: str):
    cluster.start_worker("w1", DOCKER_HOST=podman_host)
    assert cluster.wait_exit("w1", timeout=60) == 2
    log = cluster.log_of("w1")
    assert "cannot start" in log and "the engine is rootless on cgroup v1" in log
