"""Lifecycle webhooks against real Postgres: the started trigger, the deadline notices, the
events a tenant chooses, and one run's deliveries going out in the order they were written."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from runyard.platform.db import autocommit
from runyard.queue import ClaimedJob, JobQueue
from runyard.webhooks.delivery import WebhookDeliverer
from runyard.webhooks.sql import ENQUEUE_DEADLINE_NOTICES
from runyard.webhooks.tenant import TenantWebhooks
from tests.integration.queue.test_queue import LEASE, SUCCESS, T0, new_run
from tests.integration.queue.test_webhooks import (
    FAST,
    claim_deliveries,
    deliveries,
    due_ids,
    settle,
)
from tests.webhook_receiver import Receiver

HOOK = "https://hooks.acme.example/runyard"
EVERY_EVENT = ("run.started", "run.deadline_approaching", "run.completed")


def choose(engine: Engine, *events: str, lead: int | None = None, url: str = HOOK) -> str:
    """The tenant acme takes ``events`` at ``url``; its secret."""
    made = TenantWebhooks(engine).configure(
        "acme",
        url,
        events=events or None,  # type: ignore[arg-type]
        deadline_lead_seconds=lead,
    )
    return made.secret or ""


def start(queue: JobQueue, now: datetime = T0, **overrides: object) -> tuple[uuid.UUID, ClaimedJob]:
    """A run enqueued and claimed at ``now``; its id and job."""
    run_id = queue.enqueue(new_run(**overrides), now=now).run_id
    [job] = queue.claim(worker_id="w1", engine_id="e", limit=1, lease_seconds=LEASE, now=now)
    assert job.run_id == run_id
    return run_id, job


def notices(engine: Engine, now: datetime) -> int:
    """Write the deadline notices due at ``now``; how many were new."""
    return len(autocommit(engine, ENQUEUE_DEADLINE_NOTICES, {"now": now}))


def test_started__a_tenant_that_takes_it_gets_one_per_attempt(queue: JobQueue, engine: Engine):
    choose(engine, "run.started", "run.completed")
    run_id, job = start(queue, max_attempts=2)
    requeued = queue.requeue(job.job_id, job.lease_token, error_code="lost", error="lost", now=T0)
    assert requeued.owned
    later = requeued.available_at or T0
    [again] = queue.claim(worker_id="w2", engine_id="e", limit=1, lease_seconds=LEASE, now=later)
    assert queue.finalize(again.job_id, again.lease_token, SUCCESS, now=later)
    rows = deliveries(engine, run_id)
    assert [(r["event"], r["attempt"]) for r in sorted(rows, key=lambda r: r["seq"])] == [
        ("run.started", 1),
        ("run.started", 2),
        ("run.completed", None),
    ]
    assert {r["url"] for r in rows} == {HOOK}


def test_started__not_written_for_a_tenant_that_did_not_ask(queue: JobQueue, engine: Engine):
    choose(engine)  # a URL, the default events
    run_id, job = start(queue)
    assert deliveries(engine, run_id) == []
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    assert [r["event"] for r in deliveries(engine, run_id)] == ["run.completed"]


def test_completed__a_tenant_that_drops_it_gets_none(queue: JobQueue, engine: Engine):
    choose(engine, "run.started")
    run_id, job = start(queue)
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    assert [r["event"] for r in deliveries(engine, run_id)] == ["run.started"]


def test_settings__events_and_lead_are_kept_until_changed(engine: Engine):
    TenantWebhooks(engine).configure("acme", HOOK, events=("run.started",), deadline_lead_seconds=5)
    TenantWebhooks(engine).configure("acme", HOOK)  # neither given: both kept
    shown = TenantWebhooks(engine).get("acme")
    assert (shown.events, shown.deadline_lead_seconds) == (("run.started",), 5)
    assert TenantWebhooks(engine).get("nobody").events == ("run.completed",)


@pytest.mark.parametrize(
    ("seconds_in", "written"),
    [(300, 0), (479, 0), (481, 1), (599, 1), (601, 0)],
    ids=["early", "just-before-the-lead", "within-the-lead", "last-second", "past-the-deadline"],
)
def test_deadline_notice__written_only_within_the_lead_before_the_deadline(
    queue: JobQueue, engine: Engine, seconds_in: int, written: int
):
    choose(engine, *EVERY_EVENT, lead=120)
    start(queue, timeout_seconds=600)  # deadline T0 + 600 s
    assert notices(engine, T0 + timedelta(seconds=seconds_in)) == written


def test_deadline_notice__once_per_attempt_however_many_write_it(queue: JobQueue, engine: Engine):
    choose(engine, *EVERY_EVENT, lead=120)
    run_id, _ = start(queue, timeout_seconds=600)
    near = T0 + timedelta(seconds=500)
    assert notices(engine, near) == 1
    assert notices(engine, near) == 0  # a second pass, or a second delivering process
    assert notices(engine, near + timedelta(seconds=50)) == 0
    [notice] = [r for r in deliveries(engine, run_id) if r["event"] == "run.deadline_approaching"]
    assert notice["attempt"] == 1
    deadline = datetime.fromisoformat(notice["data"]["deadline_at"])
    assert deadline == T0 + timedelta(seconds=600)


def test_deadline_notice__none_for_tenants_that_did_not_ask(queue: JobQueue, engine: Engine):
    choose(engine, "run.started", "run.completed", lead=120)
    start(queue, timeout_seconds=600)
    assert notices(engine, T0 + timedelta(seconds=590)) == 0


def test_order__a_later_delivery_waits_while_an_earlier_one_of_its_run_is_pending(
    queue: JobQueue, engine: Engine
):
    choose(engine, "run.started", "run.completed")
    run_id, job = start(queue)
    other, _ = start(queue)
    [started] = [r for r in deliveries(engine, run_id) if r["event"] == "run.started"]
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    [completed] = [r for r in deliveries(engine, run_id) if r["event"] == "run.completed"]
    due = due_ids(engine, T0)
    assert started["id"] in due and completed["id"] not in due
    # The started notice fails and is due again later: its run's completion still waits;
    # the order is per run, so the other run's notice went in the same claim.
    claimed = {r.id: r for r in claim_deliveries(engine, T0)}
    [others] = [r for r in deliveries(engine, other) if r["event"] == "run.started"]
    assert set(claimed) == {started["id"], others["id"]}
    settle(engine, claimed[started["id"]], T0, code=None, delay=30)
    assert completed["id"] not in due_ids(engine, T0 + timedelta(seconds=10))
    # Delivered on its retry: the completion goes next.
    retried = {r.id: r for r in claim_deliveries(engine, T0 + timedelta(seconds=31))}
    assert started["id"] in retried and completed["id"] not in retried
    settle(engine, retried[started["id"]], T0 + timedelta(seconds=31), code=200, delay=30)
    assert completed["id"] in due_ids(engine, T0 + timedelta(seconds=31))


def test_deliverer__posts_each_event_signed_with_its_name_in_order(
    queue: JobQueue, engine: Engine, receiver: Receiver
):
    secret = choose(engine, *EVERY_EVENT, lead=3600, url=receiver.url)
    run_id = queue.enqueue(new_run(timeout_seconds=600)).run_id
    [job] = queue.claim(worker_id="w1", engine_id="e", limit=1, lease_seconds=LEASE)
    deliverer = WebhookDeliverer(engine, FAST)
    try:
        first = deliverer.run_once()  # started, then the deadline notice it writes
        assert queue.finalize(job.job_id, job.lease_token, SUCCESS)
        second = deliverer.run_once()
    finally:
        deliverer.close()
    assert (first.delivered, second.delivered) == (2, 1)
    bodies = [r.verified(secret) for r in receiver.received]
    assert [(b["event"], b["id"]) for b in bodies] == [
        ("run.started", str(run_id)),
        ("run.deadline_approaching", str(run_id)),
        ("run.completed", str(run_id)),
    ]
    assert [r.headers["runyard-event"] for r in receiver.received] == [b["event"] for b in bodies]
    assert "deadline_at" in bodies[1] and "deadline_at" not in bodies[2]
    assert bodies[2]["status"] == "succeeded"


def held_as_sandbox(engine: Engine, run_id: uuid.UUID) -> None:
    """The sandbox's own row, as the API writes it for a sandbox's run."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sandboxes (run_id, tenant, tool, idle_timeout_seconds, max_execs) "
                "VALUES (:id, 'acme', 'sandbox', 300, 4)"
            ),
            {"id": run_id},
        )


def test_sandbox_ended__a_sandboxs_end_is_named_so_for_tenants_that_take_it(
    queue: JobQueue, engine: Engine
):
    choose(engine, "run.completed", "sandbox.ended")
    sandbox_id, job = start(queue, tool="sandbox")
    held_as_sandbox(engine, sandbox_id)
    run_id, run_job = start(queue)
    for claimed in (job, run_job):
        assert queue.finalize(claimed.job_id, claimed.lease_token, SUCCESS, now=T0)
    [ended] = deliveries(engine, sandbox_id)
    assert (ended["event"], ended["data"]) == ("sandbox.ended", {"sandbox_id": str(sandbox_id)})
    assert [r["event"] for r in deliveries(engine, run_id)] == ["run.completed"]


def test_sandbox_ended__not_written_for_a_tenant_that_takes_completion_alone(
    queue: JobQueue, engine: Engine
):
    choose(engine)
    sandbox_id, job = start(queue, tool="sandbox")
    held_as_sandbox(engine, sandbox_id)
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    assert deliveries(engine, sandbox_id) == []
