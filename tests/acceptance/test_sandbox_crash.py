"""A sandbox survives its worker: ``kill -9`` of the owner while a command streams 10 MB,
and the worker that adopts the same container delivers every byte once and in order."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.acceptance.cluster import Cluster, Expected
from tests.integration.api.test_api_helpers import bearer, live_server, make_app

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(240)]

LINES = 10_240
PAD = 1015
# Ten MiB in lines of 1024 bytes, with a pause every 512 lines so the kill lands mid-stream.
STREAM = (
    "awk 'BEGIN{p=sprintf(\"%" + str(PAD) + 's",""); gsub(/ /,"x",p); '
    "for(i=0;i<" + str(LINES) + ';i++){printf "%08d%s\\n", i, p; '
    'if(i%512==0){fflush(); system("sleep 0.25")}}}\''
)


def expected_stream() -> bytes:
    pad = "x" * PAD
    return "".join(f"{i:08d}{pad}\n" for i in range(LINES)).encode()


@pytest.fixture
def client(database_url: str, engine: Engine, cluster: Cluster) -> Iterator[httpx.Client]:
    app = make_app(database_url, engine, cluster.registry, max_wait_seconds=10.0)
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers=bearer(engine, "acme"), timeout=60) as http,
    ):
        yield http


def exec_done(client: httpx.Client, sid: str, command: str) -> dict[str, Any]:
    exec_id = client.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["sh", "-c", command]}
    ).json()["id"]
    deadline = time.monotonic() + 120
    while True:
        found: dict[str, Any] = client.get(
            f"/v1/sandboxes/{sid}/execs/{exec_id}", params={"wait": 10}
        ).json()
        if found["status"] == "finished":
            return found
        assert time.monotonic() < deadline, found


def stored(engine: Engine, exec_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, stdout_end, (SELECT count(*) FROM sandbox_exec_chunks c "
                "WHERE c.exec_id = e.id) AS chunks FROM sandbox_execs e WHERE id = :id"
            ),
            {"id": exec_id},
        ).one()


def test_kill9_of_the_owner_mid_stream__the_adopter_delivers_every_byte_once(
    cluster: Cluster, client: httpx.Client, engine: Engine
):
    cluster.start_reaper()
    cluster.start_worker("w1")
    made = client.post("/v1/sandboxes", json={"tool": "sandbox", "ttl_seconds": 600})
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    cluster.accepted[uuid.UUID(sid)] = Expected("cancelled")
    cluster.wait_for(lambda: cluster.status(uuid.UUID(sid)) == "running", 60, "the sandbox")
    written = exec_done(client, sid, "head -c 1048576 /dev/urandom > kept.bin; sha256sum kept.bin")
    container = cluster.docker_client.api.inspect_container(f"runyard-{sid}-1")["Id"]

    exec_id = client.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["sh", "-c", STREAM]}
    ).json()["id"]
    cluster.wait_for(lambda: stored(engine, exec_id).stdout_end > 2_000_000, 60, "output to stream")
    assert stored(engine, exec_id).status == "running"
    cluster.kill9("w1")
    cluster.start_worker("w2")

    deadline = time.monotonic() + 120
    while (found := client.get(f"/v1/sandboxes/{sid}/execs/{exec_id}").json())["status"] != (
        "finished"
    ):
        assert time.monotonic() < deadline, found
        time.sleep(0.5)

    expected = expected_stream()
    assert found["exit_code"] == 0 and found["truncated"] is False
    got = found["stdout"].encode()
    assert len(got) == len(expected)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(expected).hexdigest()
    assert stored(engine, exec_id).stdout_end == len(expected)
    assert "adopt" in cluster.log_of("w2")
    # The same container serves the next command, with the file written before the crash.
    assert cluster.docker_client.api.inspect_container(f"runyard-{sid}-1")["Id"] == container
    again = exec_done(client, sid, "sha256sum kept.bin")
    assert again["exit_code"] == 0 and again["stdout"] == written["stdout"]

    client.delete(f"/v1/sandboxes/{sid}")
    cluster.check_invariants()
