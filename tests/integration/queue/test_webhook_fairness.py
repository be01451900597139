"""Fair webhook delivery against real Postgres and receivers on loopback: the offer, claim,
hold-back and breaker statements, and the deliverer's turns, caps, breaker and continuous
sending."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from runyard.domain.webhook_fairness import BreakerPolicy, Caps
from runyard.platform.db import autocommit
from runyard.queue import JobQueue
from runyard.webhooks.delivery import HELD_PAST_WINDOW, WebhookConfig, WebhookDeliverer
from runyard.webhooks.sql import (
    CLAIM_DELIVERIES,
    CLOSE_DESTINATION,
    DEFER_DELIVERIES,
    DELIVERY_OFFERS,
    DESTINATION_STATES,
    IN_FLIGHT,
    LOCK_CLAIM,
    LOCK_DESTINATION,
    MORE_OFFERS,
    PRUNE_DESTINATIONS,
    SAVE_DESTINATION,
)
from runyard.webhooks.tenant import TenantWebhooks
from tests.integration.queue.test_queue import T0
from tests.integration.queue.test_webhooks import (
    FAST,
    claim_params,
    deliveries,
    finish,
    webhook_events,
)
from tests.webhook_receiver import Receiver, receiver_on

HOOK = "https://hooks.example/x"


@pytest.fixture
def secrets(engine: Engine) -> None:
    for tenant in ("acme", "flood", "quiet", "other"):
        TenantWebhooks(engine).configure(tenant, None)


def offers(engine: Engine, now: Any, per_tenant: int = 10) -> list[Any]:
    return autocommit(engine, DELIVERY_OFFERS, {"per_tenant": per_tenant, "now": now})


def destination(engine: Engine, key: str, tenant: str = "acme") -> Any:
    """The tenant's breaker state at ``key`` (None: closed)."""
    rows = autocommit(engine, DESTINATION_STATES, {"tenants": [tenant], "destinations": [key]})
    return rows[0] if rows else None


def set_destination(
    engine: Engine, key: str, failures: int, open_until: Any, tenant: str = "acme"
) -> None:
    pair = {"tenant": tenant, "destination": key}
    with engine.begin() as conn:
        conn.execute(LOCK_DESTINATION, {**pair, "now": T0})
        conn.execute(
            SAVE_DESTINATION, {**pair, "failures": failures, "open_until": open_until, "now": T0}
        )


def run_in_background(deliverer: WebhookDeliverer) -> threading.Thread:
    thread = threading.Thread(target=deliverer.run_forever, name="test-deliverer", daemon=True)
    thread.start()
    return thread


