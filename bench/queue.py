"""The queue machinery alone: enqueue + claim + finalize of N no-op jobs, runyard vs Procrastinate.

Same Postgres, same database, same run; the sides alternate round by round.

- ``runyard worker``: the real ``worker.service.Worker`` with 4 slots (threads) and the fake
  runner (no container), engines as ``python -m worker`` builds them. Per job:
  ``mark_container_requested`` (whose row answers the fake runner's ask before the create),
  one ``LEASE_HELD`` (before the start), and its share of a ``FINALIZE_MANY_AND_CLAIM`` (the
  slots that finish together finalize in one statement, each job with its run mirror, status
  event and NOTIFY, and claim their next jobs in it), the fake runner's discard; the claim
  loop only fills slots that have nothing to chain to.
- ``runyard direct``: 4 plain threads, each ``claim(limit=1)`` -> ``mark_container_requested``
  -> ``finalize`` through ``JobQueue`` (no worker loop).
- ``runyard SQL, plain psycopg`` (``psycopg-floor``): runyard's own statements (ENQUEUE,
  CLAIM, MARK_CONTAINER_REQUESTED, FINALIZE, each with its NOTIFY inside) on plain psycopg
  connections in autocommit, 4 threads, no pool: close to what ``JobQueue`` itself does now.
- ``procrastinate``: Procrastinate (PyPI) with an async no-op task, ``run_worker_async(
  concurrency=4, wait=False)`` (drains the queue, then returns).

Enqueue is one job per transaction from one producer on every side (``JobQueue.enqueue``,
``task.defer_async``). jobs/s = N / (enqueue seconds + drain seconds); the phases are also
shown. ``--profile`` adds a per-statement breakdown of runyard's database round trips.

With no flags: 100,000 finished runs of history first, then 6 rounds of 5,000 jobs of the
runyard worker and Procrastinate, on an embedded Postgres; the last line says which
Procrastinate rounds were unhealthy (by ``UNHEALTHY_CPU_FACTOR``), gives the ratio (pooled,
and the worst healthy round), the runyard worker's CPU per job and drain, and the drain's
last / first round against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import logging
import math
import os
import statistics
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from bench.common import (
    BackendCpu,
    BenchDatabase,
    Deadline,
    base_parser,
    install_signal_cleanup,
    load_line,
    note,
    out,
    print_machine,
    psycopg_sql,
    queue_statement,
    statement_modules,
    table,
    wait_for_count,
)
from bench.otlp_sink import otlp_sink

NOOP_SPEC = {"image": "runyard/toolbox:latest", "command": ["true"]}


@dataclass
class QueueRound:
    """One side's round."""

    side: str
    jobs: int
    enqueue_s: float
    drain_s: float
    done: int
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def total_rate(self) -> float:
        return self.jobs / (self.enqueue_s + self.drain_s)

    @property
    def enqueue_rate(self) -> float:
        return self.jobs / self.enqueue_s

    @property
    def drain_rate(self) -> float:
        return self.done / self.drain_s


SIDE_LABELS = (
    "runyard worker",
    "runyard worker, traced",
    "runyard direct",
    "runyard SQL, plain psycopg",
)

# The targets: runyard / Procrastinate end to end in every round where Procrastinate is
# healthy (``healthy_rounds``); the drain of the last round against the first, with the
# history written before the rounds; the runyard worker's CPU per job (its process, and the
# database's backends) and its drain.
ROUND_TARGET = 2.5
FLAT_TARGET = 0.85
CLIENT_CPU_TARGET_MS = 0.4
SERVER_CPU_TARGET_MS = 0.5
DRAIN_TARGET = 1500.0
# A Procrastinate round is unhealthy when its Postgres CPU per job is more than this many
# times the median of its rounds: in about one round in four its drain falls to 70-100
# jobs/s with 10-13 ms of backend CPU per job (its own plan, whichever side ran before).
UNHEALTHY_CPU_FACTOR = 3.0
# The worker with tracing on, exporting every span, against the worker without it.
TRACED_TARGET = 0.95

# --- runyard --------------------------------------------------------------------------------


def _new_run(queue_name: str) -> Any:
    from runyard.queue import NewRun
    from runyard.registry.tools import ToolSpec

    spec = ToolSpec.model_validate({"name": "noop", **NOOP_SPEC}).snapshot()
    return NewRun(tenant="bench", tool="noop", spec=spec, input={}, queue=queue_name)


def _enqueue(queue: Any, queue_name: str, jobs: int) -> float:
    run = _new_run(queue_name)
    start = time.perf_counter()
    for _ in range(jobs):
        queue.enqueue(run)
    return time.perf_counter() - start


