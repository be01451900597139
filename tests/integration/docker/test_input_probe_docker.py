"""The input-mode probe against the real engine: proved beside it, refused where it differs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from runyard.domain.states import RunStatus
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.engine_marker import EngineMarker
from runyard.runners.docker.inputs import DEFAULT_ROOT, LABEL_PROBE, probe_engine
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker.test_docker_runner import spec_for

pytestmark = pytest.mark.docker
ROOT = DEFAULT_ROOT
needs_unshare = pytest.mark.skipif(
    shutil.which("unshare") is None or sys.platform != "linux", reason="needs util-linux unshare"
)


def _probe_dirs() -> set[Path]:
    return {p for p in Path(DEFAULT_ROOT).iterdir() if p.name.startswith(".probe-")}


def _probe_objects(client: docker.DockerClient) -> set[str]:
    selector = {"label": f"{LABEL_PROBE}=true"}
    # One listing, no inspect per container: another process's probe container may go
    # between a listing and its inspect (a 404).
    listed = client.api.containers(all=True, filters=selector)
    names = {name.lstrip("/") for c in listed for name in c.get("Names") or []}
    volumes = client.api.volumes(filters=selector).get("Volumes") or []
    return names | {v["Name"] for v in volumes}


def test_probe_engine__reads_the_marker_back_beside_the_engine_and_cleans_up(
    docker_client: docker.DockerClient, tmp_path: Path
):
    root = tmp_path / "attempts"
    root.mkdir(mode=0o700)
    before = _probe_objects(docker_client)
    assert probe_engine(docker_client.api, root, EngineMarker(docker_client).image) is None
    assert list(root.iterdir()) == []
    assert _probe_objects(docker_client) <= before


def test_choose_inputs__auto_beside_the_engine_runs_attempts_in_host_directories(
    docker_client: docker.DockerClient, registry: ToolRegistry, caplog: pytest.LogCaptureFixture
):
    runner = DockerRunner(docker_client)
    caplog.set_level("INFO", logger="runyard.runners.docker.inputs")
    choice = runner.choose_inputs("auto")
    assert (choice.mode, choice.root, runner.input_mode) == ("host", DEFAULT_ROOT, "host")
    assert [r.getMessage() for r in caplog.records] == [
        f"inputs: host work directories under {DEFAULT_ROOT}"
    ]
    spec = spec_for(registry, "echo", {"probed": True})
    result = runner.run(spec, AttemptControl())
    labels = docker_client.containers.get(spec.container_name).labels
    assert result.status == RunStatus.SUCCEEDED and result.result == {"probed": True}
    assert labels["io.runyard.workdir"] == "host"
    assert (Path(DEFAULT_ROOT) / spec.container_name / "input.json").exists()
    runner.discard(spec.run_id, spec.attempt)
    assert not (Path(DEFAULT_ROOT) / spec.container_name).exists()


def test_choose_inputs__upload_is_forced_without_a_probe(docker_client: docker.DockerClient):
    runner = DockerRunner(docker_client)
    before = _probe_objects(docker_client)
    choice = runner.choose_inputs("upload")
    assert (choice.mode, runner.input_mode) == ("upload", "upload")
    assert _probe_objects(docker_client) == before


# The same path on both sides but not the same directory, as with an engine on another host:
# this process sees a tmpfs of its own mount namespace over the root, the engine the host's.
PRIVATE_ROOT = """
import json, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", sys.argv[1]], check=True)
import docker
from runyard.runners.docker.runner import DockerRunner
runner = DockerRunner(docker.from_env())
choice = runner.choose_inputs("auto")
print(json.dumps([str(choice.mode), choice.reason, runner.input_mode]))
"""


@needs_unshare
def test_choose_inputs__an_engine_that_sees_another_directory_gets_uploads(
    docker_client: docker.DockerClient,
):
    Path(DEFAULT_ROOT).mkdir(mode=0o700, parents=True, exist_ok=True)
    before = _probe_objects(docker_client)
    dirs_before = _probe_dirs()
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            PRIVATE_ROOT,
            ROOT,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    mode, reason, runner_mode = json.loads(done.stdout)
    assert (mode, runner_mode) == ("upload", "upload")
    assert reason.startswith(f"the Docker engine does not see {DEFAULT_ROOT} as this process does")
    assert _probe_objects(docker_client) <= before
    # Only this probe's directory is judged: another process on the machine may be probing.
    assert _probe_dirs() <= dirs_before
