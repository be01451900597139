"""Two tenants and an admin against every route: another tenant's run is 404 everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.registry.tools import ToolRegistry
from runyard.tenancy.auth import AUTH_CACHE_SECONDS, PrincipalCache
from tests.integration.api.test_api_helpers import bearer, make_app, run_status


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


def _create(client: TestClient, headers: dict[str, str]) -> str:
    response = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_tenancy__every_run_route_hides_other_tenants_runs(client: TestClient, engine: Engine):
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    mine = _create(client, acme)
    theirs = _create(client, globex)

    for path in (f"/v1/runs/{theirs}", f"/v1/runs/{theirs}/logs", f"/v1/runs/{theirs}/events"):
        response = client.get(path, headers=acme)
        assert response.status_code == 404, path
        assert response.json()["code"] == "run_not_found", path
        # Indistinguishable from a run that does not exist.
        missing = client.get(
            path.replace(theirs, "00000000-0000-4000-8000-000000000000"), headers=acme
        )
        assert missing.status_code == 404
        assert response.json()["detail"].split()[:2] == missing.json()["detail"].split()[:2]
    cancel = client.post(f"/v1/runs/{theirs}/cancel", headers=acme)
    assert cancel.status_code == 404
    assert run_status(engine, theirs) == "queued"  # untouched

    listed = client.get("/v1/runs", headers=acme).json()["items"]
    assert [run["id"] for run in listed] == [mine]
    for status in ("queued", "cancelled"):
        items = client.get("/v1/runs", params={"status": status}, headers=acme).json()["items"]
        assert theirs not in [run["id"] for run in items]

    # The owner sees and controls its own run on every route.
    assert client.get(f"/v1/runs/{mine}", headers=acme).status_code == 200
    assert client.get(f"/v1/runs/{mine}/logs", headers=acme).status_code == 200
    assert client.post(f"/v1/runs/{mine}/cancel", headers=acme).status_code == 202
    assert client.get(f"/v1/runs/{mine}/events", headers=acme).status_code == 200
    assert client.get("/v1/tools", headers=acme).status_code == 200
    assert client.get("/v1/tools", headers=globex).status_code == 200


def test_tenancy__idempotency_keys_are_per_tenant(client: TestClient, engine: Engine):
    acme = {**bearer(engine, "acme"), "Idempotency-Key": "same-key"}
    globex = {**bearer(engine, "globex"), "Idempotency-Key": "same-key"}
    first = _create(client, acme)
    other = client.post("/v1/runs", json={"tool": "echo", "input": {"x": 1}}, headers=globex)
    assert other.status_code == 202
    assert other.json()["id"] != first
    assert "idempotent-replayed" not in other.headers


def test_tenancy__admin_sees_and_cancels_every_tenant(client: TestClient, engine: Engine):
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    admin = bearer(engine, "ops", admin=True)
    a, g = _create(client, acme), _create(client, globex)
    listed = {run["id"] for run in client.get("/v1/runs", headers=admin).json()["items"]}
    assert listed == {a, g}
    assert client.get(f"/v1/runs/{g}", headers=admin).status_code == 200
    assert client.get(f"/v1/runs/{g}/logs", headers=admin).status_code == 200
    assert client.post(f"/v1/runs/{g}/cancel", headers=admin).status_code == 202
    assert client.get(f"/v1/runs/{g}/events", headers=admin).status_code == 200
    # An admin's own submissions belong to its own tenant.
    own = _create(client, admin)
    assert client.get(f"/v1/runs/{own}", headers=acme).status_code == 404


def test_auth__revoked_key_stops_working_within_the_cache_bound(client: TestClient, engine: Engine):
    now = [1000.0]
    cache = PrincipalCache(ttl_seconds=AUTH_CACHE_SECONDS, clock=lambda: now[0])
    services = cast(Any, client.app).state.services
    services.auth_cache = cache
    acme = bearer(engine, "acme")
    assert client.get("/v1/runs", headers=acme).status_code == 200  # verified and cached
    with engine.begin() as conn:
        conn.execute(text("UPDATE api_keys SET revoked_at = now()"))

    now[0] += AUTH_CACHE_SECONDS - 0.5
    assert client.get("/v1/runs", headers=acme).status_code == 200  # still inside the bound
    now[0] += 0.5
    response = client.get("/v1/runs", headers=acme)
    assert response.status_code == 401 and response.json()["code"] == "invalid_api_key"
    now[0] += 3600
    assert client.get("/v1/runs", headers=acme).status_code == 401  # never cached as good


def test_auth__unknown_keys_are_not_cached_and_a_new_key_works_at_once(
    client: TestClient, engine: Engine
):
    assert client.get("/v1/runs", headers={"Authorization": "Bearer ry_x_y"}).status_code == 401
    services = cast(Any, client.app).state.services
    assert len(services.auth_cache._entries) == 0
    assert client.get("/v1/runs", headers=bearer(engine, "acme")).status_code == 200
