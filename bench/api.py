"""Submit load on the HTTP API: open loop at fixed arrival rates, p50/p99 latency and errors.

The API runs as a real process (``python -m api``) on a loopback port against its own
database; this process is the load generator (asyncio, keep-alive connections, no client
library). Requests are sent at fixed times (``i / rate``), whatever the answers do (open
loop), and each latency is measured from its scheduled send time, so a stalled server or a
late client shows up as latency rather than as a lower rate. Every request is
``POST /v1/runs`` of the ``noop`` tool with an API key (``--auth key``, the default: made
with ``runyard keys create``) or with ``RUNYARD_AUTH_DISABLED=true`` (``--auth disabled``).
No worker runs: the runs stay queued. Each rate starts from an empty queue (the runs of the
previous rate are deleted).

Each rate reports the API process's CPU and its database's Postgres backends' CPU per
request. Full size, as in docs/benchmarks.md: ``python -m bench.api --duration 30``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    BackendCpu,
    BenchDatabase,
    Deadline,
    Procs,
    base_parser,
    free_port,
    inclusive_top,
    install_signal_cleanup,
    load_line,
    note,
    out,
    percentile,
    print_machine,
    process_cpu_seconds,
    psycopg_sql,
    queue_statement,
    start_py_spy,
    summarize_py_spy,
    table,
    wait_for_api,
    write_tools_file,
)


def own_code_prefixes() -> tuple[str, ...]:
    from bench.common import ROOT

    return (f"{ROOT}/api/", f"{ROOT}/runyard/")


NOOP = {"image": "runyard/toolbox:latest", "command": ["true"], "timeout_seconds": 30}


@dataclass
class RateResult:
    """One rate's measurements."""

    rate: float
    duration: float
    sent: int = 0
    latencies: list[float] = field(default_factory=list)  # from the scheduled send time
    service: list[float] = field(default_factory=list)  # from the actual send time
    lateness: list[float] = field(default_factory=list)  # actual - scheduled send time
    statuses: dict[str, int] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)
    retried: int = 0  # reused connections the server had closed, retried at once
    api_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0  # the benchmark database's backends
    client_cpu_s: float = 0.0
    wall_s: float = 0.0

    @property
    def errors(self) -> int:
        return sum(n for code, n in self.statuses.items() if code != "202")


def _closed_before_answer(exc: BaseException) -> bool:
    """The peer closed the connection before sending any byte of an answer."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return False
    return True


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def post(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send a prepared request; returns (status, body, keep-alive)."""
        self.writer.write(request)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed")
        status = int(status_line.split()[1])
        length = 0
        keep = True
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                keep = False
        body = await self.reader.readexactly(length) if length else b""
        return status, body, keep

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Pool:
    """Idle keep-alive connections; a request that finds none opens a new one.

    uvicorn closes a connection idle for 5 s (``timeout_keep_alive``), so one idle for 3 s is
    not reused, and a reused one that turns out closed before any answer is retried once on a
    new connection (the server never saw that request), as HTTP clients do.
    """

    MAX_IDLE_SECONDS = 3.0

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[float, Connection]] = []
        self.opened = 0

    async def new(self) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.opened += 1
        return Connection(reader, writer)

    async def get(self) -> tuple[Connection, bool]:
        now = time.monotonic()
        while self.idle:
            since, conn = self.idle.pop()
            if now - since < self.MAX_IDLE_SECONDS:
                return conn, True
            conn.close()
        return await self.new(), False

    def put(self, conn: Connection) -> None:
        self.idle.append((time.monotonic(), conn))

    def close(self) -> None:
        for _, conn in self.idle:
            conn.close()
        self.idle.clear()


def http_request(port: int, path: str, body: bytes, token: str | None) -> bytes:
    """The bytes of one keep-alive ``POST path`` of a JSON ``body``."""
    headers = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if token:
        headers.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def build_request(port: int, token: str | None) -> bytes:
    return http_request(port, "/v1/runs", json.dumps({"tool": "noop", "input": {}}).encode(), token)


