"""Every route in queue mode against real Postgres; workers are driven with the fake runner."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from api.main import create_app
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.platform.settings import Settings
from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry, ToolSpec
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from runyard.tenancy.auth import issue_api_key
from tests.integration.api.test_api_helpers import bearer, count, make_app, run_status, wait_until
from worker.service import Worker, WorkerConfig


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


@pytest.fixture
def acme(engine: Engine) -> dict[str, str]:
    return bearer(engine, "acme")


def _worker(queue: JobQueue, runner: FakeRunner | None = None, worker_id: str = "w-api") -> Worker:
    return Worker(queue, runner or FakeRunner(), WorkerConfig(worker_id=worker_id, concurrency=4))


def _submit(client: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    response = client.post("/v1/runs", json={"tool": "echo", "input": {}, **body}, headers=headers)
    assert response.status_code in (200, 202), response.text
    return dict(response.json())


# --- health ---


def test_healthz__answers_without_a_key(client: TestClient):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_readyz__ready_at_head(client: TestClient):
    response = client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ready"


def test_readyz__behind_head_is_503(client: TestClient, engine: Engine):
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'old'"))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "migrations_pending"
    assert response.json()["revision"] == "old"


def test_readyz__unreachable_database_is_503(registry: ToolRegistry):
    from runyard.platform.db import make_engine

    # A loopback port nobody listens on.
    dead = make_engine("postgresql://nobody@127.0.0.1:9/none", pool_size=1, max_overflow=0)
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:9/none")
    app = create_app(settings, engine=dead, registry=registry)
    with TestClient(app) as client:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["code"] == "database_unavailable"
        assert "Retry-After" in response.headers
        runs = client.get("/v1/runs", headers={"Authorization": "Bearer ry_x_y"})
        assert runs.status_code == 503
        assert runs.json()["code"] == "database_unavailable"
    dead.dispose()


def test_metrics__counts_live_runs_without_tenants(client: TestClient, acme):
    _submit(client, acme)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert 'runyard_runs{status="queued",mode="queue"} 1' in response.text
    assert "runyard_sync_slots 0" in response.text
    assert "acme" not in response.text


# --- submit ---


def test_submit__202_with_location_job_and_first_event(client: TestClient, engine: Engine):
    # A key allowed priority 5 (a tenant key's maximum is 0 unless an admin raises it).
    allowed = {"Authorization": f"Bearer {issue_api_key(engine, 'acme', max_priority=5).key}"}
    response = client.post(
        "/v1/runs", json={"tool": "echo", "input": {"x": 1}, "priority": 5}, headers=allowed
    )
    assert response.status_code == 202
    run = response.json()
    assert response.headers["location"] == f"/v1/runs/{run['id']}"
    assert run["status"] == "queued" and run["mode"] == "queue"
    assert run["input"] == {"x": 1} and run["attempts"] == 0 and run["max_attempts"] == 1
    for key in ("result", "exit_code", "error_code", "error", "started_at", "finished_at"):
        assert run[key] is None
    assert count(engine, "SELECT count(*) FROM tool_run_jobs WHERE priority = 5") == 1


def test_submit__wait_returns_the_outcome_on_notify_not_by_polling(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue, acme
):
    # The safety re-check is 30 s away: only the NOTIFY can end the wait in time.
    app = make_app(database_url, engine, registry, events_poll_seconds=30)
    release = threading.Event()

    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        release.wait(10)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"ok": True})

    worker = _worker(queue, FakeRunner(handler))
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            client.post, "/v1/runs?wait=20", json={"tool": "echo", "input": {}}, headers=acme
        )
        wait_until(lambda: worker.run_once().claimed == 1, timeout=10)
        time.sleep(0.2)  # the request is now asleep on its subscription
        released_at = time.monotonic()
        release.set()
        response = waiting.result(timeout=15)
        elapsed = time.monotonic() - released_at
    worker.wait_idle(10)
    worker.close()
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
    assert response.json()["result"] == {"ok": True}
    assert elapsed < 5


def test_submit__wait_ends_at_its_limit_with_202(client: TestClient, acme):
    started = time.monotonic()
    response = client.post("/v1/runs?wait=0.4", json={"tool": "echo"}, headers=acme)
    assert 0.4 <= time.monotonic() - started < 3
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


def test_submit__wait_is_capped_by_max_wait_seconds(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    app = make_app(database_url, engine, registry, max_wait_seconds=0.2)
    with TestClient(app) as client:
        started = time.monotonic()
        response = client.post("/v1/runs?wait=3600", json={"tool": "echo"}, headers=acme)
        # Uncapped, the answer would take an hour; a loaded machine may stretch 0.2 s to a few.
        assert time.monotonic() - started < 30
    assert response.status_code == 202


def test_submit__snapshots_the_tool_definition(client: TestClient, engine: Engine, acme):
    run = _submit(client, acme)
    with engine.connect() as conn:
        spec = conn.execute(
            text("SELECT spec FROM tool_runs WHERE id = :id"), {"id": run["id"]}
        ).scalar_one()
    assert spec["image"] == "runyard/toolbox:latest"
    assert spec["command"][0] == "sh"


def test_idempotency__same_key_and_body_replays_the_run(client: TestClient, engine: Engine, acme):
    headers = {**acme, "Idempotency-Key": "order-42"}
    first = client.post("/v1/runs", json={"tool": "echo", "input": {"a": 1}}, headers=headers)
    again = client.post("/v1/runs", json={"tool": "echo", "input": {"a": 1}}, headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    other = client.post("/v1/runs", json={"tool": "echo", "input": {"a": 2}}, headers=headers)
    assert other.status_code == 409
    assert other.json()["code"] == "idempotency_conflict"
    assert other.json()["field"] == "Idempotency-Key"
    assert count(engine, "SELECT count(*) FROM tool_runs") == 1


# --- admission ---


def test_admission__full_queue_is_503_with_retry_after(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    app = make_app(database_url, engine, registry, max_queue_depth=2, retry_after_seconds=7)
    other = bearer(engine, "globex")
    with TestClient(app) as client:
        _submit(client, acme)
        _submit(client, other)
        refused = client.post("/v1/runs", json={"tool": "echo"}, headers=acme)
    assert refused.status_code == 503
    assert refused.json()["code"] == "queue_full"
    assert refused.headers["retry-after"] == "7"
    assert count(engine, "SELECT count(*) FROM tool_runs") == 2


def test_admission__tenant_queued_cap_is_429_and_spares_other_tenants_and_replays(
    database_url: str, engine: Engine, registry: ToolRegistry, acme
):
    app = make_app(database_url, engine, registry, tenant_max_queued=2)
    other = bearer(engine, "globex")
    with TestClient(app) as client:
        _submit(client, {**acme, "Idempotency-Key": "k1"})
        _submit(client, acme)
        refused = client.post("/v1/runs", json={"tool": "echo"}, headers=acme)
        assert refused.status_code == 429
        assert refused.json()["code"] == "tenant_queued_limit"
        assert int(refused.headers["retry-after"]) >= 1
        # A retry of an admitted request is not a new run: it still gets its run.
        replay = client.post(
            "/v1/runs",
            json={"tool": "echo", "input": {}},
            headers={**acme, "Idempotency-Key": "k1"},
        )
        assert replay.status_code == 202
        assert _submit(client, other)["status"] == "queued"


def test_admission__tenant_running_cap_is_429(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue, acme
):
    app = make_app(database_url, engine, registry, tenant_max_running=1)
    release = threading.Event()

    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        release.wait(10)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    worker = _worker(queue, FakeRunner(handler))
    try:
        with TestClient(app) as client:
            _submit(client, acme)
            assert worker.run_once().claimed == 1
            refused = client.post("/v1/runs", json={"tool": "echo"}, headers=acme)
            assert refused.status_code == 429
            assert refused.json()["code"] == "tenant_running_limit"
            release.set()
            assert worker.wait_idle(10)
            assert _submit(client, acme)["status"] == "queued"
    finally:
        release.set()
        worker.close()


# --- read, list ---


def test_get__returns_the_public_shape(client: TestClient, acme):
    run = _submit(client, acme)
    fetched = client.get(f"/v1/runs/{run['id']}", headers=acme)
    assert fetched.status_code == 200
    body = fetched.json()
    assert set(body) >= {
        "id",
        "tool",
        "status",
        "input",
        "result",
        "exit_code",
        "attempts",
        "max_attempts",
        "error_code",
        "error",
        "requested_at",
        "started_at",
        "finished_at",
        "mode",
        "stdout_truncated",
        "stderr_truncated",
    }
    assert not {"spec", "tenant", "stdout", "lease_token", "sync_owner"} & set(body)


def test_get__unknown_run_is_404_problem(client: TestClient, acme):
    response = client.get("/v1/runs/00000000-0000-4000-8000-000000000000", headers=acme)
    assert response.status_code == 404
    assert response.json()["code"] == "run_not_found"


def test_list__filters_and_pages_through_everything_once(client: TestClient, queue: JobQueue, acme):
    ids = [_submit(client, acme, tool="echo")["id"] for _ in range(5)]
    ids += [_submit(client, acme, tool="fail")["id"] for _ in range(2)]
    client.post(f"/v1/runs/{ids[0]}/cancel", headers=acme)

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/runs", params=params, headers=acme)
        assert page.status_code == 200, page.text
        seen += [item["id"] for item in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        pages += 1
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    assert seen == list(reversed(ids))  # newest first

    def listed(**params: Any) -> list[str]:
        response = client.get("/v1/runs", params=params, headers=acme)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    assert sorted(listed(tool="fail")) == sorted(ids[5:])
    assert listed(status="cancelled") == [ids[0]]
    assert len(listed(status="queued")) == 6
    assert len(listed(mode="queue")) == 7
    assert listed(mode="sync") == []


def test_list__bounds_and_bad_cursor(client: TestClient, acme):
    cases: list[tuple[dict[str, Any], str]] = [
        ({"limit": 0}, "validation_error"),
        ({"limit": 201}, "validation_error"),
        ({"limit": "ten"}, "validation_error"),
        ({"status": "done"}, "validation_error"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "invalid_cursor"),
        ({"cursor": "!!"}, "validation_error"),
    ]
    for params, code in cases:
        response = client.get("/v1/runs", params=params, headers=acme)
        assert response.status_code in (400, 422), (params, response.text)
        assert response.json()["code"] == code, params
    assert client.get("/v1/runs", params={"limit": 200}, headers=acme).status_code == 200


# --- cancel ---


def test_cancel__queued_run_at_once_then_409_with_its_status(client: TestClient, acme):
    run = _submit(client, acme)
    cancelled = client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error_code"] == "cancelled"
    again = client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
    assert again.status_code == 409
    assert again.json()["code"] == "run_finished"
    assert again.json()["run_status"] == "cancelled"


def test_cancel__running_run_reaches_its_worker(
    client: TestClient, engine: Engine, queue: JobQueue, acme
):
    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        if control.cancel.wait(20):
            return AttemptResult(status=RunStatus.CANCELLED, error_code="cancelled")
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    worker = Worker(
        queue,
        FakeRunner(handler),
        WorkerConfig(worker_id="w-cancel", concurrency=1, heartbeat_seconds=0.1),
    )
    try:
        run = _submit(client, acme)
        assert worker.run_once().claimed == 1
        response = client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
        assert response.status_code == 202
        # The answer shows the run as it is once the request is written: the worker may
        # have stopped it already on a busy machine.
        assert response.json()["status"] in ("running", "cancelled")
        assert worker.wait_idle(10)
    finally:
        worker.close()
    assert run_status(engine, run["id"]) == "cancelled"
    done = client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
    assert done.status_code == 409 and done.json()["run_status"] == "cancelled"


# --- logs ---


def test_logs__stream_selection_live_then_stored(client: TestClient, queue: JobQueue, acme):
    run = _submit(client, acme)
    url = f"/v1/runs/{run['id']}/logs"
    assert client.get(url, headers=acme).text == ""
    (job,) = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    for stream, chunk in [("stdout", "out-1\n"), ("stderr", "err-1\n"), ("stdout", "out-2\n")]:
        assert queue.append_log(
            job.job_id, job.lease_token, stream=stream, text_chunk=chunk, until="t"
        )
    live = client.get(url, headers=acme)
    assert live.status_code == 200
    assert live.headers["content-type"].startswith("text/plain")
    assert live.headers["x-runyard-run-status"] == "running"
    assert live.text == "out-1\nerr-1\nout-2\n"
    assert client.get(url, params={"stream": "stdout"}, headers=acme).text == "out-1\nout-2\n"
    assert client.get(url, params={"stream": "stderr"}, headers=acme).text == "err-1\n"

    outcome = AttemptResult(
        status=RunStatus.FAILED,
        exit_code=3,
        stdout="all out\n",
        stderr="all err\n",
        stderr_truncated=True,
        error_code="tool_failed",
    )
    assert queue.finalize(job.job_id, job.lease_token, outcome)
    stored = client.get(url, params={"stream": "both"}, headers=acme)
    assert stored.text == "all out\nall err\n"
    assert stored.headers["x-runyard-stderr-truncated"] == "true"
    assert client.get(url, params={"stream": "stderr"}, headers=acme).text == "all err\n"
    assert client.get(url, params={"stream": "video"}, headers=acme).status_code == 422


# --- events (one-shot; live and resumable streams are in test_api_sse.py) ---


def test_events__whole_history_then_end_after_terminal(client: TestClient, acme):
    run = _submit(client, acme)
    client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
    response = client.get(f"/v1/runs/{run['id']}/events", headers=acme)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in response.text.split("\n\n") if b.startswith("id:")]
    assert [b.splitlines()[1] for b in blocks] == ["event: status", "event: status"]
    assert '"status": "cancelled"' in blocks[-1]
    last_id = blocks[-1].splitlines()[0].removeprefix("id: ")
    finished = client.get(
        f"/v1/runs/{run['id']}/events", headers={**acme, "Last-Event-ID": last_id}
    )
    assert finished.status_code == 204


def test_events__last_event_id_wins_over_after(client: TestClient, acme):
    # An EventSource reconnects to its original URL (?after=) with the last id it received
    # in the header; ids are in commit order, so the header's may be the smaller one.
    run = _submit(client, acme)
    client.post(f"/v1/runs/{run['id']}/cancel", headers=acme)
    url = f"/v1/runs/{run['id']}/events"
    queued, cancelled = re.findall(r"^id: (\d+)$", client.get(url, headers=acme).text, re.M)
    resumed = client.get(
        url, params={"after": cancelled}, headers={**acme, "Last-Event-ID": queued}
    )
    assert resumed.status_code == 200
    assert re.findall(r"^id: (\d+)$", resumed.text, re.M) == [cancelled]
    assert client.get(url, params={"after": cancelled}, headers=acme).status_code == 204


# --- tools, auth, errors ---


def test_tools__lists_the_registry(client: TestClient, acme):
    response = client.get("/v1/tools", headers=acme)
    assert response.status_code == 200
    tools = {tool["name"]: tool for tool in response.json()}
    assert {"echo", "sleep", "fail", "shell"} <= set(tools)
    assert tools["sleep"]["input_schema"]["required"] == ["seconds"]
    assert "command" not in tools["echo"]
    assert tools["echo"]["network"] == "none" and "secrets" not in tools["echo"]


def test_auth__missing_bad_and_revoked_keys_are_401(client: TestClient, engine: Engine, acme):
    assert client.get("/v1/tools").json()["code"] == "unauthenticated"
    assert client.get("/v1/tools", headers={"Authorization": "Basic abc"}).status_code == 401
    bad = client.get("/v1/tools", headers={"Authorization": "Bearer ry_nope_nope"})
    assert bad.status_code == 401 and bad.json()["code"] == "invalid_api_key"
    assert bad.headers["www-authenticate"] == "Bearer"
    with engine.begin() as conn:
        conn.execute(text("UPDATE api_keys SET revoked_at = now()"))
    assert client.get("/v1/tools", headers=acme).status_code == 401


def test_auth__disabled_only_by_its_setting(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    app = make_app(database_url, engine, registry, auth_disabled=True)
    with TestClient(app) as client:
        run = client.post("/v1/runs", json={"tool": "echo"})
        assert run.status_code == 202
        assert client.get(f"/v1/runs/{run.json()['id']}").status_code == 200
    with engine.connect() as conn:
        assert conn.execute(text("SELECT tenant FROM tool_runs")).scalar_one() == "dev"


def test_unexpected_error__is_a_500_problem_without_internals(
    database_url: str, engine: Engine, acme
):
    class BrokenRegistry:
        @property
        def tools(self) -> dict[str, ToolSpec]:
            raise RuntimeError("secret internal detail")

    app = make_app(database_url, engine, cast(ToolRegistry, BrokenRegistry()))
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/v1/tools", headers=acme)
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "internal_error"
    assert "secret" not in response.text and "Traceback" not in response.text


def test_openapi__documents_examples_security_and_problem_responses(client: TestClient):
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["apiKey"]["scheme"].lower() == "bearer"
    assert doc["components"]["schemas"]["RunCreate"]["examples"]
    assert doc["components"]["schemas"]["RunOut"]["examples"]
    post = doc["paths"]["/v1/runs"]["post"]
    for status in ("409", "413", "415", "422", "429", "503"):
        assert "application/problem+json" in post["responses"][status]["content"], status
    events = doc["paths"]["/v1/runs/{run_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
