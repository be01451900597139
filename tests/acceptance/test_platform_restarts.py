"""Restarts under a running tool: the Docker daemon (live-restore) and Postgres itself."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import docker
import psycopg
import pytest
from docker.models.containers import Container

from runyard.platform.db import make_engine, migrate
from runyard.queue import JobQueue
from runyard.runners.docker.inputs import DEFAULT_ROOT
from tests.acceptance.cluster import ROOT, Cluster, Expected

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240), pytest.mark.solo]

DOCKER_PIDFILE = Path("/var/run/docker.pid")
HOST_WORKDIRS = Path(DEFAULT_ROOT)


def _daemon_is_ours() -> bool:
    """Only a local daemon this suite's scripts can start again may be restarted."""
    return (
        os.geteuid() == 0
        and not os.environ.get("DOCKER_HOST")
        and DOCKER_PIDFILE.exists()
        and (ROOT / "scripts" / "ensure-docker").exists()
    )


def _docker_answers() -> bool:
    # A failed unix-socket connect leaves its socket to the garbage collector (urllib3's
    # habit); collect it here quietly so it is not reported against a later test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=5)
            client.ping()
            client.close()
            return True
        except Exception:
            return False
        finally:
            gc.collect()


@pytest.mark.skipif(not _daemon_is_ours(), reason="needs a local dockerd this suite can restart")
def test_docker_daemon_restart_with_live_restore__run_finishes_once(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1)
    run_id = cluster.submit(
        "shell",
        {"script": "echo start; sleep 4; echo end; exit 5"},
        Expected("failed", exit_code=5),
    )
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    _restart_docker()
    started = cluster.log_of("w1")
    host_inputs = "inputs=host" in started or '"inputs": "host"' in started
    volume = f"runyard-{run_id}-1"
    if not host_inputs:
        cluster.check_invariants()
    else:
        # Docker 20.10 keeps counting the mount of a bind-backed volume whose container ran
        # across the restart: the worker removes the directory, says so once, and the record
        # goes after the engine's next restart (operations.md, "Inputs").
        cluster.check_invariants(kept_volumes=frozenset({volume}))
        cluster.wait_for(
            lambda: "keeps a volume it says is still mounted" in cluster.log_of("w1"),
            30,
            "the worker to report the volume the engine keeps",
        )
        assert not (HOST_WORKDIRS / volume).exists()
        _restart_docker()
        client = docker.from_env(timeout=30)
        try:
            client.volumes.get(volume).remove()
        finally:
            client.close()
    row = cluster.run_row(run_id)
    assert row.attempts == 1 and row.stdout.count("start") == 1


def _restart_docker() -> None:
    """SIGTERM the machine's dockerd (live-restore keeps containers), then start it again."""
    os.kill(int(DOCKER_PIDFILE.read_text().strip()), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _docker_answers() and time.monotonic() < deadline:
        time.sleep(0.2)
    subprocess.run([str(ROOT / "scripts" / "ensure-docker")], check=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def restartable_postgres(
    tmp_path: Path,
) -> Iterator[tuple[str, docker.models.containers.Container]]:
    """A Postgres container of this test's own, on a fixed loopback port so it can restart."""
    image = os.environ.get("RUNYARD_TEST_POSTGRES_IMAGE")
    client = docker.from_env(timeout=60)
    if not image:
        pytest.skip("RUNYARD_TEST_POSTGRES_IMAGE names no Postgres image to restart")
    port = _free_port()
    container = client.containers.run(
        image,
        detach=True,
        environment={"POSTGRES_USER": "ry", "POSTGRES_PASSWORD": "ry", "POSTGRES_DB": "ry"},
        ports={"5432/tcp": ("127.0.0.1", port)},
        labels={"io.runyard.test": "postgres-restart"},
    )
    url = f"postgresql://ry:ry@127.0.0.1:{port}/ry"
    try:
        _wait_postgres(url)
        yield url, container
    finally:
        container.remove(force=True)
        client.close()


def _wait_postgres(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_postgres_restart_mid_run__workers_reconnect_nothing_lost(
    restartable_postgres: tuple[str, Container], tmp_path: Path
):
    url, container = restartable_postgres
    migrate(url)
    engine = make_engine(url)
    client = docker.from_env(timeout=60)
    from runyard.platform.settings import Settings
    from runyard.registry.tools import load_registry

    made = Cluster(
        database_url=url,
        engine=engine,
        queue=JobQueue(engine),
        registry=load_registry(ROOT / "tests" / "tools.toml", Settings(database_url="x")),
        logs=tmp_path,
        docker_client=client,
    )
    try:
        made.start_reaper()
        made.start_worker("w1", concurrency=2)
        runs = [made.submit("sleep", {"seconds": 3}, Expected("succeeded")) for _ in range(2)]
        made.wait_for(lambda: all(made.container_state(r) == "running" for r in runs), 30, "run")
        container.restart(timeout=2)
        _wait_postgres(url)
        engine.dispose()
        runs += [made.submit("echo", {"after": True}, Expected("succeeded"))]
        figures = made.check_invariants(leak_timeout=20)
        assert figures["runs"] == 3
        assert made.procs["w1"].poll() is None and made.procs["reaper"].poll() is None
    finally:
        made.close()
        for run_id in made.accepted:
            for c in client.containers.list(all=True, filters={"name": f"runyard-{run_id}"}):
                c.remove(force=True)
        engine.dispose()
        client.close()
