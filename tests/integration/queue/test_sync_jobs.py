"""Sync runs on the job lease, statement by statement: the submit that inserts a run claimed
(``SUBMIT`` with an inline claim) and the adopt-only claim of an API process (``ADOPT``)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.queue import AdmissionCaps, ApiQueue, ClaimedJob, InlineClaim
from tests.integration.queue.test_queue import (
    ENGINE,
    LEASE,
    SUCCESS,
    T0,
    claim,
    events,
    new_run,
    row,
)

INLINE = InlineClaim(owner="api-1", engine_id=ENGINE, lease_seconds=LEASE)


def sync_job(api: ApiQueue, **overrides: object) -> ClaimedJob:
    job = api.submit(new_run(**overrides), AdmissionCaps(), inline=INLINE, now=T0).job
    assert job is not None
    return job


def adopt(api: ApiQueue, *, engine_id: str = ENGINE, now: object = None) -> list[ClaimedJob]:
    return api.claim(
        worker_id="api-2",
        engine_id=engine_id,
        limit=10,
        lease_seconds=LEASE,
        queues=("sync",),
        adopt_only=True,
        now=now,  # type: ignore[arg-type]
    )


def test_submit_inline__inserts_the_run_claimed_under_a_lease_in_one_statement(engine: Engine):
    api = ApiQueue(engine)
    job = sync_job(api, timeout_seconds=45)
    state = row(engine, job.run_id)
    assert (state["run_status"], state["job_status"]) == ("running", "running")
    assert state["locked_by"] == "api-1" and state["lease_token"] == job.lease_token
    assert state["locked_until"] == T0 + timedelta(seconds=LEASE) == job.locked_until
    assert job.deadline_at == T0 + timedelta(seconds=45) and job.attempt == 1
    assert job.container_requested and not job.adopted and job.max_attempts == 1
    with engine.connect() as conn:
        mode, queue, engine_id = conn.execute(
            text(
                "SELECT r.mode, j.queue, j.engine_id FROM tool_runs r"
                " JOIN tool_run_jobs j ON j.run_id = r.id WHERE r.id = :id"
            ),
            {"id": job.run_id},
        ).one()
    assert (mode, queue, engine_id) == ("sync", "sync", ENGINE)
    assert events(engine, job.run_id) == [
        ("status", {"status": "queued", "mode": "sync"}),
        ("claimed", {"attempt": 1, "worker_id": "api-1", "engine_id": ENGINE}),
        ("status", {"status": "running", "attempt": 1}),
    ]
    # Its owner writes through the job's statements, fenced by the token it was given.
    assert api.heartbeat(job.job_id, job.lease_token, lease_seconds=LEASE, now=T0).owned
    assert api.append_log(job.job_id, job.lease_token, stream="stdout", text_chunk="x", until="1")
    assert api.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    assert row(engine, job.run_id)["run_status"] == "succeeded"


def test_submit_inline__an_idempotent_retry_replays_without_a_claim(engine: Engine):
    api = ApiQueue(engine)
    first = sync_job(api, idempotency_key="k1")
    again = api.submit(new_run(idempotency_key="k1"), AdmissionCaps(), inline=INLINE, now=T0)
    assert (again.run_id, again.created, again.job) == (first.run_id, False, None)


def test_submit_inline__never_wakes_the_workers_nor_is_claimed_by_them(engine: Engine):
    api = ApiQueue(engine)
    job = sync_job(api)
    assert claim(api, limit=10) == []  # nothing queued
    with engine.connect() as conn:
        queued = conn.execute(
            text("SELECT count(*) FROM tool_run_jobs WHERE status = 'queued'")
        ).scalar_one()
    assert queued == 0 and row(engine, job.run_id)["locked_by"] == "api-1"


def test_adopt__takes_a_lease_that_ran_out_or_was_cleared_of_its_engine_only(engine: Engine):
    api = ApiQueue(engine)
    expired, cleared, live = sync_job(api), sync_job(api), sync_job(api)
    other = api.submit(
        new_run(),
        AdmissionCaps(),
        inline=InlineClaim(owner="api-9", engine_id="engine-b", lease_seconds=LEASE),
        now=T0,
    ).job
    assert other is not None
    assert api.heartbeat(live.job_id, live.lease_token, lease_seconds=LEASE * 2, now=T0).owned
    assert api.release(cleared.job_id, cleared.lease_token, now=T0)
    [first] = adopt(api, now=T0)
    assert first.run_id == cleared.run_id and first.adopted and first.attempt == 1
    assert api.heartbeat(first.job_id, first.lease_token, lease_seconds=LEASE * 2, now=T0).owned
    later = T0 + timedelta(seconds=LEASE + 1)
    [second] = adopt(api, now=later)
    assert second.run_id == expired.run_id and second.deadline_at == expired.deadline_at
    assert [j.run_id for j in adopt(api, engine_id="engine-b", now=later)] == [other.run_id]
    assert adopt(api, now=later) == []  # held by their new owners now


def test_adopt__never_claims_queued_work_nor_jobs_of_another_queue(engine: Engine):
    api = ApiQueue(engine)
    api.enqueue(new_run(), now=T0)
    [job] = claim(api, limit=1)
    later = T0 + timedelta(seconds=LEASE + 1)
    assert adopt(api, now=later) == []  # a queue-mode job whose lease ran out: not the API's
    assert row(engine, job.run_id)["job_status"] == "running"
    api.enqueue(new_run(), now=T0)
    assert adopt(api, now=later) == []


def test_adopt__fences_the_old_owner(engine: Engine):
    api = ApiQueue(engine)
    old = sync_job(api)
    later = T0 + timedelta(seconds=LEASE + 1)
    [new] = adopt(api, now=later)
    assert new.lease_token != old.lease_token
    assert not api.heartbeat(old.job_id, old.lease_token, lease_seconds=LEASE, now=later).owned
    assert not api.append_log(
        old.job_id, old.lease_token, stream="stdout", text_chunk="x", until=""
    )
    assert not api.finalize(old.job_id, old.lease_token, SUCCESS, now=later)
    assert not api.lease_held(old.job_id, old.lease_token, now=later)
    assert api.finalize(new.job_id, new.lease_token, SUCCESS, now=later)
    kinds = [kind for kind, _ in events(api.engine, old.run_id)]
    assert kinds.count("adopted") == 1 and kinds.count("stdout") == 0


def test_sync_job__cancel_and_a_lost_container_use_the_job_statements(engine: Engine):
    api = ApiQueue(engine)
    # A tool allowed retries in queue mode still has one attempt inline: nothing waits.
    cancelled, lost = sync_job(api), sync_job(api, max_attempts=3)
    assert lost.max_attempts == 1
    assert api.cancel(cancelled.run_id, now=T0).requested
    beat = api.heartbeat(cancelled.job_id, cancelled.lease_token, lease_seconds=LEASE, now=T0)
    assert beat.cancel_requested
    outcome = AttemptResult(status=RunStatus.CANCELLED, error_code="cancelled")
    assert api.finalize(cancelled.job_id, cancelled.lease_token, outcome, now=T0)
    # A sync attempt is never given back to a queue: its container counts as requested.
    assert not api.requeue_unstarted(lost.job_id, lost.lease_token, now=T0).owned
    result = api.put_back(
        lost.job_id, lost.lease_token, charged=True, error="gone", error_code="api_lost"
    )
    assert result.status is RunStatus.FAILED
    state = row(engine, lost.run_id)
    assert (state["run_status"], state["error_code"]) == ("failed", "api_lost")
