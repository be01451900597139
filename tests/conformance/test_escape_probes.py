"""Escape probes under each tier: every one is held, and each would see an escape that
happened (a container made loose on purpose, outside the runner)."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from runyard.cli.main import main
from runyard.domain.isolation import Tier
from runyard.runners.docker.probes import (
    PROBE_IMAGE,
    PROBES,
    TierCheck,
    check_tier,
    probe_script,
    read_probes,
)
from runyard.runners.docker.runner import DockerRunner

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def checked(tier: Tier) -> Iterator[TierCheck]:
    """Every probe, run once per tier in one container through the runner."""
    client = docker.from_env(timeout=60)
    try:
        yield check_tier(DockerRunner(client), tier)
    finally:
        client.close()


def test_probe_run__keeps_the_runner_contract(checked: TierCheck):
    assert checked.contract_problem is None
    assert sorted(checked.held) == sorted(probe.name for probe in PROBES)


@pytest.mark.parametrize("probe", [probe.name for probe in PROBES])
def test_escape_probe__is_held(checked: TierCheck, probe: str):
    assert checked.held[probe] is True, f"{probe} escaped under {checked.tier.name}"


def test_escape_probes__see_escapes_in_a_loose_container(docker_client: docker.DockerClient):
    # Root, with capabilities, no seccomp and the host's process namespace: what the
    # runner never makes (runyard.runners.docker.hardening), made here to prove the probes.
    output = docker_client.containers.run(
        PROBE_IMAGE,
        ["sh", "-c", probe_script().rsplit("\n", 1)[0]],
        user="0:0",
        cap_add=["SYS_ADMIN", "MKNOD", "NET_RAW"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        pid_mode="host",
        network_mode="none",
        remove=True,
    ).decode()
    held = read_probes(output)
    escaped = {name for name, ok in held.items() if not ok}
    assert {"capabilities", "mount", "new namespaces", "host processes"} <= escaped, output


def test_doctor__reports_every_tier_the_engine_offers_as_ok(
    capsys: pytest.CaptureFixture[str], tier: Tier
):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"tier {tier.name} ({tier.runtime}): ok" in out
    assert f"  {len(PROBES)} escape probes held" in out