def _noop_result(spec: Any, control: Any) -> Any:
    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus

    return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)


def runyard_worker_round(url: str, jobs: int, concurrency: int, deadline: Deadline) -> QueueRound:
    """The real Worker (slots as threads, claim loop, heartbeat thread) with the fake runner."""
    from runyard.queue import JobQueue
    from runyard.queue.workers import WorkerRegistry
    from runyard.runners.fake import FakeRunner
    from worker.__main__ import worker_engines
    from worker.service import Worker, WorkerConfig

    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    engine, heartbeat_engine = worker_engines(url, concurrency)
    try:
        queue = JobQueue(engine)
        enqueue_s = _enqueue(queue, queue_name, jobs)
        worker = Worker(
            queue,
            FakeRunner(_noop_result, engine_id=f"bench-{queue_name}"),
            WorkerConfig(
                worker_id=f"bench-{queue_name}",
                concurrency=concurrency,
                queues=(queue_name,),
                poll_seconds=1.0,
            ),
            WorkerRegistry(engine),
            heartbeat_queue=JobQueue(heartbeat_engine),
        )
        start = time.perf_counter()
        thread = threading.Thread(target=worker.run_forever, daemon=True)
        thread.start()
        try:
            wait_for_count(lambda: worker.finalized, jobs, max(deadline.left(), 1), "the drain")
        finally:
            drain_s = time.perf_counter() - start
            worker.stop()
            thread.join(timeout=10)
            worker.wait_idle(timeout=10)
            worker.close()
        return QueueRound("runyard worker", jobs, enqueue_s, drain_s, worker.finalized)
    finally:
        engine.dispose()
        heartbeat_engine.dispose()


