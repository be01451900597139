"""The created and stored caps against real Postgres: runs created per tenant per window,
whatever becomes of them, and runs kept; exact under concurrent submits, in one statement
with the admission every submit already makes (``TENANT_COUNTS_CTES``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.graph import Node
from runyard.domain.states import RunStatus
from runyard.platform.db import make_engine
from runyard.queue import AdmissionCaps, AdmissionRefused, ApiQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.queue.graph_sql import ADMIT_MANY
from tests.integration.queue.test_admission import INLINE, claim
from tests.integration.queue.test_queue import T0, new_run

WINDOW = 600.0
FAILURE = AttemptResult(status=RunStatus.FAILED, exit_code=1)


@pytest.fixture
def second_engine(database_url: str) -> Iterator[Engine]:
    """A second pool on the same database, as another API process would have."""
    eng = make_engine(database_url, pool_size=10, max_overflow=10)
    yield eng
    eng.dispose()


def created_cap(n: int) -> AdmissionCaps:
    return AdmissionCaps(tenant_max_created=n, created_window_seconds=WINDOW)


def refusal(action: Callable[[], object]) -> AdmissionRefused:
    with pytest.raises(AdmissionRefused) as refused:
        action()
    return refused.value


def window_created(engine: Engine, tenant: str = "acme") -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT window_created FROM tenant_run_counts"
                    " WHERE tenant = :tenant AND shard = 0"
                ),
                {"tenant": tenant},
            ).scalar_one()
        )


def stored(engine: Engine) -> dict[str, tuple[int, int]]:
    """Per tenant: the triggers' count of stored runs, and a real count."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                """
                SELECT tenant, sum(stored) AS counted,
                       (SELECT count(*) FROM tool_runs r WHERE r.tenant = c.tenant) AS real
                FROM tenant_run_counts c GROUP BY tenant
                """
            )
        ).all()
    return {row.tenant: (int(row.counted), int(row.real)) for row in rows}


def failed_run(api: ApiQueue, caps: AdmissionCaps) -> uuid.UUID:
    """A run of acme's that ended failed."""
    run_id = api.submit(new_run(), caps, now=T0).run_id
    (job,) = claim(api, limit=1)
    assert api.finalize(job.job_id, job.lease_token, FAILURE, now=T0)
    return run_id


def doomed_batch(writer: GraphWriter, failed: uuid.UUID, size: int, caps: AdmissionCaps) -> None:
    """A batch whose every run depends on ``failed``: each is written failed at once."""
    runs = [GraphRun(new_run(), Node(f"r{i}", (str(failed),))) for i in range(size)]
    result = writer.submit(GraphSubmit("acme", runs, batch=True), caps, now=T0)
    assert all(result.failed)


# --- runs created per window -------------------------------------------------------------


def test_created_cap__refuses_at_the_cap_until_the_window_has_passed(engine: Engine):
    api = ApiQueue(engine)
    caps = created_cap(3)
    for _ in range(3):
        api.submit(new_run(), caps, now=T0)
    refused = refusal(lambda: api.submit(new_run(), caps, now=T0 + timedelta(seconds=100)))
    assert (refused.reason, refused.limit, refused.retry_after) == ("tenant_created", 3, 500)
    assert "may create 3 runs per 600 s" in str(refused)
    # The window is the tenant's: another tenant is not counted in it.
    assert api.submit(new_run(tenant="globex"), caps, now=T0).created
    later = T0 + timedelta(seconds=WINDOW)
    assert api.submit(new_run(), caps, now=later).created
    assert window_created(engine) == 1


def test_created_cap__runs_failed_or_cancelled_at_once_count(engine: Engine):
    api, writer = ApiQueue(engine), GraphWriter(engine)
    caps = created_cap(10)
    failed = failed_run(api, caps)  # 1
    doomed_batch(writer, failed, 6, caps)  # 7
    cancelled = api.submit(new_run(), caps, now=T0).run_id  # 8
    assert api.cancel(cancelled, now=T0).cancelled_now
    single = GraphRun(new_run(), Node(None, (str(failed),)))
    writer.submit(GraphSubmit("acme", [single]), caps, now=T0)  # 9, failed at once
    api.submit(new_run(), caps, inline=INLINE, now=T0)  # 10, a sync run
    assert window_created(engine) == 10
    assert refusal(lambda: doomed_batch(writer, failed, 1, caps)).reason == "tenant_created"
    assert refusal(lambda: api.submit(new_run(), caps, now=T0)).reason == "tenant_created"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tool_runs")).scalar_one() == 10


