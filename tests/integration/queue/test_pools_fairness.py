"""Worker pools and fair tenants in the claim, against real Postgres."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.queue.sql import CLAIM, CLAIM_ANY_QUEUE, FINALIZE_AND_CLAIM
from runyard.queue.values import outcome_params
from tests.integration.queue.test_queue import ENGINE, LEASE, T0, new_run


def take(queue: JobQueue, queues: tuple[str, ...], limit: int = 1, now: datetime = T0) -> list[Any]:
    return queue.claim(
        worker_id="w", engine_id=ENGINE, limit=limit, lease_seconds=LEASE, queues=queues, now=now
    )


def tenants_of(engine: Engine, jobs: list[Any]) -> list[str]:
    with engine.connect() as conn:
        return [
            conn.execute(
                text("SELECT tenant FROM tool_runs WHERE id = :id"), {"id": job.run_id}
            ).scalar_one()
            for job in jobs
        ]


def test_claim__a_gpu_worker_never_takes_default_runs_and_vice_versa(queue: JobQueue):
    gpu = [queue.enqueue(new_run(queue="gpu"), now=T0).run_id for _ in range(3)]
    plain = [queue.enqueue(new_run(queue="default"), now=T0).run_id for _ in range(3)]
    assert {j.run_id for j in take(queue, ("gpu",), limit=10)} == set(gpu)
    assert take(queue, ("gpu",), limit=10) == []
    assert {j.run_id for j in take(queue, ("default",), limit=10)} == set(plain)
    assert take(queue, ("default", "cpu"), limit=10) == []


def test_claim__a_late_tenant_goes_within_one_turn(queue: JobQueue, engine: Engine):
    for i in range(50):
        queue.enqueue(new_run(tenant="flood"), now=T0 + timedelta(milliseconds=i))
    single = queue.enqueue(new_run(tenant="single"), now=T0 + timedelta(seconds=1)).run_id
    later = T0 + timedelta(seconds=2)
    first = take(queue, ("default",), now=later)
    second = take(queue, ("default",), now=later)
    # Both have nothing running: the older job goes first, then the tenant with less running.
    assert tenants_of(engine, first) == ["flood"]
    assert [j.run_id for j in second] == [single]


def test_claim__tenants_alternate_within_one_priority(queue: JobQueue, engine: Engine):
    for i in range(6):
        queue.enqueue(new_run(tenant="a"), now=T0 + timedelta(milliseconds=i))
    for i in range(6):
        queue.enqueue(new_run(tenant="b"), now=T0 + timedelta(seconds=1, milliseconds=i))
    later = T0 + timedelta(seconds=2)
    order = [tenants_of(engine, take(queue, ("default",), now=later))[0] for _ in range(6)]
    assert order == ["a", "b", "a", "b", "a", "b"]


def test_claim__a_batch_interleaves_tenants(queue: JobQueue, engine: Engine):
    for i in range(5):
        queue.enqueue(new_run(tenant="a"), now=T0 + timedelta(milliseconds=i))
    for i in range(5):
        queue.enqueue(new_run(tenant="b"), now=T0 + timedelta(seconds=1, milliseconds=i))
    jobs = take(queue, ("default",), limit=4, now=T0 + timedelta(seconds=2))
    assert sorted(tenants_of(engine, jobs)) == ["a", "a", "b", "b"]


def test_claim__priority_comes_before_fairness(queue: JobQueue, engine: Engine):
    for _ in range(3):
        queue.enqueue(new_run(tenant="a", priority=5), now=T0)
    queue.enqueue(new_run(tenant="b"), now=T0)
    jobs = [take(queue, ("default",))[0] for _ in range(3)]
    assert tenants_of(engine, jobs) == ["a", "a", "a"]


def test_claim__several_queues_are_fair_too(queue: JobQueue, engine: Engine):
    for _ in range(4):
        queue.enqueue(new_run(tenant="a", queue="gpu"), now=T0)
    queue.enqueue(new_run(tenant="b", queue="cpu"), now=T0 + timedelta(seconds=1))
    jobs = take(queue, ("gpu", "cpu"), limit=2, now=T0 + timedelta(seconds=2))
    assert sorted(tenants_of(engine, jobs)) == ["a", "b"]


def _insert_backlog(engine: Engine, count: int) -> None:
    """``count`` queued jobs of tenant ``flood`` in ``default``, inserted in bulk."""
    spec = json.dumps({"name": "echo", "image": "runyard/toolbox:latest", "command": ["true"]})
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                WITH runs AS (
                    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode,
                                           requested_at)
                    SELECT gen_random_uuid(), 'flood', 'echo', CAST(:spec AS jsonb), '{}',
                           'queued', 'queue', CAST(:t0 AS timestamptz)
                    FROM generate_series(1, :count)
                    RETURNING id
                )
                INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, timeout_seconds,
                                           available_at, created_at)
                SELECT gen_random_uuid(), id, 'queued', 'default', 'flood', 60,
                       CAST(:t0 AS timestamptz), CAST(:t0 AS timestamptz)
                FROM runs
                """
            ),
            {"spec": spec, "t0": T0, "count": count},
        )


