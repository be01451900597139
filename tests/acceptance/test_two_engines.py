"""Two Docker engines on one machine: adoption stays on the engine that holds the container."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from runyard.runners.docker.runner import DockerRunner
from tests.acceptance.cluster import Cluster, Expected
from tests.acceptance.second_engine import SecondEngine

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

B_NAME = "runyard-engine-b"
B_HOST = f"unix:///var/run/{B_NAME}.sock"


@pytest.fixture
def engine_b(tmp_path: Path) -> Iterator[docker.DockerClient]:
    """A second dockerd of this test's own (see ``tests/acceptance/second_engine.py``)."""
    engine = SecondEngine(B_NAME, tmp_path)
    try:
        engine.start()
        assert engine.host == B_HOST
        yield engine.client
    finally:
        engine.close()


def test_two_engines__no_cross_adoption_and_dead_engine_runs_requeue_to_b(
    cluster: Cluster, engine_b: docker.DockerClient
):
    engine_a_id = DockerRunner(cluster.docker_client).engine_id()
    engine_b_id = DockerRunner(engine_b).engine_id()
    # Two daemons on one host may report one `docker info` ID; the marker volumes differ.
    assert engine_a_id != engine_b_id

    cluster.start_reaper("reaper", RUNYARD_ENGINE_DEAD_AFTER_SECONDS="4")
    cluster.start_worker("wa", concurrency=1)
    run_id = cluster.submit("sleep", {"seconds": 30}, Expected("succeeded"))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "run on A")
    cluster.kill9("wa")
    cluster.start_worker("wb", concurrency=1, DOCKER_HOST=B_HOST)
    # While A's engine might still come back, B must not adopt the run (it lives on A).
    cluster.wait_for(
        lambda: cluster.run_row(run_id).status == "queued" or cluster.run_row(run_id).attempts == 2,
        60,
        "engine A declared dead and the run requeued",
    )
    assert cluster.run_row(run_id).adoptions == 0
    assert not engine_b.containers.list(all=True, filters={"name": f"runyard-{run_id}-1"})
    cluster.wait_for(
        lambda: (
            bool(engine_b.containers.list(all=True, filters={"name": f"runyard-{run_id}-2"}))
            or cluster.status(run_id) == "succeeded"
        ),
        60,
        "attempt 2 on engine B",
    )
    # The attempt-1 container on the dead engine is not ours to finish any more.
    cluster.docker_client.containers.get(f"runyard-{run_id}-1").remove(force=True)
    cluster.accepted[run_id].status = "succeeded"
    cluster.wait_for(lambda: cluster.status(run_id) == "succeeded", 90, "run to finish on B")
    row = cluster.run_row(run_id)
    assert row.attempts == 2 and row.adoptions == 0 and row.finals == 1
