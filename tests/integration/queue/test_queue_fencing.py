"""The statements an attempt's owner hooks use: LEASE_HELD, MARK_CONTAINER_REQUESTED, RECORD_EVENT,
HEARTBEAT's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from runyard.domain.states import RunStatus
from runyard.queue import RESERVED_EVENT_TYPES, JobQueue
from tests.integration.queue.test_queue import LEASE, SUCCESS, T0, claim, enqueue_many, events


def test_heartbeat__returns_the_database_clock(queue: JobQueue):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    at = T0 + timedelta(seconds=7)
    beat = queue.heartbeat(job.job_id, job.lease_token, lease_seconds=LEASE, now=at)
    assert beat.db_now == at


def test_lease_held__only_for_the_current_unexpired_lease(queue: JobQueue):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    assert queue.lease_held(job.job_id, job.lease_token, now=T0)
    assert queue.lease_held(job.job_id, job.lease_token, now=T0 + timedelta(seconds=LEASE - 1))
    # Expired but not reaped yet: no longer ours to act on.
    assert not queue.lease_held(job.job_id, job.lease_token, now=T0 + timedelta(seconds=LEASE))
    assert not queue.lease_held(job.job_id, job.job_id, now=T0)  # another token


def test_lease_held__not_after_release_adoption_or_finalize(queue: JobQueue):
    enqueue_many(queue, 2)
    first, second = claim(queue, limit=2)
    assert queue.release(first.job_id, first.lease_token, now=T0)
    assert not queue.lease_held(first.job_id, first.lease_token, now=T0)
    [adopted] = claim(queue, worker="w-new")
    assert queue.lease_held(adopted.job_id, adopted.lease_token, now=T0)
    assert not queue.lease_held(first.job_id, first.lease_token, now=T0)
    assert queue.finalize(second.job_id, second.lease_token, SUCCESS, now=T0)
    assert not queue.lease_held(second.job_id, second.lease_token, now=T0)


def test_record_event__written_under_the_lease_with_the_attempt(queue: JobQueue, engine: Engine):
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    assert queue.record_event(job.job_id, job.lease_token, "stale", {"seconds": 4}, now=T0)
    assert events(engine, run_id)[-1] == ("stale", {"seconds": 4, "attempt": 1})


def test_record_event__nothing_without_the_lease(queue: JobQueue, engine: Engine):
    [run_id] = enqueue_many(queue, 1)
    [job] = claim(queue)
    assert queue.release(job.job_id, job.lease_token, now=T0)
    before = events(engine, run_id)
    assert not queue.record_event(job.job_id, job.lease_token, "stale", {}, now=T0)
    assert events(engine, run_id) == before


@pytest.mark.parametrize("event_type", [*sorted(RESERVED_EVENT_TYPES), "Bad", "x" * 33, ""])
def test_record_event__refuses_the_queues_own_types_and_odd_names(queue: JobQueue, event_type):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    with pytest.raises(ValueError):
        queue.record_event(job.job_id, job.lease_token, event_type, {}, now=T0)


def test_record_event__refuses_data_json_cannot_carry(queue: JobQueue):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    with pytest.raises(ValueError):
        queue.record_event(job.job_id, job.lease_token, "stale", {"x": float("nan")}, now=T0)


def test_mark_container_requested__only_under_the_current_unexpired_lease(queue: JobQueue):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    assert not queue.mark_container_requested(job.job_id, job.job_id, now=T0)  # stale token
    # Expired but not reaped yet: the container may not be created under it.
    expired = T0 + timedelta(seconds=LEASE)
    assert not queue.mark_container_requested(job.job_id, job.lease_token, now=expired)
    assert queue.mark_container_requested(job.job_id, job.lease_token, now=T0)


def test_mark_container_requested__not_for_a_cancelled_or_finished_job(queue: JobQueue):
    [cancelled_run, _] = enqueue_many(queue, 2)
    first, second = claim(queue, limit=2)
    cancelled = first if first.run_id == cancelled_run else second
    finished = second if cancelled is first else first
    queue.cancel(cancelled.run_id, now=T0)
    ended = queue.requeue_unstarted(cancelled.job_id, cancelled.lease_token, now=T0)
    assert ended.status == RunStatus.CANCELLED
    assert not queue.mark_container_requested(cancelled.job_id, cancelled.lease_token, now=T0)
    assert queue.finalize(finished.job_id, finished.lease_token, SUCCESS, now=T0)
    assert not queue.mark_container_requested(finished.job_id, finished.lease_token, now=T0)
