"""What abuse costs a tenant over HTTP: runs created per window (failed at once or not), runs
kept, a batch's dependencies in all; batch lists without runs; an admin's batch retry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import ErrorCode, RunStatus
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, count, make_app

FAILURE = AttemptResult(
    status=RunStatus.FAILED, exit_code=2, error_code=ErrorCode.TOOL_FAILED, error="exit 2"
)
SUCCESS = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


def client_with(
    database_url: str, engine: Engine, registry: ToolRegistry, **settings: Any
) -> TestClient:
    return TestClient(make_app(database_url, engine, registry, **settings))


def finish_all(queue: JobQueue, outcome: AttemptResult) -> None:
    for job in queue.claim(worker_id="w", engine_id="e", limit=100, lease_seconds=30):
        assert queue.finalize(job.job_id, job.lease_token, outcome)


def failed_run(client: TestClient, headers: dict[str, str], queue: JobQueue) -> str:
    run_id = str(client.post("/v1/runs", json={"tool": "echo"}, headers=headers).json()["id"])
    finish_all(queue, FAILURE)
    return run_id


@pytest.fixture
def capped(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    app = make_app(
        database_url,
        engine,
        registry,
        tenant_max_created_per_window=21,
        tenant_created_window_seconds=600,
    )
    with TestClient(app) as client:
        yield client


def test_created_cap__batches_that_fail_at_once_spend_the_tenants_window(
    capped: TestClient, engine: Engine, queue: JobQueue, acme: dict[str, str]
):
    failed = failed_run(capped, acme, queue)  # 1 run
    doomed = {"runs": [{"ref": f"r{i}", "tool": "echo", "depends_on": [failed]} for i in range(10)]}
    keyed = {**acme, "Idempotency-Key": "doomed-1"}
    first = capped.post("/v1/batches", json=doomed, headers=keyed)
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "failed" and first.json()["counts"] == {"failed": 10}
    assert capped.post("/v1/batches", json=doomed, headers=acme).status_code == 202  # 21 runs
    refused = capped.post("/v1/batches", json=doomed, headers=acme)
    assert refused.status_code == 429, refused.text
    assert (refused.json()["code"], refused.json()["limit"]) == ("tenant_created_limit", 21)
    assert 1 <= int(refused.headers["retry-after"]) <= 600
    single = capped.post("/v1/runs", json={"tool": "echo"}, headers=acme)
    assert single.status_code == 429 and single.json()["code"] == "tenant_created_limit"
    # A replay creates nothing: answered, not refused; another tenant has its own window.
    replay = capped.post("/v1/batches", json=doomed, headers=keyed)
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
    other = capped.post("/v1/runs", json={"tool": "echo"}, headers=bearer(engine, "globex"))
    assert other.status_code == 202
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE tenant = 'acme'") == 21


def test_stored_cap__is_429_until_runs_are_deleted(
    database_url: str, engine: Engine, registry: ToolRegistry, acme: dict[str, str]
):
    with client_with(
        database_url, engine, registry, tenant_max_stored_runs=2, retry_after_seconds=9
    ) as client:
        kept = [client.post("/v1/runs", json={"tool": "echo"}, headers=acme) for _ in range(2)]
        refused = client.post("/v1/runs", json={"tool": "echo"}, headers=acme)
        assert refused.status_code == 429
        assert (refused.json()["code"], refused.json()["limit"]) == ("tenant_stored_limit", 2)
        assert "delete finished runs" in refused.json()["detail"]
        assert refused.headers["retry-after"] == "9"
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM tool_runs WHERE id = %s", (kept[0].json()["id"],))
        assert client.post("/v1/runs", json={"tool": "echo"}, headers=acme).status_code == 202


def test_batch_dependencies__more_than_the_cap_is_422_and_writes_nothing(
    database_url: str, engine: Engine, registry: ToolRegistry, acme: dict[str, str]
):
    def body(dependencies: int) -> dict[str, Any]:
        runs: list[dict[str, Any]] = [{"ref": f"up{i}", "tool": "echo"} for i in range(3)]
        refs = [f"up{i % 3}" for i in range(dependencies)]
        for n in range(0, dependencies, 3):
            runs.append({"ref": f"down{n}", "tool": "echo", "depends_on": refs[n : n + 3]})
        return {"runs": runs}

    with client_with(database_url, engine, registry, batch_max_dependencies=5) as client:
        refused = client.post("/v1/batches", json=body(6), headers=acme)
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "too_many_dependencies"
        assert refused.json()["field"] == "runs"
        assert "names 6 dependencies" in refused.json()["detail"]
        assert "at most 5" in refused.json()["detail"]
        assert count(engine, "SELECT count(*) FROM tool_runs") == 0
        assert client.post("/v1/batches", json=body(5), headers=acme).status_code == 202


def test_batch_list__shows_status_and_counts_not_runs(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue, acme
):
    chain = {
        "runs": [
            {"ref": "a", "tool": "echo"},
            {"ref": "b", "tool": "echo", "depends_on": ["a"]},
            {"ref": "c", "tool": "echo", "depends_on": ["a", "b"]},
        ]
    }
    with client_with(database_url, engine, registry) as client:
        first = client.post("/v1/batches", json=chain, headers=acme).json()
        finish_all(queue, FAILURE)  # a fails, and with it b and c
        second = client.post("/v1/batches", json=chain, headers=acme).json()
        listed = client.get("/v1/batches", headers=acme).json()["items"]
        own = client.get(f"/v1/batches/{second['id']}", headers=acme).json()
    assert [item["id"] for item in listed] == [second["id"], first["id"]]
    assert all(set(item) == {"id", "status", "created_at", "size", "counts"} for item in listed)
    assert [(item["status"], item["counts"]) for item in listed] == [
        ("queued", {"queued": 3}),
        ("failed", {"failed": 3}),
    ]
    assert {run["ref"]: run["depends_on"] for run in own["runs"]} == {
        "a": [],
        "b": ["a"],
        "c": ["a", "b"],
    }


def test_batch_retry__by_an_admin_writes_the_batchs_tenants_runs(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue, acme
):
    admin = bearer(engine, "ops", admin=True)
    with client_with(database_url, engine, registry) as client:
        outside = client.post("/v1/runs", json={"tool": "echo"}, headers=acme).json()["id"]
        finish_all(queue, SUCCESS)
        body = {
            "runs": [
                {"ref": "a", "tool": "echo", "depends_on": [outside]},
                {"ref": "b", "tool": "echo", "depends_on": ["a"]},
            ]
        }
        batch = client.post("/v1/batches", json=body, headers=acme).json()
        finish_all(queue, FAILURE)
        retried = client.post(f"/v1/batches/{batch['id']}/retry", headers=admin)
        assert retried.status_code == 202, retried.text
        again = retried.json()["run_ids"]
        theirs = client.get(f"/v1/runs/{again['a']}", headers=acme)
    assert theirs.status_code == 200
    assert theirs.json()["depends_on"] == [outside]
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE tenant <> 'acme'") == 0
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE rerun_of IS NOT NULL") == 2