def wait_for(predicate: Any, seconds: float, what: str) -> float:
    """Seconds until ``predicate()`` held; fails after ``seconds``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.02)
    return time.monotonic() - started


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- statements ----------------------------------------------------------------------------


def test_delivery_offers__each_tenant_oldest_due_up_to_the_limit_and_what_is_in_flight(
    queue: JobQueue, engine: Engine
):
    for i in range(5):
        finish(queue, now=T0 + timedelta(seconds=i), tenant="flood", callback_url=HOOK)
    finish(queue, now=T0 + timedelta(seconds=9), tenant="quiet", callback_url=HOOK)
    finish(queue, now=T0 + timedelta(hours=1), tenant="other", callback_url=HOOK)  # not due
    now = T0 + timedelta(seconds=10)
    oldest = min(
        (r for r in offers(engine, now) if r.tenant == "flood"), key=lambda r: r.next_attempt_at
    )
    [taken] = autocommit(engine, CLAIM_DELIVERIES, claim_params([oldest.id], now))
    rows = offers(engine, now, per_tenant=2)
    offered = [(r.tenant, r.next_attempt_at) for r in rows if not r.in_flight]
    assert offered == [
        ("flood", T0 + timedelta(seconds=1)),
        ("flood", T0 + timedelta(seconds=2)),
        ("quiet", T0 + timedelta(seconds=9)),
    ]
    assert [(r.id, r.tenant) for r in rows if r.in_flight] == [(taken.id, "flood")]
    assert {r.now for r in rows} == {now}
    # A lease that ran out (5 s) is due again, and no longer in flight.
    rows = offers(engine, now + timedelta(seconds=6), per_tenant=10)
    assert taken.id in {r.id for r in rows if not r.in_flight}
    assert not any(r.in_flight for r in rows)


def test_more_offers__a_tenants_due_deliveries_past_those_offered(queue: JobQueue, engine: Engine):
    for i in range(6):
        finish(queue, now=T0 + timedelta(seconds=i), tenant="flood", callback_url=HOOK)
    finish(queue, now=T0 + timedelta(seconds=2), tenant="quiet", callback_url=HOOK)
    finish(queue, now=T0 + timedelta(hours=1), tenant="flood", callback_url=HOOK)  # not due
    now = T0 + timedelta(seconds=10)
    first = sorted(
        (r for r in offers(engine, now, per_tenant=2) if r.tenant == "flood"),
        key=lambda r: r.next_attempt_at,
    )
    rows = autocommit(
        engine,
        MORE_OFFERS,
        {
            "tenants": ["flood"],
            "after": [first[-1].next_attempt_at],
            "seen": [r.id for r in first],
            "limit": 3,
            "now": now,
        },
    )
    assert [(r.tenant, r.next_attempt_at) for r in rows] == [
        ("flood", T0 + timedelta(seconds=2)),
        ("flood", T0 + timedelta(seconds=3)),
        ("flood", T0 + timedelta(seconds=4)),
    ]
    assert not {r.id for r in rows} & {r.id for r in first}


def test_claim_deliveries__takes_the_ids_in_the_order_given_and_only_due_ones(
    queue: JobQueue, engine: Engine
):
    runs = [finish(queue, callback_url=HOOK) for _ in range(3)]
    ids = [deliveries(engine, run)[0]["id"] for run in runs]
    early = T0 - timedelta(seconds=1)
    assert autocommit(engine, CLAIM_DELIVERIES, claim_params(ids, early)) == []  # not due
    claimed = autocommit(engine, CLAIM_DELIVERIES, claim_params([ids[2], ids[0]], T0))
    assert [r.id for r in claimed] == [ids[2], ids[0]]
    assert all(r.attempts == 1 and r.tenant == "acme" for r in claimed)
    # Claimed rows are not due until their lease runs out: only the third is left.
    assert [r.id for r in autocommit(engine, CLAIM_DELIVERIES, claim_params(ids, T0))] == [ids[1]]
    assert autocommit(engine, CLAIM_DELIVERIES, claim_params([], T0)) == []


def test_claim_deliveries__a_destination_gets_one_probe_however_claims_race(
    queue: JobQueue, engine: Engine
):
    first, second = (finish(queue, callback_url=HOOK) for _ in range(2))
    one, two = (deliveries(engine, run)[0]["id"] for run in (first, second))
    key = "hooks.example:443"
    set_destination(engine, key, failures=5, open_until=T0 - timedelta(seconds=1))
    outcome: dict[str, Any] = {}
    with engine.connect() as held:
        probe = held.execute(
            CLAIM_DELIVERIES,
            claim_params([one], T0, probe_ids=[one], probe_destinations=[key]),
        ).all()
        racer = threading.Thread(
            target=lambda: outcome.setdefault(
                "rows",
                autocommit(
                    engine,
                    CLAIM_DELIVERIES,
                    claim_params([two], T0, "p2", probe_ids=[two], probe_destinations=[key]),
                ),
            )
        )
        racer.start()
        time.sleep(0.3)  # the racer waits for the destination's row
        assert racer.is_alive()
        held.commit()
    racer.join(timeout=10)
    assert [r.id for r in probe] == [one]
    assert outcome["rows"] == []  # the destination was being probed already
    state = destination(engine, key)
    assert (state.failures, state.open_until) == (5, T0 + timedelta(seconds=5))  # the lease
    # Not a probe: claimed whatever the breaker says (the caller decides what to probe).
    assert [r.id for r in autocommit(engine, CLAIM_DELIVERIES, claim_params([two], T0))] == [two]


def test_claim_deliveries__a_probe_not_claimed_leaves_its_breaker_as_it_was(
    queue: JobQueue, engine: Engine
):
    locked_run, later_run = (finish(queue, callback_url=HOOK) for _ in range(2))
    locked, later = (deliveries(engine, run)[0]["id"] for run in (locked_run, later_run))
    key = "hooks.example:443"
    cooled = T0 - timedelta(seconds=1)
    set_destination(engine, key, failures=5, open_until=cooled)
    with engine.connect() as other:  # another claim holds the row
        other.execute(
            text("SELECT 1 FROM webhook_deliveries WHERE id = :id FOR UPDATE"), {"id": locked}
        )
        rows = autocommit(
            engine,
            CLAIM_DELIVERIES,
            claim_params([locked], T0, probe_ids=[locked], probe_destinations=[key]),
        )
        assert rows == []
        other.rollback()
    state = destination(engine, key)
    assert (state.failures, state.open_until) == (5, cooled)  # not marked as being probed
    # A probe that is no longer due (another claim took it and moved it a lease ahead).
    autocommit(engine, CLAIM_DELIVERIES, claim_params([later], T0))
    rows = autocommit(
        engine,
        CLAIM_DELIVERIES,
        claim_params([later], T0, probe_ids=[later], probe_destinations=[key]),
    )
    assert rows == []
    state = destination(engine, key)
    assert (state.failures, state.open_until) == (5, cooled)
    # A probe that is claimed marks it for its lease.
    rows = autocommit(
        engine,
        CLAIM_DELIVERIES,
        claim_params([locked], T0, probe_ids=[locked], probe_destinations=[key]),
    )
    assert [r.id for r in rows] == [locked]
    assert destination(engine, key).open_until == T0 + timedelta(seconds=5)


def test_claim_deliveries__a_probe_marks_only_its_own_tenants_breaker(
    queue: JobQueue, engine: Engine
):
    run = finish(queue, callback_url=HOOK, tenant="acme")
    [probe] = deliveries(engine, run)
    key = "hooks.example:443"
    cooled = T0 - timedelta(seconds=1)
    for tenant in ("acme", "other"):
        set_destination(engine, key, failures=5, open_until=cooled, tenant=tenant)
    params = claim_params([probe["id"]], T0, probe_ids=[probe["id"]], probe_destinations=[key])
    assert [r.id for r in autocommit(engine, CLAIM_DELIVERIES, params)] == [probe["id"]]
    assert destination(engine, key).open_until == T0 + timedelta(seconds=5)
    assert destination(engine, key, tenant="other").open_until == cooled


def test_lock_claim__a_second_claim_for_the_same_tenant_waits_and_then_sees_the_first(
    queue: JobQueue, engine: Engine
):
    first, second = (finish(queue, callback_url=HOOK) for _ in range(2))
    one, two = (deliveries(engine, run)[0]["id"] for run in (first, second))
    outcome: dict[str, Any] = {}

    def second_claim() -> None:
        with engine.begin() as conn:
            conn.execute(LOCK_CLAIM, {"keys": ["destination:other:80", "tenant:acme"]})
            outcome["in_flight"] = conn.execute(IN_FLIGHT, {"now": T0}).all()

    with engine.connect() as held:
        held.execute(LOCK_CLAIM, {"keys": ["tenant:acme", "destination:hooks.example:443"]})
        assert held.execute(IN_FLIGHT, {"now": T0}).all() == []
        held.execute(CLAIM_DELIVERIES, claim_params([one], T0))
        racer = threading.Thread(target=second_claim)
        racer.start()
        time.sleep(0.3)  # it waits for the tenant's lock
        assert racer.is_alive()
        held.commit()
    racer.join(timeout=10)
    assert [(r.tenant, r.url) for r in outcome["in_flight"]] == [("acme", HOOK)]
    # Locks of other tenants and destinations do not wait (a wait would fail at the timeout).
    with engine.connect() as held:
        held.execute(LOCK_CLAIM, {"keys": ["tenant:acme"]})
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))
            conn.execute(LOCK_CLAIM, {"keys": ["tenant:other", "destination:x:1"]})
        held.rollback()
    assert autocommit(engine, CLAIM_DELIVERIES, claim_params([two], T0))


def test_defer_deliveries__holds_back_gives_up_past_the_window_and_releases_dead_leases(
    queue: JobQueue, engine: Engine
):
    runs = [finish(queue, callback_url=HOOK) for _ in range(3)]
    held, expired, leased = (deliveries(engine, run)[0]["id"] for run in runs)
    autocommit(engine, CLAIM_DELIVERIES, claim_params([leased], T0))  # its process then dies
    now = T0 + timedelta(seconds=10)
    rows = autocommit(
        engine,
        DEFER_DELIVERIES,
        {
            "ids": [held, expired, leased],
            "untils": [
                T0 + timedelta(seconds=600),
                T0 + timedelta(seconds=4000),  # past the hour's window
                T0 + timedelta(seconds=600),
            ],
            "window": 3600.0,
            "error": HELD_PAST_WINDOW,
            "now": now,
        },
    )
    assert sorted((r.id, r.status) for r in rows) == sorted(
        [(held, "pending"), (expired, "failed"), (leased, "pending")]
    )
    by_id = {d["id"]: d for d in deliveries(engine)}
    assert by_id[held]["next_attempt_at"] == T0 + timedelta(seconds=600)
    assert by_id[held]["attempts"] == 0  # not an attempt
    assert (by_id[expired]["status"], by_id[expired]["finished_at"]) == ("failed", now)
    assert by_id[leased]["lease_token"] is None and by_id[leased]["attempts"] == 1
    assert webhook_events(engine, runs[0]) == []
    assert webhook_events(engine, runs[1]) == [
        {"delivery_id": str(expired), "attempt": 0, "outcome": "gave_up", "error": HELD_PAST_WINDOW}
    ]
    assert [e["outcome"] for e in webhook_events(engine, runs[2])] == ["interrupted"]
    # Held rows are not due, so a second hold-back finds nothing.
    again = {"ids": [held], "untils": [T0], "window": 3600.0, "error": "x", "now": now}
    assert autocommit(engine, DEFER_DELIVERIES, again) == []


def test_destination_statements__lock_save_close_and_prune_each_tenants_own(engine: Engine):
    a80 = {"tenant": "acme", "destination": "a:80"}
    with engine.begin() as conn:
        [fresh] = conn.execute(LOCK_DESTINATION, {**a80, "now": T0}).all()
        assert (fresh.failures, fresh.open_until, fresh.now) == (0, None, T0)
        conn.execute(SAVE_DESTINATION, {**a80, "failures": 3, "open_until": T0, "now": T0})
    with engine.begin() as conn:
        [again] = conn.execute(LOCK_DESTINATION, {**a80, "now": T0}).all()
        assert (again.failures, again.open_until) == (3, T0)
    set_destination(engine, "b:80", failures=1, open_until=None)
    set_destination(engine, "a:80", failures=2, open_until=None, tenant="other")
    states = autocommit(
        engine,
        DESTINATION_STATES,
        {
            "tenants": ["acme", "acme", "acme", "other"],
            "destinations": ["a:80", "b:80", "c:80", "a:80"],
        },
    )
    assert sorted((r.tenant, r.destination, r.failures) for r in states) == [
        ("acme", "a:80", 3),
        ("acme", "b:80", 1),
        ("other", "a:80", 2),
    ]
    autocommit(engine, CLOSE_DESTINATION, a80)
    assert destination(engine, "a:80") is None
    assert destination(engine, "a:80", tenant="other").failures == 2  # another tenant's own
    autocommit(engine, PRUNE_DESTINATIONS, {"age": 60.0, "now": T0 + timedelta(seconds=59)})
    assert destination(engine, "b:80") is not None
    autocommit(engine, PRUNE_DESTINATIONS, {"age": 60.0, "now": T0 + timedelta(seconds=61)})
    assert destination(engine, "b:80") is None


def _deliveries_read(engine: Engine, params: dict[str, Any], *, generic: bool) -> tuple[int, bool]:
    """Rows of webhook_deliveries the offers' plan read, and whether it scanned the table."""
    with engine.connect() as conn:
        trans = conn.begin()
        if generic:
            conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        explain = text("EXPLAIN (ANALYZE, FORMAT JSON) " + str(DELIVERY_OFFERS.text))
        plan = conn.execute(explain, params).scalar_one()
        trans.rollback()

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    read, seq = 0, False
    for node in nodes(plan[0]["Plan"]):
        if node.get("Relation Name") == "webhook_deliveries":
            rows = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read += int(rows) * int(node["Actual Loops"])
            seq = seq or node["Node Type"] == "Seq Scan"
    return read, seq