async def open_loop(
    port: int, token: str | None, rate: float, duration: float, timeout: float, record: bool = True
) -> RateResult:
    """Send at ``rate`` per second for ``duration`` seconds; wait for the stragglers."""
    result = RateResult(rate=rate, duration=duration)
    request = build_request(port, token)
    pool = Pool(port)
    loop = asyncio.get_running_loop()
    total = int(rate * duration)
    tasks: list[asyncio.Task[None]] = []

    async def one(scheduled: float) -> None:
        sent = loop.time()
        code = "error"
        try:
            conn, reused = await asyncio.wait_for(pool.get(), timeout)
            try:
                status, body, keep = await asyncio.wait_for(conn.post(request), timeout)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.close()
                if not reused or not _closed_before_answer(exc):
                    raise
                result.retried += 1
                conn = await asyncio.wait_for(pool.new(), timeout)
                try:
                    status, body, keep = await asyncio.wait_for(conn.post(request), timeout)
                except BaseException:
                    conn.close()
                    raise
            except BaseException:
                conn.close()
                raise
            if keep:
                pool.put(conn)
            else:
                conn.close()
            code = str(status)
            if status == 202 and record:
                with contextlib.suppress(ValueError, KeyError):
                    result.run_ids.append(json.loads(body)["id"])
        except TimeoutError:
            code = "timeout"
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            code = "error"
        done = loop.time()
        result.statuses[code] = result.statuses.get(code, 0) + 1
        if code == "202":
            result.latencies.append(done - scheduled)
            result.service.append(done - sent)
        result.lateness.append(sent - scheduled)

    start = loop.time() + 0.05
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
        result.sent += 1
    await asyncio.gather(*tasks)
    result.wall_s = loop.time() - start
    pool.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("api", __doc__)
    parser.add_argument("--rates", default="200,400", help="requests per second (200,400)")
    parser.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="seconds per rate (10; the documented run uses 30)",
    )
    parser.add_argument("--auth", choices=("key", "disabled"), default="key")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout (10 s)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds at 50/s first (2)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the API during the first rate (unsaturated), then count round trips per "
        "submit and time the admission checks against the backlog",
    )
    args = parser.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x]
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()

    db = BenchDatabase.open(args, "api")
    procs = Procs()
    results: list[RateResult] = []
    libs: list[tuple[str, float]] = []
    funcs: list[tuple[str, float]] = []
    shares: list[tuple[str, float]] = []
    samples = 0
    admission: list[tuple[object, ...]] = []
    trips: list[tuple[object, ...]] = []
    failed = True
    from sqlalchemy import create_engine

    engine = create_engine(db.sqlalchemy_url(), pool_size=1)
    try:
        print_machine(db.url)
        tools_file = write_tools_file(procs.logs, {"noop": NOOP})
        # One tenant sends every request and no worker drains them: its queued cap must hold
        # a whole rate's runs, or the benchmark measures the cap's 429s instead of submits.
        most_queued = int(max(rates) * args.duration) + 1_000
        env = {
            "RUNYARD_DATABASE_URL": db.url,
            "RUNYARD_TOOLS_FILE": str(tools_file),
            "RUNYARD_TENANT_MAX_QUEUED": str(max(10_000, most_queued)),
            "RUNYARD_MAX_QUEUE_DEPTH": str(max(100_000, most_queued)),
        }
        token: str | None = None
        if args.auth == "disabled":
            env["RUNYARD_AUTH_DISABLED"] = "true"
        else:
            from runyard.tenancy.auth import create_api_key

            token = create_api_key(engine, f"bench-api-{uuid.uuid4().hex[:8]}")
        procs.base_env = env
        port = free_port()
        procs.spawn("api", ["-m", "api", "--port", str(port)])
        wait_for_api(port, procs, "api")
        api_pid = procs.pid("api")
        out(
            f"auth: {args.auth}; duration per rate: {args.duration:.0f} s; "
            f"timeout: {args.timeout:.0f} s; no worker (runs stay queued); "
            f"tenant queued cap {env['RUNYARD_TENANT_MAX_QUEUED']}"
        )
        if args.warmup > 0:
            warm = asyncio.run(open_loop(port, token, 50, args.warmup, args.timeout))
            _delete_runs(engine, warm.run_ids)
        for rate in rates:
            deadline.check(f"rate {rate}")
            spy = None
            if args.profile and rate == rates[0]:
                spy = start_py_spy(api_pid, args.duration, procs.logs / "api.spy")
            with BackendCpu(db.url) as backends:
                cpu_api, cpu_me = process_cpu_seconds(api_pid), time.process_time()
                cpu_pg = backends.begin()
                res = asyncio.run(open_loop(port, token, rate, args.duration, args.timeout))
                res.api_cpu_s = process_cpu_seconds(api_pid) - cpu_api
                res.client_cpu_s = time.process_time() - cpu_me
                res.postgres_cpu_s = backends.used_since(cpu_pg)
            results.append(res)
            if spy is not None:
                spy.wait(timeout=60)
                profile = procs.logs / "api.spy"
                libs, funcs, samples = summarize_py_spy(profile)
                shares = inclusive_top(profile, own_code_prefixes())
            note(
                f"{rate:.0f}/s: p50 {percentile(res.latencies, 50) * 1000:.1f} ms, "
                f"p99 {percentile(res.latencies, 99) * 1000:.1f} ms, errors {res.errors}"
            )
            _delete_runs(engine, res.run_ids)
            if not procs.alive("api"):
                raise RuntimeError(f"the API died:\n{procs.log_tail('api')}")
        if args.profile:
            deadline.check("admission cost")
            procs.stop("api")
            admission = admission_cost(db.url, [0, 1000, 5000, 20000])
            trips = round_trips_per_submit(db.url, str(tools_file), token)
        failed = False
    finally:
        engine.dispose()
        procs.close()
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)
    report(
        results,
        lambda: _profile_tables(rates[0], samples, libs, funcs, shares, admission, trips),
    )
    return 0


