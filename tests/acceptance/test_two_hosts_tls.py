"""The deployment recipe for an API host and a worker host, with TLS to Postgres.

The API and the reaper stand for the API host (no engine of theirs runs a tool); the worker
stands for a worker-only host with a Docker engine of its own. Postgres refuses every
connection without TLS, and the services verify its certificate (``sslmode=verify-full``).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx2
import psycopg
import pytest

from runyard.platform.db import make_engine, migrate
from runyard.runners.docker.runner import DockerRunner
from tests.acceptance.conftest import cluster_on
from tests.acceptance.second_engine import SecondEngine, started_engine
from tests.integration.conftest import _quietly

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

WORKER_ENGINE = "runyard-engine-tls"
HBA = "local all all trust\nhostssl all all all scram-sha-256\nhostnossl all all all reject\n"


def _openssl(certs: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)


def _make_certificates(certs: Path) -> None:
    """A CA of the test's own and a server certificate for 127.0.0.1 that it signed."""
    ca = "-subj /CN=runyard-test-ca -keyout ca.key -out ca.crt"
    _openssl(certs, *f"req -x509 -newkey rsa:2048 -nodes -days 2 {ca}".split())
    server = "-subj /CN=127.0.0.1 -keyout server.key -out server.csr"
    _openssl(certs, *f"req -newkey rsa:2048 -nodes {server}".split())
    (certs / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    sign = "-CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.crt"
    _openssl(certs, *f"x509 -req -in server.csr {sign}".split())
    (certs / "pg_hba.conf").write_text(HBA)


def _postgres_ids(client: docker.DockerClient, image: str) -> tuple[int, int]:
    """The uid and gid of the image's ``postgres`` user (the server key must be its own)."""
    out = client.containers.run(
        image, entrypoint=["sh", "-c", "id -u postgres; id -g postgres"], remove=True
    )
    uid, gid = out.decode().split()
    return int(uid), int(gid)


@pytest.fixture
def tls_database(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(URL with verify-full TLS, the same URL without TLS) of a Postgres that takes only TLS."""
    import os

    image = os.environ.get("RUNYARD_TEST_POSTGRES_IMAGE", "postgres:16-alpine")
    certs = tmp_path / "certs"
    certs.mkdir()
    _make_certificates(certs)
    client = docker.from_env(timeout=60)
    uid, gid = _postgres_ids(client, image)
    for name in ("server.key", "server.crt", "pg_hba.conf"):
        os.chown(certs / name, uid, gid)
    (certs / "server.key").chmod(0o600)
    container = client.containers.run(
        image,
        command=[
            "postgres",
            *("-c fsync=off -c ssl=on -c hba_file=/certs/pg_hba.conf".split()),
            *("-c ssl_cert_file=/certs/server.crt -c ssl_key_file=/certs/server.key".split()),
        ],
        environment={
            "POSTGRES_USER": "runyard",
            "POSTGRES_PASSWORD": "runyard",
            "POSTGRES_DB": "runyard",
        },
        ports={"5432/tcp": ("127.0.0.1", None)},
        volumes={str(certs): {"bind": "/certs", "mode": "ro"}},
        labels={"io.runyard.test": "tls-postgres"},
        detach=True,
    )
    try:
        container.reload()
        port = container.ports["5432/tcp"][0]["HostPort"]
        base = f"postgresql://runyard:runyard@127.0.0.1:{port}/runyard"
        tls = f"{base}?sslmode=verify-full&sslrootcert={certs / 'ca.crt'}"
        deadline = time.monotonic() + 90
        while True:
            try:
                psycopg.connect(tls, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield tls, f"{base}?sslmode=disable"
    finally:
        _quietly(lambda: container.remove(force=True, v=True))
        client.close()


@pytest.fixture
def worker_engine(tmp_path: Path) -> Iterator[SecondEngine]:
    """The worker host's own Docker engine."""
    with started_engine(WORKER_ENGINE, tmp_path) as engine:
        yield engine


def test_two_hosts__api_host_and_worker_host_over_tls_run_a_tool(
    tls_database: tuple[str, str], worker_engine: SecondEngine, tmp_path: Path
):
    tls_url, plain_url = tls_database
    with pytest.raises(psycopg.OperationalError, match="reject"):
        psycopg.connect(plain_url, connect_timeout=5).close()
    migrate(tls_url)
    engine = make_engine(tls_url)
    try:
        with cluster_on(tls_url, engine, tmp_path) as cluster:
            # The API host: API (queue mode) and reaper. The worker host: a worker whose only
            # engine is its own.
            cluster.start_api("api", RUNYARD_QUEUE_ENABLED="true")
            cluster.start_reaper()
            # The default lease, not the cluster's 3 s: with those, a heartbeat round (a TLS
            # handshake and a password exchange when it connects) that a loaded machine holds
            # up for 0.5 s has its connection cut by the worker, by design, and logs the
            # cut connection's "SSL error: unexpected eof", which says nothing about TLS.
            cluster.start_worker(
                "host-b",
                concurrency=1,
                DOCKER_HOST=worker_engine.host,
                RUNYARD_LEASE_SECONDS="30",
                RUNYARD_HEARTBEAT_SECONDS="10",
            )
            port = cluster.ports["api"]
            answer = httpx2.post(
                f"http://127.0.0.1:{port}/v1/runs?wait=60",
                json={"tool": "echo", "input": {"message": "over TLS"}},
                timeout=90,
            )
            assert answer.status_code in (200, 201), answer.text
            run = answer.json()
            assert run["status"] == "succeeded", run
            assert run["result"] == {"message": "over TLS"}

            with engine.connect() as conn:
                ran_on = conn.exec_driver_sql(
                    "SELECT engine_id FROM tool_run_jobs WHERE run_id = %(id)s",
                    {"id": uuid.UUID(run["id"])},
                ).scalar_one()
                sessions: dict[bool, int] = dict(
                    conn.exec_driver_sql(
                        "SELECT s.ssl, count(*) FROM pg_stat_activity a"
                        " JOIN pg_stat_ssl s USING (pid) WHERE a.datname = current_database()"
                        " AND a.backend_type = 'client backend' GROUP BY s.ssl"
                    ).all()
                )
            assert ran_on == DockerRunner(worker_engine.client).engine_id()
            # Pools of the API, the reaper, the worker and its heartbeats, and both LISTENs.
            assert sessions.get(False, 0) == 0
            assert sessions[True] >= 4
            for name in ("api", "reaper", "host-b"):
                log = cluster.log_of(name)
                assert "listen connection lost" not in log, log[-2000:]
                assert "SSL" not in log, log[-2000:]
    finally:
        engine.dispose()
