"""A tool that writes its secret into its artifacts, their names and a binary file, on the real
engine: text and paths are stored masked, a binary file holding the secret is refused, and the
``invalid_artifact`` error never shows the secret (archive stream and host work directory)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import docker
import pytest
from sqlalchemy import Engine

from runyard.artifact_stores.postgres import PostgresArtifactStore
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.registry.secrets import SecretSource
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker.test_artifacts_docker import stored
from tests.integration.docker.test_docker_runner import spec_for
from tests.integration.queue.test_queue import new_run

pytestmark = pytest.mark.docker

SECRET = "art-s3cr3t-" + uuid.uuid4().hex
KEPT = (
    "cd /runyard/out && printf 'key=%s\\n' \"$TOKEN\" > text.txt && "
    ': > "name-$TOKEN.txt" && mkdir "dir-$TOKEN" && printf inner > "dir-$TOKEN/inner.txt" && '
    "printf '\\377\\376\\000' > plain.bin && echo '{}' > result.json"
)
BINARY = 'cd /runyard/out && printf \'\\377\\376%s\' "$TOKEN" > "blob-$TOKEN.bin"'
LINK = 'cd /runyard/out && ln -s /etc/passwd "link-$TOKEN"'


@pytest.fixture(params=["upload", "host_workdir"])
def runner(
    request: pytest.FixtureRequest, docker_client: docker.DockerClient, tmp_path: Path
) -> DockerRunner:
    workdirs = None
    if request.param == "host_workdir":
        workdirs = HostWorkdirs.open(str(tmp_path / "attempts"))
    secrets = SecretSource(environ={"RY_ARTIFACT_TOKEN": SECRET})
    return DockerRunner(docker_client, workdirs=workdirs, secrets=secrets)


def run_script(
    runner: DockerRunner,
    store: PostgresArtifactStore,
    queue: JobQueue,
    registry: ToolRegistry,
    script: str,
) -> tuple[AttemptSpec, AttemptResult]:
    run_id = queue.enqueue(new_run()).run_id
    base: Any = spec_for(
        registry,
        "echo",
        {},
        command=["sh", "-c", script],
        secrets={"TOKEN": "env:RY_ARTIFACT_TOKEN"},
    )
    spec = AttemptSpec(run_id, 1, base.tool, base.input, base.deadline_at)
    outcome = runner.run(spec, AttemptControl(artifacts=store))
    runner.discard(run_id, 1)
    return spec, outcome


def test_artifacts__text_and_names_are_stored_with_the_secret_masked(
    runner: DockerRunner, engine: Engine, queue: JobQueue, registry: ToolRegistry
):
    store = PostgresArtifactStore(engine)
    spec, outcome = run_script(runner, store, queue, registry, KEPT)
    assert outcome.status is RunStatus.SUCCEEDED, outcome
    contents, files = stored(store, spec, outcome)
    assert contents == {
        "text.txt": b"key=***\n",
        "name-***.txt": b"",
        "dir-***/inner.txt": b"inner",
        # Binary without the secret: kept byte for byte.
        "plain.bin": b"\xff\xfe\x00",
    }
    for found in files:
        assert SECRET not in found.path


@pytest.mark.parametrize(
    ("script", "shown"),
    [
        (BINARY, "'blob-***.bin' is not UTF-8 text and holds a secret value"),
        (LINK, "'link-***' is a symbolic link"),
    ],
)
def test_artifacts__refusals_keep_nothing_and_never_show_the_secret(
    runner: DockerRunner,
    engine: Engine,
    queue: JobQueue,
    registry: ToolRegistry,
    script: str,
    shown: str,
):
    store = PostgresArtifactStore(engine)
    _, outcome = run_script(runner, store, queue, registry, script + " && echo '{}' > result.json")
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "invalid_artifact")
    assert outcome.error is not None and shown in outcome.error
    assert SECRET not in outcome.error
    assert outcome.artifact_set is None