def _profile_tables(
    rate: float,
    samples: int,
    libs: list[tuple[str, float]],
    funcs: list[tuple[str, float]],
    shares: list[tuple[str, float]],
    admission: list[tuple[object, ...]],
    trips: list[tuple[object, ...]],
) -> None:
    if samples:
        out("")
        out(
            f"profile of the API process at {rate:.0f}/s (py-spy, {samples} samples of the "
            "thread holding the GIL, i.e. where the process spends CPU in Python):"
        )
        out(table(["library", "% of samples"], libs))
        out(table(["function (self)", "% of samples"], funcs))
        out(table(["runyard frame (inclusive)", "% of samples"], shares))
    if trips:
        out("")
        out("database round trips of one POST /v1/runs (in-process ASGI, 200 requests):")
        out(table(["round trip", "per request"], trips))
    if admission:
        out("")
        out("admission checks vs queued backlog of one tenant (in-process, one thread, ms):")
        out(
            table(
                [
                    "queued backlog",
                    "QUEUE_DEPTH count",
                    "ApiQueue.submit (default caps)",
                ],
                admission,
            )
        )


def admission_cost(url: str, backlogs: list[int]) -> list[tuple[object, ...]]:
    """In-process: the cost of one ``ApiQueue.submit`` (default caps; the tenant's admission is
    in its statement) and of the queue-depth count, as the queued backlog of one tenant grows.
    Runs are written with runyard's own ENQUEUE statement; the database is the benchmark's own."""
    import psycopg
    from sqlalchemy import create_engine

    from runyard.queue import AdmissionCaps, ApiQueue, NewRun
    from runyard.queue.values import enqueue_params
    from runyard.registry.tools import ToolSpec

    enqueue_sql = psycopg_sql(queue_statement("ENQUEUE"))
    depth_sql = psycopg_sql(queue_statement("QUEUE_DEPTH"))
    spec = ToolSpec.model_validate({"name": "noop", **NOOP}).snapshot()
    tenant = f"bench-admission-{uuid.uuid4().hex[:6]}"
    run = NewRun(tenant=tenant, tool="noop", spec=spec, input={})
    caps = AdmissionCaps(max_queue_depth=100_000, tenant_max_queued=1_000_000)
    engine = create_engine("postgresql+psycopg://" + url[len("postgresql://") :], pool_size=2)
    queue = ApiQueue(engine)
    rows: list[tuple[object, ...]] = []
    have = 0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for backlog in backlogs:
                with conn.pipeline():
                    for _ in range(backlog - have):
                        params = enqueue_params(run, uuid.uuid4(), uuid.uuid4(), None)
                        conn.execute(enqueue_sql, params)
                have = max(have, backlog)
                conn.execute("ANALYZE tool_runs, tool_run_jobs")
                n = 30
                t0 = time.perf_counter()
                for _ in range(n):
                    conn.execute(depth_sql, {}).fetchone()
                depth_ms = (time.perf_counter() - t0) / n * 1000
                t0 = time.perf_counter()
                for _ in range(n):
                    queue.submit(run, caps)
                have += n
                submit_ms = (time.perf_counter() - t0) / n * 1000
                rows.append((backlog, depth_ms, submit_ms))
    finally:
        engine.dispose()
    return rows


