"""A sick database fails fast: statement, lock, connect and pool timeouts, keepalives, and the
worker's own small pool for heartbeats and its row."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import psycopg.errors
import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.exc import OperationalError

from runyard.platform.db import DbTimeouts, autocommit, make_engine
from runyard.queue import JobQueue, NewRun
from runyard.queue.workers import WorkerRegistry
from worker.__main__ import HEARTBEAT_POOL_SIZE, worker_engines

SLEEP = text("SELECT pg_sleep(30)")


@pytest.fixture
def timed(database_url: str) -> Iterator[Engine]:
    """An engine whose statements may run 0.5 s and wait 0.2 s for a lock."""
    eng = make_engine(database_url, timeouts=DbTimeouts(statement_seconds=0.5, lock_seconds=0.2))
    yield eng
    eng.dispose()


def test_statement_timeout__a_sleeping_statement_is_cancelled(timed: Engine):
    started = time.monotonic()
    with pytest.raises(OperationalError) as caught, timed.connect() as conn:
        conn.execute(SLEEP)
    assert isinstance(caught.value.orig, psycopg.errors.QueryCanceled)
    assert caught.value.orig.sqlstate == "57014"
    assert time.monotonic() - started < 30  # cancelled, not slept out
    with timed.connect() as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "500ms"
        assert conn.execute(text("SELECT 1")).scalar_one() == 1  # the connection lives on


def test_statement_timeout__applies_to_autocommit_statements(timed: Engine):
    with pytest.raises(OperationalError) as caught:
        autocommit(timed, SLEEP, {})
    assert isinstance(caught.value.orig, psycopg.errors.QueryCanceled)
    assert autocommit(timed, text("SELECT 1 AS one"), {})[0].one == 1


def test_lock_timeout__a_statement_waiting_on_a_row_lock_gives_up(
    timed: Engine, queue: JobQueue, engine: Engine
):
    run = queue.enqueue(NewRun(tenant="t", tool="echo", spec={}, input={}))
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    with engine.begin() as holder:
        holder.execute(
            text("SELECT 1 FROM tool_run_jobs WHERE run_id = :id FOR UPDATE"), {"id": run.run_id}
        )
        with pytest.raises(OperationalError) as caught:
            JobQueue(timed).heartbeat(job.job_id, job.lease_token, lease_seconds=30)
    assert isinstance(caught.value.orig, psycopg.errors.LockNotAvailable)
    assert JobQueue(timed).heartbeat(job.job_id, job.lease_token, lease_seconds=30).owned


@pytest.mark.slow  # sits out a connect timeout
def test_connect_timeout__a_server_that_never_answers_fails_the_connect():
    # A loopback listener that completes the TCP handshake and then says nothing.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        eng = make_engine(
            f"postgresql://nobody@127.0.0.1:{port}/none", timeouts=DbTimeouts(connect_seconds=2)
        )
        started = time.monotonic()
        with pytest.raises(OperationalError), eng.connect():
            pass
        assert time.monotonic() - started < 60  # gave up; libpq alone would wait forever
        eng.dispose()


def test_keepalives__set_on_the_connection_socket(database_url: str):
    if make_url(database_url).host in (None, "") or "/" in str(make_url(database_url).host):
        pytest.skip("the test database is reached over a Unix socket")
    eng = make_engine(database_url)
    try:
        with eng.connect() as conn:
            fileno = conn.connection.driver_connection.pgconn.socket  # type: ignore[union-attr]
            with socket.socket(fileno=socket.dup(fileno)) as sock:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 25_000
    finally:
        eng.dispose()


def test_pool_timeout__an_exhausted_pool_raises_a_database_error(database_url: str):
    eng = make_engine(
        database_url, pool_size=1, max_overflow=0, timeouts=DbTimeouts(pool_seconds=0.2)
    )
    try:
        with eng.connect():
            # The worker retries database errors; an empty pool is one of them.
            with pytest.raises(OperationalError, match="QueuePool limit"):
                autocommit(eng, text("SELECT 1"), {})
    finally:
        eng.dispose()


def test_worker_engines__heartbeats_and_registry_never_wait_on_the_slots_pool(
    database_url: str, queue: JobQueue
):
    queue.enqueue(NewRun(tenant="t", tool="echo", spec={}, input={}))
    [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
    timeouts = DbTimeouts(statement_seconds=5, lock_seconds=1, pool_seconds=0.2)
    main, heartbeat = worker_engines(database_url, 1, timeouts)
    held = []
    try:
        assert heartbeat.pool.size() == HEARTBEAT_POOL_SIZE  # type: ignore[attr-defined]
        # Busy slots and a stuck claim loop hold every connection of the worker's pool.
        held = [main.connect() for _ in range(main.pool.size() + 1)]  # type: ignore[attr-defined]
        with pytest.raises(OperationalError):
            JobQueue(main).heartbeat(job.job_id, job.lease_token, lease_seconds=30)
        registry = WorkerRegistry(heartbeat)
        registry.register("w", "e", 1)
        done = threading.Event()

        def beat() -> None:  # the heartbeat thread, with the registry on the side
            assert JobQueue(heartbeat).heartbeat(job.job_id, job.lease_token, lease_seconds=30)
            registry.seen("w")
            done.set()

        threading.Thread(target=beat).start()
        assert done.wait(10)
        with heartbeat.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "1s"
    finally:
        for conn in held:
            conn.close()
        main.dispose()
        heartbeat.dispose()


def test_worker_engines__keep_the_generic_plans_of_their_statements(database_url: str):
    main, heartbeat = worker_engines(database_url, 1)
    try:
        # A claim planned afresh at each run costs more than it does.
        for worker_engine in (main, heartbeat):
            with worker_engine.connect() as conn:
                mode = conn.execute(text("SHOW plan_cache_mode")).scalar_one()
                assert mode == "force_generic_plan"
    finally:
        main.dispose()
        heartbeat.dispose()
