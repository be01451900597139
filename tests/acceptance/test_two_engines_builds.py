"""Two Docker engines on one machine: a built tool is built once on each engine whose
workers run it, and each engine's runs wait for that engine's own build."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from runyard.runners.docker.runner import DockerRunner
from tests.acceptance.builds_support import remove_images, use_built_tool
from tests.acceptance.cluster import Cluster, Expected
from tests.acceptance.second_engine import SecondEngine, started_engine

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

# Not the name test_two_engines.py uses: the two may run on one machine at once.
B_NAME = "runyard-engine-builds"


@pytest.fixture
def engine_b(tmp_path: Path) -> Iterator[SecondEngine]:
    """A second dockerd of this test's own (see ``tests/acceptance/second_engine.py``)."""
    with started_engine(B_NAME, tmp_path) as engine:
        yield engine


def builds(cluster: Cluster) -> list[tuple[str, str, int]]:
    with cluster.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT engine_id, status, attempts FROM tool_builds ORDER BY engine_id")
        ).all()
    return [(r.engine_id, r.status, r.attempts) for r in rows]


def test_two_engines__each_builds_once_and_runs_on_both_succeed(
    cluster: Cluster, engine_b: SecondEngine, tmp_path: Path
):
    engine_a_id = DockerRunner(cluster.docker_client).engine_id()
    engine_b_id = DockerRunner(engine_b.client).engine_id()
    tool = use_built_tool(cluster, tmp_path, build_seconds=2)
    try:
        # Both workers are up before the runs arrive: each engine asks for its build while
        # every run still waits (a build takes 2 s), so neither engine can run them all first.
        cluster.start_worker("wb", concurrency=2, DOCKER_HOST=engine_b.host)
        cluster.start_worker("wa", concurrency=2)
        cluster.wait_for(
            lambda: all("worker started" in cluster.log_of(name) for name in ("wa", "wb")),
            60,
            "both workers to start",
        )
        run_ids = [
            cluster.submit(tool, {"n": i}, Expected("succeeded", 0, {"n": i}, check_result=True))
            for i in range(8)
        ]
        cluster.drain(timeout=180)
        assert cluster.check_invariants() == {"runs": 8, "extra_attempts": 0}
        assert builds(cluster) == sorted([(engine_a_id, "ready", 1), (engine_b_id, "ready", 1)])
        for client in (cluster.docker_client, engine_b.client):
            assert client.images.list(name=f"runyard-build/{tool}")
        with cluster.engine.connect() as conn:
            engines = set(
                conn.execute(
                    text("SELECT DISTINCT engine_id FROM tool_run_jobs WHERE run_id = ANY(:ids)"),
                    {"ids": run_ids},
                ).scalars()
            )
        assert engines <= {engine_a_id, engine_b_id}
    finally:
        remove_images(cluster.docker_client, tool)
