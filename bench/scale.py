"""Many worker processes on one Postgres, through a PgBouncer in transaction mode.

For each level (1, 4, 16, 64 worker processes by default) a fresh queue gets ``--jobs`` no-op
jobs, then that many processes drain it. Each process is the real ``worker.service.Worker``
(claim loop, slots as threads, heartbeat thread) with the fake runner (no container), its
engines built as ``python -m worker`` builds them (``worker_engines`` with the settings'
connection plan: behind the pooler no prepared statements and no startup options) and no
LISTEN (behind a pooler without a direct URL the worker polls). The processes are forked
from this one once it has imported everything, so a level starts in a second.

Measured per level, from the moment every process is ready:

- claims/s: jobs / seconds until the last job is finalized (every job is claimed once);
- claim latency: each claiming statement (``claim``, ``finalize_and_claim`` and
  ``finalize_many`` calls that returned a job), timed in the worker processes, pooler
  queueing included; p50 and p99;
- server connections: the peak count of client backends on the database in
  ``pg_stat_activity``, sampled every 0.1 s (this benchmark's own sampler excluded);
- pooler clients: the peak of ``cl_active + cl_waiting`` for the database in PgBouncer's
  ``SHOW POOLS``, and the peak of ``cl_waiting`` (clients queued for a server connection).

``--direct`` runs the same levels without the pooler too, twice: as a worker on Postgres
itself is configured (prepared statements, startup options), and with the pooled plan (no
prepared statements), which tells the pooler's hop from the re-planning of unprepared
statements. A level that runs out of server connections says so instead of a rate.

The pgbouncer executable comes from ``scripts/ensure-pgbouncer``; this benchmark starts its
own on a free loopback port with a generated config and ends it after its levels.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    BenchDatabase,
    Deadline,
    base_parser,
    install_signal_cleanup,
    load_line,
    note,
    out,
    percentile,
    print_machine,
    psycopg_sql,
    queue_statement,
    table,
)
from bench.pgbouncer import PgBouncer, console_rows, find_pgbouncer, start_pgbouncer
from runyard.platform.pooling import Pooler

NOOP_SPEC = {"image": "runyard/toolbox:latest", "command": ["true"]}
SAMPLE_SECONDS = 0.1


@dataclass
class Level:
    """One level's figures."""

    mode: str
    procs: int
    slots: int
    jobs: int
    done: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    server_peak: int = 0
    clients_peak: int | None = None
    waiting_peak: int | None = None
    errors: int = 0
    warnings: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else float("nan")


# --- the worker processes -------------------------------------------------------------------


def _noop_result(spec: Any, control: Any) -> Any:
    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus

    return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)


