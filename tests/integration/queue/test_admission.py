"""Admission caps against real Postgres: exact in every API process, and the per-tenant counts
the triggers keep (migration 0006) equal a real count after every transition."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, Row, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.platform.db import make_engine
from runyard.queue import (
    AdmissionCaps,
    AdmissionRefused,
    ApiQueue,
    ClaimedJob,
    EnqueueResult,
    InlineClaim,
)
from tests.integration.queue.test_queue import new_run
from tests.integration.queue.test_sync_jobs import adopt

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 30.0
SUCCESS = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
INLINE = InlineClaim(owner="api-1", engine_id="engine-a", lease_seconds=LEASE)


def counted(engine: Engine) -> dict[str, tuple[int, int]]:
    """The triggers' counts per tenant (tenants with nothing active left out)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT tenant, sum(queued) AS q, sum(running) AS r FROM tenant_run_counts "
                "GROUP BY tenant"
            )
        ).all()
    return {row.tenant: (int(row.q), int(row.r)) for row in rows if (row.q, row.r) != (0, 0)}


def real(engine: Engine) -> dict[str, tuple[int, int]]:
    """A real count of each tenant's queued and running runs."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                """
                SELECT tenant, count(*) FILTER (WHERE status = 'queued') AS q,
                       count(*) FILTER (WHERE status = 'running') AS r
                FROM tool_runs WHERE status IN ('queued', 'running') GROUP BY tenant
                """
            )
        ).all()
    return {row.tenant: (int(row.q), int(row.r)) for row in rows}


def claim(api: ApiQueue, limit: int, now: datetime = T0, worker: str = "w1") -> list[ClaimedJob]:
    return api.claim(
        worker_id=worker, engine_id="engine-a", limit=limit, lease_seconds=LEASE, now=now
    )


def submit_until_refused(api: ApiQueue, caps: AdmissionCaps, n: int) -> tuple[int, int]:
    admitted = refused = 0
    for _ in range(n):
        try:
            api.submit(new_run(), caps, now=T0)
            admitted += 1
        except AdmissionRefused as exc:
            assert exc.reason == "tenant_queued"
            refused += 1
    return admitted, refused


@pytest.fixture
def second_engine(database_url: str) -> Iterator[Engine]:
    """A second pool on the same database, as another API process would have."""
    eng = make_engine(database_url, pool_size=10, max_overflow=10)
    yield eng
    eng.dispose()


# --- admission ---------------------------------------------------------------------------


def test_admission__refuses_exactly_at_the_queued_cap(engine: Engine):
    api = ApiQueue(engine)
    caps = AdmissionCaps(tenant_max_queued=10)
    assert submit_until_refused(api, caps, 14) == (10, 4)
    assert real(engine) == counted(engine) == {"acme": (10, 0)}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT shard, queued, running FROM tenant_run_counts")).all()
    assert [tuple(row) for row in rows] == [(0, 10, 0)]  # inserts count in the gated row 0


def test_admission__counts_the_runs_another_process_admitted(engine: Engine, second_engine: Engine):
    caps = AdmissionCaps(tenant_max_queued=10)
    first, second = ApiQueue(engine), ApiQueue(second_engine)
    assert submit_until_refused(second, caps, 8) == (8, 0)
    assert submit_until_refused(first, caps, 4) == (2, 2)
    assert submit_until_refused(second, caps, 1) == (0, 1)


def test_admission__a_claim_makes_room_under_the_queued_cap(engine: Engine):
    api = ApiQueue(engine)
    caps = AdmissionCaps(tenant_max_queued=3)
    assert submit_until_refused(api, caps, 4) == (3, 1)
    assert len(claim(api, limit=2)) == 2
    assert submit_until_refused(api, caps, 3) == (2, 1)


def test_admission__refuses_exactly_at_the_running_cap(engine: Engine):
    api = ApiQueue(engine)
    caps = AdmissionCaps(tenant_max_running=2)
    for _ in range(3):
        api.submit(new_run(), caps, now=T0)
    jobs = claim(api, limit=2)
    with pytest.raises(AdmissionRefused) as refused:
        api.submit(new_run(), caps, now=T0)
    assert refused.value.reason == "tenant_running"
    assert api.finalize(jobs[0].job_id, jobs[0].lease_token, SUCCESS, now=T0)
    assert api.submit(new_run(), caps, now=T0).created


def test_admission__an_idempotent_replay_at_the_cap_is_not_refused(engine: Engine):
    api = ApiQueue(engine)
    caps = AdmissionCaps(tenant_max_queued=1)
    keyed = new_run(idempotency_key="k1")
    first = api.submit(keyed, caps, now=T0)
    again = api.submit(keyed, caps, now=T0)
    assert (first.created, again.created, again.run_id) == (True, False, first.run_id)
    with pytest.raises(AdmissionRefused):
        api.submit(new_run(), caps, now=T0)


def test_admission__sums_all_of_the_tenants_rows_of_counts(engine: Engine):
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tenant_run_counts (tenant, shard, queued, running) VALUES "
                "('acme', 0, 5, 1), ('acme', 7, -2, 3), ('beta', 0, 9, 9)"
            )
        )
    api = ApiQueue(engine)
    # acme: 3 queued, 4 running; beta's rows are not acme's.
    for caps, reason in [
        (AdmissionCaps(tenant_max_queued=3), "tenant_queued"),
        (AdmissionCaps(tenant_max_running=4), "tenant_running"),
    ]:
        with pytest.raises(AdmissionRefused) as refused:
            api.submit(new_run(), caps, now=T0)
        assert refused.value.reason == reason
        with pytest.raises(AdmissionRefused):
            api.submit(new_run(), caps, inline=INLINE, now=T0)
    assert api.submit(new_run(), AdmissionCaps(tenant_max_queued=4), now=T0).created
    assert api.submit(new_run(), AdmissionCaps(tenant_max_running=5), inline=INLINE).created


def test_admission__a_replay_is_not_refused_when_the_queue_is_full(engine: Engine):
    api = ApiQueue(engine)
    keyed = new_run(idempotency_key="k1")
    first = api.submit(keyed, AdmissionCaps(), now=T0)
    full = AdmissionCaps(max_queue_depth=1)
    assert api.submit(keyed, full, now=T0) == EnqueueResult(run_id=first.run_id, created=False)
    with pytest.raises(AdmissionRefused) as refused:
        api.submit(new_run(), full, now=T0)
    assert refused.value.reason == "queue_full"


def hammer(apis: list[ApiQueue], caps: AdmissionCaps, threads: int, each: int) -> int:
    admitted = 0
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker(api: ApiQueue) -> None:
        nonlocal admitted
        start.wait()
        for _ in range(each):
            try:
                api.submit(new_run(), caps, now=T0)
            except AdmissionRefused:
                continue
            with lock:
                admitted += 1

    pool = [threading.Thread(target=worker, args=(apis[i % len(apis)],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return admitted


def test_admission__two_processes_never_pass_the_cap_under_concurrent_submits(
    engine: Engine, second_engine: Engine
):
    caps = AdmissionCaps(tenant_max_queued=40)
    admitted = hammer([ApiQueue(engine), ApiQueue(second_engine)], caps, threads=16, each=8)
    assert admitted == 40
    assert real(engine) == counted(engine) == {"acme": (40, 0)}


# --- the counts the triggers keep ----------------------------------------------------------


def test_counts__equal_a_real_count_after_every_transition(engine: Engine):
    api = ApiQueue(engine)
    caps = AdmissionCaps(tenant_max_queued=100, tenant_max_running=100)

    def step(name: str, action: Callable[[], object]) -> None:
        assert action(), name  # every step must change something, or it proves nothing
        assert counted(engine) == real(engine), name

    def finalize_and_claim_next() -> bool:
        finalized, claimed = api.finalize_and_claim(
            jobs[1].job_id,
            jobs[1].lease_token,
            SUCCESS,
            worker_id="w1",
            engine_id="engine-a",
            limit=1,
            lease_seconds=LEASE,
            queue="default",
            now=T0,
        )
        return finalized and len(claimed) == 1

    def requeue(job: ClaimedJob, token: uuid.UUID | None, now: datetime) -> RunStatus | None:
        return api.requeue(job.job_id, token, error_code="lost", error="lost", now=now).status

    # Two attempts, so that the reaper's requeue puts the run back in the queue.
    of_a = {"tenant": "a", "max_attempts": 2}
    of_b = {"tenant": "b", "max_attempts": 2}
    step("submit", lambda: [api.submit(new_run(**of_a), caps, now=T0) for _ in range(6)])
    step("submit b", lambda: [api.submit(new_run(**of_b), caps, now=T0) for _ in range(4)])
    step("enqueue", lambda: api.enqueue(new_run(**of_b), now=T0))
    jobs = claim(api, limit=8)  # one statement moves both tenants' runs
    step("claim", lambda: len({job.tenant for job in runs_of(engine, jobs)}) == 2)
    step("finalize", lambda: api.finalize(jobs[0].job_id, jobs[0].lease_token, SUCCESS, now=T0))
    step("finalize and claim", finalize_and_claim_next)
    step("cancel queued", lambda: api.cancel(queued_run(engine), now=T0).cancelled_now)
    step("cancel running: requested", lambda: api.cancel(jobs[2].run_id, now=T0).requested)
    step(
        "requeue of a cancelled attempt",
        lambda: requeue(jobs[2], jobs[2].lease_token, T0) == RunStatus.CANCELLED,
    )
    later = T0 + timedelta(seconds=LEASE + 1)
    step("lease expiry", lambda: api.clear_expired([jobs[3].job_id], now=later))
    step("reaper requeue", lambda: requeue(jobs[3], None, later) == RunStatus.QUEUED)
    step(
        "requeue unstarted",
        lambda: api.requeue_unstarted(jobs[4].job_id, jobs[4].lease_token, now=T0).owned,
    )
    step("release", lambda: api.release(jobs[5].job_id, jobs[5].lease_token, now=T0))
    failed = AttemptResult(status=RunStatus.FAILED, exit_code=1)
    step("fail", lambda: api.finalize(jobs[6].job_id, jobs[6].lease_token, failed, now=T0))
    synced = api.submit(new_run(tenant="a"), caps, inline=INLINE, now=T0)
    step("sync submit: inserted claimed", lambda: synced.job)
    adopted: list[ClaimedJob] = []
    step("sync adopt", lambda: adopted.__iadd__(adopt(api, now=later)))
    step("sync finish", lambda: api.finalize(adopted[0].job_id, adopted[0].lease_token, SUCCESS))
    lost = api.submit(new_run(tenant="b"), caps, inline=INLINE, now=T0).job
    assert lost is not None
    step(
        "sync lost",
        lambda: api.put_back(lost.job_id, lost.lease_token, charged=True, error="gone").owned,
    )
    step("prune", lambda: api.prune(retention_seconds=0, batch=100, now=later + timedelta(1)))
    step("delete active runs", lambda: delete(engine, DELETE_TWO_ACTIVE) == 2)
    assert counted(engine)  # active runs are left for the truncate to clear
    delete(engine, "TRUNCATE tool_runs CASCADE")
    assert counted(engine) == real(engine) == {}


DELETE_TWO_ACTIVE = """
    DELETE FROM tool_runs WHERE id IN (
        SELECT id FROM tool_runs WHERE status IN ('queued', 'running') ORDER BY id LIMIT 2)