def traced_worker_round(url: str, jobs: int, concurrency: int, deadline: Deadline) -> QueueRound:
    """``runyard_worker_round`` with tracing on, exporting each span to an OTLP sink on
    loopback (``--traced``; started by ``main``, named by ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from runyard.platform.otel import OtelTracing
    from runyard.platform.tracing import NO_TRACING, install

    endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] + "/v1/traces"
    tracing = OtelTracing("bench-worker", OTLPSpanExporter(endpoint=endpoint))
    install(tracing)
    try:
        res = runyard_worker_round(url, jobs, concurrency, deadline)
    finally:
        install(NO_TRACING)
        tracing.shutdown()
    res.side = "runyard worker, traced"
    return res


def runyard_direct_round(url: str, jobs: int, threads: int, deadline: Deadline) -> QueueRound:
    """``threads`` plain loops of claim(limit=1) -> mark_container_requested -> finalize."""
    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus
    from runyard.platform.db import make_engine
    from runyard.queue import JobQueue

    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    engine = make_engine(url, pool_size=threads, max_overflow=4)
    try:
        queue = JobQueue(engine)
        enqueue_s = _enqueue(queue, queue_name, jobs)
        outcome = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)
        done = [0]
        lock = threading.Lock()

        def loop(n: int) -> None:
            idle = 0
            while deadline.left() > 0:
                claimed = queue.claim(
                    worker_id=f"bench-direct-{n}",
                    engine_id="bench-direct",
                    limit=1,
                    lease_seconds=30,
                    queues=(queue_name,),
                )
                if not claimed:
                    idle += 1
                    if idle > 3:
                        return
                    time.sleep(0.01)
                    continue
                idle = 0
                for job in claimed:
                    queue.mark_container_requested(job.job_id, job.lease_token)
                    if queue.finalize(job.job_id, job.lease_token, outcome):
                        with lock:
                            done[0] += 1

        workers = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        drain_s = time.perf_counter() - start
        return QueueRound("runyard direct", jobs, enqueue_s, drain_s, done[0])
    finally:
        engine.dispose()


def psycopg_floor_round(url: str, jobs: int, threads: int, deadline: Deadline) -> QueueRound:
    """runyard's own statements (ENQUEUE, CLAIM, MARK_CONTAINER_REQUESTED, FINALIZE, each
    with its NOTIFY inside) sent through plain psycopg connections in autocommit, with no
    pool and no SQLAlchemy at all: a floor for ``JobQueue``, not a product path."""
    import json

    import psycopg

    enqueue_sql = psycopg_sql(queue_statement("ENQUEUE"))
    claim_sql = psycopg_sql(queue_statement("CLAIM"))
    mark_sql = psycopg_sql(queue_statement("MARK_CONTAINER_REQUESTED"))
    finalize_sql = psycopg_sql(queue_statement("FINALIZE"))
    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    run = _new_run(queue_name)
    spec_json, input_json = json.dumps(run.spec), json.dumps(run.input)
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for _ in range(jobs):
            conn.execute(
                enqueue_sql,
                {
                    "run_id": uuid.uuid4(),
                    "job_id": uuid.uuid4(),
                    "tenant": run.tenant,
                    "tool": run.tool,
                    "spec": spec_json,
                    "input": input_json,
                    "max_attempts": 1,
                    "timeout_seconds": 30,
                    "queue": queue_name,
                    "priority": 0,
                    "idempotency_key": None,
                    "request_hash": None,
                    "callback_url": None,
                    "rerun_of": None,
                    "owner": None,  # queue mode: not claimed at the insert
                    "engine_id": None,
                    "lease": None,
                    "concurrency_key": None,
                    "flow_scopes": None,
                    "now": None,
                },
            )
        enqueue_s = time.perf_counter() - start
    done = [0]
    lock = threading.Lock()

    def loop(n: int) -> None:
        idle = 0
        with psycopg.connect(url, autocommit=True) as conn:
            while deadline.left() > 0:
                rows = conn.execute(
                    claim_sql,
                    {
                        "worker_id": f"floor-{n}",
                        "engine_id": "floor",
                        "limit": 1,
                        "lease": 30.0,
                        "queue": queue_name,
                        "queues": [queue_name],
                        "now": None,
                    },
                ).fetchall()
                if not rows:
                    idle += 1
                    if idle > 3:
                        return
                    time.sleep(0.01)
                    continue
                idle = 0
                for row in rows:
                    job_id, token = row[0], row[4]
                    conn.execute(mark_sql, {"job_id": job_id, "token": token, "now": None})
                    finished = conn.execute(
                        finalize_sql,
                        {
                            "job_id": job_id,
                            "token": token,
                            "status": "succeeded",
                            "exit_code": 0,
                            "result": None,
                            "stdout": "",
                            "stderr": "",
                            "stdout_truncated": False,
                            "stderr_truncated": False,
                            "error_code": None,
                            "error": None,
                            "image_digest": None,
                            "artifact_set": None,
                            "now": None,
                        },
                    ).fetchone()
                    if finished is not None:
                        with lock:
                            done[0] += 1

    workers = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    drain_s = time.perf_counter() - start
    return QueueRound("runyard SQL, plain psycopg", jobs, enqueue_s, drain_s, done[0])


# --- Procrastinate --------------------------------------------------------------------------


def procrastinate_round(url: str, jobs: int, concurrency: int, deadline: Deadline) -> QueueRound:
    """Defer ``jobs`` no-op jobs one by one, then drain them with one worker of
    ``concurrency``."""
    import procrastinate

    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    # Any: the type checker runs where the optional 'bench' extra may not be installed.
    app: Any = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    async def noop() -> None:
        return None

    bench_noop = app.task(name="bench_noop", queue=queue_name)(noop)

    async def go() -> QueueRound:
        async with app.open_async():
            start = time.perf_counter()
            for _ in range(jobs):
                await bench_noop.defer_async()
            enqueue_s = time.perf_counter() - start
            start = time.perf_counter()
            await asyncio.wait_for(
                app.run_worker_async(
                    queues=[queue_name],
                    concurrency=concurrency,
                    wait=False,
                    install_signal_handlers=False,
                    listen_notify=True,
                ),
                timeout=max(deadline.left(), 1),
            )
            drain_s = time.perf_counter() - start
            async with app.connector.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs "
                    "WHERE queue_name = %s AND status = 'succeeded'",
                    (queue_name,),
                )
                row = await cur.fetchone()
            return QueueRound("procrastinate", jobs, enqueue_s, drain_s, int(row[0]))

    return asyncio.run(go())


def vacuum(url: str) -> None:
    """Clean up dead rows and refresh the planner statistics of every table (both sides')."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


# Finished runs (with their job and three events each) written before the rounds: a queue
# must drain as fast with a long history as with none.
HISTORY_SQL = (
    """
    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                           started_at, finished_at, attempts, max_attempts, exit_code)
    SELECT gen_random_uuid(), 'history', 'noop', '{}', '{}', 'succeeded', 'queue',
           now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
           1, 1, 0
    FROM generate_series(1, %(n)s)
    """,
    """
    INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, priority, attempts,
                               max_attempts, timeout_seconds, available_at, created_at,
                               updated_at, started_at, finished_at)
    SELECT gen_random_uuid(), r.id, 'succeeded', 'default', r.tenant, 0, 1, 1, 30,
           r.requested_at, r.requested_at, r.finished_at, r.started_at, r.finished_at
    FROM tool_runs r WHERE r.tenant = 'history'
    """,
    """
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT r.id, r.finished_at, e.type, e.data
    FROM tool_runs r CROSS JOIN (VALUES
        ('status', '{"status": "queued"}'::jsonb),
        ('claimed', '{"attempt": 1, "worker_id": "history"}'::jsonb),
        ('status', '{"status": "succeeded", "attempt": 1}'::jsonb)) AS e(type, data)
    WHERE r.tenant = 'history'
    """,
)


def write_history(url: str, runs: int) -> None:
    """``runs`` finished runs, their jobs and events, then VACUUM ANALYZE."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in HISTORY_SQL:
            conn.execute(statement, {"n": runs})
        conn.execute("VACUUM (ANALYZE)")


def ensure_procrastinate_schema(url: str) -> None:
    """Apply Procrastinate's schema once (it lives beside runyard's tables)."""
    import procrastinate
    import psycopg

    with psycopg.connect(url) as conn:
        present = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    if present and present[0]:
        return
    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
    with app.open():
        app.schema_manager.apply_schema()


# --- profile: where runyard's time goes -----------------------------------------------------


_NAMES: dict[str, str] = {}


def _statement_name(statement: str, dialect: Any) -> str:
    if not _NAMES:
        for module in statement_modules():
            for name in dir(module):
                value = getattr(module, name)
                if name.isupper() and hasattr(value, "compile"):
                    _NAMES[str(value.compile(dialect=dialect)).strip()] = name
    found = _NAMES.get(statement.strip())
    if found:
        return found
    return " ".join(statement.split())[:48]


def profile_runyard(url: str, jobs: int, concurrency: int, deadline: Deadline) -> None:
    """Where runyard's time goes: round trips per job, the cost of one transaction, and the
    client CPU by library."""
    _profile_round_trips(url, jobs, concurrency, deadline)
    _profile_transaction_cost(url)
    _profile_python(url, min(jobs, 1000), deadline)
    _profile_claim_vs_backlog(url, [100, 1000, 5000, 20000], deadline)


def _profile_round_trips(url: str, jobs: int, concurrency: int, deadline: Deadline) -> None:
    """Count every database round trip of a worker round: the queue's autocommit statements
    (one round trip each) and whatever still goes through SQLAlchemy (BEGIN, which psycopg
    sends before the first statement, statements, COMMIT). The worker's engines have no
    pool pre-ping, so a checkout costs no round trip."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    import runyard.queue.jobs as queue_module
    from runyard.queue import batch_sql
    from runyard.queue import sql as queue_sql

    counts: dict[str, int] = defaultdict(int)
    times: dict[str, float] = defaultdict(float)
    starts: dict[int, float] = {}
    names: dict[str, str] = {}
    lock = threading.Lock()

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        starts[id(cursor)] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        elapsed = time.perf_counter() - starts.pop(id(cursor), time.perf_counter())
        name = names.get(statement)
        if name is None:
            name = names[statement] = _statement_name(statement, conn.dialect)
        with lock:
            counts[name] += 1
            times[name] += elapsed

    def bump(name: str) -> Any:
        def handler(*args: Any) -> None:
            with lock:
                counts[name] += 1

        return handler

    statement_names = {
        id(v): k
        for module in (queue_sql, batch_sql)
        for k, v in vars(module).items()
        if k.isupper()
    }
    namespace = vars(queue_module)  # JobQueue calls the module's ``autocommit``
    real_autocommit = namespace["autocommit"]

    def counted(engine: Any, statement: Any, params: Any) -> Any:
        start = time.perf_counter()
        try:
            return real_autocommit(engine, statement, params)
        finally:
            name = f"{statement_names.get(id(statement), '?')} (autocommit)"
            with lock:
                counts[name] += 1
                times[name] += time.perf_counter() - start

    hooks = [
        (Engine, "before_cursor_execute", before),
        (Engine, "after_cursor_execute", after),
        (Engine, "begin", bump("BEGIN (sent by psycopg before the first statement)")),
        (Engine, "commit", bump("COMMIT")),
        (Engine, "rollback", bump("ROLLBACK")),
    ]
    for target, name, fn in hooks:
        event.listen(target, name, fn)
    namespace["autocommit"] = counted
    try:
        result = runyard_worker_round(url, jobs, concurrency, deadline)
    finally:
        namespace["autocommit"] = real_autocommit
        for target, name, fn in hooks:
            event.remove(target, name, fn)
    rows = []
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        rows.append((name, n, n / jobs, times[name] / n * 1000 if name in times else math.nan))
    total = sum(counts.values())
    out("")
    out(
        f"profile 1: database round trips of a runyard worker round ({jobs} jobs, "
        f"{concurrency} slots, {result.total_rate:.0f} jobs/s end to end)"
    )
    out(table(["round trip", "count", "per job", "mean ms (statements)"], rows))
    out(f"round trips per job: {total / jobs:.1f}")


