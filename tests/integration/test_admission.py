"""Admission caps against real Postgres: exact near a cap, no lock and no count far below it."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from runyard.queue import AdmissionCaps, AdmissionRefused, ApiQueue, NewRun
from runyard.queue_values import TenantEstimate

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def new_run(tenant: str = "acme") -> NewRun:
    return NewRun(
        tenant=tenant,
        tool="echo",
        spec={"name": "echo", "image": "runyard/toolbox:latest", "command": ["true"]},
        input={"n": 1},
        timeout_seconds=60,
    )


@contextmanager
def statements(engine: Engine) -> Iterator[dict[str, int]]:
    """Counts the advisory locks and tenant counts sent through ``engine``."""
    seen = {"lock": 0, "count": 0}
    lock = threading.Lock()

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        with lock:
            if "pg_advisory_xact_lock" in statement:
                seen["lock"] += 1
            if "status = 'running'" in statement and "LIMIT" in statement:
                seen["count"] += 1

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def queued(engine: Engine, tenant: str = "acme") -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM tool_runs WHERE tenant = :t AND status = 'queued'"),
                {"t": tenant},
            ).scalar_one()
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


def test_admission__far_below_the_cap_skips_the_lock_and_the_count(engine: Engine):
    api = ApiQueue(engine, tenant_estimate_seconds=60)
    caps = AdmissionCaps(tenant_max_queued=1000)
    with statements(engine) as seen:
        for _ in range(50):
            assert api.submit(new_run(), caps, now=T0).created
    # The first submit counts (no estimate yet); the next 49 ride on it.
    assert seen == {"lock": 1, "count": 1}
    assert queued(engine) == 50


def test_admission__the_estimate_expires_and_counts_again(engine: Engine):
    api = ApiQueue(engine, tenant_estimate_seconds=0.2)
    caps = AdmissionCaps(tenant_max_queued=1000)
    with statements(engine) as seen:
        api.submit(new_run(), caps, now=T0)
        api.submit(new_run(), caps, now=T0)
        assert seen == {"lock": 1, "count": 1}
        threading.Event().wait(0.3)
        api.submit(new_run(), caps, now=T0)
    assert seen == {"lock": 2, "count": 2}


def test_admission__near_the_cap_every_submit_counts_and_refuses_exactly(engine: Engine):
    api = ApiQueue(engine, tenant_estimate_seconds=60)
    caps = AdmissionCaps(tenant_max_queued=10)
    with statements(engine) as seen:
        admitted, refused = submit_until_refused(api, caps, 14)
    assert (admitted, refused) == (10, 4)
    assert queued(engine) == 10
    # Submits 2-5 skipped (the count said 0 and 4 more keep it below half of 10); from then
    # on the tenant is at half its cap or more and every submit counts under the lock.
    assert seen == {"lock": 10, "count": 10}


def test_admission__runs_of_another_process_are_counted_near_the_cap(engine: Engine):
    caps = AdmissionCaps(tenant_max_queued=10)
    first, second = ApiQueue(engine, tenant_estimate_seconds=60), ApiQueue(engine)
    for _ in range(8):
        second.submit(new_run(), caps, now=T0)
    # ``first`` has no estimate yet: it counts, sees 8, and refuses exactly at 10.
    assert submit_until_refused(first, caps, 4) == (2, 2)
    assert queued(engine) == 10


def test_admission__idempotent_replay_on_the_fast_path_is_one_run(engine: Engine):
    api = ApiQueue(engine, tenant_estimate_seconds=60)
    caps = AdmissionCaps(tenant_max_queued=1000)
    api.submit(new_run(), caps, now=T0)
    keyed = NewRun(**{**new_run().__dict__, "idempotency_key": "k1"})
    results = [api.submit(keyed, caps, now=T0) for _ in range(3)]
    assert [r.created for r in results] == [True, False, False]
    assert len({r.run_id for r in results}) == 1
    assert queued(engine) == 2


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


def test_admission__one_process_never_passes_the_cap_under_concurrent_submits(engine: Engine):
    api = ApiQueue(engine, tenant_estimate_seconds=60)
    caps = AdmissionCaps(tenant_max_queued=40)
    with statements(engine) as seen:
        admitted = hammer([api], caps, threads=16, each=8)
    assert admitted == queued(engine) == 40
    assert seen["lock"] < 16 * 8  # the first half of the cap went without the lock


@pytest.mark.parametrize("processes", [2, 3])
def test_admission__n_processes_overshoot_at_most_n_minus_1_half_caps(
    engine: Engine, processes: int
):
    cap = 41
    apis = [ApiQueue(engine, tenant_estimate_seconds=60) for _ in range(processes)]
    caps = AdmissionCaps(tenant_max_queued=cap)
    # Every process counts first (0, 1, 2), so each may then admit about half the cap uncounted.
    for api in apis:
        api.submit(new_run(), caps, now=T0)
    admitted = processes + hammer(apis, caps, threads=12, each=10)
    assert admitted == queued(engine)
    assert cap <= admitted <= cap + (processes - 1) * math.ceil(cap / 2)


def test_estimate__reserves_below_half_of_each_cap_only():
    estimate = TenantEstimate(ttl=60)
    caps = AdmissionCaps(tenant_max_queued=10, tenant_max_running=4)
    assert not estimate.reserve("t", caps)  # never counted
    assert estimate.counted("t", caps, 3, 1) is None  # held: one counted submit in flight
    assert not estimate.reserve("t", caps)  # running 1 + own 1 is half of 4
    estimate.release("t", fast=False, admitted=True)
    assert not estimate.reserve("t", caps)  # still 1 + 1 admitted since the count
    assert estimate.counted("t", caps, 3, 0) is None
    estimate.release("t", fast=False, admitted=True)
    assert estimate.reserve("t", caps)  # queued 3 + 1 < 5, running 0 + 1 < 2
    assert not estimate.reserve("t", caps)  # running 0 + 2 is half of 4
    # The uncounted submit in flight is added to the next exact count.
    assert estimate.counted("t", caps, 9, 0) == "tenant_queued"
    estimate.release("t", fast=True, admitted=False)
    assert estimate.counted("t", caps, 9, 0) is None
    assert estimate.counted("t", caps, 0, 4) == "tenant_running"


def test_estimate__ttl_zero_turns_the_fast_path_off():
    estimate = TenantEstimate(ttl=0)
    caps = AdmissionCaps(tenant_max_queued=100)
    estimate.counted("t", caps, 0, 0)
    assert not estimate.reserve("t", caps)


def test_estimate__forgets_idle_tenants_past_its_size():
    estimate = TenantEstimate(ttl=60, max_tenants=3)
    caps = AdmissionCaps(tenant_max_queued=100)
    for tenant in "abcd":
        assert estimate.counted(tenant, caps, 0, 0) is None
        estimate.release(tenant, fast=False, admitted=True)
    assert estimate.reserve("d", caps)
    assert len(estimate._views) <= 3