@pytest.mark.slow  # writes a backlog of thousands of deliveries: seconds
@pytest.mark.parametrize("generic", [False, True])
def test_delivery_offers__plan_reads_no_backlog(engine: Engine, generic: bool):
    with engine.begin() as conn:  # 20,000 failed runs of one tenant, each with a delivery
        conn.execute(
            text(
                """
                INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode,
                                       requested_at, finished_at, callback_url)
                SELECT gen_random_uuid(), 'flood', 'echo', '{}', '{}', 'failed', 'queue',
                       CAST(:t0 AS timestamptz), CAST(:t0 AS timestamptz) + i * interval '1 ms',
                       'http://dead.example/h'
                FROM generate_series(1, 20000) AS i
                """
            ),
            {"t0": T0},
        )
        conn.execute(text("ANALYZE webhook_deliveries"))
    assert len(deliveries(engine)) == 20000
    read, seq = _deliveries_read(
        engine, {"per_tenant": 20, "now": T0 + timedelta(hours=1)}, generic=generic
    )
    assert not seq
    assert read < 200


# --- the deliverer -------------------------------------------------------------------------


def test_deliverer__a_dead_receiver_of_one_tenant_does_not_delay_another_tenants_delivery(
    queue: JobQueue, engine: Engine, secrets: None, receiver: Receiver, dead: Receiver
):
    for _ in range(40):
        finish(queue, now=None, tenant="flood", callback_url=dead.url)
    config = WebhookConfig(
        timeout_seconds=10.0,
        lease_seconds=30.0,
        concurrency=4,
        poll_seconds=0.2,
        caps=Caps(per_tenant=2, per_destination=4),
        policy=FAST.policy,
    )
    deliverer = WebhookDeliverer(engine, config)
    thread = run_in_background(deliverer)
    try:
        wait_for(lambda: len(dead.received) >= 2, 10, "the flood's attempts in flight")
        quiet = finish(queue, now=None, tenant="quiet", callback_url=receiver.url)
        took = wait_for(lambda: receiver.received, 5, "the quiet tenant's delivery")
        assert took < 5  # an attempt to the dead receiver holds its slot for 10 s
        assert [r.run()["id"] for r in receiver.received] == [str(quiet)]
        assert len(dead.received) <= 2  # the flood never had more than its cap in flight
    finally:
        deliverer.stop()
        dead.hold.set()
        thread.join(timeout=30)
    [delivered] = deliveries(engine, quiet)
    assert delivered["status"] == "delivered"


