"""Batch throughput: runs accepted per second through ``POST /v1/batches``, with single submits.

One real ``python -m api`` process on a loopback port, its own database, no worker (the runs
stay queued). This process is the load generator (asyncio, keep-alive connections, no client
library), open loop on two streams at once for ``--duration`` seconds:

- batches of ``--batch-size`` (1,000) ``noop`` runs at ``--rate`` runs per second (5,000, i.e.
  5 batches a second), each sent at its scheduled time on a connection of its own (several are
  in flight when answers are slow, so one slow answer does not hold the rate); ``--shape
  independent`` (no edges) or ``layered`` (a source, then layers of 111 runs each waiting on 1-4
  runs of the layer before, as bench/workflows.py part a);
- single ``POST /v1/runs`` of ``noop`` at ``--single-rate`` (200) per second.

Latency is measured from the scheduled send time. Runs accepted per second = runs of 2xx
batches / wall time (from the first send to the last answer). Batches and singles use two API
keys of two tenants (``--same-tenant``: one key), each key made as ``runyard keys create``
does. The admission caps are raised so the run is not capped: ``RUNYARD_TENANT_MAX_QUEUED``,
``RUNYARD_MAX_QUEUE_DEPTH``, ``RUNYARD_TENANT_MAX_CREATED_PER_WINDOW`` and
``RUNYARD_TENANT_MAX_STORED_RUNS`` of 10,000,000 (the admission statements still run and lock
the tenant's row of counts as with the defaults; a cap of 0 would skip that).

Targets: >= 5,000 runs/s accepted while the single submits keep p99 <= 50 ms, no errors.
Quick and documented run: ``python -m bench.batches`` (30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.api import Connection, Pool, http_request
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
    out,
    percentile,
    print_machine,
    process_cpu_seconds,
    start_py_spy,
    summarize_py_spy,
    table,
    wait_for_api,
    write_tools_file,
)

NOOP = {"image": "runyard/toolbox:latest", "command": ["true"], "timeout_seconds": 30}
UNCAPPED = "10000000"
TARGET_RUNS_PER_S = 5000.0
TARGET_SINGLE_P99_S = 0.050


@dataclass
class Stream:
    """One open-loop stream's measurements."""

    name: str
    rate: float  # requests per second
    runs_per_request: int
    sent: int = 0
    accepted_runs: int = 0
    latencies: list[float] = field(default_factory=list)  # of 2xx, from the scheduled time
    statuses: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def errors(self) -> int:
        return sum(n for code, n in self.statuses.items() if not code.startswith("2"))


def layered_runs(size: int) -> list[dict[str, Any]]:
    """A source, then layers of 111 runs, each waiting on 1-4 runs of the layer before."""
    runs: list[dict[str, Any]] = [{"ref": "r0", "tool": "noop"}]
    previous = ["r0"]
    layer: list[str] = []
    for i in range(1, size):
        ref = f"r{i}"
        span = 1 + i % 4
        deps = sorted({previous[(i + k) % len(previous)] for k in range(span)})
        runs.append({"ref": ref, "tool": "noop", "depends_on": deps})
        layer.append(ref)
        if len(layer) == 111:
            previous, layer = layer, []
    return runs


def batch_body(size: int, shape: str) -> bytes:
    if shape == "layered":
        runs = layered_runs(size)
    else:
        runs = [{"tool": "noop", "input": {"i": i}} for i in range(size)]
    return json.dumps({"runs": runs}).encode()


async def open_loop(
    stream: Stream, pool: Pool, request: bytes, duration: float, timeout: float, start: float
) -> None:
    """Send ``stream.rate`` requests a second from ``start`` for ``duration`` seconds."""
    loop = asyncio.get_running_loop()
    total = int(stream.rate * duration)
    tasks: list[asyncio.Task[None]] = []

    async def one(scheduled: float) -> None:
        code = "error"
        held: list[Connection] = []
        try:
            conn, _ = await asyncio.wait_for(pool.get(), timeout)
            held.append(conn)
            status, _body, keep = await asyncio.wait_for(conn.post(request), timeout)
            held.clear()
            if keep:
                pool.put(conn)
            else:
                conn.close()
            code = str(status)
        except TimeoutError:
            code = "timeout"
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            code = "error"
        finally:
            for broken in held:
                broken.close()
        stream.statuses[code] = stream.statuses.get(code, 0) + 1
        if code.startswith("2"):
            stream.latencies.append(loop.time() - scheduled)
            stream.accepted_runs += stream.runs_per_request

    for i in range(total):
        scheduled = start + i / stream.rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
        stream.sent += 1
    await asyncio.gather(*tasks)
    stream.wall_s = loop.time() - start


