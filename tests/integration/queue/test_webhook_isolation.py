"""Webhook delivery between tenants, against real Postgres and receivers on loopback: one
tenant's failures never hold back another tenant's deliveries to a receiver they share, the
caps hold between two delivering processes, and a tenant's deliveries to a healthy receiver
do not wait behind its own to a full one."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

import runyard.webhooks.delivery as delivery
from runyard.domain.webhook_fairness import BreakerPolicy, Caps, pick_deliveries
from runyard.platform.db import autocommit
from runyard.queue import JobQueue
from runyard.webhooks.delivery import WebhookConfig, WebhookDeliverer
from runyard.webhooks.sql import CLAIM_DELIVERIES, SETTLE_DELIVERY
from runyard.webhooks.tenant import TenantWebhooks
from tests.integration.queue.test_webhook_fairness import destination, run_in_background, wait_for
from tests.integration.queue.test_webhooks import (
    FAST,
    claim_params,
    deliveries,
    finish,
    webhook_events,
)
from tests.webhook_receiver import Receiver

SATURATED = "already waiting for an answer; not resolving now"


@pytest.fixture
def secrets(engine: Engine) -> None:
    for tenant in ("flood", "quiet"):
        TenantWebhooks(engine).configure(tenant, None)


def config(**overrides: Any) -> WebhookConfig:
    fields: dict[str, Any] = {
        "timeout_seconds": 0.5,
        "lease_seconds": 30.0,
        "backoff_base_seconds": 0.1,
        "backoff_max_seconds": 0.2,
        "concurrency": 4,
        "poll_seconds": 0.1,
        # Room for 8 at a destination: a tenant may hold half of it, as many as its own cap.
        "caps": Caps(per_tenant=4, per_destination=8),
        "breaker": BreakerPolicy(failures=2, cooldown_seconds=600, cooldown_max_seconds=600),
        "policy": FAST.policy,
    }
    fields.update(overrides)
    return WebhookConfig(**fields)


def in_flight(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT tenant, url FROM webhook_deliveries "
                    "WHERE status = 'pending' AND lease_token IS NOT NULL "
                    "AND next_attempt_at > now()"
                )
            ).all()
        )


# --- the breaker is each tenant's own --------------------------------------------------------


def test_deliverer__lookups_one_tenant_used_up_never_open_a_shared_receivers_breaker(
    queue: JobQueue, engine: Engine, secrets: None, receiver: Receiver
):
    """A tenant whose lookups hang (its name server never answers) uses up its share of the
    resolver; its next deliveries to a receiver that others share then fail without a packet
    sent. That is the tenant's failure, not the receiver's: no breaker opens there."""
    stuck = threading.Event()

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if host == "never.test":
            stuck.wait(30)
            raise OSError("no answer")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    shared = f"http://shared.test:{receiver.port}/hook"
    key = f"shared.test:{receiver.port}"
    flood = [
        finish(queue, now=None, tenant="flood", callback_url=f"http://never.test:{receiver.port}/")
        for _ in range(4)
    ]
    flood += [finish(queue, now=None, tenant="flood", callback_url=shared) for _ in range(6)]
    deliverer = WebhookDeliverer(engine, config(), getaddrinfo=getaddrinfo)
    try:
        first = deliverer.run_once()
        assert first.delivered == 0 and first.retrying >= 6
        errors = [e["error"] for run in flood[4:] for e in webhook_events(engine, run)]
        assert errors and all(e.endswith(SATURATED) for e in errors), errors
        assert destination(engine, key, tenant="flood") is None
        quiet = [finish(queue, now=None, tenant="quiet", callback_url=shared) for _ in range(2)]
        second = deliverer.run_once()
    finally:
        stuck.set()
        deliverer.close()
    assert second.deferred == 0
    assert {d["status"] for run in quiet for d in deliveries(engine, run)} == {"delivered"}
    assert {r.run()["id"] for r in receiver.received} >= {str(run) for run in quiet}


def test_deliverer__a_path_that_never_answers_holds_back_only_its_own_tenant(
    queue: JobQueue, engine: Engine, secrets: None, receiver: Receiver
):
    """Two tenants share one receiver; one names a path of it that never answers. Its
    timeouts open its own breaker there; the other tenant's deliveries go on."""
    receiver.silent.add("/silent")
    silent = f"http://127.0.0.1:{receiver.port}/silent"
    key = f"127.0.0.1:{receiver.port}"
    for _ in range(4):
        finish(queue, now=None, tenant="flood", callback_url=silent)
    # Retries wait longer than a pass lasts, however slow the machine: each of the four is
    # attempted once in the first pass.
    deliverer = WebhookDeliverer(engine, config(backoff_base_seconds=30, backoff_max_seconds=30))
    try:
        first = deliverer.run_once()
        assert first.retrying == 4
        opened = destination(engine, key, tenant="flood")
        assert opened is not None and opened.open_until is not None
        quiet = [
            finish(queue, now=None, tenant="quiet", callback_url=receiver.url) for _ in range(3)
        ]
        later = finish(queue, now=None, tenant="flood", callback_url=silent)
        second = deliverer.run_once()
    finally:
        deliverer.close()
    assert second.delivered == 3
    assert {d["status"] for run in quiet for d in deliveries(engine, run)} == {"delivered"}
    assert destination(engine, key, tenant="quiet") is None
    # The flood's own breaker holds its deliveries there back.
    assert second.deferred >= 1
    [held] = deliveries(engine, later)
    assert held["attempts"] == 0 and held["next_attempt_at"] == opened.open_until


