"""The answer of a queued submit is built from what its statement wrote, not read back: it is
byte for byte the run as a read right after the commit shows it."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi.testclient import TestClient

from runyard.queue.workers import WorkerRegistry
from runyard.registry.tools import FlowSpec
from tests.integration.api.test_api_helpers import bearer, make_app


def test_submit__the_202_is_the_run_as_read_right_after(database_url, engine, registry):
    fail = registry.tools["fail"].model_copy(update={"flow": FlowSpec(key_max_running=1)})
    flows = dataclasses.replace(registry, tools={**registry.tools, "fail": fail})
    acme = bearer(engine, "acme")
    bodies: list[dict[str, Any]] = [
        # jsonb orders keys shorter first: the answer shows the input as stored.
        {"tool": "echo", "input": {"seconds": 1, "b": [1.5, {"zz": None, "a": "x"}]}},
        {"tool": "fail", "input": {}, "concurrency_key": "cust-7", "priority": 0},
        {"tool": "sleep", "input": {"seconds": 2}, "limits": {"timeout_seconds": 5}},
    ]
    answers, reads = [], []
    with TestClient(make_app(database_url, engine, flows)) as client:
        for i, body in enumerate(bodies):
            if i == 2:
                WorkerRegistry(engine).register("w-default", "engine-a", 2)
            answers.append(client.post("/v1/runs", json=body, headers=acme))
            reads.append(client.get(f"/v1/runs/{answers[-1].json()['id']}", headers=acme))
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert [a.text for a in answers] == [r.text for r in reads]
    waiting = [a.json()["waiting_for"] for a in answers]
    assert waiting == [
        "no live worker serves queue default",
        "its flow limits: concurrency_key cust-7",
        None,
    ]
    assert list(answers[0].json()["input"]) == ["b", "seconds"]