def round_trips_per_submit(
    url: str, tools_file: str, token: str | None, n: int = 200
) -> list[tuple[object, ...]]:
    """In-process (ASGI, no socket): database round trips of one ``POST /v1/runs``, counted
    with SQLAlchemy events: BEGIN, statements, COMMIT/ROLLBACK; the pool's pings (the dialect's
    ``do_ping``: at checkout when pre-ping is on, or after an idle spell); and statements
    sent on the psycopg cursor directly (autocommit)."""
    import threading
    from collections import defaultdict

    import psycopg
    from fastapi.testclient import TestClient
    from sqlalchemy import event
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
    from sqlalchemy.engine import Engine

    from api.main import create_app
    from runyard.platform.settings import Settings

    counts: dict[str, int] = defaultdict(int)
    counting = [False]

    def bump(name: str) -> Any:
        def handler(*args: Any) -> None:
            if counting[0]:
                counts[name] += 1

        return handler

    in_sqlalchemy = threading.local()

    def statement(conn: Any, cursor: Any, text_: str, *rest: Any) -> None:
        in_sqlalchemy.active = True
        if counting[0]:
            counts["statement: " + " ".join(text_.split())[:60]] += 1

    def statement_done(*args: Any) -> None:
        in_sqlalchemy.active = False

    # Statements sent on a pooled connection's psycopg cursor directly
    # (runyard.platform.db.autocommit) bypass SQLAlchemy's events; a ping is counted where
    # the dialect sends it.
    pings = ("SELECT 1", ";")
    original_execute = psycopg.Cursor.execute
    original_ping: Any = PGDialect_psycopg.do_ping

    def counted_ping(self: Any, dbapi_connection: Any) -> Any:
        if counting[0]:
            counts["ping (SELECT 1)"] += 1
        return original_ping(self, dbapi_connection)

    def psycopg_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text_ = query if isinstance(query, str) else str(query)
        if counting[0] and not getattr(in_sqlalchemy, "active", False) and text_ not in pings:
            counts["statement (autocommit): " + " ".join(text_.split())[:60]] += 1
        return original_execute(self, query, *args, **kwargs)

    hooks = [
        (Engine, "begin", bump("BEGIN")),
        (Engine, "commit", bump("COMMIT")),
        (Engine, "rollback", bump("ROLLBACK (end of a read)")),
        (Engine, "before_cursor_execute", statement),
        (Engine, "after_cursor_execute", statement_done),
        (Engine, "handle_error", statement_done),
    ]
    settings = Settings(
        database_url=url,
        tools_file=tools_file,
        auth_disabled=token is None,
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for target, name, fn in hooks:
        event.listen(target, name, fn)
    psycopg.Cursor.execute = psycopg_execute  # type: ignore[method-assign]
    PGDialect_psycopg.do_ping = counted_ping  # type: ignore[method-assign]
    try:
        with TestClient(create_app(settings)) as client:
            for _ in range(5):
                client.post("/v1/runs", json={"tool": "noop", "input": {}}, headers=headers)
            counting[0] = True
            for _ in range(n):
                answer = client.post(
                    "/v1/runs", json={"tool": "noop", "input": {}}, headers=headers
                )
                assert answer.status_code == 202, answer.text
            counting[0] = False
    finally:
        psycopg.Cursor.execute = original_execute  # type: ignore[method-assign]
        PGDialect_psycopg.do_ping = original_ping  # type: ignore[method-assign]
        for target, name, fn in hooks:
            event.remove(target, name, fn)
    rows: list[tuple[object, ...]] = [
        (name, count / n) for name, count in sorted(counts.items(), key=lambda kv: -kv[1])
    ]
    rows.append(("TOTAL round trips", sum(counts.values()) / n))
    return rows


def _delete_runs(engine: Any, run_ids: list[str]) -> None:
    from sqlalchemy import text

    if not run_ids:
        return
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM tool_run_events WHERE run_id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": run_ids},
        )
        conn.execute(
            text("DELETE FROM tool_run_jobs WHERE run_id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": run_ids},
        )
        conn.execute(
            text("DELETE FROM tool_runs WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": run_ids}
        )
        conn.execute(text("ANALYZE tool_runs, tool_run_jobs, tool_run_events"))


