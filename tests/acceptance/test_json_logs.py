"""Operators' logs: with RUNYARD_LOG_FORMAT=json every line is JSON with the run fields."""

from __future__ import annotations

import json

import pytest

from tests.acceptance.cluster import Cluster, Expected

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


def test_worker_json_logs__carry_run_attempt_and_worker(cluster: Cluster):
    cluster.start_worker("wj", concurrency=1)
    run_id = cluster.submit("echo", {"x": 1}, Expected("succeeded"))
    cluster.check_invariants()
    cluster.kill9("wj")
    records = [json.loads(line) for line in cluster.log_of("wj").splitlines() if line.strip()]
    assert records, "the worker logged nothing"
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    about_run = [r for r in records if r.get("run_id") == str(run_id)]
    actions = {r.get("action") for r in about_run}
    assert {"claimed", "finalized"} <= actions
    assert all(r["worker_id"] == "wj" and r["attempt"] == 1 for r in about_run if "action" in r)
