"""A tool's network under each tier: the bridge reaches a listener, no network reaches
nothing, an egress allow-list lets through only what it lists."""

from __future__ import annotations

import docker
import pytest

from runyard.domain.isolation import GVISOR, Tier
from runyard.registry.tools import ToolRegistry
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker import test_egress_docker as egress
from tests.integration.docker import test_tool_isolation_docker as isolation
from tests.integration.docker.test_egress_docker import listener, outbound
from tests.integration.docker.test_tool_isolation_docker import bridge_listener

pytestmark = pytest.mark.docker

__all__ = ["bridge_listener", "listener", "outbound"]
PASSTHROUGH = "gVisor in passthrough networking mode: networked tools are unreliable under it"


def _passthrough(client: docker.DockerClient, tier: Tier) -> bool:
    """Whether the engine runs this tier's runtime with the host's network stack."""
    runtime = (client.info().get("Runtimes") or {}).get(tier.runtime) or {}
    return "--network=host" in (runtime.get("runtimeArgs") or [])


def test_network__each_tier_reaches_the_bridge_and_nothing_without_a_network(
    tier: Tier,
    docker_client: docker.DockerClient,
    docker_runner: DockerRunner,
    registry: ToolRegistry,
    bridge_listener: str,
):
    if tier is GVISOR and _passthrough(docker_client, tier):
        # Debian's runsc on a newer kernel: passthrough reads fail now and then with EAGAIN
        # (docs/isolation.md, "gVisor and networks"); offline tools are proved all the same.
        pytest.skip(
            "gVisor in passthrough networking mode: networked tools are unreliable under it"
        )
    isolation.test_network__a_bridge_tool_reaches_a_listener_a_none_tool_cannot(
        docker_runner, registry, bridge_listener
    )


@pytest.mark.slow  # sits out a 3 s connect that the tool's network drops
def test_egress__each_tier_reaches_listed_destinations_only(
    tier: Tier,
    docker_client: docker.DockerClient,
    registry: ToolRegistry,
    outbound: str,
    listener: tuple[str, str],
):
    if tier is GVISOR and _passthrough(docker_client, tier):
        pytest.skip(PASSTHROUGH)
    egress.test_egress__only_listed_destinations_answer_and_each_connection_is_an_event(
        docker_client, registry, outbound, listener
    )