def test_deliverer__a_destination_never_has_more_than_its_cap_in_flight(
    queue: JobQueue, engine: Engine, secrets: None, receiver: Receiver, dead: Receiver
):
    for tenant in ("flood", "other"):
        for _ in range(6):
            finish(queue, now=None, tenant=tenant, callback_url=dead.url)
    finish(queue, now=None, tenant="quiet", callback_url=receiver.url)
    config = WebhookConfig(
        timeout_seconds=10.0,
        lease_seconds=30.0,
        concurrency=8,
        poll_seconds=0.1,
        caps=Caps(per_tenant=4, per_destination=4),
        policy=FAST.policy,
    )
    deliverer = WebhookDeliverer(engine, config)
    thread = run_in_background(deliverer)
    try:
        wait_for(lambda: receiver.received, 5, "the delivery to the other destination")
        wait_for(lambda: len(dead.received) >= 4, 5, "attempts to the slow destination")
        time.sleep(1)  # many claims pass meanwhile: none may add a fifth
        assert len(dead.received) == 4
        senders = {got.run()["id"] for got in dead.received}
        tenants = {deliveries(engine, uuid.UUID(run))[0]["tenant"] for run in senders}
        # The destination's room went in turns, and no tenant took more than half of it.
        assert tenants == {"flood", "other"}
    finally:
        deliverer.stop()
        dead.hold.set()
        thread.join(timeout=30)


