"""Reads never fail on stored data: rows written before today's bounds are still served."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.domain.tool_json import UNREADABLE_KEY
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runners.fake import FakeRunner
from runyard.tenancy.auth import create_api_key
from tests.integration.api.test_api_helpers import bearer, make_app, run_status, wait_until
from worker.service import Worker, WorkerConfig


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry), follow_redirects=False) as http:
        yield http


def _finished_run(client: TestClient, engine: Engine, queue: JobQueue) -> str:
    headers = bearer(engine, "acme")
    created = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=headers)
    assert created.status_code == 202, created.text
    run_id = str(created.json()["id"])
    worker = Worker(queue, FakeRunner(), WorkerConfig(worker_id="w-rows", concurrency=1))
    worker.run_once()
    assert worker.wait_idle(timeout=30)
    worker.close()
    wait_until(lambda: run_status(engine, run_id) == "succeeded")
    return run_id


@pytest.mark.parametrize("depth", [300, 5000])
def test_reads__a_stored_result_deeper_than_any_bound_is_served(
    client: TestClient, engine: Engine, queue: JobQueue, database_url: str, depth: int
):
    run_id = _finished_run(client, engine, queue)
    deep = "[" * depth + "]" * depth
    # Written straight into the table, as an older version of runyard could have.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE tool_runs SET result = %s::jsonb WHERE id = %s", (deep, run_id))
        conn.execute(
            "INSERT INTO tool_run_events (run_id, type, data) VALUES (%s, 'status', %s::jsonb)",
            (run_id, deep),
        )
    headers = bearer(engine, "acme")
    admin = bearer(engine, "ops", admin=True)

    one = client.get(f"/v1/runs/{run_id}", headers=headers)
    assert one.status_code == 200, one.text
    assert set(one.json()["result"]) == {UNREADABLE_KEY}
    assert "nests deeper than 128 levels" in one.json()["result"][UNREADABLE_KEY]
    for url, who in (("/v1/runs", headers), ("/v1/runs", admin)):
        page = client.get(url, headers=who)
        assert page.status_code == 200, (url, page.text)
    assert client.get(f"/v1/runs/{run_id}/logs", headers=headers).status_code == 200
    with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as stream:
        assert stream.status_code == 200
        body = "".join(stream.iter_text())
    assert '"status": "succeeded"' in body

    key = create_api_key(engine, "acme")
    assert client.post("/ui/login", data={"api_key": key, "next": "/ui/runs"}).status_code == 303
    for path in ("/ui/runs", f"/ui/runs/{run_id}"):
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text[:500])
