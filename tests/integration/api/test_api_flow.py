"""Flow control over HTTP: a tenant's submit rate answers 429 with RateLimit headers; a run's
concurrency_key is shown, and a held run says what holds it."""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient

from runyard.registry.tools import FlowSpec
from tests.integration.api.test_api_helpers import bearer, make_app


def test_submit__past_the_tenants_rate_is_429_with_ratelimit_headers(
    database_url, engine, registry
):
    app = make_app(database_url, engine, registry, tenant_submits_per_second=2)
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    body = {"tool": "echo", "input": {}}
    with TestClient(app) as client:
        answers = [client.post("/v1/runs", json=body, headers=acme) for _ in range(3)]
        other = client.post("/v1/runs", json=body, headers=globex)
    assert [a.status_code for a in answers] == [202, 202, 429]
    refused = answers[2]
    assert refused.json()["code"] == "tenant_submit_rate" and refused.json()["limit"] == 2
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["RateLimit-Policy"] == '"submits";q=2;w=1'
    assert refused.headers["RateLimit"] == '"submits";r=0;t=1'
    assert other.status_code == 202  # each tenant has its own bucket


def test_submit__concurrency_key_is_kept_and_a_held_run_says_why(database_url, engine, registry):
    echo = registry.tools["echo"].model_copy(update={"flow": FlowSpec(key_max_running=1)})
    flows = dataclasses.replace(registry, tools={**registry.tools, "echo": echo})
    acme = bearer(engine, "acme")
    with TestClient(make_app(database_url, engine, flows)) as client:
        made = client.post(
            "/v1/runs", json={"tool": "echo", "concurrency_key": "cust-7"}, headers=acme
        )
        bad = client.post("/v1/runs", json={"tool": "echo", "concurrency_key": "a:b"}, headers=acme)
    assert made.status_code == 202, made.text
    run = made.json()
    assert run["concurrency_key"] == "cust-7"
    assert run["waiting_for"] == "its flow limits: concurrency_key cust-7"
    assert bad.status_code == 422 and bad.json()["field"] == "concurrency_key"