def _profile_transaction_cost(url: str, n: int = 2000) -> None:
    """Wall time and client CPU of one single-statement transaction, four ways."""
    import psycopg
    from sqlalchemy import create_engine, text

    from runyard.platform.db import autocommit as run_autocommit
    from runyard.platform.db import make_engine

    stmt = text("SELECT pg_notify(:channel, :payload)")
    params = {"channel": "bench_profile", "payload": "x"}
    sa_url = "postgresql+psycopg://" + url[len("postgresql://") :]
    engines = {
        "runyard: engine.begin() + 1 statement (make_engine: pings idle connections only)": (
            make_engine(url)
        ),
        "plain SQLAlchemy engine, no pre-ping": create_engine(sa_url, pool_size=5),
        "SQLAlchemy AUTOCOMMIT engine, no pre-ping, 1 statement": create_engine(
            sa_url, pool_size=5, isolation_level="AUTOCOMMIT"
        ),
    }
    rows = []
    try:
        for label, engine in engines.items():
            autocommit = "AUTOCOMMIT" in label

            def once(engine: Any = engine, autocommit: bool = autocommit) -> None:
                if autocommit:
                    with engine.connect() as conn:
                        conn.execute(stmt, params)
                else:
                    with engine.begin() as conn:
                        conn.execute(stmt, params)

            rows.append((label, *_cost(once, n)))
        worker_engine = make_engine(url, pool_size=5, pre_ping=False)
        engines["runyard.platform.db.autocommit (what JobQueue does now)"] = worker_engine
        rows.append(
            (
                "runyard.platform.db.autocommit (what JobQueue does now)",
                *_cost(lambda: run_autocommit(worker_engine, stmt, params), n),
            )
        )
        with psycopg.connect(url, autocommit=True) as conn:
            rows.append(
                (
                    "plain psycopg, autocommit, 1 statement",
                    *_cost(
                        lambda: conn.execute("SELECT pg_notify(%s, %s)", ("bench_profile", "x")), n
                    ),
                )
            )
    finally:
        for engine in engines.values():
            engine.dispose()
    out("")
    out(f"profile 2: one single-statement transaction, {n} times, one thread")
    out(table(["how", "wall us", "client CPU us"], rows))


