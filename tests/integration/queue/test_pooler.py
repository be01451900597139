"""The queue behind PgBouncer in transaction mode: engines built from the pooled plan work."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from bench.pgbouncer import PgBouncer, find_pgbouncer, start_pgbouncer
from runyard.domain.attempt import AttemptResult
from runyard.domain.flow_limits import FlowConfig, Limit, ToolFlow
from runyard.domain.states import RunStatus
from runyard.platform.db import DbTimeouts, make_engine
from runyard.platform.pooling import connection_plan
from runyard.queue import JobQueue, NewRun
from runyard.queue.flow import FlowGate

pytestmark = pytest.mark.skipif(
    find_pgbouncer() is None, reason="no pgbouncer (scripts/ensure-pgbouncer installs it)"
)

TIMEOUTS = DbTimeouts(statement_seconds=30, lock_seconds=5)


@pytest.fixture
def pgbouncer(postgres_server_url: str) -> Iterator[PgBouncer]:
    bouncer = start_pgbouncer(postgres_server_url, pool_size=2)
    yield bouncer
    bouncer.stop()


def _pooled_url(bouncer: PgBouncer, database_url: str) -> str:
    return bouncer.url(str(conninfo_to_dict(database_url)["dbname"]))


def _pooled_engine(bouncer: PgBouncer, database_url: str, pool_size: int) -> Engine:
    """An engine built from the transaction pooler's plan, as a deployment behind it."""
    url = _pooled_url(bouncer, database_url)
    plan = connection_plan("transaction", url, "")
    return make_engine(url, pool_size=pool_size, max_overflow=0, timeouts=TIMEOUTS, plan=plan)


def test_pooled_engine__runs_the_queue_through_a_transaction_pooler(
    database_url: str, pgbouncer: PgBouncer
):
    engine = _pooled_engine(pgbouncer, database_url, 6)
    queue = JobQueue(engine)
    run = NewRun(tenant="t", tool="echo", spec={}, input={})
    errors: list[BaseException] = []
    finished: list[bool] = []

    def enqueue() -> None:
        try:
            for _ in range(12):
                queue.enqueue(run)
        except BaseException as exc:
            errors.append(exc)

    def drain() -> None:
        try:
            while jobs := queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30):
                outcome = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
                finished.append(queue.finalize(jobs[0].job_id, jobs[0].lease_token, outcome))
        except BaseException as exc:
            errors.append(exc)

    # Each statement runs far more often than psycopg's prepare threshold, on 6 client
    # connections sharing 2 server connections: a prepared statement would go missing.
    try:
        for target in (enqueue, drain):
            threads = [threading.Thread(target=target) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
    finally:
        engine.dispose()
    assert errors == []
    assert len(finished) == 72 and all(finished)
    pools = [p for p in pgbouncer.show("POOLS") if p["database"] != "pgbouncer"]
    assert pools and all(p["pool_mode"] == "transaction" for p in pools)


def test_direct_plan__is_refused_by_a_transaction_pooler(database_url: str, pgbouncer: PgBouncer):
    # Why the pooled plan sends no startup options: PgBouncer refuses the connection.
    url = _pooled_url(pgbouncer, database_url)
    engine = make_engine(url, timeouts=TIMEOUTS, plan=connection_plan("none", url, ""))
    try:
        with pytest.raises(OperationalError, match="unsupported startup parameter"):
            with engine.connect():
                pass
    finally:
        engine.dispose()


def test_flow_gate__holds_a_keys_maximum_through_a_transaction_pooler(
    database_url: str, pgbouncer: PgBouncer
):
    engine = _pooled_engine(pgbouncer, database_url, 4)
    config = FlowConfig(tools={"echo": ToolFlow(key=Limit(max_running=2))})
    scope = "key:echo:t:k"
    held = NewRun(tenant="t", tool="echo", spec={}, input={}, flow_scopes=(scope,))
    claimed: list[int] = []
    errors: list[BaseException] = []

    def claim_some() -> None:
        queue = JobQueue(engine, flow=FlowGate(engine, lambda: config))
        try:
            for _ in range(5):
                jobs = queue.claim(worker_id="w", engine_id="e", limit=2, lease_seconds=30)
                claimed.append(len(jobs))
        except BaseException as exc:
            errors.append(exc)

    try:
        setup = JobQueue(engine)
        for _ in range(10):
            setup.enqueue(held)
        threads = [threading.Thread(target=claim_some) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        engine.dispose()
    assert errors == []
    assert sum(claimed) == 2  # nothing ends: the key's two, whatever four gates did
