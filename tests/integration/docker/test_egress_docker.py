"""A tool with an egress allow-list against the real engine: only listed destinations answer,
private, metadata and unlisted ones are refused, and each connection is a run event with its
byte counts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from runyard.domain.states import RunStatus
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.egress import EGRESS_DNS, EgressGate, egress_name
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker.test_docker_runner import shell
from tests.integration.docker.test_tool_isolation_docker import PAGE, _listener

pytestmark = pytest.mark.docker


@pytest.fixture
def outbound(docker_client: docker.DockerClient) -> Iterator[str]:
    """The test's own outbound network (the proxy's way out), removed after."""
    network = docker_client.networks.create(f"runyard-test-out-{uuid.uuid4().hex[:12]}")
    try:
        yield str(network.name)
    finally:
        network.remove()


@pytest.fixture
def listener(docker_client: docker.DockerClient, outbound: str) -> Iterator[tuple[str, str]]:
    """A listener on the outbound network: its container name and address."""
    name = f"runyard-test-listener-{uuid.uuid4().hex[:12]}"
    for ip in _listener(docker_client, outbound, name):
        yield name, ip


@pytest.mark.slow  # sits out a 3 s connect that the tool's network drops
def test_egress__only_listed_destinations_answer_and_each_connection_is_an_event(
    docker_client: docker.DockerClient,
    registry: ToolRegistry,
    outbound: str,
    listener: tuple[str, str],
):
    name, ip = listener
    runner = DockerRunner(docker_client, egress=EgressGate(docker_client.api, outbound))
    script = (
        f"wget -q -O - http://{ip}:8080/ && echo listed-answered; "
        # Listed by name, but the name resolves to a private address.
        f"wget -q -O - http://{name}:8080/ || echo private-refused; "
        "wget -q -O - http://169.254.169.254/ || echo metadata-refused; "
        "wget -q -O - http://unlisted.example:8080/ || echo unlisted-refused; "
        # No lookups through the host's resolvers either: only the proxy's name resolves.
        "nslookup deb.debian.org >/dev/null 2>&1 || echo dns-refused; "
        # Around the proxy: the tool's network has no other way out.
        f"timeout 3 wget -Y off -q -O - http://{ip}:8080/ || echo direct-blocked"
    )
    spec = shell(registry, script, egress=[f"{ip}:8080", f"{name}:8080"])
    notes: list[tuple[str, dict[str, Any]]] = []
    control = AttemptControl(note=lambda kind, data: notes.append((kind, data)))
    try:
        result = runner.run(spec, control)
        host = docker_client.api.inspect_container(spec.container_name)["HostConfig"]
        assert host["NetworkMode"] == egress_name(spec.container_name)
        # The mechanism itself: this machine answers no container's lookups anyway.
        assert host["Dns"] == EGRESS_DNS
    finally:
        runner.discard(spec.run_id, spec.attempt)
    assert result.status == RunStatus.SUCCEEDED, result
    assert result.stdout.splitlines() == [
        PAGE,
        "listed-answered",
        "private-refused",
        "metadata-refused",
        "unlisted-refused",
        "dns-refused",
        "direct-blocked",
    ]
    events = {data["host"]: data for kind, data in notes if kind == "egress"}
    assert [kind for kind, _ in notes] == ["egress"] * 4
    answered = events[ip]
    assert answered["allowed"] is True and answered["address"] == ip
    assert answered["bytes_in"] > len(PAGE) and answered["bytes_out"] > 0
    private = events[name]
    assert private["allowed"] is False and private["address"] == ip
    assert private["reason"] == f"{ip} is a private address, not listed by address"
    assert events["169.254.169.254"]["reason"] == (
        "169.254.169.254:80 is not on the tool's egress list"
    )
    assert events["unlisted.example"]["address"] == ""  # refused before any lookup
    assert all(e["bytes_in"] == 0 for e in events.values() if not e["allowed"])
    # The proxy and the attempt's network went with the attempt.
    assert docker_client.networks.list(names=[egress_name(spec.container_name)]) == []
    assert not docker_client.containers.list(
        all=True, filters={"name": egress_name(spec.container_name)}
    )


@pytest.mark.slow  # sits out an orphaned proxy's sweep
def test_sweep__an_orphaned_proxy_goes_one_of_a_listed_attempt_waits_for_its_discard(
    docker_client: docker.DockerClient, registry: ToolRegistry
):
    # Two proxies as a worker that died after making them would leave: one whose attempt
    # has a (labelled) volume left, one whose attempt left nothing.
    maker = EgressGate(docker_client.api)
    tool = {"egress": ["api.example.org:443"]}
    kept = shell(registry, "true")
    orphan = shell(registry, "true")
    for spec in (kept, orphan):
        maker.prepare(spec.container_name, tool, {"io.runyard.run_id": str(spec.run_id)})
    docker_client.volumes.create(
        kept.container_name,
        labels={
            "io.runyard.managed": "true",
            "io.runyard.run_id": str(kept.run_id),
            "io.runyard.attempt": "1",
        },
    )
    sweeper = DockerRunner(docker_client, egress=EgressGate(docker_client.api, orphan_seconds=0))
    try:
        sweeper.managed_attempts()
        assert not _exists(docker_client, egress_name(orphan.container_name))
        assert _exists(docker_client, egress_name(kept.container_name))
        sweeper.discard(kept.run_id, kept.attempt)
        assert not _exists(docker_client, egress_name(kept.container_name))
        assert docker_client.networks.list(names=[egress_name(kept.container_name)]) == []
    finally:
        for spec in (kept, orphan):
            maker.remove(spec.container_name)


def _exists(client: docker.DockerClient, name: str) -> bool:
    """Whether a container of exactly that name exists (one list call: no inspect to race)."""
    return bool(client.api.containers(all=True, filters={"name": f"^/{name}$"}))
