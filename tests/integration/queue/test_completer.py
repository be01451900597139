"""The batch completer: finalizes of slots that finish together go as one statement, and
every slot learns its own answer, or the batch's failure."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.platform.db import DbTimeouts, make_engine
from runyard.queue import ClaimedJob, JobQueue
from runyard.queue.completer import BatchCompleter
from runyard.queue.values import ClaimFor
from tests.integration.queue.test_queue import ENGINE, LEASE, SUCCESS, new_run, row

CLAIM_FOR = ClaimFor(worker_id="w1", engine_id=ENGINE, queue="default", lease_seconds=LEASE)
# Long enough that the slots of a test always meet in one batch; a batch leaves as soon as
# every busy slot is in it.
WINDOW = 10.0


def enqueue_many(queue: JobQueue, n: int) -> list[uuid.UUID]:
    """Runs due now on the database's clock, as the completer's claims see it."""
    return [queue.enqueue(new_run()).run_id for _ in range(n)]


def claim(queue: JobQueue, limit: int = 1) -> list[ClaimedJob]:
    return queue.claim(worker_id="w1", engine_id=ENGINE, limit=limit, lease_seconds=LEASE)


def completer(queue: JobQueue, slots: int) -> BatchCompleter:
    return BatchCompleter(queue, busy=lambda: slots, window_seconds=WINDOW)


def together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls in threads at once; each one's return value or the exception it raised."""
    answers: list[Any] = [None] * len(calls)

    def run(n: int) -> None:
        try:
            answers[n] = calls[n]()
        except Exception as exc:
            answers[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


def chained(batch: BatchCompleter, job: ClaimedJob, token: uuid.UUID | None = None, **kw: Any):
    def call() -> tuple[bool, list[ClaimedJob]]:
        outcome = kw.get("outcome", SUCCESS)
        return batch.finalize_and_claim(job.job_id, token or job.lease_token, outcome, CLAIM_FOR)

    return call


def test_completer__one_statement_each_slot_its_own_answer_and_next_job(
    queue: JobQueue, engine: Engine
):
    runs = enqueue_many(queue, 6)
    jobs = claim(queue, limit=3)
    batch = completer(queue, 3)
    answers = together(
        [chained(batch, jobs[0]), chained(batch, jobs[1], uuid.uuid4()), chained(batch, jobs[2])]
    )
    assert batch.finalizes.batches == 1
    assert [owned for owned, _ in answers] == [True, False, True]
    nexts = [next_jobs[0].run_id for _, next_jobs in answers]
    assert sorted(nexts) == sorted(runs[3:])  # one next job per slot, none twice
    assert [row(engine, r)["run_status"] for r in runs[:3]] == ["succeeded", "running", "succeeded"]
    assert row(engine, runs[1])["lease_token"] == jobs[1].lease_token  # the stale one: untouched


def test_completer__a_double_finalize_in_one_batch_applies_once(queue: JobQueue, engine: Engine):
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    batch = completer(queue, 2)
    answers = together([lambda: batch.finalize(job.job_id, job.lease_token, SUCCESS)] * 2)
    assert batch.finalizes.batches == 1
    assert sorted(answers) == [False, True]
    assert row(engine, run_id)["run_status"] == "succeeded"


def test_completer__a_cancelled_job_in_the_batch_learns_it_lost_the_others_apply(
    queue: JobQueue, engine: Engine
):
    cancelled, other = enqueue_many(queue, 2)
    a, b = claim(queue, limit=2)
    assert queue.requeue_unstarted(a.job_id, a.lease_token).owned
    assert queue.cancel(cancelled).cancelled_now
    batch = completer(queue, 2)
    answers = together(
        [
            lambda: batch.finalize(a.job_id, a.lease_token, SUCCESS),
            lambda: batch.finalize(b.job_id, b.lease_token, SUCCESS),
        ]
    )
    assert answers == [False, True] and batch.finalizes.batches == 1
    assert (row(engine, cancelled)["run_status"], row(engine, other)["run_status"]) == (
        "cancelled",
        "succeeded",
    )


def test_completer__an_outcome_the_database_refuses_fails_only_its_own_slot(
    queue: JobQueue, engine: Engine
):
    bad_run, good_run = enqueue_many(queue, 2)
    bad, good = claim(queue, limit=2)
    refused = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"x": "\u0000"})
    batch = completer(queue, 2)
    answers = together(
        [chained(batch, bad, outcome=refused), chained(batch, good, outcome=SUCCESS)]
    )
    assert isinstance(answers[0], DBAPIError)
    assert answers[1][0] is True
    assert row(engine, bad_run)["run_status"] == "running"
    assert row(engine, good_run)["run_status"] == "succeeded"


@pytest.fixture
def impatient(database_url: str) -> Iterator[JobQueue]:
    """A queue whose statements wait 0.2 s at most for a row lock."""
    eng = make_engine(database_url, timeouts=DbTimeouts(lock_seconds=0.2))
    try:
        yield JobQueue(eng)
    finally:
        eng.dispose()


def test_completer__a_batch_that_fails_fails_every_slot_and_writes_nothing(
    queue: JobQueue, impatient: JobQueue, engine: Engine
):
    runs = enqueue_many(queue, 3)
    jobs = claim(queue, limit=3)
    batch = completer(impatient, 3)
    with engine.connect() as conn, conn.begin():
        # Another transaction holds one job's row: the batch's statement times out on it.
        conn.execute(
            text("SELECT 1 FROM tool_run_jobs WHERE id = :id FOR UPDATE"), {"id": jobs[2].job_id}
        )
        answers = together([chained(batch, job) for job in jobs])
    assert batch.finalizes.batches == 1
    assert all(isinstance(answer, OperationalError) for answer in answers)
    for run_id, job in zip(runs, jobs, strict=True):
        state = row(engine, run_id)
        assert (state["run_status"], state["lease_token"]) == ("running", job.lease_token)
    assert [row(engine, r)["run_status"] for r in runs] == ["running"] * 3


def test_completer__a_lone_slot_sends_the_plain_statement_at_once(queue: JobQueue, engine: Engine):
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    sent: list[str] = []

    class Recording(JobQueue):
        def finalize(self, *args: Any, **kw: Any) -> bool:
            sent.append("finalize")
            return super().finalize(*args, **kw)

    batch = BatchCompleter(Recording(engine), busy=lambda: 1, window_seconds=WINDOW)
    assert batch.finalize(job.job_id, job.lease_token, SUCCESS)
    assert sent == ["finalize"]
    assert row(engine, run_id)["run_status"] == "succeeded"
