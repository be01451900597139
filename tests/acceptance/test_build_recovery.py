"""kill -9 of the worker in the middle of a build: another worker of the engine takes the
build over once its lease runs out, builds it again, and the waiting run succeeds once; the
build's usage is recorded once."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from tests.acceptance.builds_support import remove_images, use_built_tool
from tests.acceptance.cluster import Cluster, Expected

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


def build_row(cluster: Cluster) -> dict[str, object]:
    with cluster.engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, attempts, locked_by, log FROM tool_builds")
        ).one_or_none()
    return {} if row is None else dict(row._mapping)


def test_kill9_mid_build__recovered_by_another_worker_and_the_run_succeeds_once(
    cluster: Cluster, tmp_path: Path
):
    tool = use_built_tool(cluster, tmp_path, build_seconds=6)
    try:
        run_id = cluster.submit(
            tool, {"n": 1}, Expected("succeeded", 0, {"n": 1}, check_result=True)
        )
        cluster.start_worker("w1")
        cluster.wait_for(
            lambda: "build started" in str(build_row(cluster).get("log", "")),
            60,
            "the build to start on w1",
        )
        assert build_row(cluster)["locked_by"] == "w1"
        cluster.kill9("w1")
        assert cluster.status(run_id) == "queued"
        cluster.start_worker("w2")
        cluster.drain(timeout=120)
        figures = cluster.check_invariants()
        assert figures == {"runs": 1, "extra_attempts": 0}
        row = build_row(cluster)
        assert row["status"] == "ready" and row["attempts"] == 2
        assert row["locked_by"] is None
        assert "build done" in str(row["log"])
        assert cluster.run_row(run_id).stdout.startswith("built")
        # Metered once, by w2, from w1's first claim: both workers' time (and, in the
        # build's parent cgroup, both workers' steps' CPU) in one record.
        with cluster.engine.connect() as conn:
            usage = conn.execute(text("SELECT tenant, wall_seconds FROM build_usage")).all()
        assert [u.tenant for u in usage] == ["acceptance"] and usage[0].wall_seconds >= 6
    finally:
        remove_images(cluster.docker_client, tool)