def _cost(fn: Any, n: int) -> tuple[float, float]:
    fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)


def _profile_python(url: str, jobs: int, deadline: Deadline) -> None:
    """cProfile on the CPU clock over one thread doing enqueue, claim, mark and finalize:
    client CPU by library (time spent waiting on the socket costs no CPU, so it is left out;
    the profiler's own overhead inflates Python code somewhat, so read the shares, not the
    absolute figures)."""
    import cProfile
    import pstats

    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus
    from runyard.platform.db import make_engine
    from runyard.queue import JobQueue

    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    engine = make_engine(url, pool_size=1)
    queue = JobQueue(engine)
    run = _new_run(queue_name)
    outcome = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)

    def work(n: int) -> None:
        for _ in range(n):
            queue.enqueue(run)
        while deadline.left() > 0:
            claimed = queue.claim(
                worker_id="bench-profile",
                engine_id="bench-profile",
                limit=1,
                lease_seconds=30,
                queues=(queue_name,),
            )
            if not claimed:
                break
            for job in claimed:
                queue.mark_container_requested(job.job_id, job.lease_token)
                queue.finalize(job.job_id, job.lease_token, outcome)

    try:
        work(50)  # warm caches and prepared statements
        cpu, wall = time.process_time(), time.perf_counter()
        work(jobs)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        work(jobs)
        profiler.disable()
    finally:
        engine.dispose()
    stats = pstats.Stats(profiler)
    buckets: dict[str, float] = defaultdict(float)
    top: list[tuple[float, str]] = []
    for (path, line, func), entry in stats.stats.items():  # type: ignore[attr-defined]
        tottime = entry[2]
        if path == "~":
            bucket = "psycopg C extension" if "psycopg" in func else "C builtins"
        elif "/sqlalchemy/" in path:
            bucket = "SQLAlchemy"
        elif "/psycopg/" in path:
            bucket = "psycopg (Python)"
        elif "/runyard/" in path or "/worker/" in path:
            bucket = "runyard"
        elif "site-packages" in path:
            bucket = "other libraries"
        else:
            bucket = "stdlib"
        buckets[bucket] += tottime
        short = path.split("site-packages/")[-1] if path != "~" else ""
        top.append((tottime, f"{short}:{line} {func}" if short else func))
    total = sum(buckets.values()) or 1.0
    out("")
    out(
        f"profile 3: one thread, {jobs} jobs of enqueue + claim + mark + finalize through "
        f"JobQueue: {wall / jobs * 1000:.2f} ms wall, {cpu / jobs * 1000:.2f} ms client CPU per "
        "job without the profiler; client CPU by library (cProfile on the CPU clock):"
    )
    out(
        table(
            ["library", "share %"],
            [(k, v / total * 100) for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])],
        )
    )
    out("top functions by own CPU:")
    out(
        table(
            ["function", "share %"],
            [(name[-90:], t / total * 100) for t, name in sorted(top, reverse=True)[:12]],
        )
    )


