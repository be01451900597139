"""The lease protocol against real Postgres: claims, fencing, reaping, backoff, cancel."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.platform.db import make_engine
from runyard.queue import JobQueue, NewRun
from runyard.queue.sql import CLAIM, CLAIM_ANY_QUEUE

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 30.0
ENGINE = "engine-a"


def new_run(**overrides: object) -> NewRun:
    fields: dict[str, object] = {
        "tenant": "acme",
        "tool": "echo",
        "spec": {"name": "echo", "image": "runyard/toolbox:latest", "command": ["true"]},
        "input": {"n": 1},
        "timeout_seconds": 60,
    }
    fields.update(overrides)
    return NewRun(**fields)  # type: ignore[arg-type]


def enqueue_many(queue: JobQueue, n: int, **overrides: object) -> list[uuid.UUID]:
    return [queue.enqueue(new_run(**overrides), now=T0).run_id for _ in range(n)]


def claim(queue: JobQueue, worker: str = "w1", limit: int = 1, now: datetime = T0, **kw: object):
    return queue.claim(
        worker_id=worker,
        engine_id=str(kw.pop("engine_id", ENGINE)),
        limit=limit,
        lease_seconds=LEASE,
        now=now,
    )


def row(engine: Engine, run_id: uuid.UUID) -> dict[str, object]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                """
                SELECT j.status AS job_status, r.status AS run_status, j.attempts,
                       r.attempts AS run_attempts, j.locked_by, j.locked_until, j.lease_token,
                       j.available_at, r.started_at, r.finished_at, j.engine_id, r.error_code,
                       r.result, j.cancel_requested_at
                FROM tool_run_jobs j JOIN tool_runs r ON r.id = j.run_id
                WHERE r.id = :id
                """
            ),
            {"id": run_id},
        ).one()
    return dict(found._mapping)


def events(engine: Engine, run_id: uuid.UUID) -> list[tuple[str, dict[str, object]]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT type, data FROM tool_run_events WHERE run_id = :id ORDER BY id"),
            {"id": run_id},
        ).all()
    return [(r.type, r.data) for r in rows]


SUCCESS = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result={"ok": True})


# --- enqueue and claim -------------------------------------------------------------------


def test_enqueue__writes_run_job_and_event_together(queue: JobQueue, engine: Engine):
    run_id = queue.enqueue(new_run(), now=T0).run_id
    state = row(engine, run_id)
    assert state["job_status"] == "queued" and state["run_status"] == "queued"
    assert state["started_at"] is None and state["finished_at"] is None
    assert events(engine, run_id) == [("status", {"status": "queued"})]


def test_enqueue__idempotency_key_replays_and_conflicts(queue: JobQueue):
    first = queue.enqueue(new_run(idempotency_key="k1"), now=T0)
    again = queue.enqueue(new_run(idempotency_key="k1"), now=T0)
    assert first.created and not again.created and again.run_id == first.run_id
    from runyard.queue import IdempotencyConflict

    with pytest.raises(IdempotencyConflict):
        queue.enqueue(new_run(idempotency_key="k1", input={"n": 2}), now=T0)


def test_claim__sets_lease_attempt_deadline_and_mirrors_run(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue)
    assert job.run_id == run_id and job.attempt == 1 and not job.adopted
    assert job.locked_until == T0 + timedelta(seconds=LEASE)
    assert job.deadline_at == T0 + timedelta(seconds=60)
    state = row(engine, run_id)
    assert state["job_status"] == "running" and state["run_status"] == "running"
    assert state["started_at"] == T0 and state["run_attempts"] == 1
    assert state["locked_by"] == "w1" and state["engine_id"] == ENGINE
    assert [t for t, _ in events(engine, run_id)] == ["status", "claimed", "status"]


def test_claim__orders_by_priority_then_age_and_respects_available_at(queue: JobQueue):
    low = queue.enqueue(new_run(priority=0), now=T0).run_id
    high = queue.enqueue(new_run(priority=5), now=T0 + timedelta(seconds=1)).run_id
    later = queue.enqueue(new_run(priority=9), now=T0 + timedelta(seconds=100)).run_id
    claimed = [j.run_id for j in claim(queue, limit=3, now=T0 + timedelta(seconds=2))]
    assert claimed == [high, low]
    assert later not in claimed


def test_claim__new_lease_token_each_claim(queue: JobQueue):
    enqueue_many(queue, 2)
    tokens = {j.lease_token for j in claim(queue, limit=2)}
    assert len(tokens) == 2


@pytest.mark.parametrize("planner", ["default", "no_hash_no_merge"])
def test_claim__race_500_jobs_16_threads_each_claimed_once(database_url: str, planner: str):
    options = "" if planner == "default" else "-c enable_hashjoin=off -c enable_mergejoin=off"
    from sqlalchemy import create_engine

    from runyard.platform.settings import normalize_database_url

    eng = create_engine(
        normalize_database_url(database_url),
        pool_size=16,
        max_overflow=4,
        connect_args={"options": options} if options else {},
    )
    queue = JobQueue(eng)
    try:
        expected = set(enqueue_many(queue, 500))
        claimed: list[uuid.UUID] = []
        over_limit: list[tuple[int, int]] = []
        lock = threading.Lock()
        start = threading.Barrier(16)

        def worker(n: int) -> None:
            rng = random.Random(n)
            start.wait()
            while True:
                limit = rng.randint(1, 8)
                jobs = claim(queue, worker=f"w{n}", limit=limit)
                with lock:
                    claimed.extend(j.run_id for j in jobs)
                    if len(jobs) > limit:
                        over_limit.append((limit, len(jobs)))
                if not jobs:
                    return

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not over_limit
        assert len(claimed) == len(set(claimed)) == 500
        assert set(claimed) == expected
    finally:
        eng.dispose()


@pytest.mark.parametrize("statement", ["CLAIM", "CLAIM_ANY_QUEUE"])
@pytest.mark.parametrize("planner", ["default", "no_hash_no_merge"])
def test_claim__locks_no_more_rows_than_its_limit(database_url: str, planner: str, statement: str):
    options = "" if planner == "default" else "-c enable_hashjoin=off -c enable_mergejoin=off"
    eng = make_engine(database_url)
    queue = JobQueue(eng)
    try:
        enqueue_many(queue, 40)
        with eng.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgrowlocks"))
        with eng.connect() as conn:
            trans = conn.begin()
            if options:
                conn.execute(text("SET LOCAL enable_hashjoin = off"))
                conn.execute(text("SET LOCAL enable_mergejoin = off"))
            rows = conn.execute(
                CLAIM if statement == "CLAIM" else CLAIM_ANY_QUEUE,
                {
                    "worker_id": "w",
                    "engine_id": ENGINE,
                    "limit": 5,
                    "lease": LEASE,
                    "queue": "default",
                    "queues": ["other", "default"],
                    "now": T0,
                },
            ).all()
            with eng.connect() as other:
                locked = other.execute(
                    text("SELECT count(*) FROM pgrowlocks('tool_run_jobs')")
                ).scalar_one()
            trans.rollback()
        assert len(rows) == 5
        assert locked == 5
    finally:
        eng.dispose()


# --- fencing -----------------------------------------------------------------------------


def test_fencing__old_owner_changes_nothing_after_adoption(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [old] = claim(queue, worker="w-old")
    later = T0 + timedelta(seconds=LEASE + 1)
    assert queue.clear_expired(queue.select_expired(batch=10, now=later), now=later) == [run_id]
    [new] = claim(queue, worker="w-new", now=later)
    assert new.adopted and new.attempt == 1 and new.lease_token != old.lease_token
    assert new.deadline_at == old.deadline_at  # an adopter keeps the same deadline

    assert not queue.heartbeat(old.job_id, old.lease_token, lease_seconds=LEASE, now=later).owned
    assert not queue.finalize(old.job_id, old.lease_token, SUCCESS, now=later)
    assert not queue.requeue(old.job_id, old.lease_token, error_code="x", error="x").owned
    assert not queue.release(old.job_id, old.lease_token, now=later)
    state = row(engine, run_id)
    assert state["locked_by"] == "w-new" and state["job_status"] == "running"

    assert queue.finalize(new.job_id, new.lease_token, SUCCESS, now=later)
    assert row(engine, run_id)["run_status"] == "succeeded"


def test_terminal_run__never_changes(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue)
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
    before = row(engine, run_id)
    failure = AttemptResult(status=RunStatus.FAILED, exit_code=1)
    assert not queue.finalize(job.job_id, job.lease_token, failure, now=T0)
    assert not queue.requeue(job.job_id, job.lease_token, error_code="x", error="x").owned
    assert not queue.requeue(job.job_id, None, error_code="x", error="x").owned
    cancel = queue.cancel(run_id)
    assert cancel.status == RunStatus.SUCCEEDED and not cancel.cancelled_now
    far = T0 + timedelta(days=1)
    assert queue.clear_expired(queue.select_expired(batch=10, now=far), now=far) == []
    assert claim(queue, now=far) == []
    assert row(engine, run_id) == before


def test_finalize__clears_lease_and_records_outcome(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue)
    done = T0 + timedelta(seconds=5)
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=done)
    state = row(engine, run_id)
    assert state["job_status"] == state["run_status"] == "succeeded"
    assert state["finished_at"] == done and state["result"] == {"ok": True}
    assert state["locked_by"] is None and state["locked_until"] is None
    assert events(engine, run_id)[-1] == (
        "status",
        {"status": "succeeded", "attempt": 1, "exit_code": 0, "error_code": None},
    )


def finalize_and_claim(queue: JobQueue, job_id, token, *, now: datetime = T0, limit: int = 1):
    return queue.finalize_and_claim(
        job_id,
        token,
        SUCCESS,
        worker_id="w1",
        engine_id=ENGINE,
        limit=limit,
        lease_seconds=LEASE,
        queue="default",
        now=now,
    )


def test_finalize_and_claim__finalizes_then_claims_adoptable_first(queue: JobQueue, engine: Engine):
    first, adopt_me, fresh = enqueue_many(queue, 3)
    [job, lost] = claim(queue, limit=2)
    at = T0 + timedelta(seconds=LEASE + 1)
    queue.heartbeat(job.job_id, job.lease_token, lease_seconds=LEASE * 2, now=T0)
    queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
    done, claimed = finalize_and_claim(queue, job.job_id, job.lease_token, now=at, limit=2)
    assert done and [c.run_id for c in claimed] == [adopt_me, fresh]
    assert [c.adopted for c in claimed] == [True, False] and claimed[0].job_id == lost.job_id
    assert row(engine, first)["run_status"] == "succeeded"
    assert row(engine, fresh)["run_status"] == "running"
    assert [t for t, _ in events(engine, first)][-1] == "status"
    assert [t for t, _ in events(engine, fresh)] == ["status", "claimed", "status"]
    again, none = finalize_and_claim(queue, job.job_id, job.lease_token, now=at)
    assert not again and none == []
    assert row(engine, first)["result"] == {"ok": True}


def test_finalize_and_claim__lost_lease_changes_nothing_but_still_claims(
    queue: JobQueue, engine: Engine
):
    run_id, other = enqueue_many(queue, 2)
    [job] = claim(queue)
    done, claimed = finalize_and_claim(queue, job.job_id, uuid.uuid4())
    assert not done and [c.run_id for c in claimed] == [other]
    assert row(engine, run_id)["run_status"] == "running"


def test_heartbeat__extends_lease(queue: JobQueue, engine: Engine):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    beat = queue.heartbeat(
        job.job_id, job.lease_token, lease_seconds=LEASE, now=T0 + timedelta(seconds=10)
    )
    assert beat.owned and not beat.cancel_requested
    assert beat.locked_until == T0 + timedelta(seconds=10 + LEASE)


# --- reaper ------------------------------------------------------------------------------


def test_reaper__clears_only_expired_leases_and_keeps_running(queue: JobQueue, engine: Engine):
    expired, fresh = enqueue_many(queue, 2)
    claim(queue, limit=1, now=T0)
    claim(queue, limit=1, now=T0 + timedelta(seconds=20))
    at = T0 + timedelta(seconds=LEASE + 1)
    assert queue.clear_expired(queue.select_expired(batch=10, now=at), now=at) == [expired]
    state = row(engine, expired)
    assert state["job_status"] == "running" and state["locked_until"] is None
    assert state["lease_token"] is None and state["attempts"] == 1
    assert row(engine, fresh)["locked_until"] is not None
    assert events(engine, expired)[-1][0] == "lease_expired"


def test_reaper__finalize_between_select_and_update_wins(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue)
    at = T0 + timedelta(seconds=LEASE + 1)
    selected = queue.select_expired(batch=10, now=at)
    assert selected == [job.job_id]
    assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=at)
    assert queue.clear_expired(selected, now=at) == []
    assert row(engine, run_id)["run_status"] == "succeeded"


def test_reaper__heartbeat_between_select_and_update_wins(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue)
    at = T0 + timedelta(seconds=LEASE + 1)
    selected = queue.select_expired(batch=10, now=at)
    assert queue.heartbeat(job.job_id, job.lease_token, lease_seconds=LEASE, now=at).owned
    assert queue.clear_expired(selected, now=at) == []
    assert row(engine, run_id)["locked_by"] == "w1"


def test_two_reapers__clear_each_lease_once(queue: JobQueue, engine: Engine):
    enqueue_many(queue, 50)
    claim(queue, limit=50)
    at = T0 + timedelta(seconds=LEASE + 1)
    selections = [queue.select_expired(batch=100, now=at) for _ in range(2)]
    results: list[list[uuid.UUID]] = [[], []]
    barrier = threading.Barrier(2)

    def reap(i: int) -> None:
        barrier.wait()
        results[i] = queue.clear_expired(selections[i], now=at)

    threads = [threading.Thread(target=reap, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    cleared = results[0] + results[1]
    assert len(cleared) == len(set(cleared)) == 50
    with engine.connect() as conn:
        n = conn.execute(
            text("SELECT count(*) FROM tool_run_events WHERE type = 'lease_expired'")
        ).scalar_one()
    assert n == 50


def test_adoption__only_by_the_same_engine(queue: JobQueue):
    enqueue_many(queue, 1)
    claim(queue)
    at = T0 + timedelta(seconds=LEASE + 1)
    queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
    assert claim(queue, engine_id="engine-b", now=at) == []
    [job] = claim(queue, engine_id=ENGINE, now=at)
    assert job.adopted


def test_adoption__comes_before_queued_work(queue: JobQueue):
    adopt_me = enqueue_many(queue, 1)[0]
    claim(queue)
    enqueue_many(queue, 3, priority=10)
    at = T0 + timedelta(seconds=LEASE + 1)
    queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
    jobs = claim(queue, limit=2, now=at)
    assert jobs[0].run_id == adopt_me and jobs[0].adopted
    assert not jobs[1].adopted


def test_claim__several_queues_by_priority_never_another_queue(queue: JobQueue):
    a = queue.enqueue(new_run(queue="a", priority=1), now=T0).run_id
    b = queue.enqueue(new_run(queue="b", priority=5), now=T0).run_id
    queue.enqueue(new_run(queue="c", priority=9), now=T0)
    jobs = queue.claim(
        worker_id="w", engine_id=ENGINE, limit=5, lease_seconds=LEASE, queues=("a", "b"), now=T0
    )
    assert [j.run_id for j in jobs] == [b, a]
    assert claim(queue) == []
    none = queue.claim(worker_id="w", engine_id=ENGINE, limit=5, lease_seconds=LEASE, queues=())
    assert none == []


def test_claim__adoption_and_fresh_lock_no_more_than_the_limit(database_url: str):
    eng = make_engine(database_url)
    queue = JobQueue(eng)
    try:
        adopt_me = enqueue_many(queue, 1)[0]
        claim(queue)
        enqueue_many(queue, 10)
        at = T0 + timedelta(seconds=LEASE + 1)
        queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
        with eng.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgrowlocks"))
        with eng.connect() as conn:
            trans = conn.begin()
            rows = conn.execute(
                CLAIM,
                {
                    "worker_id": "w2",
                    "engine_id": ENGINE,
                    "limit": 3,
                    "lease": LEASE,
                    "queue": "default",
                    "now": at,
                },
            ).all()
            with eng.connect() as other:
                locked = other.execute(
                    text("SELECT count(*) FROM pgrowlocks('tool_run_jobs')")
                ).scalar_one()
            trans.rollback()
        assert [r.adopted for r in rows] == [True, False, False]
        assert rows[0].run_id == adopt_me and rows[0].attempts == 1
        assert [r.attempts for r in rows[1:]] == [1, 1]
        assert locked == 3
    finally:
        eng.dispose()


def test_statements__notify_in_their_own_transaction(database_url: str, queue: JobQueue):
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as listener:
        for channel in ("runyard_jobs", "runyard_runs"):
            listener.execute(f"LISTEN {channel}")
        run_id = enqueue_many(queue, 1)[0]
        [job] = claim(queue)
        assert queue.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
        lost = enqueue_many(queue, 1, max_attempts=2)[0]
        [job] = claim(queue)
        queue.requeue(job.job_id, job.lease_token, error_code="container_lost", error="x", now=T0)
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=1.0, stop_after=4)]
    assert notes == [
        ("runyard_jobs", "default"),
        ("runyard_runs", str(run_id)),
        ("runyard_jobs", "default"),
        ("runyard_jobs", str(lost)),
    ]


# --- backoff and attempts ----------------------------------------------------------------


def test_lost_container__requeues_with_growing_backoff_then_fails(queue: JobQueue, engine: Engine):
    run_id = queue.enqueue(new_run(max_attempts=3), now=T0).run_id
    now = T0
    delays = []
    for attempt in (1, 2, 3):
        [job] = claim(queue, now=now)
        assert job.attempt == attempt and not job.adopted
        result = queue.requeue(
            job.job_id, job.lease_token, error_code="container_lost", error="gone", now=now
        )
        assert result.owned
        if attempt < 3:
            assert result.status == RunStatus.QUEUED
            assert result.available_at is not None
            delays.append((result.available_at - now).total_seconds())
            assert claim(queue, now=now) == []  # not before its backoff
            assert row(engine, run_id)["run_status"] == "queued"
            now = result.available_at
        else:
            assert result.status == RunStatus.FAILED
    base = 2.0
    assert base / 2 <= delays[0] <= base
    assert base <= delays[1] <= 2 * base
    state = row(engine, run_id)
    assert state["run_status"] == "failed" and state["error_code"] == "container_lost"
    assert state["attempts"] == 3 and state["finished_at"] is not None


def test_exhausted_row__never_blocks_the_queue(queue: JobQueue, engine: Engine):
    stuck = queue.enqueue(new_run(priority=100), now=T0).run_id
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE tool_run_jobs SET attempts = max_attempts WHERE run_id = :id"),
            {"id": stuck},
        )
    other = queue.enqueue(new_run(), now=T0).run_id
    jobs = claim(queue, limit=1)
    assert [j.run_id for j in jobs] == [other]


def test_orphans_on_dead_engine__requeued_or_failed(queue: JobQueue, engine: Engine):
    retry = queue.enqueue(new_run(max_attempts=2), now=T0).run_id
    final = queue.enqueue(new_run(max_attempts=1), now=T0).run_id
    claim(queue, limit=2)
    at = T0 + timedelta(seconds=LEASE + 1)
    queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
    # No worker row for the engine at all: dead once the lease has been clear long enough.
    assert queue.select_orphaned(dead_after_seconds=60, batch=10, now=at) == []
    later = at + timedelta(seconds=61)
    orphans = queue.select_orphaned(dead_after_seconds=60, batch=10, now=later)
    assert len(orphans) == 2
    for orphan in orphans:
        assert orphan.container_requested is False and orphan.attempts_left is (
            orphan.run_id == retry
        )
        queue.requeue(
            orphan.job_id, None, error_code="container_lost", error="engine gone", now=later
        )
    assert row(engine, retry)["run_status"] == "queued"
    assert row(engine, final)["run_status"] == "failed"


def test_orphans__not_while_a_worker_of_that_engine_lives(queue: JobQueue, engine: Engine):
    from runyard.queue.workers import WorkerRegistry

    enqueue_many(queue, 1)
    claim(queue)
    at = T0 + timedelta(seconds=LEASE + 1)
    queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
    later = at + timedelta(seconds=61)
    WorkerRegistry(engine).register("w2", ENGINE, 1, now=later - timedelta(seconds=5))
    assert queue.select_orphaned(dead_after_seconds=60, batch=10, now=later) == []


def test_worker_registry__re_registration_takes_the_new_engine(queue: JobQueue, engine: Engine):
    from runyard.queue.workers import WorkerRegistry

    enqueue_many(queue, 1)
    claim(queue)
    at = T0 + timedelta(seconds=LEASE + 1)
    queue.clear_expired(queue.select_expired(batch=10, now=at), now=at)
    later = at + timedelta(seconds=61)
    registry = WorkerRegistry(engine)
    registry.register("w2", ENGINE, 1, now=later - timedelta(seconds=30))
    registry.stopped("w2", now=later - timedelta(seconds=20))
    # The same RUNYARD_WORKER_ID comes back on another engine, with more slots.
    registry.register("w2", "engine-b", 8, now=later - timedelta(seconds=5))
    with engine.connect() as conn:
        worker = conn.execute(text("SELECT * FROM workers WHERE id = 'w2'")).one()
    assert worker.engine_id == "engine-b" and worker.concurrency == 8
    assert worker.stopped_at is None
    assert worker.started_at == worker.last_seen_at == later - timedelta(seconds=5)
    # No live worker is left on the first engine: its adoptable run is an orphan now.
    assert len(queue.select_orphaned(dead_after_seconds=60, batch=10, now=later)) == 1


def test_release__makes_the_job_adoptable_at_once(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue, worker="w-old")
    assert queue.release(job.job_id, job.lease_token, now=T0)
    state = row(engine, run_id)
    assert state["job_status"] == "running" and state["locked_until"] is None
    [again] = claim(queue, worker="w-new", now=T0)
    assert again.adopted and again.attempt == 1


def test_release_later__adoptable_only_after_the_delay(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue, worker="w-old")
    assert queue.release_later(
        job.job_id, job.lease_token, delay_seconds=5, reason="engine_down", now=T0
    )
    assert not queue.release_later(
        job.job_id, job.lease_token, delay_seconds=5, reason="engine_down", now=T0
    )  # fenced: the token is gone
    state = row(engine, run_id)
    assert state["job_status"] == "running" and state["locked_until"] is None
    assert claim(queue, worker="w-new", now=T0 + timedelta(seconds=4.9)) == []
    [again] = claim(queue, worker="w-new", now=T0 + timedelta(seconds=5))
    assert again.adopted and again.attempt == 1
    released = [data for kind, data in events(engine, run_id) if kind == "released"]
    assert released == [
        {"attempt": 1, "reason": "engine_down", "adoptable_at": "2030-01-01T00:00:05+00:00"}
    ]


def test_release_later__held_back_run_still_settles_when_its_engine_dies(
    queue: JobQueue, engine: Engine
):
    enqueue_many(queue, 1)
    [job] = claim(queue)
    queue.release_later(job.job_id, job.lease_token, delay_seconds=3600, reason="x", now=T0)
    later = T0 + timedelta(seconds=61)
    [orphan] = queue.select_orphaned(dead_after_seconds=60, batch=10, now=later)
    assert orphan.job_id == job.job_id


def test_put_back__uncharged_only_if_no_container_was_requested(queue: JobQueue, engine: Engine):
    marked, unmarked = enqueue_many(queue, 2, max_attempts=2)
    jobs = {j.run_id: j for j in claim(queue, limit=2)}
    assert queue.mark_container_requested(jobs[marked].job_id, jobs[marked].lease_token, now=T0)
    refused = queue.put_back(
        jobs[marked].job_id, jobs[marked].lease_token, charged=False, error="x", now=T0
    )
    assert not refused.owned  # a container may exist: never given back for free
    charged = queue.put_back(
        jobs[marked].job_id, jobs[marked].lease_token, charged=True, error="lost", now=T0
    )
    assert charged.status == RunStatus.QUEUED and charged.attempts == 1
    assert row(engine, marked)["available_at"] != T0  # with backoff
    free = queue.put_back(
        jobs[unmarked].job_id, jobs[unmarked].lease_token, charged=False, error="x", now=T0
    )
    assert free.status == RunStatus.QUEUED and free.attempts == 0
    assert row(engine, unmarked)["available_at"] == T0  # at once


def test_requeue_never_started__only_the_lease_holder_gives_a_marked_attempt_back(
    queue: JobQueue, engine: Engine
):
    run_id = enqueue_many(queue, 1, max_attempts=1)[0]
    [job] = claim(queue)
    queue.mark_container_requested(job.job_id, job.lease_token, now=T0)
    assert not queue.requeue_never_started(job.job_id, uuid.uuid4(), delay_seconds=0).owned
    result = queue.requeue_never_started(job.job_id, job.lease_token, delay_seconds=2, now=T0)
    assert (result.status, result.attempts) == (RunStatus.QUEUED, 0)
    assert result.available_at == T0 + timedelta(seconds=2)
    assert claim(queue, now=T0 + timedelta(seconds=1)) == []
    [again] = claim(queue, now=T0 + timedelta(seconds=2))
    assert again.attempt == 1 and not again.container_requested  # same number, no charge
    assert events(engine, run_id)[-4:-2] == [
        ("requeued", {"attempt": 1, "unstarted": True}),
        ("status", {"status": "queued"}),
    ]


def test_orphans__carry_the_facts_adoption_needs(queue: JobQueue, engine: Engine):
    marked, cancelled = enqueue_many(queue, 2, max_attempts=2)
    jobs = {j.run_id: j for j in claim(queue, limit=2)}
    queue.mark_container_requested(jobs[marked].job_id, jobs[marked].lease_token, now=T0)
    queue.cancel(cancelled, now=T0)
    for job in jobs.values():
        queue.release(job.job_id, job.lease_token, now=T0)
    later = T0 + timedelta(seconds=LEASE + 61)
    found = {o.run_id: o for o in queue.select_orphaned(dead_after_seconds=60, batch=10, now=later)}
    assert (found[marked].container_requested, found[marked].cancel_requested) == (True, False)
    assert (found[cancelled].container_requested, found[cancelled].cancel_requested) == (
        False,
        True,
    )
    assert all(o.attempts_left and o.deadline_passed for o in found.values())


# --- cancel ------------------------------------------------------------------------------


def test_cancel__queued_run_is_cancelled_at_once(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    result = queue.cancel(run_id, now=T0)
    assert result.cancelled_now and result.status == RunStatus.CANCELLED
    state = row(engine, run_id)
    assert state["job_status"] == state["run_status"] == "cancelled"
    assert state["finished_at"] == T0
    assert claim(queue) == []


def test_cancel__running_run_reaches_owner_through_heartbeat(queue: JobQueue, engine: Engine):
    run_id = enqueue_many(queue, 1)[0]
    [job] = claim(queue)
    result = queue.cancel(run_id, now=T0)
    assert result.requested and result.status == RunStatus.RUNNING
    assert row(engine, run_id)["run_status"] == "running"
    beat = queue.heartbeat(job.job_id, job.lease_token, lease_seconds=LEASE, now=T0)
    assert beat.owned and beat.cancel_requested
    cancelled = AttemptResult(status=RunStatus.CANCELLED, error_code="cancelled")
    assert queue.finalize(job.job_id, job.lease_token, cancelled, now=T0)
    assert row(engine, run_id)["run_status"] == "cancelled"


def test_cancel__unknown_run(queue: JobQueue):
    result = queue.cancel(uuid.uuid4())
    assert not result.found and result.status is None


def test_cancel__lost_container_of_cancelled_run_is_not_retried(queue: JobQueue, engine: Engine):
    run_id = queue.enqueue(new_run(max_attempts=3), now=T0).run_id
    [job] = claim(queue)
    queue.cancel(run_id, now=T0)
    result = queue.requeue(job.job_id, job.lease_token, error_code="container_lost", error="x")
    assert result.status == RunStatus.CANCELLED
    assert row(engine, run_id)["run_status"] == "cancelled"


def test_prune__removes_old_terminal_runs_with_their_jobs_and_events(
    queue: JobQueue, engine: Engine
):
    old, recent, live = enqueue_many(queue, 3)
    jobs = {j.run_id: j for j in claim(queue, limit=3)}
    queue.finalize(jobs[old].job_id, jobs[old].lease_token, SUCCESS, now=T0)
    queue.finalize(
        jobs[recent].job_id, jobs[recent].lease_token, SUCCESS, now=T0 + timedelta(days=9)
    )
    pruned = queue.prune(retention_seconds=7 * 86400, batch=10, now=T0 + timedelta(days=10))
    assert pruned == 1
    with engine.connect() as conn:
        remaining = set(conn.execute(text("SELECT run_id FROM tool_run_jobs")).scalars())
        runs = set(conn.execute(text("SELECT id FROM tool_runs")).scalars())
    assert remaining == {recent, live}
    assert runs == {recent, live}
    assert events(engine, old) == []
    assert events(engine, recent) != []


def test_admission__caps_refuse(engine: Engine):
    from runyard.queue import AdmissionCaps, AdmissionRefused, ApiQueue

    api = ApiQueue(engine)
    caps = AdmissionCaps(max_queue_depth=5, tenant_max_queued=2)
    for _ in range(2):
        assert api.submit(new_run(), caps, now=T0).created
    with pytest.raises(AdmissionRefused) as refused:
        api.submit(new_run(), caps, now=T0)
    assert refused.value.reason == "tenant_queued"
    for _ in range(3):
        api.submit(new_run(tenant="other"), AdmissionCaps(max_queue_depth=5), now=T0)
    with pytest.raises(AdmissionRefused) as full:
        api.submit(new_run(tenant="third"), AdmissionCaps(max_queue_depth=5), now=T0)
    assert full.value.reason == "queue_full"


def test_queue_depth__is_the_queued_runs_of_every_tenant_whatever_moved(
    engine: Engine, queue: JobQueue
):
    from runyard.platform.db import autocommit
    from runyard.queue.sql import QUEUE_DEPTH

    enqueue_many(queue, 4, tenant="acme", max_attempts=2)
    enqueue_many(queue, 3, tenant="beta", max_attempts=2)
    running = claim(queue, limit=3)
    assert queue.finalize(running[0].job_id, running[0].lease_token, SUCCESS, now=T0)
    back = queue.requeue(running[1].job_id, running[1].lease_token, error_code="lost", error="x")
    assert back.status is RunStatus.QUEUED
    cancelled, gone = enqueue_many(queue, 2, tenant="beta")
    assert queue.cancel(cancelled, now=T0).cancelled_now
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM tool_runs WHERE id = :id"), {"id": gone})
        queued_jobs = conn.execute(
            text("SELECT count(*) FROM tool_run_jobs WHERE status = 'queued'")
        ).scalar_one()
    # 9 written; 3 claimed: one ended, one given back to the queue, one still running; one
    # cancelled and one deleted while queued.
    assert queued_jobs == 5
    assert autocommit(engine, QUEUE_DEPTH, {})[0][0] == queued_jobs


# --- one statement, one round trip ---------------------------------------------------------


def test_autocommit__killed_connection_fails_once_then_the_pool_heals(database_url: str):
    import psycopg
    from sqlalchemy.exc import OperationalError

    from runyard.platform.db import autocommit

    eng = make_engine(database_url, pool_size=1, max_overflow=0, pre_ping=False)
    queue = JobQueue(eng)
    try:
        run_id = enqueue_many(queue, 1)[0]
        pid = autocommit(eng, text("SELECT pg_backend_pid() AS pid"), {})[0].pid
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(OperationalError):
            claim(queue)
        [job] = claim(queue)
        assert job.run_id == run_id
    finally:
        eng.dispose()


def test_autocommit__the_pooled_connection_goes_back_transactional(database_url: str):
    from runyard.platform.db import autocommit

    eng = make_engine(database_url, pool_size=1, max_overflow=0, pre_ping=False)
    try:
        assert autocommit(eng, text("SELECT 1 AS one"), {})[0].one == 1
        with eng.connect() as conn:
            trans = conn.begin()
            conn.execute(text("CREATE TABLE autocommit_probe (x int)"))
            trans.rollback()
        with eng.connect() as conn:
            found = conn.execute(text("SELECT to_regclass('autocommit_probe')")).scalar_one()
        assert found is None
    finally:
        eng.dispose()
