"""The HTTP request metrics: labels from route templates, and the middleware without a server."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from starlette.routing import Route

from api.http_metrics import RequestMetrics, method_label, route_label
from runyard.reads.metrics import Metrics, Role


@pytest.mark.parametrize(
    ("scope", "label"),
    [
        ({"route": Route("/v1/runs/{run_id}", lambda r: None)}, "/v1/runs/{run_id}"),
        ({"route": None}, "unmatched"),
        ({}, "unmatched"),
    ],
)
def test_route_label__is_the_template_or_unmatched(scope: dict[str, Any], label: str):
    assert route_label(scope) == label


@pytest.mark.parametrize(
    ("method", "label"),
    [("GET", "GET"), ("DELETE", "DELETE"), ("PROPFIND", "other"), ("get", "other")],
)
def test_method_label__keeps_the_usual_methods_only(method: str, label: str):
    assert method_label(method) == label


def app_with_metrics() -> tuple[TestClient, Metrics]:
    metrics = Metrics().export(Role.API)
    app = FastAPI()

    @app.get("/things/{thing_id}")
    def thing(thing_id: int) -> dict[str, int]:
        return {"id": thing_id}

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("boom")

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    app.add_middleware(RequestMetrics, metrics=metrics)
    return TestClient(app, raise_server_exceptions=False), metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_request_metrics__count_by_template_status_and_time_each():
    client, metrics = app_with_metrics()
    for thing_id in (1, 2, 3):
        assert client.get(f"/things/{thing_id}").status_code == 200
    assert client.get("/things/x").status_code == 422
    assert client.get("/nowhere/42").status_code == 404
    assert client.get("/boom").status_code == 500

    counted = "runyard_http_requests_total"
    assert sample(metrics, counted, method="GET", route="/things/{thing_id}", status="200") == 3
    assert sample(metrics, counted, method="GET", route="/things/{thing_id}", status="422") == 1
    assert sample(metrics, counted, method="GET", route="unmatched", status="404") == 1
    assert sample(metrics, counted, method="GET", route="/boom", status="500") == 1
    timed = "runyard_http_request_duration_seconds_count"
    assert sample(metrics, timed, method="GET", route="/things/{thing_id}") == 4
    assert "/things/1" not in generate_latest(metrics.registry).decode()


def test_request_metrics__leave_probes_uncounted():
    client, metrics = app_with_metrics()
    assert client.get("/healthz").status_code == 200
    assert "/healthz" not in generate_latest(metrics.registry).decode()