# --- the caps hold between processes ----------------------------------------------------------


class PausedPick:
    """Holds the first pick of the thread named ``name`` until ``resume`` is set, so its claim
    works from offers read before what the test does meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.name = name
        self.picked = threading.Event()
        self.resume = threading.Event()
        real = pick_deliveries

        def pick(*args: Any, **kwargs: Any) -> Any:
            picks = real(*args, **kwargs)
            if threading.current_thread().name == name and not self.picked.is_set():
                self.picked.set()
                assert self.resume.wait(30)
            return picks

        monkeypatch.setattr("runyard.webhooks.delivery.pick_deliveries", pick)


def deliver_in_thread(deliverer: WebhookDeliverer, name: str) -> threading.Thread:
    thread = threading.Thread(target=deliverer.run_once, name=name, daemon=True)
    thread.start()
    return thread


def test_deliverers__two_processes_never_pass_a_tenants_cap_together(
    queue: JobQueue,
    engine: Engine,
    secrets: None,
    dead: Receiver,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
):
    """Process 1 picks two deliveries of a tenant with none in flight (its cap is 2). Before
    it claims them, another process claims one of that tenant's deliveries to elsewhere and
    process 2 one more: process 1 may claim none."""
    older = [finish(queue, now=None, tenant="flood", callback_url=dead.url) for _ in range(2)]
    elsewhere = finish(queue, now=None, tenant="flood", callback_url=receiver.url)
    caps = Caps(per_tenant=2, per_destination=8)
    slow = config(timeout_seconds=10.0, caps=caps)
    paused = PausedPick(monkeypatch, "process-1")
    one = WebhookDeliverer(engine, slow, owner="process-1")
    two = WebhookDeliverer(engine, slow, owner="process-2")
    threads = [deliver_in_thread(one, "process-1")]
    try:
        assert paused.picked.wait(10)
        # Meanwhile: a third process holds the tenant's newest delivery (to another receiver),
        # then process 2 claims with a view of that.
        [other] = deliveries(engine, elsewhere)
        autocommit(engine, CLAIM_DELIVERIES, claim_params([other["id"]], None, "process-3"))
        threads.append(deliver_in_thread(two, "process-2"))
        wait_for(lambda: len(dead.received) == 1, 10, "process 2's attempt")
        paused.resume.set()
        time.sleep(1)  # process 1 claims, and sends what it claimed
        assert len(dead.received) == 1
        assert len(in_flight(engine)) == 2  # the cap
    finally:
        paused.resume.set()
        dead.hold.set()
        for thread in threads:
            thread.join(timeout=30)
        one.close()
        two.close()
    assert {d["status"] for run in older for d in deliveries(engine, run)} == {"delivered"}


def test_deliverers__two_processes_never_pass_a_destinations_cap_together(
    queue: JobQueue,
    engine: Engine,
    secrets: None,
    dead: Receiver,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
):
    """Process 1 sees tenant quiet with an attempt in flight elsewhere and gives the
    destination's room (2) to flood. That attempt then ends, and process 2 gives the room to
    one delivery of each: process 1 may claim no more there."""
    flood = [finish(queue, now=None, tenant="flood", callback_url=dead.url) for _ in range(2)]
    quiet = finish(queue, now=None, tenant="quiet", callback_url=dead.url)
    busy = finish(queue, now=None, tenant="quiet", callback_url=receiver.url)
    [elsewhere] = deliveries(engine, busy)
    [taken] = autocommit(engine, CLAIM_DELIVERIES, claim_params([elsewhere["id"]], None, "p3"))
    caps = Caps(per_tenant=4, per_destination=2)
    slow = config(timeout_seconds=10.0, caps=caps, lease_seconds=30.0)
    paused = PausedPick(monkeypatch, "process-1")
    one = WebhookDeliverer(engine, slow, owner="process-1")
    two = WebhookDeliverer(engine, slow, owner="process-2")
    threads = [deliver_in_thread(one, "process-1")]
    try:
        assert paused.picked.wait(10)
        autocommit(
            engine,
            SETTLE_DELIVERY,
            {
                "id": taken.id,
                "token": taken.lease_token,
                "delivered": True,
                "delay": 1.0,
                "window": 3600.0,
                "status_code": 200,
                "error": None,
                "now": None,
            },
        )
        threads.append(deliver_in_thread(two, "process-2"))
        wait_for(lambda: len(dead.received) == 2, 10, "process 2's attempts")
        paused.resume.set()
        time.sleep(1)  # process 1 claims, and sends what it claimed
        assert len(dead.received) == 2
        assert len(in_flight(engine)) == 2  # the cap
        arrived = {r.run()["id"] for r in dead.received}
        assert arrived == {str(flood[0]), str(quiet)}  # the room went in turns
    finally:
        paused.resume.set()
        dead.hold.set()
        for thread in threads:
            thread.join(timeout=30)
        one.close()
        two.close()


# --- a full destination does not hold back the rest --------------------------------------------


def test_deliverer__a_tenants_delivery_to_a_healthy_receiver_does_not_wait_behind_a_full_one(
    queue: JobQueue, engine: Engine, secrets: None, receiver: Receiver, dead: Receiver
):
    """The tenant's oldest deliveries, more than a claim is offered, all go to a receiver
    whose room is taken; its newest goes to another one, and is sent at once."""
    for _ in range(delivery.OFFER_SPARE + 10):
        finish(queue, now=None, tenant="flood", callback_url=dead.url)
    newest = finish(queue, now=None, tenant="flood", callback_url=receiver.url)
    slow = config(timeout_seconds=10.0, caps=Caps(per_tenant=4, per_destination=1))
    deliverer = WebhookDeliverer(engine, slow)
    thread = run_in_background(deliverer)
    try:
        wait_for(lambda: receiver.received, 5, "the delivery to the healthy receiver")
        assert [r.run()["id"] for r in receiver.received] == [str(newest)]
        # The full one's room: its one attempt may reach it after the healthy delivery did.
        wait_for(lambda: dead.received, 5, "the attempt to the full receiver")
        time.sleep(0.5)  # claims pass meanwhile: none may add a second
        assert len(dead.received) == 1
    finally:
        deliverer.stop()
        dead.hold.set()
        thread.join(timeout=30)
