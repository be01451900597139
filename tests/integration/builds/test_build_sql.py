"""The build statements against real Postgres: request, claim, fencing, recovery, the runs
that wait, and the claim of runs that skips builds not ready on its engine."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from runyard.domain.build_ref import BuildRef
from runyard.queue import JobQueue, NewRun
from runyard.queue.build_sql import statements
from runyard.queue.builds import BuildQueue
from runyard.queue.sql import CLAIM
from tests.integration.queue.test_pools_fairness import _job_rows_read

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 30.0
A, B = "engine-a", "engine-b"
TAG = "runyard-build/stats:0123456789ab"


def ref(tag: str = TAG, timeout: int = 600) -> BuildRef:
    return BuildRef(
        tool="stats",
        tag=tag,
        digest=tag.rsplit(":", 1)[1] + "f" * 52,
        dockerfile="Dockerfile",
        args={},
        network="none",
        timeout_seconds=timeout,
        size=3,
    )


def built_run(tag: str = TAG, tenant: str = "acme", queue: str = "default") -> NewRun:
    spec = {"name": "stats", "image": tag, "command": ["true"], "build": {"tag": tag}}
    return NewRun(tenant=tenant, tool="stats", spec=spec, input={}, queue=queue)


def image_run(tenant: str = "acme") -> NewRun:
    spec = {"name": "echo", "image": "runyard/toolbox:latest", "command": ["true"]}
    return NewRun(tenant=tenant, tool="echo", spec=spec, input={})


@pytest.fixture
def builds(engine: Engine) -> BuildQueue:
    return BuildQueue(engine, log_cap=100)


@pytest.fixture
def jobs(engine: Engine) -> JobQueue:
    return JobQueue(engine)


def claim_runs(jobs: JobQueue, engine_id: str = A, limit: int = 10, now: datetime = T0):
    return jobs.claim(worker_id="w", engine_id=engine_id, limit=limit, lease_seconds=LEASE, now=now)


def run_row(engine: Engine, run_id: uuid.UUID) -> dict[str, object]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT r.status, r.error_code, r.error, j.status AS job_status "
                "FROM tool_runs r JOIN tool_run_jobs j ON j.run_id = r.id WHERE r.id = :id"
            ),
            {"id": run_id},
        ).one()
    return dict(found._mapping)


def build_rows(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tag, engine_id, status, attempts, log, log_size FROM tool_builds")
        ).all()
    return [dict(r._mapping) for r in rows]


def test_statements__all_compile_and_run_against_postgres(engine: Engine):
    assert set(statements()) >= {"CLAIM_BUILD", "REQUEST_BUILDS", "BUILD_FAILED"}


def test_save_context__kept_once_per_tag(builds: BuildQueue, engine: Engine):
    builds.save_context(ref(), b"one")
    builds.save_context(ref(), b"two")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT context FROM tool_build_contexts")).scalar_one() == b"one"


def test_request_builds__one_row_per_engine_however_many_runs_wait(
    builds: BuildQueue, jobs: JobQueue, engine: Engine
):
    builds.save_context(ref(), b"tar")
    for _ in range(10):
        jobs.enqueue(built_run(), now=T0)
    assert builds.request_builds(A, ["default"], now=T0) == [TAG]
    assert builds.request_builds(A, ["default"], now=T0) == []
    assert builds.request_builds(B, ["default"], now=T0) == [TAG]
    assert sorted(str(r["engine_id"]) for r in build_rows(engine)) == [A, B]


def test_request_builds__only_for_the_workers_queues(builds: BuildQueue, jobs: JobQueue):
    builds.save_context(ref(), b"tar")
    jobs.enqueue(built_run(queue="gpu"), now=T0)
    assert builds.request_builds(A, ["default"], now=T0) == []
    assert builds.request_builds(A, ["gpu", "default"], now=T0) == [TAG]


def test_pending__runs_waiting_in_any_queue_or_a_due_or_orphaned_build_of_the_engine(
    builds: BuildQueue, jobs: JobQueue
):
    builds.save_context(ref(), b"tar")
    assert not builds.pending(A, now=T0)
    jobs.enqueue(image_run(), now=T0)
    assert not builds.pending(A, now=T0)  # a run of a plain image waits for no build
    waiting = jobs.enqueue(built_run(queue="gpu"), now=T0).run_id
    # FAIL_WAITING looks at every queue's runs, so any worker's round has work.
    assert builds.pending(A, now=T0) and builds.pending(B, now=T0)
    assert builds.request_builds(A, ["gpu"], now=T0) == [TAG]
    assert jobs.cancel(waiting, now=T0).cancelled_now
    assert builds.pending(A, now=T0)  # its build is queued and due
    assert not builds.pending(B, now=T0)  # another engine's build is not B's work
    held = builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None
    assert not builds.pending(A, now=T0)  # held under a live lease
    assert builds.pending(A, now=T0 + timedelta(seconds=LEASE + 1))  # orphaned
    assert builds.release(held.build_id, held.lease_token, delay=5, now=T0)
    assert not builds.pending(A, now=T0)  # queued again, due only later
    assert builds.pending(A, now=T0 + timedelta(seconds=6))


def test_claim_runs__wait_for_the_build_of_their_engine_only(builds: BuildQueue, jobs: JobQueue):
    builds.save_context(ref(), b"tar")
    waiting = jobs.enqueue(built_run(), now=T0).run_id
    assert claim_runs(jobs, A) == []
    builds.request_builds(A, ["default"], now=T0)
    held = builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None and held.request.context == b"tar" and not held.recovered
    assert claim_runs(jobs, A) == []
    assert builds.ready(held.build_id, held.lease_token, "sha256:x", now=T0)
    assert claim_runs(jobs, B) == []
    assert [j.run_id for j in claim_runs(jobs, A)] == [waiting]


def test_claim_runs__blocked_runs_never_hold_back_other_runs_or_tenants(
    builds: BuildQueue, jobs: JobQueue
):
    builds.save_context(ref(), b"tar")
    for i in range(30):
        jobs.enqueue(built_run(tenant="a"), now=T0 + timedelta(milliseconds=i))
    later = T0 + timedelta(seconds=1)
    same_tenant = jobs.enqueue(image_run(tenant="a"), now=later).run_id
    other_tenant = jobs.enqueue(image_run(tenant="b"), now=later).run_id
    claimed = claim_runs(jobs, A, limit=5, now=later)
    assert sorted(str(j.run_id) for j in claimed) == sorted([str(same_tenant), str(other_tenant)])


def test_claim_build__one_holder_among_racing_workers(builds: BuildQueue, jobs: JobQueue):
    builds.save_context(ref(), b"tar")
    jobs.enqueue(built_run(), now=T0)
    builds.request_builds(A, ["default"], now=T0)
    got: list[object] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        got.append(builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for g in got if g is not None) == 1
    assert builds.claim(worker_id="w", engine_id=B, lease_seconds=LEASE, now=T0) is None


def test_claim_build__orphan_recovered_after_its_lease_and_old_holder_fenced(
    builds: BuildQueue, jobs: JobQueue, engine: Engine
):
    builds.save_context(ref(), b"tar")
    jobs.enqueue(built_run(), now=T0)
    builds.request_builds(A, ["default"], now=T0)
    first = builds.claim(worker_id="w1", engine_id=A, lease_seconds=LEASE, now=T0)
    assert first is not None
    assert builds.heartbeat(first.build_id, first.lease_token, lease_seconds=LEASE, now=T0)
    assert builds.claim(worker_id="w2", engine_id=A, lease_seconds=LEASE, now=T0) is None
    late = T0 + timedelta(seconds=LEASE + 1)
    second = builds.claim(worker_id="w2", engine_id=A, lease_seconds=LEASE, now=late)
    assert second is not None and second.recovered and second.attempt == 2
    assert not builds.heartbeat(first.build_id, first.lease_token, lease_seconds=LEASE, now=late)
    assert not builds.append_log(first.build_id, first.lease_token, "stale", now=late)
    assert not builds.ready(first.build_id, first.lease_token, "sha256:old", now=late)
    assert builds.failed(first.build_id, first.lease_token, "x", now=late) == (False, 0)
    assert builds.ready(second.build_id, second.lease_token, "sha256:new", now=late)
    assert build_rows(engine)[0]["status"] == "ready"


def test_append_log__keeps_the_tail_and_counts_everything(
    builds: BuildQueue, jobs: JobQueue, engine: Engine
):
    builds.save_context(ref(), b"tar")
    jobs.enqueue(built_run(), now=T0)
    builds.request_builds(A, ["default"], now=T0)
    held = builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None
    for i in range(30):
        assert builds.append_log(held.build_id, held.lease_token, f"line {i:02d}\n", now=T0)
    row = build_rows(engine)[0]
    assert row["log_size"] == 240
    assert len(str(row["log"])) == 100 and str(row["log"]).endswith("line 29\n")


def test_build_failed__fails_waiting_runs_then_later_submits_until_rebuild(
    builds: BuildQueue, jobs: JobQueue, engine: Engine
):
    builds.save_context(ref(), b"tar")
    waiting = [jobs.enqueue(built_run(), now=T0).run_id for _ in range(3)]
    other = jobs.enqueue(image_run(), now=T0).run_id
    builds.request_builds(A, ["default"], now=T0)
    held = builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None
    assert builds.failed(held.build_id, held.lease_token, "build failed: boom", now=T0) == (
        True,
        3,
    )
    for run_id in waiting:
        assert run_row(engine, run_id) == {
            "status": "failed",
            "error_code": "build_failed",
            "error": "build failed: boom",
            "job_status": "failed",
        }
    assert run_row(engine, other)["status"] == "queued"
    late = jobs.enqueue(built_run(), now=T0).run_id
    assert builds.request_builds(B, ["default"], now=T0) == []  # a failed digest waits
    assert builds.fail_waiting(TAG, now=T0) == 1
    assert run_row(engine, late)["error"] == "build failed: boom"
    assert builds.rebuild(TAG, "default", now=T0).again == 1
    after = jobs.enqueue(built_run(), now=T0).run_id
    assert builds.fail_waiting(now=T0) == 0
    assert run_row(engine, after)["status"] == "queued"


def test_build_failed__runs_stay_when_another_engine_has_it_ready(
    builds: BuildQueue, jobs: JobQueue, engine: Engine
):
    builds.save_context(ref(), b"tar")
    run_id = jobs.enqueue(built_run(), now=T0).run_id
    builds.request_builds(A, ["default"], now=T0)
    builds.request_builds(B, ["default"], now=T0)
    on_b = builds.claim(worker_id="wb", engine_id=B, lease_seconds=LEASE, now=T0)
    on_a = builds.claim(worker_id="wa", engine_id=A, lease_seconds=LEASE, now=T0)
    assert on_a is not None and on_b is not None
    assert builds.ready(on_b.build_id, on_b.lease_token, "sha256:b", now=T0)
    assert builds.failed(on_a.build_id, on_a.lease_token, "no room", now=T0) == (True, 0)
    assert builds.fail_waiting(now=T0) == 0
    assert [j.run_id for j in claim_runs(jobs, B)] == [run_id]


def test_release__gives_the_attempt_back_and_delays_it(
    builds: BuildQueue, jobs: JobQueue, engine: Engine
):
    builds.save_context(ref(), b"tar")
    jobs.enqueue(built_run(), now=T0)
    builds.request_builds(A, ["default"], now=T0)
    held = builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0)
    assert held is not None
    assert builds.release(held.build_id, held.lease_token, delay=5, now=T0)
    assert builds.claim(worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0) is None
    again = builds.claim(
        worker_id="w", engine_id=A, lease_seconds=LEASE, now=T0 + timedelta(seconds=6)
    )
    assert again is not None and again.attempt == 1 and not again.recovered


def test_rebuild__makes_rows_for_live_engines_of_the_queue(builds: BuildQueue, engine: Engine):
    builds.save_context(ref(), b"tar")
    with engine.begin() as conn:
        for wid, eng, queues, seen in (
            ("w1", A, ["default"], T0),
            ("w2", B, ["gpu"], T0),
            ("w3", "engine-c", ["default"], T0 - timedelta(hours=1)),
        ):
            conn.execute(
                text(
                    "INSERT INTO workers (id, engine_id, host, pid, queues, last_seen_at) "
                    "VALUES (:id, :e, 'h', 1, :q, :seen)"
                ),
                {"id": wid, "e": eng, "q": queues, "seen": seen},
            )
    assert builds.rebuild(TAG, "default", now=T0).made == 1
    assert [r["engine_id"] for r in build_rows(engine)] == [A]


@pytest.fixture
def blocked_backlog(engine: Engine) -> Iterator[None]:
    """20,000 queued runs of one tenant waiting for a build no engine has."""
    spec = json.dumps({"name": "stats", "image": TAG, "command": ["true"], "build": {"tag": TAG}})
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                WITH runs AS (
                    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode,
                                           requested_at)
                    SELECT gen_random_uuid(), 'flood', 'stats', CAST(:spec AS jsonb), '{}',
                           'queued', 'queue', CAST(:t0 AS timestamptz)
                    FROM generate_series(1, 20000)
                    RETURNING id
                )
                INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, timeout_seconds,
                                           available_at, created_at, build_tag)
                SELECT gen_random_uuid(), id, 'queued', 'default', 'flood', 60,
                       CAST(:t0 AS timestamptz), CAST(:t0 AS timestamptz), :tag
                FROM runs
                """
            ),
            {"spec": spec, "t0": T0, "tag": TAG},
        )
        conn.execute(text("ANALYZE tool_run_jobs"))
    yield


def test_claim__plan_reads_none_of_the_runs_blocked_on_a_build(
    engine: Engine, jobs: JobQueue, blocked_backlog: None
):
    jobs.enqueue(image_run(tenant="flood"), now=T0)
    params = {
        "worker_id": "w",
        "engine_id": A,
        "limit": 2,
        "lease": LEASE,
        "queue": "default",
        "now": T0,
    }
    read, seq = _job_rows_read(engine, CLAIM, params)
    assert not seq
    assert read < 100
