"""Worker pools, priority maxima and per-run limits through the API, on real Postgres."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.platform.settings import Settings
from runyard.queue.workers import WorkerRegistry
from runyard.registry.tools import ToolRegistry, parse_registry
from runyard.tenancy.auth import issue_api_key
from tests.integration.api.test_api_helpers import bearer, make_app
from tests.integration.api.test_ui_http import log_in

TOOL = {"image": "runyard/toolbox:latest", "command": ["true"], "timeout_seconds": 30}


@pytest.fixture
def pools_registry() -> ToolRegistry:
    document = {
        "tools": {
            "plain": {**TOOL, "memory_mb": 64, "cpus": 0.5},
            "roomy": {
                **TOOL,
                "memory_mb": 64,
                "cpus": 0.5,
                "max_timeout_seconds": 120,
                "max_memory_mb": 256,
                "max_cpus": 1.0,
            },
            "render": {**TOOL, "queue": "gpu"},
        }
    }
    return parse_registry(document, Settings(database_url="unused"))


def _job(engine: Engine, run_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT j.queue, j.tenant, j.timeout_seconds, r.spec FROM tool_run_jobs j"
                " JOIN tool_runs r ON r.id = j.run_id WHERE r.id = :id"
            ),
            {"id": run_id},
        ).one()


def test_tools__show_queue_and_maxima(
    database_url: str, engine: Engine, pools_registry: ToolRegistry
):
    with TestClient(make_app(database_url, engine, pools_registry)) as client:
        tools = {t["name"]: t for t in client.get("/v1/tools", headers=bearer(engine, "a")).json()}
    assert tools["render"]["queue"] == "gpu" and tools["plain"]["queue"] == "default"
    assert tools["plain"]["max_memory_mb"] == 64 and tools["plain"]["max_cpus"] == 0.5
    assert tools["roomy"]["max_timeout_seconds"] == 120 and tools["roomy"]["max_memory_mb"] == 256


def test_runs__go_to_the_tools_queue_and_say_when_no_worker_serves_it(
    database_url: str, engine: Engine, pools_registry: ToolRegistry
):
    headers = bearer(engine, "acme")
    with TestClient(make_app(database_url, engine, pools_registry)) as client:
        WorkerRegistry(engine).register("w-default", "engine-a", 2)
        gpu = client.post("/v1/runs", json={"tool": "render"}, headers=headers).json()
        plain = client.post("/v1/runs", json={"tool": "plain"}, headers=headers).json()
        assert _job(engine, gpu["id"]).queue == "gpu"
        assert _job(engine, gpu["id"]).tenant == "acme"
        assert _job(engine, plain["id"]).queue == "default"
        assert gpu["waiting_for"] == "no live worker serves queue gpu"
        assert plain["waiting_for"] is None

        WorkerRegistry(engine).register("w-gpu", "engine-b", 1, queues=("gpu",))
        again = client.get(f"/v1/runs/{gpu['id']}", headers=headers).json()
        assert again["waiting_for"] is None

        page = client.get("/ui/queue", headers=bearer(engine, "ops", admin=True))
        assert page.status_code == 200
        metrics = client.get("/metrics")
    assert 'runyard_queue_live_workers{queue="gpu"} 1.0' in metrics.text
    assert 'runyard_queue_live_workers{queue="default"} 1.0' in metrics.text


def test_priority__a_tenant_key_is_held_to_its_maximum(
    database_url: str, engine: Engine, pools_registry: ToolRegistry
):
    tenant_key = issue_api_key(engine, "acme")
    tenant = {"Authorization": f"Bearer {tenant_key.key}"}
    admin = bearer(engine, "ops", admin=True)
    with TestClient(make_app(database_url, engine, pools_registry)) as client:
        assert client.post("/v1/runs", json={"tool": "plain"}, headers=tenant).status_code == 202
        refused = client.post("/v1/runs", json={"tool": "plain", "priority": 1}, headers=tenant)
        assert refused.status_code == 422
        assert refused.json()["code"] == "above_maximum"
        assert "maximum 0" in refused.json()["detail"]

        changed = client.patch(
            f"/v1/keys/{tenant_key.prefix}", json={"max_priority": 5}, headers=admin
        )
        assert changed.status_code == 200 and changed.json()["max_priority"] == 5
        ok = client.post("/v1/runs", json={"tool": "plain", "priority": 5}, headers=tenant)
        assert ok.status_code == 202
        over = client.post("/v1/runs", json={"tool": "plain", "priority": 6}, headers=tenant)
        assert over.status_code == 422 and "maximum 5" in over.json()["detail"]
        assert (
            client.patch(
                f"/v1/keys/{tenant_key.prefix}", json={"max_priority": 5}, headers=tenant
            ).status_code
            == 403
        )
        assert (
            client.patch(
                "/v1/keys/000000000000", json={"max_priority": 5}, headers=admin
            ).status_code
            == 404
        )

        created = client.post(
            "/v1/keys", json={"tenant": "beta", "max_priority": 3}, headers=admin
        ).json()
        assert created["max_priority"] == 3
        beta = {"Authorization": f"Bearer {created['key']}"}
        beta_run = client.post("/v1/runs", json={"tool": "plain", "priority": 3}, headers=beta)
        assert beta_run.status_code == 202
        assert (
            client.post(
                "/v1/runs", json={"tool": "plain", "priority": 100}, headers=admin
            ).status_code
            == 202
        )


def test_limits__within_the_maxima_go_into_the_spec(
    database_url: str, engine: Engine, pools_registry: ToolRegistry
):
    headers = bearer(engine, "acme")
    body = {"tool": "roomy", "limits": {"timeout_seconds": 120, "memory_mb": 256, "cpus": 1.0}}
    with TestClient(make_app(database_url, engine, pools_registry)) as client:
        run = client.post("/v1/runs", json=body, headers=headers)
        lower = client.post(
            "/v1/runs", json={"tool": "plain", "limits": {"memory_mb": 32}}, headers=headers
        )
    assert run.status_code == 202, run.text
    job = _job(engine, run.json()["id"])
    assert job.timeout_seconds == 120
    assert job.spec["memory_mb"] == 256 and job.spec["cpus"] == 1.0
    assert job.spec["timeout_seconds"] == 120
    assert lower.status_code == 202
    assert _job(engine, lower.json()["id"]).spec["memory_mb"] == 32


@pytest.mark.parametrize(
    ("tool", "limits", "field", "maximum"),
    [
        ("roomy", {"memory_mb": 257}, "limits.memory_mb", "256"),
        ("roomy", {"timeout_seconds": 121}, "limits.timeout_seconds", "120"),
        ("roomy", {"cpus": 1.5}, "limits.cpus", "1.0"),
        ("plain", {"memory_mb": 65}, "limits.memory_mb", "64"),
        ("plain", {"timeout_seconds": 31}, "limits.timeout_seconds", "30"),
    ],
)
def test_limits__beyond_a_maximum_are_refused_naming_it(
    database_url: str,
    engine: Engine,
    pools_registry: ToolRegistry,
    tool: str,
    limits: dict[str, Any],
    field: str,
    maximum: str,
):
    with TestClient(make_app(database_url, engine, pools_registry)) as client:
        refused = client.post(
            "/v1/runs", json={"tool": tool, "limits": limits}, headers=bearer(engine, "acme")
        )
    assert refused.status_code == 422
    problem = refused.json()
    assert problem["code"] == "above_maximum" and field in problem["detail"]
    assert f"maximum {maximum}" in problem["detail"]


@pytest.mark.parametrize(
    ("limits", "field", "bounds"),
    [
        ({"cpus": 1e-10}, "limits.cpus", "must be from 0.01 to 256 CPUs"),
        ({"cpus": 0.001}, "limits.cpus", "must be from 0.01 to 256 CPUs"),
        ({"memory_mb": 1}, "limits.memory_mb", "must be from 6 to 1048576 MB"),
        ({"timeout_seconds": 0}, "limits.timeout_seconds", "must be from 1 to 604800 seconds"),
    ],
)
def test_limits__below_the_engines_floor_are_a_422_naming_the_field_and_the_bounds(
    database_url: str,
    engine: Engine,
    pools_registry: ToolRegistry,
    limits: dict[str, Any],
    field: str,
    bounds: str,
):
    with TestClient(make_app(database_url, engine, pools_registry)) as client:
        refused = client.post(
            "/v1/runs", json={"tool": "roomy", "limits": limits}, headers=bearer(engine, "acme")
        )
    assert refused.status_code == 422
    problem = refused.json()
    assert (problem["code"], problem["field"]) == ("validation_error", field)
    assert problem["detail"].startswith(f"{field}: {bounds}")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tool_runs")).scalar_one() == 0


def test_dashboard__run_page_and_queue_page_tell_a_queue_without_workers(
    database_url: str, engine: Engine, pools_registry: ToolRegistry
):
    key = issue_api_key(engine, "acme").key
    app = make_app(database_url, engine, pools_registry)
    with TestClient(app, follow_redirects=False) as client:
        run = client.post(
            "/v1/runs", json={"tool": "render"}, headers={"Authorization": f"Bearer {key}"}
        ).json()
        WorkerRegistry(engine).register("w-default", "engine-a", 2)
        log_in(client, key)
        run_page = client.get(f"/ui/runs/{run['id']}").text
        assert re.search(r'id="run-waiting-for"[^>]*>no live worker serves queue gpu<', run_page)
        pools = re.search(r'<table id="pools">.*?</table>', client.get("/ui/queue").text, re.S)
        assert pools is not None
        assert re.search(r"<td>default</td><td class=\"num\">1</td>", pools.group(0))
        assert "no live worker serves queue gpu" in pools.group(0)

        WorkerRegistry(engine).register("w-gpu", "engine-b", 1, queues=("gpu",))
        assert "run-waiting-for" not in client.get(f"/ui/runs/{run['id']}").text
