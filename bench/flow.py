"""Flow control: what a claim costs with 1,000 active concurrency keys, against none.

Baseline: ``--runs`` queued runs of one tenant, no flow limits; a claimer (``JobQueue.claim``,
limit 1) takes and finalizes them one at a time, ``--claims`` times. Keys: the same runs, each
of one of ``--keys`` concurrency keys whose tool allows one running run per key, written held;
a flow gate passes every ``--gate-interval`` seconds on a thread beside the claimer, as on a
worker's chore thread. The table gives each claim's time and their ratio, and the gate's
passes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from bench.common import (
    BenchDatabase,
    Deadline,
    base_parser,
    install_signal_cleanup,
    median,
    out,
    percentile,
    print_machine,
    table,
)

RUNS_SQL = """
WITH runs AS (
    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                           concurrency_key)
    SELECT gen_random_uuid(), 'acme', 'echo', '{"name": "echo"}', '{}', 'queued', 'queue',
           now(), CASE WHEN %(keys)s > 0 THEN 'k' || (n %% %(keys)s) END
    FROM generate_series(1, %(n)s) n
    RETURNING id, concurrency_key
)
INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, timeout_seconds, available_at,
                           created_at, flow_scopes)
SELECT gen_random_uuid(), id, 'queued', 'default', 'acme', 600,
       CASE WHEN concurrency_key IS NULL THEN now() ELSE 'infinity' END, clock_timestamp(),
       CASE WHEN concurrency_key IS NOT NULL
            THEN ARRAY['key:echo:acme:' || concurrency_key] END
FROM runs
"""
EMPTY_SQL = (
    "TRUNCATE tool_runs, tool_run_jobs, tool_run_events, tenant_run_counts, flow_counters CASCADE"
)


@dataclass(frozen=True)
class Outcome:
    """One scenario's figures: each claim's time, in milliseconds."""

    keys: int
    claims: int
    median_ms: float
    p95_ms: float
    gate_median_ms: float


def scenario(url: str, runs: int, keys: int, claims: int, interval: float) -> Outcome:
    """Fill the queue (held by key, or not), then time ``claims`` claims and finalizes."""
    import psycopg

    from runyard.domain.attempt import AttemptResult
    from runyard.domain.flow_limits import FlowConfig, Limit, ToolFlow
    from runyard.domain.states import RunStatus
    from runyard.platform.db import make_engine
    from runyard.queue import JobQueue
    from runyard.queue.flow import FlowGate

    done = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result=None)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EMPTY_SQL)
        conn.execute(RUNS_SQL, {"n": runs, "keys": keys})
        conn.execute("ANALYZE tool_runs, tool_run_jobs")
    # As a worker's engine: its statements keep their generic plans.
    engine = make_engine(url, pool_size=3, max_overflow=0, generic_plans=True)
    config = FlowConfig(tools={"echo": ToolFlow(key=Limit(max_running=1))})
    gate = FlowGate(engine, lambda: config)
    queue = JobQueue(engine)
    times: list[float] = []
    passes: list[float] = []
    stop = threading.Event()

    def gate_passes() -> None:
        while not stop.wait(interval):
            began = time.perf_counter()
            gate.release()
            passes.append(time.perf_counter() - began)

    beside = threading.Thread(target=gate_passes, name="bench-gate", daemon=True)
    if keys:
        beside.start()
    try:
        while len(times) < claims:
            began = time.perf_counter()
            jobs = queue.claim(worker_id="bench", engine_id="e", limit=1, lease_seconds=60)
            times.append(time.perf_counter() - began)
            for job in jobs:
                queue.finalize(job.job_id, job.lease_token, done)
            if not jobs:
                time.sleep(0.005)  # an idle worker waits for its wake-up or poll
    finally:
        stop.set()
        if keys:
            beside.join(timeout=30)
        engine.dispose()
    millis = [t * 1000 for t in times]
    gate_ms = median([t * 1000 for t in passes]) if passes else 0.0
    return Outcome(keys, claims, median(millis), percentile(millis, 95), gate_ms)


def main(argv: list[str] | None = None) -> int:
    """Run the baseline and the keys, print both."""
    parser = base_parser("flow", __doc__)
    parser.add_argument("--runs", type=int, default=5000, help="queued runs (default 5000)")
    parser.add_argument("--keys", type=int, default=1000, help="active keys (default 1000)")
    parser.add_argument("--claims", type=int, default=1000, help="claims timed (default 1000)")
    parser.add_argument(
        "--gate-interval", type=float, default=0.1, help="seconds between gate passes (0.1)"
    )
    args = parser.parse_args(argv)
    install_signal_cleanup()
    Deadline(args.time_limit)
    db = BenchDatabase.open(args, "flow")
    print_machine(db.url)
    try:
        outcomes = [
            scenario(db.url, args.runs, keys, args.claims, args.gate_interval)
            for keys in (0, args.keys)
        ]
    finally:
        db.close(keep=args.keep_db)
    base = outcomes[0].median_ms
    out(
        table(
            [
                "active keys",
                "claims",
                "median claim (ms)",
                "p95 claim (ms)",
                "median vs none",
                "gate pass median (ms)",
            ],
            [
                [
                    o.keys,
                    o.claims,
                    f"{o.median_ms:.2f}",
                    f"{o.p95_ms:.2f}",
                    f"{o.median_ms / base:.2f}",
                    f"{o.gate_median_ms:.2f}" if o.keys else "-",
                ]
                for o in outcomes
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
