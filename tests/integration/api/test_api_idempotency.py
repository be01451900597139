"""Idempotency under concurrency: 20 parallel POSTs with one key make exactly one run."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest
from sqlalchemy import Engine

from runyard.queue import AdmissionCaps, ApiQueue, IdempotencyConflict, NewRun
from runyard.registry.tools import ToolRegistry
from tests.integration.api.test_api_helpers import bearer, count, live_server, make_app

PARALLEL = 20


@pytest.mark.parametrize(
    "caps",
    [
        pytest.param({}, id="tenant-caps-on (advisory lock)"),
        pytest.param(
            {"tenant_max_queued": 0, "tenant_max_running": 0, "max_queue_depth": 0},
            id="no-caps (ON CONFLICT)",
        ),
    ],
)
def test_idempotency__20_parallel_posts_with_one_key_make_one_run(
    database_url: str, engine: Engine, registry: ToolRegistry, caps: dict[str, Any]
):
    headers = {**bearer(engine, "acme"), "Idempotency-Key": "pay-7f3a"}
    app = make_app(database_url, engine, registry, api_db_pool_size=PARALLEL, **caps)
    barrier = threading.Barrier(PARALLEL)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:

        def post(_: int) -> httpx2.Response:
            barrier.wait()
            return http.post("/v1/runs", json={"tool": "echo", "input": {"n": 1}}, headers=headers)

        with ThreadPoolExecutor(PARALLEL) as pool:
            responses = list(pool.map(post, range(PARALLEL)))
    assert [r.status_code for r in responses] == [202] * PARALLEL, [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(1 for r in responses if "idempotent-replayed" not in r.headers) == 1
    assert count(engine, "SELECT count(*) FROM tool_runs") == 1
    assert count(engine, "SELECT count(*) FROM tool_run_jobs") == 1
    assert count(engine, "SELECT count(*) FROM tool_run_events") == 1


def test_submit__parallel_same_key_at_the_queue_one_creates_others_replay_or_conflict(
    engine: Engine, registry: ToolRegistry
):
    queue = ApiQueue(engine)
    barrier = threading.Barrier(PARALLEL)

    def submit(i: int) -> str:
        # Half the callers send another body under the same key: they must get a conflict.
        run = NewRun(
            tenant="acme",
            tool="echo",
            spec={"name": "echo"},
            input={"n": i % 2},
            idempotency_key="k",
        )
        barrier.wait()
        try:
            return str(queue.submit(run, AdmissionCaps()).run_id)
        except IdempotencyConflict:
            return "conflict"

    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(submit, range(PARALLEL)))
    ids = {r for r in results if r != "conflict"}
    assert len(ids) == 1
    assert results.count("conflict") == PARALLEL // 2
    assert count(engine, "SELECT count(*) FROM tool_runs") == 1
    assert count(engine, "SELECT count(*) FROM tool_run_jobs") == 1