def test_created_cap__a_batch_counts_all_its_runs_and_is_admitted_whole_or_not(engine: Engine):
    writer = GraphWriter(engine)
    caps = created_cap(10)

    def submit(size: int) -> None:
        runs = [GraphRun(new_run(), Node(f"r{i}")) for i in range(size)]
        writer.submit(GraphSubmit("acme", runs, batch=True), caps, now=T0)

    submit(8)
    assert refusal(lambda: submit(3)).retry_after == WINDOW
    assert window_created(engine) == 8
    submit(2)
    assert window_created(engine) == 10


def test_created_cap__an_idempotent_replay_creates_nothing_and_is_never_refused(engine: Engine):
    api, writer = ApiQueue(engine), GraphWriter(engine)
    caps = created_cap(2)
    keyed = new_run(idempotency_key="k1")
    first = api.submit(keyed, caps, now=T0)
    dependency = GraphRun(new_run(idempotency_key="k2"), Node(None, (str(first.run_id),)))
    graphed = writer.submit(GraphSubmit("acme", [dependency], idempotency_key="k2"), caps, now=T0)
    assert window_created(engine) == 2
    again = api.submit(keyed, caps, now=T0)
    replayed = writer.submit(GraphSubmit("acme", [dependency], idempotency_key="k2"), caps, now=T0)
    assert (again.run_id, again.created) == (first.run_id, False)
    assert (replayed.run_ids, replayed.created) == (graphed.run_ids, False)
    assert window_created(engine) == 2
    assert refusal(lambda: api.submit(new_run(), caps, now=T0)).reason == "tenant_created"