def test_deliverer__fills_a_free_slot_without_waiting_for_the_slowest_attempt(
    queue: JobQueue, engine: Engine, secrets: None, receiver: Receiver, dead: Receiver
):
    slow = finish(queue, now=None, callback_url=dead.url)  # the oldest: in the first claim
    fast = [finish(queue, now=None, callback_url=receiver.url) for _ in range(6)]
    config = WebhookConfig(
        timeout_seconds=10.0, lease_seconds=30.0, concurrency=2, poll_seconds=5.0,
        policy=FAST.policy,
    )  # fmt: skip
    deliverer = WebhookDeliverer(engine, config)
    done: dict[str, Any] = {}
    pass_thread = threading.Thread(target=lambda: done.setdefault("pass", deliverer.run_once()))
    pass_thread.start()
    try:
        took = wait_for(lambda: len(receiver.received) == len(fast), 5, "the quick ones")
        assert took < 5
        assert len(dead.received) == 1 and "pass" not in done  # the slow one is still out
    finally:
        dead.hold.set()
        pass_thread.join(timeout=30)
        deliverer.close()
    assert done["pass"].claimed == 7 and done["pass"].delivered == 7
    assert {r.run()["id"] for r in receiver.received} == {str(r) for r in fast}
    assert deliveries(engine, slow)[0]["status"] == "delivered"


