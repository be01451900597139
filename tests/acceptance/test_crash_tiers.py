"""Crash adoption under every isolation tier the engine offers: a worker killed (-9) while
its tool's container runs under gVisor, or after it exited but before its finalize, leaves
a run the next worker adopts and finalizes once, as under runc (test_crash_matrix)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runyard.domain.isolation import GVISOR
from runyard.platform.settings import Settings
from runyard.registry.tools import load_registry
from tests.acceptance import test_crash_matrix as matrix
from tests.acceptance.cluster import ROOT, Cluster
from tests.conformance.tiers import required_tiers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

TOOL_HEADER = re.compile(r"^(\[tools\.[A-Za-z0-9_-]+\])$", re.MULTILINE)


@pytest.fixture
def gvisor_cluster(cluster: Cluster, tmp_path: Path) -> Cluster:
    """The cluster with every test tool under gVisor (skipped on an engine without it,
    unless scripts/test installed it)."""
    if GVISOR.runtime not in (cluster.docker_client.info().get("Runtimes") or {}):
        if GVISOR.name in required_tiers():
            pytest.fail("the gVisor tier is required but the engine has no runsc")
        pytest.skip("this engine offers no gVisor tier")
    tools = tmp_path / "tools.toml"
    source = (ROOT / "tests" / "tools.toml").read_text()
    tools.write_text(TOOL_HEADER.sub(rf'\1\nruntime = "{GVISOR.runtime}"', source))
    cluster.registry = load_registry(tools, Settings(database_url="unused"))
    assert {tool.runtime for tool in cluster.registry.tools.values()} == {GVISOR.runtime}
    cluster.env["RUNYARD_TOOLS_FILE"] = str(tools)
    return cluster


def test_kill9_while_container_runs_under_gvisor__adopted_not_restarted(
    gvisor_cluster: Cluster,
):
    matrix.test_kill9_while_container_runs__adopted_not_restarted(gvisor_cluster)


def test_kill9_after_exit_before_finalize_under_gvisor__finalized_once(gvisor_cluster: Cluster):
    matrix.test_kill9_after_exit_before_finalize__finalized_once_from_container(gvisor_cluster)
