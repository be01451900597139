"""Every defined series moves when real runs go through an in-process API, worker, reaper and
webhook deliverer: with one shared registry (as ``runyard dev`` wires them) and with one each
(the split services, the worker's and the reaper's on ports of their own)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from reaper.service import Reaper, ReaperConfig
from runyard.domain.attempt import AttemptResult
from runyard.domain.states import ErrorCode, RunStatus
from runyard.queue import JobQueue
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics, Role
from runyard.registry.tools import ToolRegistry
from runyard.runners.fake import FakeRunner
from runyard.webhooks.delivery import WebhookConfig, WebhookDeliverer
from tests.integration.api.test_api_helpers import bearer, make_settings, wait_until
from tests.metrics_support import NEEDS_OTHER_EVENTS, moved_series, still_zero
from tests.webhook_receiver import receiver_on
from worker.service import Worker, WorkerConfig

RUNS = 3
SUCCEEDED = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
FAILED = AttemptResult(status=RunStatus.FAILED, exit_code=1, error_code=ErrorCode.TOOL_FAILED)


@dataclass
class Processes:
    """The registries a deployment's processes would have (all one in ``runyard dev``)."""

    api: Metrics
    worker: Metrics
    reaper: Metrics


def scrape(port: int) -> str:
    """``/metrics`` of a process's own metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


@contextmanager
def served(metrics: Metrics) -> Iterator[int]:
    """``metrics`` on a free loopback port, as a worker or reaper serves them."""
    server, thread = metrics.serve(0, "127.0.0.1")
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run_everything(
    database_url: str, engine: Engine, registry: ToolRegistry, processes: Processes
) -> str:
    """Submit runs (and a refused one) with a completion webhook, run them on a worker,
    deliver the webhooks, let the reaper prune them; the API's ``/metrics`` then."""
    settings = make_settings(database_url, webhook_allow_loopback=True)
    app = create_app(settings, engine=engine, registry=registry, metrics=processes.api)
    queue = JobQueue(engine)
    worker = Worker(
        queue,
        FakeRunner(),
        WorkerConfig(worker_id="metrics-w", concurrency=RUNS),
        WorkerRegistry(engine),
        metrics=processes.worker,
    )
    deliverer = WebhookDeliverer(
        engine, WebhookConfig.from_settings(settings), metrics=processes.reaper
    )
    reaper = Reaper(queue, ReaperConfig(retention_seconds=60.0), metrics=processes.reaper)
    admin, acme = bearer(engine, "ops", admin=True), bearer(engine, "acme")
    with receiver_on() as receiver, TestClient(app) as client:
        hook = client.put("/v1/tenants/acme/webhook", json={"url": None}, headers=admin)
        assert hook.status_code == 200, hook.text
        for n in range(RUNS):
            body: dict[str, Any] = {"tool": "echo", "input": {"n": n}}
            submitted = client.post(
                "/v1/runs", json={**body, "callback_url": receiver.url}, headers=acme
            )
            assert submitted.status_code == 202, submitted.text
        unknown = client.post("/v1/runs", json={"tool": "nope", "input": {}}, headers=acme)
        assert unknown.status_code == 422
        assert client.get(f"/v1/runs/{submitted.json()['id']}", headers=acme).status_code == 200

        assert worker.run_once().claimed == RUNS
        assert worker.wait_idle(timeout=30)
        worker.close()
        wait_until(lambda: deliverer.run_once() and len(receiver.received) == RUNS, timeout=30)
        deliverer.close()
        assert reaper.run_once(now=datetime.now(UTC) + timedelta(days=1)).pruned >= RUNS
        return str(client.get("/metrics").text)


def test_allow_list__names_only_defined_series():
    defined = {name for role in Role for name in Metrics().names(role)}
    assert set(NEEDS_OTHER_EVENTS) <= defined


def test_shared_registry__api_metrics_show_every_part_moving(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    shared = Metrics()
    scraped = run_everything(
        database_url, engine, registry, Processes(api=shared, worker=shared, reaper=shared)
    )
    assert still_zero(scraped, *Role) == []
    assert 'runyard_api_submissions_total{result="created"} 3.0' in scraped
    assert 'runyard_api_submissions_total{result="rejected"} 1.0' in scraped
    # Route templates, never ids: the read above is counted under its template.
    assert (
        'runyard_http_requests_total{method="GET",route="/v1/runs/{run_id}",status="200"} 1.0'
    ) in scraped
    assert "/metrics" not in {
        line.split('route="')[1].split('"')[0]
        for line in scraped.splitlines()
        if line.startswith("runyard_http_requests_total{")
    }


@pytest.mark.slow  # starts the services as processes of their own
def test_split_services__each_serves_its_own_series(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    processes = Processes(api=Metrics(), worker=Metrics(), reaper=Metrics())
    with served(processes.worker) as worker_port, served(processes.reaper) as reaper_port:
        api_text = run_everything(database_url, engine, registry, processes)
        worker_text, reaper_text = scrape(worker_port), scrape(reaper_port)

    assert still_zero(api_text, Role.API) == []
    assert still_zero(worker_text, Role.WORKER, Role.ATTEMPTS) == []
    assert still_zero(reaper_text, Role.REAPER, Role.WEBHOOKS) == []
    # No process shows another's series (a worker gauge at 0 in the reaper would page).
    api_names = set(moved_series(api_text))
    worker_names = set(moved_series(worker_text))
    reaper_names = set(moved_series(reaper_text))
    assert "runyard_worker_engine_up" in worker_names - api_names - reaper_names
    assert "runyard_api_submissions" in api_names - worker_names - reaper_names
    assert "runyard_reaper_actions" in reaper_names - api_names - worker_names


def test_batches__count_their_runs_and_their_retries(
    database_url: str, engine: Engine, registry: ToolRegistry
):
    metrics = Metrics()
    app = create_app(make_settings(database_url), engine=engine, registry=registry, metrics=metrics)
    queue = JobQueue(engine)
    acme = bearer(engine, "acme")
    body = {"runs": [{"ref": "ok", "tool": "echo"}, {"ref": "flaky", "tool": "echo"}]}
    key = {**acme, "Idempotency-Key": "batch-1"}
    with TestClient(app) as client:
        batch = client.post("/v1/batches", json=body, headers=key).json()
        assert client.post("/v1/batches", json=body, headers=key).status_code in (200, 202)
        for job in queue.claim(worker_id="w", engine_id="e", limit=10, lease_seconds=30):
            failed = str(job.run_id) == batch["run_ids"]["flaky"]
            queue.finalize(job.job_id, job.lease_token, FAILED if failed else SUCCEEDED)
        retry = f"/v1/batches/{batch['id']}/retry"
        assert client.post(retry, headers=acme).status_code == 202
        # Refused before any run is made (the retried run is still queued): nothing counted.
        assert client.post(retry, headers=acme).status_code == 409

    def submitted(result: str) -> float | None:
        return metrics.registry.get_sample_value(
            "runyard_api_submissions_total", {"result": result}
        )

    assert submitted("created") == 2 + 1  # the batch's two, the retry's one
    assert submitted("replayed") == 2
    assert submitted("rejected") is None
