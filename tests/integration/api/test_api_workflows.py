"""Workflows over HTTP: depends_on, run_at, batches, retry, re-run, the NDJSON event log."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import ErrorCode, RunStatus
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import bearer, count, make_app, run_status

SUCCESS = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"ok": 1})
FAILURE = AttemptResult(
    status=RunStatus.FAILED, exit_code=2, error_code=ErrorCode.TOOL_FAILED, error="exit 2"
)


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


def finish_claimable(queue: JobQueue, outcome: AttemptResult = SUCCESS) -> set[str]:
    """Run every claimable job to ``outcome``; the run ids."""
    jobs = queue.claim(worker_id="w", engine_id="e", limit=100, lease_seconds=30)
    for job in jobs:
        assert queue.finalize(job.job_id, job.lease_token, outcome)
    return {str(job.run_id) for job in jobs}


def post(client: TestClient, headers: dict[str, str], **body: Any) -> Any:
    return client.post("/v1/runs", json={"tool": "echo", "input": {}, **body}, headers=headers)


def test_depends_on__shown_on_the_run_until_it_is_met(client, acme, queue):
    first = post(client, acme).json()["id"]
    second = post(client, acme, depends_on=[first, first])
    assert second.status_code == 202, second.text
    body = second.json()
    assert body["depends_on"] == [first] and body["waiting_on"] == [first]
    assert body["waiting_for"] == "1 of its dependencies to succeed"
    assert finish_claimable(queue) == {first}
    now = client.get(f"/v1/runs/{body['id']}", headers=acme).json()
    assert (now["waiting_on"], now["depends_on"]) == ([], [first])
    listed = client.get("/v1/runs", headers=acme).json()["items"]
    assert [run["depends_on"] for run in listed] == [[first], []]


def test_depends_on__unknown_or_other_tenants_run_is_422_and_writes_nothing(client, acme, engine):
    theirs = post(client, bearer(engine, "globex")).json()["id"]
    for dep in (theirs, str(uuid.uuid4())):
        refused = post(client, acme, depends_on=[dep])
        assert refused.status_code == 422
        assert refused.json()["code"] == "unknown_dependency"
        assert refused.json()["field"] == "depends_on"
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE tenant = 'acme'") == 0


def test_run_at__more_than_30_days_ahead_is_422_and_soon_is_scheduled(client, acme):
    far = (datetime.now(UTC) + timedelta(days=31)).isoformat()
    refused = post(client, acme, run_at=far)
    assert refused.status_code == 422 and "30 days" in refused.json()["detail"]
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    run = post(client, acme, run_at=soon).json()
    assert run["status"] == "queued" and run["waiting_for"] == "its run_at time"
    assert datetime.fromisoformat(run["run_at"]) == datetime.fromisoformat(soon)


def test_batch__accepted_as_one_graph_and_read_back(client, acme, queue):
    body = {
        "runs": [
            {"ref": "build", "tool": "echo", "input": {"s": "build"}},
            {"ref": "test", "tool": "echo", "input": {}, "depends_on": ["build"]},
            {"tool": "echo", "input": {}, "depends_on": ["build", "test"]},
        ]
    }
    created = client.post("/v1/batches", json=body, headers=acme)
    assert created.status_code == 202, created.text
    batch = created.json()
    assert set(batch["run_ids"]) == {"build", "test", "#2"}
    assert batch["status"] == "queued" and batch["counts"] == {"queued": 3}
    run = client.get(f"/v1/runs/{batch['run_ids']['test']}", headers=acme).json()
    assert (run["batch_id"], run["ref"]) == (batch["id"], "test")
    finish_claimable(queue)
    finish_claimable(queue)
    finish_claimable(queue)
    done = client.get(f"/v1/batches/{batch['id']}", headers=acme).json()
    assert (done["status"], done["counts"]) == ("succeeded", {"succeeded": 3})
    by_ref = {run["ref"]: run for run in done["runs"]}
    assert by_ref["#2"]["depends_on"] == ["build", "test"]
    listed = client.get("/v1/batches", headers=acme).json()
    assert [item["id"] for item in listed["items"]] == [batch["id"]]


def test_batch__answer_is_what_a_read_right_after_shows(client, acme, queue):
    # The 202 is built from the write, not read back: it must match the read exactly, runs
    # and dependencies in the same order, for refs whose order differs between collations.
    failed_id = post(client, acme).json()["id"]
    assert finish_claimable(queue, FAILURE) == {failed_id}
    other = client.post("/v1/batches", json={"runs": [{"ref": "up", "tool": "echo"}]}, headers=acme)
    upstream = other.json()["run_ids"]["up"]
    body = {
        "runs": [
            {"ref": "b", "tool": "echo"},
            {"ref": "B", "tool": "echo", "depends_on": ["b", upstream]},
            {"ref": "a_b", "tool": "echo", "depends_on": [upstream.upper(), "b", "B"]},
            {"ref": "a-b", "tool": "echo", "depends_on": [failed_id]},
            {"ref": "a.c", "tool": "echo", "depends_on": ["a-b", "a_b"]},
            {"tool": "echo", "input": {"n": 10}},
            {"tool": "echo", "depends_on": ["#5", "a.c"]},
        ]
    }
    created = client.post("/v1/batches", json=body, headers={**acme, "Idempotency-Key": "k"})
    assert created.status_code == 202, created.text
    answer = created.json()
    read = client.get(f"/v1/batches/{answer['id']}", headers=acme).json()
    assert {k: v for k, v in answer.items() if k != "run_ids"} == read
    assert answer["counts"] == {"queued": 4, "failed": 3}
    by_ref = {run["ref"]: run for run in answer["runs"]}
    assert by_ref["a_b"]["depends_on"] == ["B", "b", upstream]
    assert by_ref["a-b"]["error_code"] == "dependency_failed"
    replay = client.post("/v1/batches", json=body, headers={**acme, "Idempotency-Key": "k"})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == answer


@pytest.mark.parametrize(
    ("runs", "code", "field"),
    [
        (
            [{"ref": "a", "tool": "echo"}, {"ref": "b", "tool": "nope"}],
            "unknown_tool",
            "runs[1].tool",
        ),
        (
            [
                {"ref": "a", "tool": "echo", "depends_on": ["b"]},
                {"ref": "b", "tool": "echo", "depends_on": ["a"]},
            ],
            "invalid_graph",
            "runs[0].depends_on",
        ),
        (
            [{"ref": "a", "tool": "echo", "depends_on": ["zz"]}],
            "invalid_graph",
            "runs[0].depends_on",
        ),
    ],
)
def test_batch__a_bad_item_is_named_and_nothing_is_admitted(
    client, acme, engine, runs, code, field
):
    refused = client.post("/v1/batches", json={"runs": runs}, headers=acme)
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == code
    assert refused.json()["field"] == field
    assert count(engine, "SELECT count(*) FROM tool_runs") == 0


def test_batch__retry_runs_again_only_what_did_not_succeed(client, acme, queue, engine):
    body = {
        "runs": [
            {"ref": "ok", "tool": "echo"},
            {"ref": "flaky", "tool": "echo"},
            {"ref": "after", "tool": "echo", "depends_on": ["ok", "flaky"]},
        ]
    }
    batch = client.post("/v1/batches", json=body, headers=acme).json()
    ids = batch["run_ids"]
    jobs = queue.claim(worker_id="w", engine_id="e", limit=10, lease_seconds=30)
    for job in jobs:
        outcome = FAILURE if str(job.run_id) == ids["flaky"] else SUCCESS
        queue.finalize(job.job_id, job.lease_token, outcome)
    failed = client.get(f"/v1/batches/{batch['id']}", headers=acme).json()
    assert failed["status"] == "failed"
    assert run_status(engine, ids["after"]) == "failed"
    early = client.post(f"/v1/batches/{batch['id']}/retry", headers=acme)
    assert early.status_code == 202, early.text
    again = early.json()["run_ids"]
    assert set(again) == {"flaky", "after"}
    second = client.post(f"/v1/batches/{batch['id']}/retry", headers=acme)
    assert second.status_code == 409
    new_after = client.get(f"/v1/runs/{again['after']}", headers=acme).json()
    assert new_after["rerun_of"] == ids["after"]
    assert sorted(new_after["depends_on"]) == sorted([ids["ok"], again["flaky"]])
    assert finish_claimable(queue) == {again["flaky"]}
    assert finish_claimable(queue) == {again["after"]}
    done = client.get(f"/v1/batches/{batch['id']}", headers=acme).json()
    assert done["status"] == "succeeded" and len(done["runs"]) == 3
    assert count(engine, "SELECT count(*) FROM tool_runs WHERE tenant = 'acme'") == 5


def test_batch__cancel_ends_every_run(client, acme, engine):
    body = {
        "runs": [{"ref": "a", "tool": "echo"}, {"ref": "b", "tool": "echo", "depends_on": ["a"]}]
    }
    batch = client.post("/v1/batches", json=body, headers=acme).json()
    cancelled = client.post(f"/v1/batches/{batch['id']}/cancel", headers=acme)
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    assert {run["error_code"] for run in cancelled.json()["runs"]} == {"cancelled"}


def test_batch__another_tenants_batch_is_404(client, acme, engine):
    body = {"runs": [{"ref": "a", "tool": "echo"}]}
    theirs = client.post("/v1/batches", json=body, headers=bearer(engine, "globex")).json()
    for method, path in (
        ("GET", f"/v1/batches/{theirs['id']}"),
        ("POST", f"/v1/batches/{theirs['id']}/cancel"),
        ("POST", f"/v1/batches/{theirs['id']}/retry"),
    ):
        assert client.request(method, path, headers=acme).status_code == 404, path
    assert client.get("/v1/batches", headers=acme).json()["items"] == []


def test_rerun__same_tool_and_input_as_a_new_run(client, acme):
    first = post(client, acme, input={"message": "again"}).json()
    rerun = client.post(f"/v1/runs/{first['id']}/rerun", headers=acme)
    assert rerun.status_code == 202, rerun.text
    body = rerun.json()
    assert body["id"] != first["id"]
    assert (body["rerun_of"], body["tool"], body["input"]) == (
        first["id"],
        "echo",
        {"message": "again"},
    )


def test_events__ndjson_download_is_the_whole_log_then_the_end(client, acme, queue):
    run = post(client, acme).json()
    finish_claimable(queue)
    for kwargs in (
        {"params": {"format": "ndjson"}},
        {"headers": {"Accept": "application/x-ndjson"}},
    ):
        headers = {**acme, **kwargs.get("headers", {})}
        response = client.get(
            f"/v1/runs/{run['id']}/events", headers=headers, params=kwargs.get("params")
        )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.text.splitlines()]
        assert lines[0]["type"] == "status"
        assert lines[-1]["data"]["status"] == "succeeded"
        assert all(set(line) == {"id", "type", "at", "data"} for line in lines)


def test_sync_mode__workflows_are_refused_with_a_reason(database_url, engine, registry):
    app = make_app(database_url, engine, registry, FakeRunner(), queue_enabled=False)
    with TestClient(app) as sync_client:
        headers = bearer(engine, "acme")
        refused = post(sync_client, headers, depends_on=[str(uuid.uuid4())])
        assert refused.status_code == 422 and refused.json()["code"] == "queue_mode_only"
        batch = sync_client.post("/v1/batches", json={"runs": [{"tool": "echo"}]}, headers=headers)
        assert batch.status_code == 422 and batch.json()["code"] == "queue_mode_only"