def _profile_claim_vs_backlog(url: str, backlogs: list[int], deadline: Deadline) -> None:
    """One CLAIM (limit 1, prepared, rolled back) as the queued backlog grows: flat when the
    claim reads the queued index in order and stops at its limit."""
    import json

    import psycopg

    enqueue_sql = psycopg_sql(queue_statement("ENQUEUE"))
    claim_sql = psycopg_sql(queue_statement("CLAIM"))
    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    run = _new_run(queue_name)
    spec = json.dumps(run.spec)
    params = {
        "worker_id": "bench-claim",
        "engine_id": "bench-claim",
        "limit": 1,
        "lease": 30.0,
        "queue": queue_name,
        "queues": [queue_name],
        "now": None,
    }
    rows: list[tuple[object, ...]] = []
    have = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for backlog in backlogs:
            if deadline.left() < 30:
                break
            with conn.pipeline():
                for _ in range(backlog - have):
                    conn.execute(
                        enqueue_sql,
                        {
                            "run_id": uuid.uuid4(),
                            "job_id": uuid.uuid4(),
                            "tenant": "bench",
                            "tool": "noop",
                            "spec": spec,
                            "input": "{}",
                            "max_attempts": 1,
                            "timeout_seconds": 30,
                            "queue": queue_name,
                            "priority": 0,
                            "idempotency_key": None,
                            "request_hash": None,
                            "callback_url": None,
                            "rerun_of": None,
                            "owner": None,  # queue mode: not claimed at the insert
                            "engine_id": None,
                            "lease": None,
                            "concurrency_key": None,
                            "flow_scopes": None,
                            "now": None,
                        },
                    )
            have = backlog
            conn.execute("ANALYZE tool_runs, tool_run_jobs")
            for _ in range(6):  # past psycopg's prepare threshold
                conn.execute("BEGIN")
                conn.execute(claim_sql, params).fetchall()
                conn.execute("ROLLBACK")
            n = 30
            start = time.perf_counter()
            for _ in range(n):
                conn.execute("BEGIN")
                conn.execute(claim_sql, params).fetchall()
                conn.execute("ROLLBACK")
            rows.append((backlog, (time.perf_counter() - start) / n * 1000))
    out("")
    out("profile 4: one claim (limit 1, prepared, BEGIN + CLAIM + ROLLBACK) vs queued backlog, ms")
    out(table(["queued backlog", "runyard CLAIM"], rows))


