"""Two Docker engines on one machine: adoption stays on the engine that holds the container."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from runyard.docker_runner import DockerRunner
from tests.acceptance.cluster import Cluster, Expected
from tests.integration.conftest import _quietly

sys.path.insert(0, "/tmp")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

B_SOCKET = "/var/run/runyard-engine-b.sock"
B_HOST = f"unix://{B_SOCKET}"
B_DATA = Path("/var/lib/runyard-engine-b")
B_EXEC = Path("/var/run/runyard-engine-b")
B_PIDFILE = Path("/var/run/runyard-engine-b.pid")
B_NETNS = "runyard-engine-b"


def _can_run_second_daemon() -> bool:
    return os.geteuid() == 0 and all(shutil.which(b) for b in ("dockerd", "ip", "nsenter"))


@pytest.fixture
def engine_b(tmp_path: Path) -> Iterator[docker.DockerClient]:
    """A second dockerd with its own data root, exec root and socket, in a network namespace
    of its own so that its bridge is its own: beside the first daemon in one namespace, a
    second one was seen to delete the first daemon's ``docker0``."""
    if not _can_run_second_daemon():
        pytest.skip("a second dockerd needs root, dockerd, ip and nsenter")
    first = docker.from_env(timeout=60)
    driver = first.info()["Driver"]
    subprocess.run(["ip", "netns", "del", B_NETNS], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", B_NETNS], check=True)
    config = tmp_path / "daemon-b.json"
    config.write_text("{}")
    log = (tmp_path / "dockerd-b.log").open("wb")
    proc = subprocess.Popen(
        [
            # nsenter switches only the network namespace (ip netns exec would hide cgroups).
            "nsenter",
            f"--net=/var/run/netns/{B_NETNS}",
            "dockerd",
            "--config-file",
            str(config),
            "--host",
            B_HOST,
            "--data-root",
            str(B_DATA),
            "--exec-root",
            str(B_EXEC),
            "--pidfile",
            str(B_PIDFILE),
            "--storage-driver",
            driver,
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    client: docker.DockerClient | None = None
    try:
        while not Path(B_SOCKET).exists():
            assert proc.poll() is None, (tmp_path / "dockerd-b.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "second dockerd did not create its socket"
            time.sleep(0.2)
        client = docker.DockerClient(base_url=B_HOST, timeout=60, version="1.41")
        while True:
            try:
                client.ping()
                break
            except docker.errors.APIError:
                assert time.monotonic() < deadline, "second dockerd did not answer"
                time.sleep(0.3)
        image = first.images.get("runyard/toolbox:latest")
        client.images.load(b"".join(image.save(named=True)))
        yield client
    finally:
        if client is not None:
            # A worker of the test may be removing its own container right now (404/409).
            for container in client.containers.list(all=True, sparse=True):
                _quietly(functools.partial(container.remove, force=True))
            client.close()
        first.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(B_EXEC, ignore_errors=True)
        subprocess.run(["ip", "netns", "del", B_NETNS], capture_output=True, check=False)
        docker0 = subprocess.run(["ip", "link", "show", "docker0"], capture_output=True)
        assert docker0.returncode == 0, "the first daemon lost its bridge"


def test_two_engines__no_cross_adoption_and_dead_engine_runs_requeue_to_b(
    cluster: Cluster, engine_b: docker.DockerClient
):
    engine_a_id = DockerRunner(cluster.docker_client).engine_id()
    engine_b_id = DockerRunner(engine_b).engine_id()
    # Two daemons on one host may report one `docker info` ID; the marker volumes differ.
    assert engine_a_id != engine_b_id

    cluster.start_reaper("reaper", RUNYARD_ENGINE_DEAD_AFTER_SECONDS="4")
    cluster.start_worker("wa", concurrency=1)
    run_id = cluster.submit("sleep", {"seconds": 30}, Expected("succeeded"))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "run on A")
    cluster.kill9("wa")
    cluster.start_worker("wb", concurrency=1, DOCKER_HOST=B_HOST)
    # While A's engine might still come back, B must not adopt the run (it lives on A).
    cluster.wait_for(
        lambda: cluster.run_row(run_id).status == "queued" or cluster.run_row(run_id).attempts == 2,
        60,
        "engine A declared dead and the run requeued",
    )
    assert cluster.run_row(run_id).adoptions == 0
    assert not engine_b.containers.list(all=True, filters={"name": f"runyard-{run_id}-1"})
    cluster.wait_for(
        lambda: (
            bool(engine_b.containers.list(all=True, filters={"name": f"runyard-{run_id}-2"}))
            or cluster.status(run_id) == "succeeded"
        ),
        60,
        "attempt 2 on engine B",
    )
    # The attempt-1 container on the dead engine is not ours to finish any more.
    cluster.docker_client.containers.get(f"runyard-{run_id}-1").remove(force=True)
    cluster.accepted[run_id].status = "succeeded"
    cluster.wait_for(lambda: cluster.status(run_id) == "succeeded", 90, "run to finish on B")
    row = cluster.run_row(run_id)
    assert row.attempts == 2 and row.adoptions == 0 and row.finals == 1