@pytest.fixture
def backlog(engine: Engine) -> Iterator[None]:
    """20,000 queued jobs of one tenant in ``default``, with fresh statistics."""
    _insert_backlog(engine, 20000)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE tool_run_jobs"))
    yield


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _job_rows_read(
    engine: Engine, statement: Any, params: dict[str, Any], *, generic: bool = False
) -> tuple[int, bool]:
    """Rows of tool_run_jobs the plan read (kept or filtered out), and whether it scanned the
    table whole; ``generic``: the plan a prepared statement settles on."""
    with engine.connect() as conn:
        trans = conn.begin()
        if generic:
            conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        compiled = str(statement.text)
        plan = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled), params).scalar_one()
        trans.rollback()
    read = 0
    seq = False
    for node in _nodes(plan[0]["Plan"]):
        if node.get("Relation Name") == "tool_run_jobs":
            kept_or_dropped = (
                node["Actual Rows"]
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
            read += int(kept_or_dropped) * int(node["Actual Loops"])
            seq = seq or node["Node Type"] == "Seq Scan"
    return read, seq


@pytest.mark.parametrize("statement", ["CLAIM", "CLAIM_ANY_QUEUE"])
def test_claim__plan_reads_no_backlog_of_another_queue(
    engine: Engine, backlog: None, statement: str
):
    queue = JobQueue(engine)
    queue.enqueue(new_run(queue="gpu", tenant="b"), now=T0)
    params = {
        "worker_id": "w",
        "engine_id": ENGINE,
        "limit": 1,
        "lease": LEASE,
        "queue": "gpu",
        "queues": ["gpu", "cpu"],
        "now": T0,
    }
    read, seq = _job_rows_read(engine, CLAIM if statement == "CLAIM" else CLAIM_ANY_QUEUE, params)
    assert not seq
    assert read < 100


def test_claim__plan_reads_no_backlog_of_its_own_queue(engine: Engine, backlog: None):
    queue = JobQueue(engine)
    queue.enqueue(new_run(tenant="b"), now=T0)
    params = {
        "worker_id": "w",
        "engine_id": ENGINE,
        "limit": 2,
        "lease": LEASE,
        "queue": "default",
        "queues": ["default", "gpu"],
        "now": T0,
    }
    for statement in (CLAIM, CLAIM_ANY_QUEUE):
        read, seq = _job_rows_read(engine, statement, params)
        assert not seq
        assert read < 200


@pytest.mark.parametrize("generic", [False, True], ids=["custom_plan", "generic_plan"])
def test_claim__plans_probe_offered_ids_when_statistics_say_nothing_is_queued(
    engine: Engine, generic: bool
):
    # The statistics say nothing is queued (as after a VACUUM ANALYZE between drains): 2,000
    # finished jobs; then 2,000 jobs arrive. Re-reading the offered jobs must probe their
    # ids, not walk the queued jobs' index and filter by id.
    queue = JobQueue(engine)
    _insert_backlog(engine, 2000)
    with engine.begin() as conn:
        conn.execute(text("UPDATE tool_run_jobs SET status = 'succeeded'"))
        conn.execute(text("UPDATE tool_runs SET status = 'succeeded'"))
    with engine.begin() as conn:
        conn.execute(text("ANALYZE tool_run_jobs"))
    _insert_backlog(engine, 2000)
    held = take(queue, ("default",))[0]
    params = {
        "worker_id": "w",
        "engine_id": ENGINE,
        "limit": 1,
        "lease": LEASE,
        "queue": "default",
        "now": T0,
        "job_id": held.job_id,
        "token": held.lease_token,
        **outcome_params(AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)),
    }
    for statement in (CLAIM, FINALIZE_AND_CLAIM):
        read, seq = _job_rows_read(engine, statement, params, generic=generic)
        assert not seq
        assert read < 200