def report(results: list[RateResult], extra: Any = None) -> None:
    out("")
    out(
        table(
            [
                "rate/s",
                "sent",
                "achieved/s",
                "202",
                "errors",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "p99 service ms",
                "p99 send lag ms",
                "retried",
                "API CPU ms/req",
                "Postgres CPU ms/req",
                "client CPU ms/req",
            ],
            [
                (
                    r.rate,
                    r.sent,
                    r.sent / r.wall_s if r.wall_s else 0.0,
                    r.statuses.get("202", 0),
                    r.errors,
                    percentile(r.latencies, 50) * 1000,
                    percentile(r.latencies, 90) * 1000,
                    percentile(r.latencies, 99) * 1000,
                    max(r.latencies, default=0.0) * 1000,
                    percentile(r.service, 99) * 1000,
                    percentile(r.lateness, 99) * 1000,
                    r.retried,
                    r.api_cpu_s / r.sent * 1000 if r.sent else 0.0,
                    r.postgres_cpu_s / r.sent * 1000 if r.sent else 0.0,
                    r.client_cpu_s / r.sent * 1000 if r.sent else 0.0,
                )
                for r in results
            ],
        )
    )
    bad = {code: n for r in results for code, n in r.statuses.items() if code != "202"}
    if bad:
        out(f"non-202 answers: {bad}")
    if extra is not None:
        extra()
    out("")
    out(load_line())
    out(
        "api: "
        + "; ".join(
            f"{r.rate:.0f}/s for {r.duration:.0f} s: "
            f"p50 {percentile(r.latencies, 50) * 1000:.1f} ms, "
            f"p99 {percentile(r.latencies, 99) * 1000:.1f} ms, {r.errors} errors, "
            f"API CPU {r.api_cpu_s / r.sent * 1000 if r.sent else 0.0:.2f} ms a submit"
            for r in results
        )
        + " (targets: API CPU <= 1.5 ms a submit; at 400/s p99 <= 50 ms, no errors)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