def _timed_queue(engine: Any, latencies: list[float]) -> Any:
    """A ``JobQueue`` that times its claiming statements (those that returned a job)."""
    from runyard.queue import JobQueue

    def timed(call: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        answer = call(*args, **kwargs)
        if answer if isinstance(answer, list) else answer[1]:  # a job came back
            latencies.append(time.perf_counter() - start)
        return answer

    class TimedQueue(JobQueue):
        def claim(self, **kwargs: Any) -> Any:
            return timed(super().claim, **kwargs)

        def finalize_and_claim(self, *args: Any, **kwargs: Any) -> Any:
            return timed(super().finalize_and_claim, *args, **kwargs)

        def finalize_many(self, *args: Any, **kwargs: Any) -> Any:
            return timed(super().finalize_many, *args, **kwargs)

    return TimedQueue(engine)


class _LogCounter(logging.Handler):
    """Counts the records it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _worker_process(
    url: str,
    pooler: Pooler,
    queue_name: str,
    slots: int,
    index: int,
    ready: Any,
    done: Any,
    go: Any,
    stop: Any,
    results: Any,
) -> None:
    """One worker process: build the worker, say ready, drain on ``go`` until ``stop``."""
    from runyard.platform.db import DbTimeouts
    from runyard.platform.settings import Settings
    from runyard.queue import JobQueue
    from runyard.queue.workers import WorkerRegistry
    from runyard.runners.fake import FakeRunner
    from worker.__main__ import worker_engines
    from worker.service import Worker, WorkerConfig

    latencies: list[float] = []
    errors = 0
    # The worker's warnings (connection refused, retries) are counted, not printed.
    warnings = _LogCounter()
    root = logging.getLogger()
    root.handlers = [warnings]
    root.setLevel(logging.WARNING)
    settings = Settings(database_url=url, database_pooler=pooler)
    engine, heartbeat_engine = worker_engines(
        url,
        slots,
        DbTimeouts.from_settings(settings),
        heartbeat_timeout=settings.heartbeat_round_timeout,
        plan=settings.connection_plan(),
    )
    worker_id = f"bench-{queue_name}-{index}"
    try:
        worker = Worker(
            _timed_queue(engine, latencies),
            FakeRunner(_noop_result, engine_id=worker_id),
            WorkerConfig(
                worker_id=worker_id,
                concurrency=slots,
                queues=(queue_name,),
                poll_seconds=settings.worker_poll_seconds,
            ),
            WorkerRegistry(heartbeat_engine),
            heartbeat_queue=JobQueue(heartbeat_engine),
        )
        with contextlib.suppress(Exception):  # a connection up front, where one is to be had
            with engine.connect():
                pass
        with ready.get_lock():
            ready.value += 1
        go.wait()
        thread = threading.Thread(target=worker.run_forever, daemon=True)
        thread.start()
        while not stop.wait(0.05):
            done[index] = worker.finalized
        done[index] = worker.finalized
        worker.stop()
        thread.join(timeout=15)
        worker.wait_idle(timeout=15)
        worker.close()
    except Exception:
        errors += 1
    finally:
        results.put((index, latencies, errors, warnings.count))
        engine.dispose()
        heartbeat_engine.dispose()


# --- the benchmark --------------------------------------------------------------------------


def _enqueue(url: str, queue_name: str, jobs: int) -> None:
    """``jobs`` no-op runs on ``queue_name`` with runyard's ENQUEUE, pipelined in one
    transaction on a direct connection (the set-up is not what is measured)."""
    import psycopg

    from runyard.queue import NewRun
    from runyard.queue.values import enqueue_params
    from runyard.registry.tools import ToolSpec

    spec = ToolSpec.model_validate({"name": "noop", **NOOP_SPEC}).snapshot()
    run = NewRun(tenant="bench", tool="noop", spec=spec, input={}, queue=queue_name)
    sql = psycopg_sql(queue_statement("ENQUEUE"))
    params = [enqueue_params(run, uuid.uuid4(), uuid.uuid4(), None) for _ in range(jobs)]
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        cursor.executemany(sql, params)


class Sampler:
    """Peaks of server connections (pg_stat_activity) and pooler clients (SHOW POOLS)."""

    def __init__(self, direct_url: str, database: str, bouncer: PgBouncer | None) -> None:
        self._url = direct_url
        self._database = database
        self._bouncer = bouncer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.server_peak = 0
        self.clients_peak = 0
        self.waiting_peak = 0

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import psycopg

        with contextlib.ExitStack() as stack:
            conn = stack.enter_context(psycopg.connect(self._url, autocommit=True))
            admin = None
            if self._bouncer is not None:
                admin = stack.enter_context(
                    psycopg.connect(self._bouncer.url("pgbouncer"), autocommit=True)
                )
            while not self._stop.wait(SAMPLE_SECONDS):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchone()
                self.server_peak = max(self.server_peak, int(row[0]) if row else 0)
                if admin is not None:
                    clients, waiting = _pool_clients(admin, self._database)
                    self.clients_peak = max(self.clients_peak, clients)
                    self.waiting_peak = max(self.waiting_peak, waiting)


def _pool_clients(admin: Any, database: str) -> tuple[int, int]:
    """``cl_active + cl_waiting`` and ``cl_waiting`` of the database's pools."""
    clients = waiting = 0
    for row in console_rows(admin, "POOLS"):
        if row.get("database") == database:
            clients += int(row["cl_active"]) + int(row["cl_waiting"])
            waiting += int(row["cl_waiting"])
    return clients, waiting


def run_level(
    mode: str,
    pooler: Pooler,
    worker_url: str,
    direct_url: str,
    database: str,
    bouncer: PgBouncer | None,
    procs: int,
    slots: int,
    jobs: int,
    deadline: Deadline,
) -> Level:
    """Pre-enqueue ``jobs``, start ``procs`` worker processes, time the drain."""
    level = Level(mode, procs, slots, jobs)
    queue_name = f"scale-{uuid.uuid4().hex[:8]}"
    _enqueue(direct_url, queue_name, jobs)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Value("i", 0)
    done = ctx.Array("i", procs)
    go, stop = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    children = [
        ctx.Process(
            target=_worker_process,
            args=(worker_url, pooler, queue_name, slots, i, ready, done, go, stop, results),
            daemon=True,
        )
        for i in range(procs)
    ]
    try:
        for child in children:
            child.start()
        limit = time.monotonic() + min(60.0, max(deadline.left(), 1.0))
        while ready.value < procs and time.monotonic() < limit:
            time.sleep(0.05)
        with Sampler(direct_url, database, bouncer) as sampler:
            start = time.monotonic()
            go.set()
            # A level gets at most 90 s (or what is left of the time limit) to drain.
            limit = start + min(90.0, max(deadline.left(), 1.0))
            while sum(done[:]) < jobs and time.monotonic() < limit:
                time.sleep(0.01)
            level.seconds = time.monotonic() - start
            level.done = sum(done[:])
        level.server_peak = sampler.server_peak
        if bouncer is not None:
            level.clients_peak = sampler.clients_peak
            level.waiting_peak = sampler.waiting_peak
        if level.done < jobs:
            level.note = f"drained {level.done}/{jobs} in {level.seconds:.0f} s"
    finally:
        stop.set()
        go.set()
        got = 0
        collect_until = time.monotonic() + 30
        while got < len(children) and time.monotonic() < collect_until:
            with contextlib.suppress(Exception):
                _, latencies, errors, warned = results.get(timeout=1)
                level.latencies += latencies
                level.errors += errors
                level.warnings += warned
                got += 1
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join(timeout=5)
    return level


def _server_setting(url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
        return str(row[0]) if row else "?"


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("scale", __doc__)
    parser.set_defaults(time_limit=420.0)
    parser.add_argument("--levels", default="1,4,16,64", help="worker processes per level")
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per level (3000)")
    parser.add_argument("--slots", type=int, default=2, help="slots per worker process (2)")
    parser.add_argument(
        "--pool-size", type=int, default=20, help="pgbouncer default_pool_size (20)"
    )
    parser.add_argument("--direct", action="store_true", help="the same levels without pgbouncer")
    args = parser.parse_args(argv)
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()
    levels = [int(n) for n in args.levels.split(",") if n.strip()]
    if find_pgbouncer() is None:
        raise SystemExit("no pgbouncer executable: run scripts/ensure-pgbouncer (as root)")
    from psycopg.conninfo import conninfo_to_dict

    db = BenchDatabase.open(args, "scale")
    results: list[Level] = []
    try:
        print_machine(db.url)
        database = str(conninfo_to_dict(db.url)["dbname"])
        note(f"Postgres max_connections={_server_setting(db.url, 'max_connections')}")
        # (mode, pooler setting of the workers, through pgbouncer): the pooled plan directly
        # on Postgres tells the pooler's hop from the statements it costs to leave unprepared.
        modes: list[tuple[str, Pooler, bool]] = [("pgbouncer", "transaction", True)]
        if args.direct:
            modes += [("direct", "none", False), ("direct, unprepared", "transaction", False)]
        for mode, pooler, pooled in modes:
            with contextlib.ExitStack() as stack:
                bouncer = None
                if pooled:
                    # Started per mode and stopped after it: its idle server connections
                    # would count in the next mode's.
                    bouncer = start_pgbouncer(db.url, pool_size=args.pool_size)
                    stack.callback(bouncer.stop)
                    note(
                        f"pgbouncer on 127.0.0.1:{bouncer.port} (pool_mode=transaction, "
                        f"default_pool_size={args.pool_size})"
                    )
                url = bouncer.url(database) if bouncer is not None else db.url
                for procs in levels:
                    deadline.check(f"{mode} with {procs} processes")
                    level = run_level(
                        mode,
                        pooler,
                        url,
                        db.url,
                        database,
                        bouncer,
                        procs,
                        args.slots,
                        args.jobs,
                        deadline,
                    )
                    results.append(level)
                    note(
                        f"{mode} {procs} processes: {level.rate:.0f} claims/s, p99 "
                        f"{percentile(level.latencies, 99) * 1000:.1f} ms, server connections "
                        f"{level.server_peak}, pooler clients {level.clients_peak}"
                        + (f" ({level.note})" if level.note else "")
                    )
    finally:
        with contextlib.suppress(Exception):
            db.close(keep=args.keep_db)
    report(results, args.pool_size)
    return 0


def report(results: list[Level], pool_size: int) -> None:
    out("")
    out(
        table(
            [
                "mode",
                "worker processes",
                "slots",
                "jobs done",
                "seconds",
                "claims/s",
                "claim p50 ms",
                "claim p99 ms",
                "peak server connections",
                "peak pooler clients",
                "peak clients waiting",
                "worker warnings",
                "note",
            ],
            [
                (
                    r.mode,
                    r.procs,
                    r.procs * r.slots,
                    f"{r.done}/{r.jobs}",
                    r.seconds,
                    r.rate,
                    percentile(r.latencies, 50) * 1000,
                    percentile(r.latencies, 99) * 1000,
                    r.server_peak,
                    "-" if r.clients_peak is None else r.clients_peak,
                    "-" if r.waiting_peak is None else r.waiting_peak,
                    r.warnings,
                    "; ".join(
                        part
                        for part in (
                            r.note,
                            f"{r.errors} process(es) failed" if r.errors else "",
                        )
                        if part
                    ),
                )
                for r in results
            ],
        )
    )
    out("")
    out(load_line())
    pooled = [r for r in results if r.mode == "pgbouncer"]
    if pooled:
        parts = ", ".join(
            f"{r.procs}: {r.rate:.0f}/s p99 {percentile(r.latencies, 99) * 1000:.0f} ms"
            for r in pooled
        )
        out(
            f"scale (pgbouncer transaction, pool {pool_size}): worker processes {parts}; "
            f"peak server connections {max(r.server_peak for r in pooled)} for up to "
            f"{max(r.clients_peak or 0 for r in pooled)} pooler clients"
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    raise SystemExit(main())
