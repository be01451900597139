"""GET /v1/usage: a tenant's own usage only, totals that are the sum of its runs', CSV, the
per-tenant counters, and the daily CPU quota's 429."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.domain.usage import AttemptUsage
from runyard.queue import JobQueue, NewRun
from runyard.reads.metrics import Metrics
from runyard.registry.tools import ToolRegistry
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.api.test_api_helpers import bearer, make_app
from worker.service import Worker, WorkerConfig


def metered(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
    """The echo tool, as if it used input.cpu CPU seconds."""
    cpu = float(spec.input.get("cpu", 0))
    usage = AttemptUsage(
        cpu_seconds=cpu, memory_peak_bytes=1000, memory_avg_bytes=100, wall_seconds=2
    )
    return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, usage=usage)


@pytest.fixture
def client(database_url: str, engine: Engine, registry: ToolRegistry) -> Iterator[TestClient]:
    with TestClient(make_app(database_url, engine, registry)) as test_client:
        yield test_client


def run_all(queue: JobQueue) -> None:
    worker = Worker(queue, FakeRunner(metered), WorkerConfig(worker_id="u", concurrency=4))
    worker.run_once()
    assert worker.wait_idle(timeout=10)
    worker.close()


def submit(client: TestClient, headers: dict[str, str], cpu: float) -> None:
    response = client.post(
        "/v1/runs", json={"tool": "echo", "input": {"cpu": cpu}}, headers=headers
    )
    assert response.status_code == 202, response.text


def test_usage__totals_are_the_sum_of_the_tenants_runs_and_no_one_elses(
    client: TestClient, engine: Engine, queue: JobQueue
):
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    admin = bearer(engine, "ops", admin=True)
    for cpu in (1.5, 2.0, 0.25):
        submit(client, acme, cpu)
    submit(client, globex, 40.0)
    run_all(queue)
    with engine.connect() as conn:
        acme_runs = conn.execute(
            text(
                "SELECT sum(u.cpu_seconds) FROM attempt_usage u JOIN tool_runs r ON r.id = u.run_id"
                " WHERE r.tenant = 'acme'"
            )
        ).scalar_one()

    report = client.get("/v1/usage", headers=acme).json()
    assert report["tenant"] == "acme" and report["group_by"] == "tool"
    assert [line["key"] for line in report["lines"]] == ["echo"]
    assert report["total"]["cpu_seconds"] == pytest.approx(acme_runs) == pytest.approx(3.75)
    assert report["total"]["runs"] == 3 and report["total"]["memory_peak_bytes"] == 1000
    by_tenant = client.get("/v1/usage", params={"group_by": "tenant"}, headers=acme).json()
    assert [line["key"] for line in by_tenant["lines"]] == ["acme"]  # never globex
    refused = client.get("/v1/usage", params={"tenant": "globex"}, headers=acme)
    assert refused.status_code == 404 and refused.json()["code"] == "tenant_not_found"

    everyone = client.get("/v1/usage", params={"group_by": "tenant"}, headers=admin).json()
    assert {line["key"]: line["cpu_seconds"] for line in everyone["lines"]} == {
        "acme": pytest.approx(3.75),
        "globex": 40.0,
    }
    one = client.get("/v1/usage", params={"tenant": "globex"}, headers=admin).json()
    assert one["tenant"] == "globex" and one["total"]["cpu_seconds"] == 40.0


def test_usage__builds_are_lines_of_kind_build_their_tenant_sees_and_no_one_else(
    client: TestClient, engine: Engine, queue: JobQueue
):
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    admin = bearer(engine, "ops", admin=True)
    submit(client, acme, 1.5)
    run_all(queue)
    with engine.begin() as conn:
        for tenant, cpu in (("acme", 4.0), ("globex", 9.0), (None, 2.0)):
            conn.execute(
                text(
                    "INSERT INTO build_usage (build_id, started_at, tag, tool, engine_id, "
                    "tenant, wall_seconds, cpu_seconds, memory_peak_bytes) VALUES "
                    "(gen_random_uuid(), now(), 't', 'echo', 'e', :tenant, 5, :cpu, 64)"
                ),
                {"tenant": tenant, "cpu": cpu},
            )

    report = client.get("/v1/usage", headers=acme).json()
    kinds = {line["kind"]: line for line in report["lines"]}
    assert set(kinds) == {"run", "build"} and kinds["build"]["cpu_seconds"] == 4.0
    assert (kinds["build"]["runs"], kinds["build"]["attempts"]) == (0, 1)
    assert report["total"]["kind"] == "all"
    assert report["total"]["cpu_seconds"] == pytest.approx(5.5)  # the lines summed
    as_csv = client.get("/v1/usage", params={"format": "csv"}, headers=acme).text
    assert [row["kind"] for row in csv.DictReader(io.StringIO(as_csv))] == ["run", "build"]
    [theirs] = client.get("/v1/usage", headers=globex).json()["lines"]
    assert (theirs["kind"], theirs["cpu_seconds"]) == ("build", 9.0)  # never acme's
    everyone = client.get("/v1/usage", params={"group_by": "tenant"}, headers=admin).json()
    assert sorted((line["key"], line["kind"]) for line in everyone["lines"]) == [
        ("(platform)", "build"),
        ("acme", "build"),
        ("acme", "run"),
        ("globex", "build"),
    ]


def test_usage__csv_by_format_or_accept(client: TestClient, engine: Engine, queue: JobQueue):
    acme = bearer(engine, "acme")
    submit(client, acme, 1.0)
    run_all(queue)
    today = datetime.now(UTC).date().isoformat()
    for kwargs in (
        {"params": {"group_by": "day", "format": "csv"}},
        {"params": {"group_by": "day"}, "headers": {"Accept": "text/csv"}},
    ):
        params = dict(kwargs["params"])
        headers = {**acme, **dict(kwargs.get("headers", {}))}
        response = client.get("/v1/usage", params=params, headers=headers)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(response.text)))
        assert [(row["day"], float(row["cpu_seconds"]), row["runs"]) for row in rows] == [
            (today, 1.0, "1")
        ]


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"from": "2026-02-02", "to": "2026-02-01"}, 400, "invalid_window"),
        ({"from": "2020-01-01", "to": "2026-01-01"}, 400, "invalid_window"),
        ({"group_by": "color"}, 422, None),
        ({"from": "yesterday"}, 422, None),
    ],
)
def test_usage__bad_windows_are_refused_clearly(
    client: TestClient, engine: Engine, params: dict[str, str], status: int, code: str | None
):
    response = client.get("/v1/usage", params=params, headers=bearer(engine, "acme"))
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/problem+json")
    if code is not None:
        assert response.json()["code"] == code


def test_usage__an_empty_window_has_zero_totals(client: TestClient, engine: Engine):
    past = (datetime.now(UTC) - timedelta(days=40)).date().isoformat()
    report = client.get("/v1/usage", params={"from": past, "to": past}, headers=bearer(engine, "a"))
    assert report.json()["lines"] == [] and report.json()["total"]["cpu_seconds"] == 0


def test_usage__tenant_counters_count_each_attempt_once(engine: Engine, queue: JobQueue):
    metrics = Metrics()
    metrics.watch_queue(engine)
    for cpu in (1.0, 2.5):
        queue.enqueue(NewRun(tenant="acme", tool="echo", spec={}, input={"cpu": cpu}))
    run_all(queue)
    exposed = generate_latest(metrics.registry).decode()
    assert 'runyard_tenant_cpu_seconds_total{tenant="acme"} 3.5' in exposed
    assert 'runyard_tenant_attempts_metered_total{tenant="acme"} 2.0' in exposed


def test_usage__a_spent_daily_quota_refuses_new_runs_with_429(
    database_url: str, engine: Engine, registry: ToolRegistry, queue: JobQueue
):
    app = make_app(database_url, engine, registry, tenant_daily_cpu_seconds=3.0)
    acme, globex = bearer(engine, "acme"), bearer(engine, "globex")
    with TestClient(app) as client:
        submit(client, acme, 3.0)
        run_all(queue)
        refused = client.post("/v1/runs", json={"tool": "echo", "input": {}}, headers=acme)
        assert refused.status_code == 429
        body = refused.json()
        assert body["code"] == "tenant_cpu_quota_spent" and body["limit"] == 3
        assert "daily quota of 3 CPU seconds is spent" in body["detail"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 86400
        batch = client.post(
            "/v1/batches", json={"runs": [{"ref": "a", "tool": "echo", "input": {}}]}, headers=acme
        )
        assert batch.status_code == 429
        submit(client, globex, 1.0)  # another tenant's day is its own
