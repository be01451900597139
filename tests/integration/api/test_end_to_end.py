"""The walking skeleton: POST a run, a worker runs it in Docker, GET shows the result."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from api.main import create_app
from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runners.docker.runner import DockerRunner
from runyard.tenancy.auth import create_api_key
from worker.service import Worker, WorkerConfig

pytestmark = pytest.mark.docker


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    settings = Settings(database_url=database_url)
    with TestClient(create_app(settings, engine=engine, registry=registry)) as test_client:
        yield test_client


def test_echo_run__goes_from_api_through_container_to_result(
    client: TestClient, engine: Engine, queue: JobQueue, docker_client: docker.DockerClient
):
    key = create_api_key(engine, "acme")
    headers = {"Authorization": f"Bearer {key}"}

    created = client.post(
        "/v1/runs", json={"tool": "echo", "input": {"greeting": "hi"}}, headers=headers
    )
    assert created.status_code == 202, created.text
    run = created.json()
    assert run["status"] == "queued"
    assert created.headers["location"] == f"/v1/runs/{run['id']}"
    with engine.connect() as conn:
        job_status = conn.execute(
            text("SELECT status FROM tool_run_jobs WHERE run_id = :id"), {"id": run["id"]}
        ).scalar_one()
    assert job_status == "queued"

    worker = Worker(queue, DockerRunner(docker_client), WorkerConfig(worker_id="w-e2e"))
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=60)
    worker.close()

    fetched = client.get(f"/v1/runs/{run['id']}", headers=headers)
    assert fetched.status_code == 200
    body = fetched.json()
    assert body["status"] == "succeeded", body
    assert body["result"] == {"greeting": "hi"}
    assert body["exit_code"] == 0
    assert body["attempts"] == 1
    assert body["started_at"] is not None and body["finished_at"] is not None
    assert "lease_token" not in body and "engine_id" not in body
    # Removed only after the terminal state was committed.
    assert docker_client.containers.list(all=True, filters={"name": f"runyard-{run['id']}-1"}) == []


def test_other_tenant__sees_404(client: TestClient, engine: Engine):
    mine = {"Authorization": f"Bearer {create_api_key(engine, 'acme')}"}
    theirs = {"Authorization": f"Bearer {create_api_key(engine, 'globex')}"}
    run = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=mine).json()
    assert client.get(f"/v1/runs/{run['id']}", headers=theirs).status_code == 404
    assert client.get(f"/v1/runs/{run['id']}", headers=mine).status_code == 200


def test_unknown_field__is_rejected_with_problem_json(client: TestClient, engine: Engine):
    headers = {"Authorization": f"Bearer {create_api_key(engine, 'acme')}"}
    response = client.post(
        "/v1/runs", json={"tool": "echo", "input": {}, "image": "evil"}, headers=headers
    )
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "validation_error"
    assert "image" in response.json()["detail"]


def test_missing_key__is_401(client: TestClient):
    response = client.get("/v1/runs")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"