"""


def runs_of(engine: Engine, jobs: list[ClaimedJob]) -> list[Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT id, tenant FROM tool_runs WHERE id = ANY(:ids)"),
                {"ids": [job.run_id for job in jobs]},
            ).all()
        )


def queued_run(engine: Engine) -> uuid.UUID:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id FROM tool_runs WHERE status = 'queued' ORDER BY id LIMIT 1")
        ).scalar_one()
    return uuid.UUID(str(found))


def delete(engine: Engine, statement: str) -> int:
    with engine.begin() as conn:
        return conn.execute(text(statement)).rowcount


def test_counts__stay_exact_under_concurrent_submits_claims_and_finalizes(engine: Engine):
    """Workers that claim runs of several tenants in one statement and finalize them, next to
    submits of those tenants: no deadlock, no error, and the counts stay exact."""
    api = ApiQueue(engine)
    tenants = ["a", "b", "c"]
    caps = AdmissionCaps(tenant_max_queued=10_000)
    for i in range(60):
        api.submit(new_run(tenant=tenants[i % 3]), caps, now=T0)
    errors: list[BaseException] = []
    submitting = threading.Event()
    submitting.set()

    def submitter(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                api.submit(new_run(tenant=rng.choice(tenants)), caps, now=T0)
        except BaseException as exc:
            errors.append(exc)

    def worker(name: str) -> None:
        try:
            while True:
                last = not submitting.is_set()  # read before the claim that may come back empty
                jobs = claim(api, limit=3, worker=name)
                for job in jobs:
                    assert api.finalize(job.job_id, job.lease_token, SUCCESS, now=T0)
                if last and not jobs:
                    return
        except BaseException as exc:
            errors.append(exc)

    submitters = [threading.Thread(target=submitter, args=(i,)) for i in range(2)]
    workers = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in submitters + workers:
        t.start()
    for t in submitters:
        t.join()
    submitting.clear()
    for t in workers:
        t.join()
    assert errors == []
    assert counted(engine) == real(engine) == {}
    with engine.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM tool_runs WHERE status = 'succeeded'"))
        assert done.scalar_one() == 180
