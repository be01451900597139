"""The conformance suite: the runner contract, hostile tools and escape probes, each run
under every isolation tier this engine offers (docs/isolation.md).

The tests are the integration tests' own, collected again here with the ``registry`` fixture
overridden: every tool of the tests' registry names the tier's runtime, so each test runs its
containers under that tier. ``RUNYARD_CONFORMANCE_TIERS`` (comma-separated tier names; set by
scripts/test from what it installed) names the tiers that must be there: a missing one fails
instead of skipping.
"""

from __future__ import annotations

import docker
import pytest

from runyard.domain.isolation import (
    KNOWN_TIERS,
    NAMESPACES,
    Tier,
    limits_problem,
    offered_tiers,
)
from runyard.platform.settings import Settings
from runyard.registry.tools import ToolRegistry, load_registry
from tests.conformance.tiers import required_tiers
from tests.integration.conftest import ROOT, docker_client, docker_runner

# The integration fixtures these tests use, offered here too.
__all__ = ["docker_client", "docker_runner"]


@pytest.fixture(scope="session", params=KNOWN_TIERS, ids=[tier.name for tier in KNOWN_TIERS])
def tier(request: pytest.FixtureRequest) -> Tier:
    """One isolation tier; skipped when this engine lacks it, unless it is required."""
    wanted: Tier = request.param
    client = docker.from_env(timeout=30)
    try:
        info = client.info()
    finally:
        client.close()
    unlimited = limits_problem(info)
    if unlimited is not None:
        # Its fork bombs and memory hogs would run unbounded on a shared machine.
        pytest.fail(f"the suite does not run on this engine: {unlimited}")
    if wanted is not NAMESPACES:
        runtimes = (info.get("Runtimes") or {}).keys()
        if wanted not in offered_tiers(runtimes):
            if wanted.name in required_tiers():
                pytest.fail(
                    f"tier {wanted.name} is required but the engine has no {wanted.runtime}"
                )
            pytest.skip(f"this engine offers no {wanted.name} tier (runtime {wanted.runtime})")
    return wanted


@pytest.fixture(scope="session")
def registry(tier: Tier) -> ToolRegistry:
    """The tests' registry with every tool under ``tier``'s runtime."""
    base = load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="unused"))
    tools = {
        name: tool.model_copy(update={"runtime": tier.runtime}) for name, tool in base.tools.items()
    }
    return ToolRegistry(tools=tools, base_dir=base.base_dir)