async def run_load(
    port: int,
    tokens: tuple[str | None, str | None],
    args: Any,
    duration: float,
) -> tuple[Stream, Stream]:
    """Both streams at once; returns (batches, singles)."""
    batches = Stream("batches", args.rate / args.batch_size, args.batch_size)
    singles = Stream("singles", args.single_rate, 1)
    batch_request = http_request(
        port, "/v1/batches", batch_body(args.batch_size, args.shape), tokens[0]
    )
    single_body = json.dumps({"tool": "noop", "input": {}}).encode()
    single_request = http_request(port, "/v1/runs", single_body, tokens[1])
    batch_pool, single_pool = Pool(port), Pool(port)
    start = asyncio.get_running_loop().time() + 0.1
    try:
        loops = [
            open_loop(stream, pool, request, duration, args.timeout, start)
            for stream, pool, request in (
                (batches, batch_pool, batch_request),
                (singles, single_pool, single_request),
            )
            if stream.rate > 0
        ]
        await asyncio.gather(*loops)
    finally:
        batch_pool.close()
        single_pool.close()
    return batches, singles


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("batches", __doc__)
    parser.add_argument("--rate", type=float, default=TARGET_RUNS_PER_S, help="runs/s (5000)")
    parser.add_argument("--batch-size", type=int, default=1000, help="runs per batch (1000)")
    parser.add_argument(
        "--single-rate", type=float, default=200.0, help="POST /v1/runs/s (200; 0: none)"
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds (30)")
    parser.add_argument("--shape", choices=("independent", "layered"), default="independent")
    parser.add_argument("--auth", choices=("key", "disabled"), default="key")
    parser.add_argument(
        "--same-tenant", action="store_true", help="batches and singles with one key"
    )
    parser.add_argument(
        "--api-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="RUNYARD_API_WORKERS: API processes (one a core: each uses one at most)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (30 s)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds at a fifth of the rate")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the API (first process) during the run"
    )
    args = parser.parse_args(argv)
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()

    db = BenchDatabase.open(args, "batches")
    procs = Procs()
    failed = True
    from sqlalchemy import create_engine

    engine = create_engine(db.sqlalchemy_url(), pool_size=1)
    batches = singles = None
    api_cpu = pg_cpu = float("nan")
    profile: tuple[list[tuple[str, float]], list[tuple[str, float]], int] | None = None
    shares: list[tuple[str, float]] = []
    try:
        print_machine(db.url)
        tools_file = write_tools_file(procs.logs, {"noop": NOOP})
        env = {
            "RUNYARD_DATABASE_URL": db.url,
            "RUNYARD_TOOLS_FILE": str(tools_file),
            "RUNYARD_TENANT_MAX_QUEUED": UNCAPPED,
            "RUNYARD_MAX_QUEUE_DEPTH": UNCAPPED,
            "RUNYARD_TENANT_MAX_CREATED_PER_WINDOW": UNCAPPED,
            "RUNYARD_TENANT_MAX_STORED_RUNS": UNCAPPED,
        }
        env["RUNYARD_API_WORKERS"] = str(max(1, args.api_workers))
        tokens: tuple[str | None, str | None] = (None, None)
        if args.auth == "disabled":
            env["RUNYARD_AUTH_DISABLED"] = "true"
        else:
            from runyard.tenancy.auth import create_api_key

            stamp = uuid.uuid4().hex[:8]
            batch_key = create_api_key(engine, f"bench-batches-{stamp}")
            single_key = (
                batch_key if args.same_tenant else create_api_key(engine, f"bench-single-{stamp}")
            )
            tokens = (batch_key, single_key)
        procs.base_env = env
        port = free_port()
        procs.spawn("api", ["-m", "api", "--port", str(port)])
        wait_for_api(port, procs, "api")
        api_pid = procs.pid("api")
        out(
            f"auth: {args.auth} ({'one tenant' if args.same_tenant else 'two tenants'}); "
            f"batches of {args.batch_size} ({args.shape}) at {args.rate:.0f} runs/s and "
            f"POST /v1/runs at {args.single_rate:.0f}/s for {args.duration:.0f} s; tenant and "
            f"queue caps {UNCAPPED}; no worker (runs stay queued); "
            f"API processes: {max(1, args.api_workers)}"
        )
        if args.warmup > 0:
            warm = argparse_copy(args, rate=args.rate / 5, single_rate=20.0)
            asyncio.run(run_load(port, tokens, warm, args.warmup))
        deadline.check("the load")
        out(load_line())
        pids = [api_pid, *children(api_pid)]
        spy = None
        if args.profile:
            spy = start_py_spy(pids[-1], args.duration, procs.logs / "api.spy")
        with BackendCpu(db.url) as backends:
            before_pg = backends.begin()
            before_api = sum(process_cpu_seconds(pid) for pid in pids)
            batches, singles = asyncio.run(run_load(port, tokens, args, args.duration))
            api_cpu = sum(process_cpu_seconds(pid) for pid in pids) - before_api
            pg_cpu = backends.used_since(before_pg)
        if spy is not None:
            spy.wait(timeout=60)
            path = procs.logs / "api.spy"
            libs, funcs, samples = summarize_py_spy(path)
            profile = (libs, funcs, samples)
            from bench.api import own_code_prefixes

            shares = inclusive_top(path, own_code_prefixes())
        if not procs.alive("api"):
            raise RuntimeError(f"the API died:\n{procs.log_tail('api')}")
        failed = False
    finally:
        engine.dispose()
        _stop_api(procs)
        procs.close()
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)
    assert batches is not None and singles is not None
    return report(args, batches, singles, api_cpu, pg_cpu, profile, shares)


