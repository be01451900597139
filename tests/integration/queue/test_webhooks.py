"""Completion webhooks against real Postgres and a receiver on loopback: the outbox trigger,
the claim and settle statements, and the delivery loop."""

from __future__ import annotations

import functools
import json
import socket
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from api.routes.runs import RUN_JSON
from runyard.platform.db import autocommit
from runyard.queue import JobQueue
from runyard.reads.runs import RunReader
from runyard.webhooks.delivery import WebhookConfig, WebhookDeliverer
from runyard.webhooks.http import post
from runyard.webhooks.sql import CLAIM_DELIVERIES, DELIVERY_OFFERS, SETTLE_DELIVERY
from runyard.webhooks.tenant import TenantWebhooks
from runyard.webhooks.urls import DestinationPolicy
from tests.integration.queue.test_queue import LEASE, SUCCESS, T0, events, new_run
from tests.webhook_receiver import Receiver

FAST = WebhookConfig(
    timeout_seconds=2.0,
    lease_seconds=5.0,
    retry_seconds=3600.0,
    # A retry is never due within the pass that made it, however slow the machine: a pass
    # asserts one attempt per delivery.
    backoff_base_seconds=60.0,
    backoff_max_seconds=120.0,
    concurrency=4,
    policy=DestinationPolicy(allow_loopback=True),
)


def finish(queue: JobQueue, now: datetime | None = T0, **overrides: Any) -> uuid.UUID:
    """A run that went queued -> running -> succeeded through the queue's own statements."""
    run_id = queue.enqueue(new_run(**overrides), now=now).run_id
    [job] = queue.claim(worker_id="w1", engine_id="e", limit=1, lease_seconds=LEASE, now=now)
    assert job.run_id == run_id
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=now)
    return run_id


def deliveries(engine: Engine, run_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT * FROM webhook_deliveries "
                "WHERE CAST(:run_id AS uuid) IS NULL OR run_id = CAST(:run_id AS uuid) "
                "ORDER BY created_at, id"
            ),
            {"run_id": run_id},
        ).all()
    return [dict(r._mapping) for r in rows]