def test_created_cap__two_processes_never_pass_it_under_concurrent_submits(
    engine: Engine, second_engine: Engine
):
    apis = [ApiQueue(engine), ApiQueue(second_engine)]
    writers = [GraphWriter(engine), GraphWriter(second_engine)]
    caps = created_cap(40)
    admitted: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(12)

    def singles(api: ApiQueue) -> None:
        start.wait()
        for _ in range(10):
            try:
                api.submit(new_run(), caps, now=T0)
            except AdmissionRefused:
                continue
            with lock:
                admitted.append(1)

    def batches(writer: GraphWriter) -> None:
        start.wait()
        for _ in range(4):
            runs = [GraphRun(new_run(), Node(f"r{i}")) for i in range(3)]
            try:
                writer.submit(GraphSubmit("acme", runs, batch=True), caps, now=T0)
            except AdmissionRefused:
                continue
            with lock:
                admitted.append(3)

    threads = [threading.Thread(target=singles, args=(apis[i % 2],)) for i in range(8)]
    threads += [threading.Thread(target=batches, args=(writers[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with engine.connect() as conn:
        made = conn.execute(text("SELECT count(*) FROM tool_runs")).scalar_one()
    # 80 single submits and 16 batches of 3 asked for 128 runs: the cap holds, exactly.
    assert made == sum(admitted) == window_created(engine)
    assert 38 <= made <= 40


def test_created_cap__singles_from_two_processes_reach_it_exactly(
    engine: Engine, second_engine: Engine
):
    caps = created_cap(40)
    apis = [ApiQueue(engine), ApiQueue(second_engine)]
    admitted = 0
    lock = threading.Lock()
    start = threading.Barrier(16)

    def worker(api: ApiQueue) -> None:
        nonlocal admitted
        start.wait()
        for _ in range(8):
            try:
                api.submit(new_run(), caps, now=T0)
            except AdmissionRefused:
                continue
            with lock:
                admitted += 1

    threads = [threading.Thread(target=worker, args=(apis[i % 2],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admitted == window_created(engine) == 40


def admit_two(conn: Connection, caps: AdmissionCaps, now: datetime | None = None) -> str | None:
    """What ``ADMIT_MANY`` decides for two more runs of acme's, in ``conn``'s transaction."""
    params = {"tenant": "acme", "n": 2, "now": now, **caps.tenant_params()}
    refused: str | None = conn.execute(ADMIT_MANY, params).one().refused
    return refused


def window_start(engine: Engine) -> datetime:
    with engine.connect() as conn:
        started: datetime = conn.execute(
            text("SELECT window_started_at FROM tenant_run_counts WHERE shard = 0")
        ).scalar_one()
    return started


def test_created_window__a_transaction_begun_before_another_started_it_keeps_its_runs_counted(
    engine: Engine,
):
    caps = created_cap(3)
    with engine.begin() as conn:  # a window of long ago, full
        conn.execute(
            text(
                "INSERT INTO tenant_run_counts (tenant, shard, window_started_at, window_created)"
                " VALUES ('acme', 0, now() - interval '1 day', 3)"
            )
        )
    api = ApiQueue(engine)
    with engine.connect() as late:
        with late.begin():
            # This transaction begins now (a batch locking its dependencies before it is
            # admitted): its clock stays at this moment.
            began = late.execute(text("SELECT now()")).scalar_one()
            # Meanwhile another admission starts a new window and creates two runs in it.
            api.submit(new_run(), caps)
            api.submit(new_run(), caps)
            started = window_start(engine)
            assert started > began
            # To the late transaction the window is current: two more would pass the cap.
            assert admit_two(late, caps) == "tenant_created"
    assert (window_start(engine), window_created(engine)) == (started, 2)
    assert api.submit(new_run(), caps).created
    assert refusal(lambda: api.submit(new_run(), caps)).reason == "tenant_created"


def test_created_window__an_earlier_clock_keeps_the_windows_runs_counted(engine: Engine):
    api = ApiQueue(engine)
    caps = created_cap(3)
    later = T0 + timedelta(seconds=WINDOW + 100)
    api.submit(new_run(), caps, now=T0)
    api.submit(new_run(), caps, now=later)  # a new window, from ``later``
    api.submit(new_run(), caps, now=later)
    with engine.begin() as conn:
        # A clock behind the window's start (a transaction's, or the database's own that
        # went back) never forgets the runs counted in it.
        assert admit_two(conn, caps, now=later - timedelta(seconds=50)) == "tenant_created"
    assert window_created(engine) == 2


# --- runs stored -------------------------------------------------------------------------


def test_stored_cap__counts_every_run_kept_and_a_delete_makes_room(engine: Engine):
    api, writer = ApiQueue(engine), GraphWriter(engine)
    caps = AdmissionCaps(tenant_max_stored=4)
    failed = failed_run(api, caps)
    doomed_batch(writer, failed, 2, caps)
    api.submit(new_run(), caps, now=T0)
    refused = refusal(lambda: api.submit(new_run(), caps, now=T0))
    assert (refused.reason, refused.limit, refused.retry_after) == ("tenant_stored", 4, None)
    assert refusal(lambda: doomed_batch(writer, failed, 1, caps)).reason == "tenant_stored"
    # Retention deletes the finished runs (to a row of counts other than row 0).
    later = T0 + timedelta(days=1)
    assert api.prune(retention_seconds=60, batch=100, now=later) == 3
    assert stored(engine) == {"acme": (1, 1)}
    for _ in range(3):
        api.submit(new_run(), caps, now=later)
    assert refusal(lambda: api.submit(new_run(), caps, now=later)).reason == "tenant_stored"


def test_stored_counts__equal_a_real_count_after_inserts_deletes_and_truncate(engine: Engine):
    api, writer = ApiQueue(engine), GraphWriter(engine)
    caps = AdmissionCaps()
    failed = failed_run(api, caps)
    doomed_batch(writer, failed, 5, caps)
    for tenant in ("acme", "globex", "globex"):
        api.enqueue(new_run(tenant=tenant), now=T0)
    assert stored(engine) == {"acme": (7, 7), "globex": (2, 2)}
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM tool_runs WHERE status = 'failed'"))
    assert stored(engine) == {"acme": (1, 1), "globex": (2, 2)}
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE tool_runs CASCADE"))
    assert stored(engine) == {}