def _stop_api(procs: Procs) -> None:
    """SIGTERM first: uvicorn's supervisor then stops its workers (a SIGKILL would orphan
    them); any left after it are killed by pid."""
    import os
    import signal

    if "api" not in procs.procs or not procs.alive("api"):
        return
    workers = children(procs.pid("api"))
    procs.stop("api")
    for pid in workers:
        with contextlib.suppress(OSError):
            if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def argparse_copy(args: Any, **changes: Any) -> Any:
    import argparse

    values = vars(args) | changes
    return argparse.Namespace(**values)


def children(pid: int) -> list[int]:
    """Child processes of ``pid`` (uvicorn's workers), from /proc."""
    from bench.common import children_of

    return children_of(pid)


def report(
    args: Any,
    batches: Stream,
    singles: Stream,
    api_cpu: float,
    pg_cpu: float,
    profile: tuple[list[tuple[str, float]], list[tuple[str, float]], int] | None,
    shares: list[tuple[str, float]],
) -> int:
    accepted = batches.accepted_runs / batches.wall_s if batches.wall_s else 0.0
    runs = batches.accepted_runs + singles.accepted_runs
    out("")
    out(
        table(
            [
                "stream",
                "rate/s",
                "sent",
                "2xx",
                "errors",
                "runs accepted/s",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
            ],
            [
                (
                    s.name,
                    s.rate,
                    s.sent,
                    s.sent - s.errors,
                    s.errors,
                    s.accepted_runs / s.wall_s if s.wall_s else 0.0,
                    percentile(s.latencies, 50) * 1000,
                    percentile(s.latencies, 90) * 1000,
                    percentile(s.latencies, 99) * 1000,
                    max(s.latencies, default=float("nan")) * 1000,
                )
                for s in (batches, singles)
            ],
        )
    )
    bad = {
        f"{s.name} {code}": n
        for s in (batches, singles)
        for code, n in s.statuses.items()
        if not code.startswith("2")
    }
    if bad:
        out(f"errors by status: {bad}")
    wall = max(batches.wall_s, singles.wall_s)
    if runs and wall > 0:
        out(
            f"CPU per accepted run: API {api_cpu / runs * 1e6:.0f} us, "
            f"Postgres backends {pg_cpu / runs * 1e6:.0f} us "
            f"(API {api_cpu / wall:.2f} cores, Postgres {pg_cpu / wall:.2f})"
        )
    if profile is not None:
        libs, funcs, samples = profile
        out("")
        out(f"profile of the API process (py-spy, {samples} samples of the GIL holder):")
        out(table(["library", "% of samples"], libs))
        out(table(["function (self)", "% of samples"], funcs))
        out(table(["runyard frame (inclusive)", "% of samples"], shares))
    out("")
    out(load_line())
    single_p99 = percentile(singles.latencies, 99)
    met = (
        accepted >= TARGET_RUNS_PER_S
        and single_p99 <= TARGET_SINGLE_P99_S
        and not batches.errors
        and not singles.errors
    )
    out(
        f"batches: {'met' if met else 'missed'}: {accepted:,.0f} runs/s accepted "
        f"(batch p50 {percentile(batches.latencies, 50) * 1000:.0f} ms, "
        f"p99 {percentile(batches.latencies, 99) * 1000:.0f} ms), single submits "
        f"p99 {single_p99 * 1000:.1f} ms, errors {batches.errors + singles.errors} "
        f"(targets: >= {TARGET_RUNS_PER_S:,.0f} runs/s, single p99 <= "
        f"{TARGET_SINGLE_P99_S * 1000:.0f} ms, no errors)"
    )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
