"""Limits on what a tool writes and how long it may stay quiet, against the real engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from runyard.domain.attempt import container_name
from runyard.domain.states import RunStatus
from runyard.platform.settings import Settings
from runyard.registry.tools import ToolRegistry, load_registry
from runyard.runner import AttemptControl
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.runner import DockerLimits, DockerRunner
from tests.integration.conftest import ROOT
from tests.integration.docker.test_docker_runner import shell, spec_for

pytestmark = pytest.mark.docker

# Many 1 MiB files: no single file reaches the per-file cap, only the sum passes disk_mb.
FILL_MANY = "i=0; while true; do head -c 1048576 /dev/zero > /runyard/out/f$i; i=$((i+1)); done"
FILL_ONE = "head -c 100000000 /dev/zero > /runyard/out/big"


@pytest.fixture(params=["upload", "host"])
def limited_runner(
    request: pytest.FixtureRequest, docker_client: docker.DockerClient, tmp_path: Path
) -> DockerRunner:
    """The adapter with a short stop grace, inputs uploaded or in host work directories."""
    limits = DockerLimits(stop_grace_seconds=1)
    if request.param == "upload":
        return DockerRunner(docker_client, limits)
    workdirs = HostWorkdirs.open(str(tmp_path / "attempts"))
    return DockerRunner(docker_client, limits, workdirs=workdirs)


@pytest.mark.parametrize("script", [FILL_MANY, FILL_ONE], ids=["many-files", "one-file"])
def test_disk_limit__a_fill_is_stopped_and_named(
    limited_runner: DockerRunner,
    registry: ToolRegistry,
    script: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
):
    spec = shell(registry, script, disk_mb=20)
    result = limited_runner.run(spec, AttemptControl())
    assert (result.status, result.error_code) == (RunStatus.FAILED, "disk_limit_exceeded")
    assert result.error == "the tool wrote more than 20 MB under /runyard"
    name = container_name(spec.run_id, spec.attempt)
    assert docker_client.containers.list(all=True, filters={"name": name})
    limited_runner.discard(spec.run_id, spec.attempt)
    # What the tool wrote is gone with its container, volume and work directory. The host's
    # free space is no measure of it: on a shared engine other processes write meanwhile.
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert docker_client.volumes.list(filters={"name": name}) == []
    assert not (tmp_path / "attempts" / name).exists()


def test_disk_limit__writing_under_it_succeeds(
    limited_runner: DockerRunner, registry: ToolRegistry
):
    script = "head -c 5000000 /dev/zero > /runyard/out/data; echo '{}' > /runyard/out/result.json"
    result = limited_runner.run(shell(registry, script, disk_mb=20), AttemptControl())
    assert (result.status, result.result) == (RunStatus.SUCCEEDED, {})


@pytest.mark.slow  # sits out an idle timeout
def test_idle_timeout__a_silent_tool_is_warned_then_stopped(
    docker_client: docker.DockerClient, registry: ToolRegistry
):
    runner = DockerRunner(docker_client, DockerLimits(stop_grace_seconds=1))
    notes: list[tuple[str, dict[str, Any]]] = []
    control = AttemptControl(note=lambda kind, data: notes.append((kind, data)))
    spec = shell(registry, "echo started; sleep 60", idle_timeout_seconds=3)
    result = runner.run(spec, control)
    assert (result.status, result.error_code) == (RunStatus.TIMED_OUT, "idle_timeout")
    assert result.error == "the tool printed nothing for 3 s"
    assert result.stdout == "started\n"
    assert [kind for kind, _ in notes] == ["stale"]


@pytest.mark.slow  # the tool prints for 6 s by design
def test_idle_timeout__a_tool_that_keeps_printing_runs_to_its_end(
    docker_client: docker.DockerClient, registry: ToolRegistry
):
    runner = DockerRunner(docker_client, DockerLimits(stop_grace_seconds=1))
    notes: list[str] = []
    control = AttemptControl(note=lambda kind, data: notes.append(kind))
    script = "for i in 1 2 3 4 5 6; do echo tick$i; sleep 1; done"
    result = runner.run(shell(registry, script, idle_timeout_seconds=3), control)
    assert result.status == RunStatus.SUCCEEDED, result
    assert notes == []


def test_wordcount__the_shipped_example_does_real_work(
    docker_runner: DockerRunner, registry: ToolRegistry
):
    shipped = load_registry(
        ROOT / "tools" / "tools.toml",
        Settings(database_url="unused"),
    )
    spec = spec_for(shipped, "wordcount", {"text": "the quick brown fox"})
    result = docker_runner.run(spec, AttemptControl())
    assert (result.status, result.result) == (RunStatus.SUCCEEDED, {"words": 4})