def webhook_events(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return [data for kind, data in events(engine, run_id) if kind == "webhook"]


def due_ids(engine: Engine, now: datetime | None, per_tenant: int = 10) -> list[uuid.UUID]:
    """What DELIVERY_OFFERS offers (not in flight), oldest first."""
    rows = autocommit(engine, DELIVERY_OFFERS, {"per_tenant": per_tenant, "now": now})
    return [r.id for r in sorted(rows, key=lambda r: r.next_attempt_at) if not r.in_flight]


def claim_params(
    ids: list[uuid.UUID], now: datetime | None, owner: str = "p1", **probes: Any
) -> dict[str, Any]:
    return {
        "ids": ids,
        "probe_ids": probes.get("probe_ids", []),
        "probe_destinations": probes.get("probe_destinations", []),
        "owner": owner,
        "lease": 5.0,
        "now": now,
    }


def claim_deliveries(engine: Engine, now: datetime, batch: int = 10, owner: str = "p1") -> Any:
    """Claim what is offered, oldest first, up to ``batch``."""
    ids = due_ids(engine, now, batch)[:batch]
    return autocommit(engine, CLAIM_DELIVERIES, claim_params(ids, now, owner))


def settle(engine: Engine, row: Any, now: datetime, *, code: int | None, delay: float) -> Any:
    return autocommit(
        engine,
        SETTLE_DELIVERY,
        {
            "id": row.id,
            "token": row.lease_token,
            "delivered": code is not None and 200 <= code < 300,
            "delay": delay,
            "window": 3600.0,
            "status_code": code,
            "error": None if code else "connection refused",
            "now": now,
        },
    )


@pytest.fixture
def secret(engine: Engine) -> str:
    configured = TenantWebhooks(engine).configure("acme", None)
    assert configured.secret is not None
    return configured.secret


# --- the outbox ----------------------------------------------------------------------------


def test_outbox__a_run_that_ends_gets_one_delivery_at_its_end(queue: JobQueue, engine: Engine):
    run_id = finish(queue, callback_url="https://hooks.example/run")
    [delivery] = deliveries(engine, run_id)
    assert delivery["url"] == "https://hooks.example/run"
    assert delivery["status"] == "pending" and delivery["attempts"] == 0
    assert delivery["created_at"] == delivery["next_attempt_at"] == T0
    with engine.begin() as conn:  # changes that are not a status change add nothing
        conn.execute(text("UPDATE tool_runs SET error = 'x' WHERE id = :id"), {"id": run_id})
    assert len(deliveries(engine, run_id)) == 1


def test_outbox__the_tenant_default_applies_and_the_run_own_url_wins(
    queue: JobQueue, engine: Engine
):
    nothing = finish(queue)
    TenantWebhooks(engine).configure("acme", "https://hooks.example/default")
    default = finish(queue)
    own = finish(queue, callback_url="https://hooks.example/own")
    other_tenant = finish(queue, tenant="globex")
    assert deliveries(engine, nothing) == []
    assert [d["url"] for d in deliveries(engine, default)] == ["https://hooks.example/default"]
    assert [d["url"] for d in deliveries(engine, own)] == ["https://hooks.example/own"]
    assert deliveries(engine, other_tenant) == []


def test_outbox__a_cancelled_queued_run_gets_one_too(queue: JobQueue, engine: Engine):
    run_id = queue.enqueue(new_run(callback_url="https://hooks.example/c"), now=T0).run_id
    assert deliveries(engine, run_id) == []
    queue.cancel(run_id, now=T0)
    assert [d["url"] for d in deliveries(engine, run_id)] == ["https://hooks.example/c"]


def test_outbox__a_rolled_back_end_leaves_no_delivery(queue: JobQueue, engine: Engine):
    run_id = queue.enqueue(new_run(callback_url="https://hooks.example/r"), now=T0).run_id
    with engine.connect() as conn:
        conn.execute(
            text("UPDATE tool_runs SET status = 'failed', finished_at = now() WHERE id = :id"),
            {"id": run_id},
        )
        assert conn.execute(text("SELECT count(*) FROM webhook_deliveries")).scalar_one() == 1
        conn.rollback()
    assert deliveries(engine) == []


# --- claim and settle ----------------------------------------------------------------------


def test_claim__concurrent_claimers_skip_each_other_and_claimed_rows_are_not_due(
    queue: JobQueue, engine: Engine
):
    for _ in range(6):
        finish(queue, callback_url="https://hooks.example/x")
    with engine.connect() as held:
        params = claim_params(due_ids(engine, T0)[:4], T0)
        first = held.execute(CLAIM_DELIVERIES, params).all()  # locks held until rollback
        second = claim_deliveries(engine, T0, owner="p2")
        assert len(first) == 4 and len(second) == 2
        assert {r.id for r in first}.isdisjoint({r.id for r in second})
        held.commit()
    assert claim_deliveries(engine, T0 + timedelta(seconds=4)) == []
    assert all(r.attempts == 1 and r.lease_token is not None for r in first + second)


def test_claim__a_lease_that_ran_out_is_claimed_again_and_the_old_holder_is_fenced(
    queue: JobQueue, engine: Engine, secret: str
):
    run_id = finish(queue, callback_url="https://hooks.example/x")
    [first] = claim_deliveries(engine, T0)
    assert first.secret == secret
    [again] = claim_deliveries(engine, T0 + timedelta(seconds=6), owner="p2")
    assert (again.id, again.attempts) == (first.id, 2) and again.lease_token != first.lease_token
    assert settle(engine, first, T0 + timedelta(seconds=7), code=200, delay=1) == []
    assert [r.status for r in settle(engine, again, T0 + timedelta(seconds=7), code=204, delay=1)]
    assert webhook_events(engine, run_id) == [
        {
            "delivery_id": str(first.id),
            "attempt": 1,
            "outcome": "interrupted",
            "error": "the delivering process stopped before it knew",
        },
        {"delivery_id": str(first.id), "attempt": 2, "outcome": "delivered", "status_code": 204},
    ]


def test_settle__a_failure_is_retried_after_its_delay_until_the_window_ends(
    queue: JobQueue, engine: Engine
):
    run_id = finish(queue, callback_url="https://hooks.example/x")
    now = T0
    for delay in (300.0, 600.0, 1200.0):
        [row] = claim_deliveries(engine, now)
        [settled] = settle(engine, row, now, code=None, delay=delay)
        assert settled.status == "pending"
        assert claim_deliveries(engine, now + timedelta(seconds=delay - 1)) == []
        now += timedelta(seconds=delay)
    [row] = claim_deliveries(engine, now)  # 2100 s after the end: 2400 more is past the hour
    [settled] = settle(engine, row, now, code=500, delay=2400.0)
    assert settled.status == "failed"
    assert claim_deliveries(engine, now + timedelta(days=2)) == []
    outcomes = [(e["attempt"], e["outcome"]) for e in webhook_events(engine, run_id)]
    assert outcomes == [(1, "retrying"), (2, "retrying"), (3, "retrying"), (4, "gave_up")]
    [delivery] = deliveries(engine, run_id)
    assert (delivery["last_status_code"], delivery["finished_at"]) == (500, now)


# --- the delivery loop ---------------------------------------------------------------------


def test_deliverer__posts_the_run_signed_as_the_api_shows_it(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    run_ids = [finish(queue, now=None, callback_url=receiver.url) for _ in range(3)]
    deliverer = WebhookDeliverer(engine, FAST)
    try:
        result = deliverer.run_once()
    finally:
        deliverer.close()
    assert (result.claimed, result.delivered) == (3, 3)
    by_run = {r.run()["id"]: r for r in receiver.received}
    assert set(by_run) == {str(r) for r in run_ids}
    for run_id in run_ids:
        got = by_run[str(run_id)]
        view = RunReader(engine).view(run_id, None)
        assert view is not None
        run_as_shown = json.loads(RUN_JSON.dump_json(view))
        # A run no container ran (the queue's own statements) has no usage metered.
        assert got.verified(secret) == {**run_as_shown, "event": "run.completed", "usage": None}
        assert got.headers["content-type"] == "application/json"
        assert got.headers["runyard-event"] == "run.completed"
        [delivery] = deliveries(engine, run_id)
        assert got.webhook_id == str(delivery["id"]) and delivery["status"] == "delivered"
        [event] = webhook_events(engine, run_id)
        assert event == {
            "delivery_id": str(delivery["id"]),
            "attempt": 1,
            "outcome": "delivered",
            "status_code": 200,
        }
    with engine.connect() as conn:
        everything = conn.execute(text("SELECT data::text FROM tool_run_events")).scalars()
        assert not any(secret[6:] in data or "whsec_" in data for data in everything)


def test_deliverer__a_redirect_is_a_failed_attempt_and_is_not_followed(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    receiver.status = 302
    receiver.location = receiver.url.replace("/hook", "/elsewhere")
    run_id = finish(queue, now=None, callback_url=receiver.url)
    deliverer = WebhookDeliverer(engine, FAST)
    try:
        assert deliverer.run_once().retrying == 1
    finally:
        deliverer.close()
    assert len(receiver.of_path("/hook")) == 1 and receiver.of_path("/elsewhere") == []
    [event] = webhook_events(engine, run_id)
    assert (event["outcome"], event["status_code"]) == ("retrying", 302)
    [delivery] = deliveries(engine, run_id)
    assert (delivery["status"], delivery["last_status_code"]) == ("pending", 302)


def test_deliverer__a_private_destination_is_refused_without_the_setting(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    run_id = finish(queue, now=None, callback_url=receiver.url)
    deliverer = WebhookDeliverer(engine, WebhookConfig())
    try:
        assert deliverer.run_once().retrying == 1
    finally:
        deliverer.close()
    assert receiver.received == []
    [event] = webhook_events(engine, run_id)
    assert event["error"] == (
        "refused: 127.0.0.1 is a loopback address (RUNYARD_WEBHOOK_ALLOW_LOOPBACK allows it)"
    )


def test_deliverer__connects_to_the_address_it_checked_with_the_url_host(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    resolved: list[str] = []

    def resolve(host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        resolved.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    url = f"http://hooks.test:{receiver.port}/hook?k=v"
    run_id = finish(queue, now=None, callback_url=url)
    deliverer = WebhookDeliverer(engine, FAST, send=functools.partial(post, resolve=resolve))
    try:
        assert deliverer.run_once().delivered == 1
    finally:
        deliverer.close()
    assert resolved == ["hooks.test"]
    [got] = receiver.received
    assert (got.path, got.headers["host"]) == ("/hook?k=v", f"hooks.test:{receiver.port}")
    assert got.run()["id"] == str(run_id)


def test_deliverer__an_attempt_ends_at_its_timeout(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    receiver.hold.clear()
    run_id = finish(queue, now=None, callback_url=receiver.url)
    config = WebhookConfig(timeout_seconds=0.5, lease_seconds=5, policy=FAST.policy)
    deliverer = WebhookDeliverer(engine, config)
    try:
        assert deliverer.run_once().retrying == 1
    finally:
        receiver.hold.set()
        deliverer.close()
    [event] = webhook_events(engine, run_id)
    assert event["error"] == "timed out after 0.5 s"


def test_deliverer__a_tenant_without_a_secret_is_not_sent_to(
    queue: JobQueue, engine: Engine, receiver: Receiver
):
    run_id = finish(queue, now=None, callback_url=receiver.url)
    deliverer = WebhookDeliverer(engine, FAST)
    try:
        assert deliverer.run_once().retrying == 1
    finally:
        deliverer.close()
    assert receiver.received == []
    [event] = webhook_events(engine, run_id)
    assert event["error"] == "the tenant has no webhook secret to sign with"


def test_deliverer__copies_at_once_deliver_each_delivery_once(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    run_ids = {finish(queue, now=None, callback_url=receiver.url) for _ in range(20)}
    copies = [WebhookDeliverer(engine, FAST, owner=f"p{i}") for i in range(3)]
    threads = [threading.Thread(target=copy.run_once) for copy in copies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for copy in copies:
        copy.close()
    ids = [r.webhook_id for r in receiver.received]
    assert len(ids) == len(set(ids)) == 20
    assert {r.run()["id"] for r in receiver.received} == {str(r) for r in run_ids}


def test_deliverer__https_speaks_tls_to_the_checked_address(
    queue: JobQueue, engine: Engine, secret: str, receiver: Receiver
):
    run_id = finish(queue, now=None, callback_url=receiver.url.replace("http://", "https://"))
    deliverer = WebhookDeliverer(engine, FAST)
    try:
        assert deliverer.run_once().retrying == 1
    finally:
        deliverer.close()
    [event] = webhook_events(engine, run_id)
    assert event["error"].startswith("SSLError")  # a plain-HTTP peer cannot complete TLS
    assert receiver.received == []
