"""Collecting a real container's /runyard/out into the Postgres store: through the engine's
archive stream and through the host work directory; links, FIFOs and limits refused."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import docker
import pytest
from sqlalchemy import Engine, text

from runyard.artifact_stores.postgres import PostgresArtifactStore
from runyard.artifacts.reads import ArtifactReads, Found
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptAbandoned, AttemptControl
from runyard.runners.docker.host_workdirs import HostWorkdirs
from runyard.runners.docker.runner import DockerRunner
from tests.integration.docker.test_adoption_docker import orphan, release, spec_of
from tests.integration.docker.test_docker_runner import shell
from tests.integration.queue.test_queue import new_run
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker

FILES_SCRIPT = (
    "cd /runyard/out && mkdir -p sub/deeper && printf hello > a.txt && "
    "printf nested > sub/deeper/n.txt && : > empty && printf spaced > 'with space.txt' && "
    "head -c 3000000 /dev/zero > sub/big.bin && echo '{}' > result.json"
)
EXPECTED = {
    "a.txt": b"hello",
    "empty": b"",
    "sub/big.bin": b"\0" * 3_000_000,
    "sub/deeper/n.txt": b"nested",
    "with space.txt": b"spaced",
}


@pytest.fixture
def store(engine: Engine) -> PostgresArtifactStore:
    return PostgresArtifactStore(engine)


def collect(
    runner: DockerRunner,
    store: PostgresArtifactStore,
    queue: JobQueue,
    registry: ToolRegistry,
    script: str,
    **tool: Any,
) -> tuple[AttemptSpec, AttemptResult]:
    run_id = queue.enqueue(new_run()).run_id
    spec = shell(registry, script, **tool)
    spec = AttemptSpec(run_id, 1, spec.tool, spec.input, spec.deadline_at)
    outcome = runner.run(spec, AttemptControl(artifacts=store))
    return spec, outcome


def stored(store: PostgresArtifactStore, spec: AttemptSpec, outcome: AttemptResult):
    assert outcome.artifact_set is not None
    files = store.files(spec.run_id, outcome.artifact_set)
    return {
        f.path: b"".join(store.read(spec.run_id, outcome.artifact_set, f.path, 0, f.size))
        for f in files
    }, files


def sets_left(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT count(DISTINCT set_id) FROM run_artifacts")).scalar_one()
        )


def test_archive__keeps_every_file_but_the_result(
    docker_runner: DockerRunner, store, queue: JobQueue, registry: ToolRegistry
):
    spec, outcome = collect(docker_runner, store, queue, registry, FILES_SCRIPT)
    assert outcome.status is RunStatus.SUCCEEDED, outcome
    assert outcome.result == {}
    contents, files = stored(store, spec, outcome)
    assert contents == EXPECTED
    assert {f.path: f.sha256 for f in files} == {
        path: hashlib.sha256(data).hexdigest() for path, data in EXPECTED.items()
    }


def test_archive__a_failed_tool_keeps_its_artifacts(
    docker_runner: DockerRunner, store, queue: JobQueue, registry: ToolRegistry
):
    script = "printf partial > /runyard/out/report.txt; exit 3"
    spec, outcome = collect(docker_runner, store, queue, registry, script)
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "tool_failed")
    assert stored(store, spec, outcome)[0] == {"report.txt": b"partial"}


@pytest.mark.parametrize(
    ("make", "why"),
    [
        ("ln -s /etc/passwd /runyard/out/link", "symbolic link"),
        ("ln -s / /runyard/out/root", "symbolic link"),
        ("mkfifo /runyard/out/pipe", "FIFO"),
        ("ln /runyard/out/a /runyard/out/hard", "hard link"),
    ],
)
def test_archive__links_and_fifos_fail_the_run_and_keep_nothing(
    docker_runner: DockerRunner,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    engine: Engine,
    make: str,
    why: str,
):
    script = f"printf a > /runyard/out/a && {make}"
    _, outcome = collect(docker_runner, store, queue, registry, script)
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "invalid_artifact")
    assert why in (outcome.error or "")
    assert outcome.artifact_set is None
    assert sets_left(engine) == 0


def test_archive__over_the_size_limit_fails_naming_it(
    docker_runner: DockerRunner, store, queue: JobQueue, registry: ToolRegistry, engine: Engine
):
    script = "head -c 700000 /dev/zero > /runyard/out/a; head -c 700000 /dev/zero > /runyard/out/b"
    _, outcome = collect(docker_runner, store, queue, registry, script, artifacts_max_mb=1)
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "artifacts_limit_exceeded")
    assert "size limit" in (outcome.error or "") and "1 MB" in (outcome.error or "")
    assert sets_left(engine) == 0


@pytest.mark.slow  # writes thousands of files
def test_archive__over_the_file_count_fails_naming_it(
    docker_runner: DockerRunner, store, queue: JobQueue, registry: ToolRegistry
):
    script = "cd /runyard/out && i=0; while [ $i -le 1000 ]; do : > f$i; i=$((i+1)); done"
    _, outcome = collect(docker_runner, store, queue, registry, script)
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "artifacts_limit_exceeded")
    assert "more than 1000 files" in (outcome.error or "")


def test_host_workdir__collects_from_the_directory_and_refuses_links(
    docker_client: docker.DockerClient,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    tmp_path: Path,
):
    runner = DockerRunner(docker_client, workdirs=HostWorkdirs.open(str(tmp_path / "attempts")))
    spec, outcome = collect(runner, store, queue, registry, FILES_SCRIPT)
    assert outcome.status is RunStatus.SUCCEEDED, outcome
    assert stored(store, spec, outcome)[0] == EXPECTED
    script = "printf a > /runyard/out/a && ln -s /etc/shadow /runyard/out/sub"
    _, refused = collect(runner, store, queue, registry, script)
    assert (refused.status, refused.error_code) == (RunStatus.FAILED, "invalid_artifact")


@pytest.mark.parametrize(
    ("script", "asked"),
    [
        ("echo '{}' > /runyard/out/result.json", 2),  # before the create and the start only
        ("printf a > /runyard/out/a.txt", 3),  # and before the files are stored
    ],
    ids=["result-only", "a-file"],
)
def test_host_workdir__the_lease_is_asked_before_storing_files_and_only_then(
    docker_client: docker.DockerClient,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    tmp_path: Path,
    engine: Engine,
    script: str,
    asked: int,
):
    runner = DockerRunner(docker_client, workdirs=HostWorkdirs.open(str(tmp_path / "attempts")))
    run_id = queue.enqueue(new_run()).run_id
    spec = dataclasses.replace(shell(registry, script), run_id=run_id)
    checks: list[bool] = []

    def held_until_the_collection() -> bool:
        checks.append(True)
        return len(checks) < 3  # lost once the container has exited

    control = AttemptControl(artifacts=store)
    control.still_owner = held_until_the_collection
    if asked == 2:
        outcome = runner.run(spec, control)
        assert outcome.status is RunStatus.SUCCEEDED, outcome
        assert outcome.artifact_set is not None and store.files(run_id, outcome.artifact_set) == []
    else:
        with pytest.raises(AttemptAbandoned):
            runner.run(spec, control)
        assert sets_left(engine) == 0  # nothing stored by an owner that lost its lease
    runner.discard(spec.run_id, spec.attempt)
    assert len(checks) == asked


def test_adoption__the_adopter_collects_and_only_its_set_is_published(
    queue: JobQueue, engine: Engine, store, registry: ToolRegistry, docker_client
):
    runner = DockerRunner(docker_client)
    run_id, job = orphan(queue, registry, runner.engine_id(), "shell", {"script": FILES_SCRIPT})
    # The dead owner ran the container and collected, then died before its finalize.
    dead = runner.run(spec_of(job), AttemptControl(artifacts=store))
    assert dead.artifact_set is not None
    release(queue, job)
    adopter = Worker(queue, runner, WorkerConfig(worker_id="adopter"), artifacts=store)
    assert adopter.run_once().adopted == 1
    assert adopter.wait_idle(timeout=60)
    adopter.close()
    reads = ArtifactReads(engine, store)
    published = reads.published(run_id, None)
    assert published.found is Found.READY and published.status == "succeeded"
    assert published.set_id not in (None, dead.artifact_set)
    files = reads.files(published)
    assert {f.path: f.sha256 for f in files} == {
        path: hashlib.sha256(data).hexdigest() for path, data in EXPECTED.items()
    }


@pytest.mark.parametrize("mode", ["upload", "host_workdir"])
def test_deps__a_dependent_finds_its_dependencys_artifacts(
    docker_client: docker.DockerClient,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    tmp_path: Path,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
):
    workdirs = HostWorkdirs.open(str(tmp_path / "attempts")) if mode == "host_workdir" else None
    runner = DockerRunner(docker_client, workdirs=workdirs)
    first, made = collect(runner, store, queue, registry, FILES_SCRIPT)
    assert made.artifact_set is not None
    here = f"/runyard/deps/{first.run_id}"
    big = hashlib.sha256(b"\0" * 3_000_000).hexdigest()
    # No double quotes: the test shell tool takes its script out of input.json as it is.
    script = (
        f"test $(cat {here}/a.txt) = hello && "
        f"test $(sha256sum {here}/sub/big.bin | cut -c1-64) = {big} && "
        f"test $(cat '{here}/with space.txt') = spaced && "
        f"! touch {here}/a.txt 2>/dev/null && echo 1 > /runyard/out/result.json"
    )
    run_id = queue.enqueue(new_run()).run_id
    base = shell(registry, script)
    spec = AttemptSpec(
        run_id,
        1,
        base.tool,
        base.input,
        base.deadline_at,
        dep_artifacts={str(first.run_id): made.artifact_set},
    )
    uploads: list[str] = []
    put_archive = docker_client.api.put_archive

    def counting(container: str, path: str, data: Any) -> bool:
        uploads.append(path)
        return bool(put_archive(container, path, data))

    monkeypatch.setattr(docker_client.api, "put_archive", counting)
    outcome = runner.run(spec, AttemptControl(artifacts=store))
    assert (outcome.status, outcome.result) == (RunStatus.SUCCEEDED, 1), outcome
    # Uploads: the input and the dependencies' artifacts in one archive (one unpack).
    assert uploads == (["/runyard"] if mode == "upload" else [])


@pytest.mark.slow  # fills a disk allowance with real files in containers: seconds
@pytest.mark.parametrize("mode", ["upload", "host_workdir"])
def test_deps__the_dependencys_artifacts_are_not_charged_to_the_dependents_disk_limit(
    docker_client: docker.DockerClient,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    tmp_path: Path,
    mode: str,
):
    workdirs = HostWorkdirs.open(str(tmp_path / "attempts")) if mode == "host_workdir" else None
    runner = DockerRunner(docker_client, workdirs=workdirs)
    first, made = collect(runner, store, queue, registry, FILES_SCRIPT)  # about 3 MB
    assert made.artifact_set is not None
    # 1 MB of its own within its 2 MB, for long enough that the disk watch measures it.
    script = (
        "head -c 1000000 /dev/zero > /runyard/out/mine && sleep 1.5 && "
        "echo 1 > /runyard/out/result.json"
    )
    run_id = queue.enqueue(new_run()).run_id
    base = shell(registry, script, disk_mb=2)
    spec = AttemptSpec(
        run_id,
        1,
        base.tool,
        base.input,
        base.deadline_at,
        dep_artifacts={str(first.run_id): made.artifact_set},
    )
    outcome = runner.run(spec, AttemptControl(artifacts=store))
    assert (outcome.status, outcome.result) == (RunStatus.SUCCEEDED, 1), outcome
    # What the tool writes itself still counts: 3 MB of its own is over its 2 MB.
    run_id = queue.enqueue(new_run()).run_id
    over = shell(registry, "head -c 3000000 /dev/zero > /runyard/out/mine; sleep 3", disk_mb=2)
    spec = dataclasses.replace(spec, run_id=run_id, tool=over.tool, input=over.input)
    outcome = runner.run(spec, AttemptControl(artifacts=store))
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "disk_limit_exceeded")


@pytest.mark.parametrize("mode", ["upload", "host_workdir"])
def test_deps__a_set_whose_paths_clash_fails_the_dependent_not_the_engine(
    docker_client: docker.DockerClient,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    tmp_path: Path,
    mode: str,
):
    workdirs = HostWorkdirs.open(str(tmp_path / "attempts")) if mode == "host_workdir" else None
    runner = DockerRunner(docker_client, workdirs=workdirs)
    # A set kept before such paths were refused: a file, and a directory of the same name.
    first = queue.enqueue(new_run()).run_id
    writer = store.writer(first)
    writer.add("a-***", [b"x"])
    writer.add("a-***/f", [b"y"])
    writer.done()
    run_id = queue.enqueue(new_run()).run_id
    base = shell(registry, "echo 1 > /runyard/out/result.json")
    spec = AttemptSpec(
        run_id,
        1,
        base.tool,
        base.input,
        base.deadline_at,
        dep_artifacts={str(first): writer.set_id},
    )
    try:
        outcome = runner.run(spec, AttemptControl(artifacts=store))
        # Nothing of the attempt's is left on the host (its container goes with the run).
        left = list((tmp_path / "attempts").iterdir()) if workdirs is not None else []
    finally:
        runner.discard(run_id, 1)
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, "invalid_artifact")
    assert outcome.error is not None
    assert f"cannot be copied to /runyard/deps/{first}" in outcome.error
    assert "'a-***/f' lies in 'a-***'" in outcome.error
    assert left == []


def test_collect__logs_the_files_it_kept_and_no_info_line_for_none(
    docker_runner: DockerRunner,
    store,
    queue: JobQueue,
    registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level("DEBUG", logger="runyard.runners.docker.collector")
    kept, _ = collect(docker_runner, store, queue, registry, FILES_SCRIPT)
    empty, _ = collect(docker_runner, store, queue, registry, "true")
    lines = {
        (r.run_id, r.levelname, r.files)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "artifacts collected"
    }
    assert lines == {(str(kept.run_id), "INFO", 5), (str(empty.run_id), "DEBUG", 0)}