# --- main -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line; with no flags, the documented run."""
    parser = base_parser("queue", __doc__)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per side per round (5000)")
    parser.add_argument("--threads", type=int, default=4, help="worker slots / threads (4)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (6)")
    parser.add_argument(
        "--sides",
        default="runyard-worker,procrastinate",
        help="which sides to run (comma-separated, of runyard-worker, runyard-worker-traced "
        "(tracing on, exporting to an OTLP sink on loopback), runyard-direct, psycopg-floor, "
        "procrastinate; 'none' with --profile: the profile only)",
    )
    parser.add_argument("--profile", action="store_true", help="add a statement breakdown")
    parser.add_argument(
        "--warmup", type=int, default=1000, help="unrecorded jobs per side before round 0 (1000)"
    )
    parser.add_argument(
        "--history",
        type=int,
        default=100_000,
        help="finished runs (with jobs and events) written before the rounds (100000)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()
    logging.getLogger("procrastinate").setLevel(logging.WARNING)

    sides = [s for s in args.sides.split(",") if s and s != "none"]
    if "procrastinate" in sides and importlib.util.find_spec("procrastinate") is None:
        note("Procrastinate is not installed (pip install -e '.[bench]'): that side is skipped")
        sides.remove("procrastinate")
    db = BenchDatabase.open(args, "queue")
    rounds: list[QueueRound] = []
    profile_text = ""
    stack = contextlib.ExitStack()
    try:
        if "runyard-worker-traced" in sides:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = stack.enter_context(otlp_sink())
        print_machine(db.url)
        if "procrastinate" in sides:
            ensure_procrastinate_schema(db.url)
        if args.history:
            note(f"writing {args.history} finished runs of history")
            write_history(db.url, args.history)
        server_cpu = stack.enter_context(BackendCpu(db.url))
        runners = {
            "runyard-worker": runyard_worker_round,
            "runyard-worker-traced": traced_worker_round,
            "runyard-direct": runyard_direct_round,
            "psycopg-floor": psycopg_floor_round,
            "procrastinate": procrastinate_round,
        }
        # A warm-up of each side (imports, pools, plans), not recorded. VACUUM ANALYZE after
        # it and after every round (not timed): no round runs on the statistics of empty
        # tables, or next to autovacuum cleaning up the previous side's dead rows (that made
        # whichever side came second slow: Procrastinate drained 42-67 jobs/s with 13 ms of
        # backend CPU per job right after a runyard round, 170-310 jobs/s otherwise).
        for side in sides:
            runners[side](db.url, min(args.warmup, args.jobs), args.threads, deadline)
        vacuum(db.url)
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else list(reversed(sides))
            for side in order:
                deadline.check(f"{side} round {r}")
                cpu0, srv0 = time.process_time(), server_cpu.begin()
                sampler0 = server_cpu.own_cpu_s()
                res = runners[side](db.url, args.jobs, args.threads, deadline)
                # The producer's and the side's CPU: the backend sampler's left out.
                res.client_cpu_s = time.process_time() - cpu0 - (server_cpu.own_cpu_s() - sampler0)
                time.sleep(0.15)  # one more sample of the backends that are closing
                res.server_cpu_s = server_cpu.used_since(srv0)
                rounds.append(res)
                vacuum(db.url)
                note(
                    f"round {r} {side}: enqueue {res.enqueue_rate:.0f}/s, "
                    f"drain {res.drain_rate:.0f}/s, total {res.total_rate:.0f}/s, "
                    f"done {res.done}/{res.jobs}"
                )
        if args.profile:
            deadline.check("profile")
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                profile_runyard(db.url, min(args.jobs, 2000), args.threads, deadline)
            profile_text = buffer.getvalue()
    finally:
        stack.close()
        with contextlib.suppress(Exception):
            db.close(keep=args.keep_db)
    report(rounds, args.threads, profile_text)
    return 0


def report(rounds: list[QueueRound], threads: int, profile_text: str = "") -> None:
    if not rounds:  # --sides none: the profile alone
        out(profile_text.rstrip())
        return
    out("")
    out(
        table(
            [
                "side",
                "jobs",
                "done",
                "enqueue s",
                "drain s",
                "enqueue/s",
                "claim+finalize/s",
                "end-to-end jobs/s",
                "client CPU ms/job",
                "Postgres CPU ms/job",
            ],
            [
                (
                    r.side,
                    r.jobs,
                    r.done,
                    r.enqueue_s,
                    r.drain_s,
                    r.enqueue_rate,
                    r.drain_rate,
                    r.total_rate,
                    r.client_cpu_s / r.jobs * 1000,
                    r.server_cpu_s / r.jobs * 1000,
                )
                for r in rounds
            ],
        )
    )

    def pooled(side: str) -> tuple[float, float, float] | None:
        mine = [r for r in rounds if r.side == side]
        if not mine:
            return None
        jobs = sum(r.jobs for r in mine)
        enq = sum(r.enqueue_s for r in mine)
        drain = sum(r.drain_s for r in mine)
        return jobs / (enq + drain), jobs / enq, sum(r.done for r in mine) / drain

    base = pooled("procrastinate")
    per_round: dict[str, list[float]] = defaultdict(list)
    base_rounds = [r for r in rounds if r.side == "procrastinate"]
    for side in SIDE_LABELS:
        mine = [r for r in rounds if r.side == side]
        for one, theirs in zip(mine, base_rounds, strict=False):
            per_round[side].append(one.total_rate / theirs.total_rate)
    if per_round:
        out("")
        out("end-to-end ratio to Procrastinate, round by round:")
        out(
            table(
                ["side", *[f"round {i}" for i in range(len(base_rounds))]],
                [(side, *vals) for side, vals in per_round.items()],
            )
        )
    parts = []
    healthy = healthy_rounds(base_rounds)
    if base_rounds:
        sick = [str(i) for i, ok in enumerate(healthy) if not ok]
        parts.append(
            f"Procrastinate unhealthy in round(s) {', '.join(sick) or 'none'} (Postgres CPU per "
            f"job above {UNHEALTHY_CPU_FACTOR:g}x the median of its rounds)"
        )
    for side in SIDE_LABELS:
        ours = pooled(side)
        if ours is None or base is None:
            continue
        fair = [ratio for ratio, ok in zip(per_round.get(side, []), healthy, strict=False) if ok]
        worst = min(fair or [0.0])
        parts.append(
            f"{side} {ours[0]:.0f} jobs/s vs procrastinate {base[0]:.0f} jobs/s = "
            f"{ours[0] / base[0]:.2f}x pooled (enqueue {ours[1] / base[1]:.2f}x, "
            f"claim+finalize {ours[2] / base[2]:.2f}x), worst healthy round {worst:.2f}x "
            f"{_verdict(worst >= ROUND_TARGET)} (>= {ROUND_TARGET}x)"
        )
    parts.extend(cost_verdicts([r for r in rounds if r.side == "runyard worker"]))
    flat = drain_flatness(rounds)
    if flat:
        out("")
        out("drain as the tables grow: each side's end-to-end jobs/s, round by round:")
        out(
            table(
                [
                    "side",
                    *[f"round {i}" for i in range(max(len(v) for v in flat.values()))],
                    "last / first",
                ],
                [(side, *rates, rates[-1] / rates[0]) for side, rates in flat.items()],
            )
        )
    if profile_text:
        out(profile_text.rstrip())
    out("")
    out(load_line())
    if base is None:  # no Procrastinate round: the rates alone
        rates = {side: pooled(side) for side in SIDE_LABELS}
        alone = [f"{side} {rate[0]:.0f} jobs/s" for side, rate in rates.items() if rate]
        parts[:0] = [*alone, "no Procrastinate baseline"]
    for side, side_rates in flat.items():
        if side != "procrastinate" and len(side_rates) > 1:
            ratio = side_rates[-1] / side_rates[0]
            parts.append(
                f"{side} drain last / first round {ratio:.2f} "
                f"{_verdict(ratio >= FLAT_TARGET)} (>= {FLAT_TARGET})"
            )
    plain, traced = pooled("runyard worker"), pooled("runyard worker, traced")
    if plain is not None and traced is not None:
        ratio = traced[0] / plain[0]
        parts.append(
            f"tracing on / off {ratio:.3f} {_verdict(ratio >= TRACED_TARGET)} (>= {TRACED_TARGET})"
        )
    out(f"queue ({threads} threads): " + "; ".join(parts))


def healthy_rounds(base_rounds: list[QueueRound]) -> list[bool]:
    """Whether each Procrastinate round was healthy: its Postgres CPU per job at most
    ``UNHEALTHY_CPU_FACTOR`` times the median of its rounds."""
    if not base_rounds:
        return []
    median = statistics.median(r.server_cpu_s / r.jobs for r in base_rounds)
    return [r.server_cpu_s / r.jobs <= UNHEALTHY_CPU_FACTOR * median for r in base_rounds]


def cost_verdicts(mine: list[QueueRound]) -> list[str]:
    """The runyard worker's CPU per job (worst round) and pooled drain against the targets."""
    if not mine:
        return []
    client = max(r.client_cpu_s / r.jobs * 1000 for r in mine)
    server = max(r.server_cpu_s / r.jobs * 1000 for r in mine)
    drain = sum(r.done for r in mine) / sum(r.drain_s for r in mine)
    return [
        f"runyard worker CPU per job (worst round): client {client:.2f} ms "
        f"{_verdict(client <= CLIENT_CPU_TARGET_MS)} (<= {CLIENT_CPU_TARGET_MS}), Postgres "
        f"{server:.2f} ms {_verdict(server <= SERVER_CPU_TARGET_MS)} (<= {SERVER_CPU_TARGET_MS})",
        f"runyard worker drain {drain:.0f} jobs/s {_verdict(drain >= DRAIN_TARGET)} "
        f"(>= {DRAIN_TARGET:.0f})",
    ]


def drain_flatness(rounds: list[QueueRound]) -> dict[str, list[float]]:
    """Each side's end-to-end rate per round, in round order."""
    rates: dict[str, list[float]] = defaultdict(list)
    for r in rounds:
        rates[r.side].append(r.total_rate)
    return dict(rates)


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


if __name__ == "__main__":
    raise SystemExit(main())