def test_deliverer__a_failing_destination_is_held_back_probed_and_given_back(
    queue: JobQueue, engine: Engine, secrets: None
):
    port = closed_port()
    url = f"http://127.0.0.1:{port}/hook"
    key = f"127.0.0.1:{port}"
    runs = [finish(queue, now=T0, callback_url=url) for _ in range(10)]
    policy = BreakerPolicy(failures=3, cooldown_seconds=60, cooldown_max_seconds=600)
    config = WebhookConfig(
        timeout_seconds=2.0,
        lease_seconds=5.0,
        retry_seconds=3600.0,
        backoff_base_seconds=1.0,
        backoff_max_seconds=1.0,
        concurrency=2,
        caps=Caps(per_tenant=4, per_destination=2),
        breaker=policy,
        policy=FAST.policy,
    )
    deliverer = WebhookDeliverer(engine, config)

    def attempts() -> int:
        return sum(len(webhook_events(engine, run)) for run in runs)

    try:
        # Refused connections: the breaker opens at the third failure in a row; attempts
        # already in flight finish, the rest are held until the cool-down ends.
        first = deliverer.run_once(now=T0)
        state = destination(engine, key)
        assert state.failures >= 3 and state.open_until >= T0 + timedelta(seconds=60)
        assert attempts() == first.retrying == state.failures < 10
        assert first.deferred == 10 - state.failures
        held = [d for d in deliveries(engine) if d["attempts"] == 0]
        assert len(held) == first.deferred
        # Held until the cool-down the breaker had when they were looked at (an attempt
        # still in flight may have lengthened it since: then they are held again).
        [until] = {d["next_attempt_at"] for d in held}
        assert T0 + timedelta(seconds=60) <= until <= state.open_until
        # The cool-down over: one probe, which fails, and the breaker opens twice as long.
        probe_at = state.open_until + timedelta(seconds=1)
        second = deliverer.run_once(now=probe_at)
        assert attempts() - first.retrying == 1 and second.retrying == 1
        reopened = destination(engine, key)
        assert reopened.failures == state.failures + 1
        assert reopened.open_until == probe_at + timedelta(
            seconds=60 * 2 ** (1 + state.failures - 3)
        )
        assert second.deferred == 9
        # The receiver is back: the next probe gets an answer, which closes the breaker, and
        # the same pass sends every other delivery.
        with receiver_on(port) as receiver:
            third = deliverer.run_once(now=reopened.open_until + timedelta(seconds=1))
            assert destination(engine, key) is None
            assert third.delivered == 10 and len(receiver.received) == 10
    finally:
        deliverer.close()
    assert {d["status"] for d in deliveries(engine)} == {"delivered"}


def test_deliverer__held_back_deliveries_still_end_with_their_retry_window(
    queue: JobQueue, engine: Engine, secrets: None
):
    port = closed_port()
    url = f"http://127.0.0.1:{port}/hook"
    runs = [finish(queue, now=T0, callback_url=url) for _ in range(4)]
    config = WebhookConfig(
        timeout_seconds=2.0,
        lease_seconds=5.0,
        retry_seconds=300.0,
        backoff_base_seconds=1.0,
        backoff_max_seconds=1.0,
        concurrency=1,
        breaker=BreakerPolicy(failures=1, cooldown_seconds=400, cooldown_max_seconds=400),
        policy=FAST.policy,
    )
    deliverer = WebhookDeliverer(engine, config)
    try:
        result = deliverer.run_once(now=T0)  # one failure opens it past the 300 s window
    finally:
        deliverer.close()
    assert (result.retrying, result.deferred, result.gave_up) == (1, 0, 3)
    outcomes = sorted(e["outcome"] for run in runs for e in webhook_events(engine, run))
    assert outcomes == ["gave_up", "gave_up", "gave_up", "retrying"]
    given_up = [d for d in deliveries(engine) if d["status"] == "failed"]
    assert len(given_up) == 3 and all(d["last_error"] == HELD_PAST_WINDOW for d in given_up)
