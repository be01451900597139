"""FINALIZE_MANY and FINALIZE_MANY_AND_CLAIM: a batch of finalizes, each fenced on its own."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.queue.values import ClaimFor, Finalize
from tests.integration.queue.test_queue import (
    ENGINE,
    LEASE,
    SUCCESS,
    T0,
    claim,
    enqueue_many,
    events,
    row,
)

FAILED = AttemptResult(status=RunStatus.FAILED, exit_code=3, stdout="out", stderr="err")
CLAIM_FOR = ClaimFor(worker_id="w1", engine_id=ENGINE, queue="default", lease_seconds=LEASE)


def test_finalize_many__each_outcome_lands_on_its_own_run(queue: JobQueue, engine: Engine):
    first, second = enqueue_many(queue, 2)
    a, b = claim(queue, limit=2)
    applied, claimed = queue.finalize_many(
        [Finalize(a.job_id, a.lease_token, SUCCESS), Finalize(b.job_id, b.lease_token, FAILED)],
        now=T0,
    )
    assert applied == [True, True] and claimed == []
    assert row(engine, first)["run_status"] == "succeeded"
    assert row(engine, first)["result"] == {"ok": True}
    assert (row(engine, second)["run_status"], row(engine, second)["result"]) == ("failed", None)
    assert events(engine, second)[-1] == (
        "status",
        {"status": "failed", "attempt": 1, "exit_code": 3, "error_code": None},
    )


def test_finalize_many__a_stale_lease_is_left_alone_and_the_others_apply(
    queue: JobQueue, engine: Engine
):
    first, stale, third = enqueue_many(queue, 3)
    a, b, c = claim(queue, limit=3)
    applied, _ = queue.finalize_many(
        [
            Finalize(a.job_id, a.lease_token, SUCCESS),
            Finalize(b.job_id, uuid.uuid4(), SUCCESS),  # another owner's token
            Finalize(c.job_id, c.lease_token, FAILED),
        ],
        now=T0,
    )
    assert applied == [True, False, True]
    assert row(engine, stale)["run_status"] == "running"
    assert row(engine, stale)["lease_token"] == b.lease_token
    assert [row(engine, r)["run_status"] for r in (first, third)] == ["succeeded", "failed"]


def test_finalize_many__a_job_twice_in_one_batch_is_finalized_once_by_its_first_request(
    queue: JobQueue, engine: Engine
):
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    applied, _ = queue.finalize_many(
        [
            Finalize(job.job_id, job.lease_token, FAILED),
            Finalize(job.job_id, job.lease_token, SUCCESS),
        ],
        now=T0,
    )
    assert applied == [True, False]
    assert row(engine, run_id)["run_status"] == "failed"
    assert [t for t, _ in events(engine, run_id)].count("status") == 3  # queued, running, failed


def test_finalize_many__a_cancelled_job_is_not_finalized(queue: JobQueue, engine: Engine):
    cancelled, other = enqueue_many(queue, 2)
    a, b = claim(queue, limit=2)
    # Cancelled while queued again (released, then requeued without charge, then cancelled).
    assert queue.requeue_unstarted(a.job_id, a.lease_token, now=T0).owned
    assert queue.cancel(cancelled, now=T0).cancelled_now
    applied, _ = queue.finalize_many(
        [Finalize(a.job_id, a.lease_token, SUCCESS), Finalize(b.job_id, b.lease_token, SUCCESS)],
        now=T0,
    )
    assert applied == [False, True]
    assert row(engine, cancelled)["run_status"] == "cancelled"
    assert row(engine, other)["run_status"] == "succeeded"


def test_finalize_many_and_claim__claims_one_job_per_request_that_wants_one(
    queue: JobQueue, engine: Engine
):
    _, _, *waiting = enqueue_many(queue, 5)
    a, b = claim(queue, limit=2)
    applied, claimed = queue.finalize_many(
        [
            Finalize(a.job_id, a.lease_token, SUCCESS, next_job=True),
            Finalize(b.job_id, uuid.uuid4(), SUCCESS, next_job=True),  # stale: still claims
        ],
        claim=CLAIM_FOR,
        now=T0,
    )
    assert applied == [True, False]
    assert [c.run_id for c in claimed] == waiting[:2]
    assert all(row(engine, r)["locked_by"] == "w1" for r in waiting[:2])
    assert row(engine, waiting[2])["run_status"] == "queued"
    applied, claimed = queue.finalize_many(
        [Finalize(c.job_id, c.lease_token, SUCCESS) for c in claimed], claim=CLAIM_FOR, now=T0
    )
    assert applied == [True, True] and claimed == []  # no request wanted a next job
    assert row(engine, waiting[2])["run_status"] == "queued"


def test_finalize_many__a_statement_that_fails_writes_nothing(queue: JobQueue, engine: Engine):
    first, second = enqueue_many(queue, 2)
    a, b = claim(queue, limit=2)
    bad = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"x": "\u0000"})
    with pytest.raises(DBAPIError):
        queue.finalize_many(
            [Finalize(a.job_id, a.lease_token, SUCCESS), Finalize(b.job_id, b.lease_token, bad)],
            claim=CLAIM_FOR,
            now=T0,
        )
    for run_id, job in ((first, a), (second, b)):
        state = row(engine, run_id)
        assert (state["run_status"], state["lease_token"]) == ("running", job.lease_token)
        assert [t for t, _ in events(engine, run_id)] == ["status", "claimed", "status"]


def test_finalize_many__refuses_a_status_that_is_not_terminal(queue: JobQueue):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    running = AttemptResult(status=RunStatus.RUNNING)
    with pytest.raises(ValueError, match="terminal"):
        queue.finalize_many([Finalize(job.job_id, job.lease_token, running)])
