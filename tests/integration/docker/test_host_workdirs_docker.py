"""Inputs written on the engine's host (bind-backed volumes) against the real engine."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from runyard.domain.attempt import container_name
from runyard.domain.states import ContainerState, RunStatus
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker.test_docker_runner import shell, spec_for

pytestmark = pytest.mark.docker


def files(input_value: object) -> dict[str, bytes]:
    return {"input.json": json.dumps(input_value).encode()}


@pytest.fixture
def workdirs(tmp_path: Path) -> Iterator[HostWorkdirs]:
    yield HostWorkdirs.open(str(tmp_path / "attempts"))


@pytest.fixture
def bound_runner(docker_client: docker.DockerClient, workdirs: HostWorkdirs) -> DockerRunner:
    return DockerRunner(docker_client, workdirs=workdirs)


def test_bound__tool_sees_the_same_contract_and_discard_removes_everything(
    bound_runner: DockerRunner,
    docker_client: docker.DockerClient,
    workdirs: HostWorkdirs,
    registry: ToolRegistry,
):
    script = (
        "id -u; cat /runyard/input.json; echo; "
        "echo tamper > /runyard/input.json 2>/dev/null && echo input-writable; "
        "touch /etc/x 2>/dev/null && echo root-writable; "
        "cp /runyard/input.json /runyard/out/result.json; echo ok"
    )
    spec = shell(registry, script)
    result = bound_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED, result
    lines = result.stdout.split("\n")
    assert lines[0] == "65534"
    assert '"script"' in lines[1]
    assert "input-writable" not in lines and "root-writable" not in lines
    assert lines[2] == "ok"
    assert result.result == {"script": script}
    name = spec.container_name
    volume = docker_client.volumes.get(name)
    assert volume.attrs["Options"]["device"] == str(workdirs.path(name))
    assert volume.attrs["Labels"]["io.runyard.run_id"] == str(spec.run_id)
    mounts = docker_client.containers.get(name).attrs["Mounts"]
    assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", "/runyard")]

    bound_runner.discard(spec.run_id, spec.attempt)
    assert not workdirs.path(name).exists()
    assert bound_runner.state(spec.run_id, spec.attempt) is ContainerState.MISSING
    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(name)


def test_bound__stale_directory_of_a_vanished_container_is_replaced(
    bound_runner: DockerRunner, workdirs: HostWorkdirs, registry: ToolRegistry
):
    spec = spec_for(registry, "echo", {"fresh": True})
    name = spec.container_name
    workdirs.prepare(name, files({"stale": True}), "65534:65534")
    (workdirs.path(name) / "out" / "result.json").write_text('{"stale": true}')
    result = bound_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.SUCCEEDED and result.result == {"fresh": True}


class _InvisibleToEngine(HostWorkdirs):
    """Directories the engine cannot see: as if the worker ran on another host."""

    def prepare(self, name: str, input_value: Any, user: str) -> bool:
        return True


def test_bound__engine_that_cannot_see_the_directory_falls_back_to_uploads(
    docker_client: docker.DockerClient,
    tmp_path: Path,
    registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
):
    workdirs = _InvisibleToEngine(HostWorkdirs.open(str(tmp_path / "elsewhere")).root)
    runner = DockerRunner(docker_client, workdirs=workdirs)
    first = runner.run(spec_for(registry, "echo", {"n": 1}), AttemptControl())
    assert first.status == RunStatus.SUCCEEDED and first.result == {"n": 1}
    assert [r.message for r in caplog.records if r.levelname == "ERROR"] == [
        "the Docker engine cannot see RUNYARD_HOST_WORKDIR_ROOT; uploading inputs instead"
    ]
    second = spec_for(registry, "echo", {"n": 2})
    assert runner.run(second, AttemptControl()).result == {"n": 2}
    assert not docker_client.volumes.get(second.container_name).attrs.get("Options")


def test_bound__orphan_directory_is_listed_for_the_sweep(
    bound_runner: DockerRunner, workdirs: HostWorkdirs
):
    run_id = uuid.uuid4()
    workdirs.prepare(container_name(run_id, 1), files({}), "65534:65534")
    listed = {(a.run_id, a.attempt): a.running for a in bound_runner.managed_attempts()}
    assert listed[(run_id, 1)] is False
    bound_runner.discard(run_id, 1)
    assert not workdirs.path(container_name(run_id, 1)).exists()


def test_bound__a_linked_result_is_refused(bound_runner: DockerRunner, registry: ToolRegistry):
    spec = shell(registry, "ln -s /runyard/input.json /runyard/out/result.json")
    result = bound_runner.run(spec, AttemptControl())
    assert result.status == RunStatus.FAILED and result.error_code == "invalid_result"
    assert result.error == "result.json is a link; only a regular file is accepted"


def test_bound__adopter_without_host_directories_reads_the_result_from_the_engine(
    bound_runner: DockerRunner, docker_client: docker.DockerClient, registry: ToolRegistry
):
    spec = spec_for(registry, "echo", {"via": "engine"})
    assert bound_runner.run(spec, AttemptControl()).result == {"via": "engine"}
    labels = docker_client.containers.get(spec.container_name).labels
    assert labels["io.runyard.workdir"] == "host"
    adopted = DockerRunner(docker_client).run(spec, AttemptControl())
    assert adopted.status == RunStatus.SUCCEEDED and adopted.result == {"via": "engine"}


def test_bound__adopter_with_another_root_reads_the_result_from_the_engine(
    bound_runner: DockerRunner,
    docker_client: docker.DockerClient,
    registry: ToolRegistry,
    tmp_path: Path,
):
    # A rolling change of RUNYARD_HOST_WORKDIR_ROOT: the adopter's root lacks the directory.
    spec = spec_for(registry, "echo", {"via": "other root"})
    assert bound_runner.run(spec, AttemptControl()).result == {"via": "other root"}
    other = DockerRunner(docker_client, workdirs=HostWorkdirs.open(str(tmp_path / "other")))
    adopted = other.run(spec, AttemptControl())
    assert adopted.status == RunStatus.SUCCEEDED and adopted.result == {"via": "other root"}
