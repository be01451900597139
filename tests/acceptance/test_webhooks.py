"""Completion webhooks with real processes: a worker runs tools in Docker, ``python -m reaper``
delivers to a receiver on loopback that verifies every signature with the Standard Webhooks
library; the receiver goes away for 30 s, the delivering process is killed with SIGKILL in
the middle of a delivery, the receiver redirects, a private destination is refused, and a
run's lifecycle events arrive in order across the kill of its worker."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue, NewRun
from runyard.submission.request import prepare_run
from runyard.tenancy.auth import create_api_key
from runyard.webhooks.tenant import TenantWebhooks
from tests.acceptance.cluster import Cluster, Expected, events_of
from tests.integration.api.test_api_helpers import make_app
from tests.webhook_receiver import Received, Receiver, receiver_on

TENANT = "acceptance"
# The first wait after a reaper starts includes the reaper's own start, seconds of CPU: on two
# slow cores busy with other tests it took most of 20-25 s.
REAPER_START = 60
# Small retry timings; loopback receivers need the loopback setting.
WEBHOOKS = {
    "RUNYARD_WEBHOOK_ALLOW_LOOPBACK": "true",
    "RUNYARD_WEBHOOK_BACKOFF_BASE_SECONDS": "0.5",
    "RUNYARD_WEBHOOK_BACKOFF_MAX_SECONDS": "4",
    "RUNYARD_WEBHOOK_TIMEOUT_SECONDS": "2",
    "RUNYARD_WEBHOOK_LEASE_SECONDS": "4",
    "RUNYARD_WEBHOOK_POLL_SECONDS": "0.2",
    "RUNYARD_WEBHOOK_RETRY_HOURS": "1",
    # A receiver that is down opens its destination's breaker: short cool-downs here.
    "RUNYARD_WEBHOOK_BREAKER_COOLDOWN_SECONDS": "1",
    "RUNYARD_WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS": "4",
}


@pytest.fixture
def secret(engine: Engine) -> str:
    made = TenantWebhooks(engine).configure(TENANT, None).secret
    assert made is not None
    return made


def submit(cluster: Cluster, tool: str, value: Any, url: str, expected: Expected) -> uuid.UUID:
    """Enqueue a run with a callback URL, recorded for the checker."""
    run = prepare_run(
        cluster.registry, tenant=TENANT, tool_name=tool, input_value=value, callback_url=url
    )
    run_id = cluster.queue.enqueue(run).run_id
    cluster.accepted[run_id] = expected
    return run_id


def finish_here(queue: JobQueue, url: str, n: int) -> set[uuid.UUID]:
    """``n`` runs that end at once, through the queue's own statements (no tool runs)."""
    runs = set()
    for i in range(n):
        run = NewRun(tenant=TENANT, tool="echo", spec={}, input={"i": i}, callback_url=url)
        run_id = queue.enqueue(run).run_id
        [job] = queue.claim(worker_id="test", engine_id="none", limit=1, lease_seconds=60)
        queue.finalize(job.job_id, job.lease_token, AttemptResult(RunStatus.SUCCEEDED, exit_code=0))
        runs.add(run_id)
    return runs


def by_run(received: list[Received]) -> dict[str, list[Received]]:
    grouped: dict[str, list[Received]] = {}
    for got in received:
        grouped.setdefault(got.run()["id"], []).append(got)
    return grouped


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiver_on() as made:
        yield made


def test_webhooks__each_terminal_run_arrives_signed_as_get_shows_it(
    cluster: Cluster, secret: str, receiver: Receiver, database_url: str, engine: Engine
):
    runs = {
        submit(cluster, "echo", {"n": 1}, receiver.url, Expected("succeeded")): "succeeded",
        submit(cluster, "fail", {}, receiver.url, Expected("failed")): "failed",
        submit(cluster, "echo", {"n": 2}, receiver.url, Expected("succeeded")): "succeeded",
    }
    cluster.start_worker("w1")
    cluster.start_reaper("reaper", **WEBHOOKS)
    cluster.check_invariants()
    cluster.wait_for(lambda: len(receiver.received) >= len(runs), REAPER_START, "every delivery")
    time.sleep(1)  # anything more would be a duplicate: there must be none here
    got = by_run(receiver.received)
    assert set(got) == {str(r) for r in runs}
    app = make_app(database_url, engine, cluster.registry)
    admin = {"Authorization": f"Bearer {create_api_key(engine, 'ops', admin=True)}"}
    with TestClient(app) as client:
        for run_id, status in runs.items():
            [delivery] = got[str(run_id)]
            shown = client.get(f"/v1/runs/{run_id}", headers=admin)
            body = delivery.verified(secret)
            usage = body.pop("usage")
            assert body == {**shown.json(), "event": "run.completed"}
            # Metered once: a tool that ends at once may read 0.0 s of wall time.
            assert usage["attempts"] == 1 and usage["wall_seconds"] >= 0
            assert json.loads(delivery.body)["status"] == status
            webhook = [d for kind, d in events_of(engine, run_id) if kind == "webhook"]
            assert [(e["attempt"], e["outcome"], e["status_code"]) for e in webhook] == [
                (1, "delivered", 200)
            ]


def test_webhooks__a_receiver_down_for_30_s_gets_every_delivery_when_back(
    cluster: Cluster, secret: str, engine: Engine
):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    runs = finish_here(cluster.queue, url, 8)
    cluster.start_reaper("reaper", **WEBHOOKS)
    down_until = time.monotonic() + 30
    # Five refused connections in a row open the destination's breaker: from then on its
    # deliveries wait, probed every few seconds, and none is lost.
    cluster.wait_for(lambda: failed_attempts(engine) >= 5, REAPER_START, "failed attempts")
    time.sleep(max(0.0, down_until - time.monotonic()))
    with receiver_on(port) as receiver:
        cluster.wait_for(lambda: delivered(engine) == len(runs), 20, "every delivery")
        got = by_run(receiver.received)
    assert set(got) == {str(r) for r in runs}
    for deliveries in got.values():
        for delivery in deliveries:
            delivery.verified(secret)
    errors = {
        d["error"]
        for r in runs
        for kind, d in events_of(engine, r)
        if kind == "webhook" and "error" in d
    }
    assert any("Connection refused" in e or "ConnectionRefused" in e for e in errors), errors


def failed_attempts(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM tool_run_events "
                    "WHERE type = 'webhook' AND data->>'outcome' = 'retrying'"
                )
            ).scalar_one()
        )


def test_webhooks__kill_9_mid_delivery_loses_none(
    cluster: Cluster, secret: str, receiver: Receiver, engine: Engine
):
    receiver.hold.clear()  # requests arrive and wait: the reaper is mid-delivery
    runs = finish_here(cluster.queue, receiver.url, 6)
    cluster.start_reaper("reaper-1", **WEBHOOKS, RUNYARD_WEBHOOK_CONCURRENCY="2")
    cluster.wait_for(lambda: len(receiver.received) >= 2, REAPER_START, "deliveries in flight")
    cluster.kill9("reaper-1")
    in_flight = {got.run()["id"] for got in receiver.received}
    receiver.hold.set()
    cluster.start_reaper("reaper-2", **WEBHOOKS)
    cluster.wait_for(
        lambda: delivered(engine) == len(runs), 30, "every delivery settled as delivered"
    )
    got = by_run(receiver.received)
    assert set(got) == {str(r) for r in runs}
    for deliveries in got.values():
        assert len({d.webhook_id for d in deliveries}) == 1  # a duplicate has the same id
        for delivery in deliveries:
            delivery.verified(secret)
    for run_id in in_flight:  # cut off before it was settled: sent again
        assert len(got[run_id]) == 2
        outcomes = [
            d["outcome"] for kind, d in events_of(engine, uuid.UUID(run_id)) if kind == "webhook"
        ]
        assert outcomes == ["interrupted", "delivered"]


def delivered(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")
            ).scalar_one()
        )


def test_webhooks__a_redirect_is_not_followed_and_private_is_refused_without_the_setting(
    cluster: Cluster, secret: str, receiver: Receiver, engine: Engine
):
    [run_id] = finish_here(cluster.queue, receiver.url, 1)
    strict = {k: v for k, v in WEBHOOKS.items() if k != "RUNYARD_WEBHOOK_ALLOW_LOOPBACK"}
    cluster.start_reaper("strict", **strict)
    cluster.wait_for(lambda: failed_attempts(engine) >= 1, REAPER_START, "a refused attempt")
    cluster.kill9("strict")
    assert receiver.received == []
    [refused, *_] = [d for kind, d in events_of(engine, run_id) if kind == "webhook"]
    assert "refused: 127.0.0.1 is a loopback address" in refused["error"]

    receiver.status = 307
    receiver.location = receiver.url.replace("/hook", "/elsewhere")
    cluster.start_reaper("lenient", **WEBHOOKS)
    cluster.wait_for(
        lambda: len(receiver.of_path("/hook")) >= 2, REAPER_START, "redirected attempts"
    )
    assert receiver.of_path("/elsewhere") == []
    codes = [d.get("status_code") for kind, d in events_of(engine, run_id) if kind == "webhook"]
    assert 307 in codes and delivered(engine) == 0


def test_lifecycle__started_deadline_and_completed_arrive_signed_in_order_across_a_kill_9(
    cluster: Cluster, receiver: Receiver, engine: Engine
):
    # The lead covers the tool's whole timeout: the deadline notice is due once it starts.
    made = TenantWebhooks(engine).configure(
        TENANT,
        None,
        events=("run.started", "run.deadline_approaching", "run.completed"),
        deadline_lead_seconds=3600,
    )
    assert made.secret is not None
    run_id = submit(cluster, "sleep", {"seconds": 6}, receiver.url, Expected("succeeded"))
    cluster.start_reaper("reaper", **WEBHOOKS)
    cluster.start_worker("w1", concurrency=1)
    cluster.wait_for(
        lambda: len(receiver.received) >= 2, REAPER_START, "started and deadline notices"
    )
    assert cluster.container_state(run_id) == "running"
    cluster.kill9("w1")
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    cluster.wait_for(lambda: delivered(engine) == 3, 30, "every delivery settled")
    assert cluster.run_row(run_id).adoptions == 1  # the same attempt, adopted
    bodies = [got.verified(made.secret) for got in receiver.received]
    # A delivery cut off by nothing here arrives once; one sent again keeps its webhook-id.
    ids = list(dict.fromkeys(got.webhook_id for got in receiver.received))
    assert len(ids) == 3 == len(receiver.received)
    assert [(b["event"], b["id"]) for b in bodies] == [
        ("run.started", str(run_id)),
        ("run.deadline_approaching", str(run_id)),
        ("run.completed", str(run_id)),
    ]
    assert bodies[2]["status"] == "succeeded"
    # Adopted, not run again: one attempt, metered once, in the final delivery.
    assert bodies[2]["usage"]["attempts"] == 1 and "usage" not in bodies[0]
