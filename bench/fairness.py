"""Fair tenants: how long one tenant's single run waits while another has flooded the queue.

One real ``worker.service.Worker`` (``--slots`` slots, the fake runner: each attempt takes
``--job-seconds``) drains a queue in which tenant ``flood`` has ``--flood`` queued runs (none
in the baseline). Once every slot is busy, tenant ``single`` submits one run; its wait is
``started_at - requested_at`` on the database clock, and "flood runs started first" counts
the flood's runs that started in between. Under first-in-first-out the single run would
wait for the whole backlog (about flood x job-seconds / slots); the fair claim starts it
at the next slot turnover (about job-seconds / slots).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.common import (
    BenchDatabase,
    Deadline,
    base_parser,
    install_signal_cleanup,
    note,
    out,
    print_machine,
    table,
    wait_until,
)

FLOOD_SQL = """
WITH runs AS (
    INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at)
    SELECT gen_random_uuid(), 'flood', 'echo', '{"name": "echo"}', '{}', 'queued', 'queue',
           now()
    FROM generate_series(1, %(n)s)
    RETURNING id
)
INSERT INTO tool_run_jobs (id, run_id, status, queue, tenant, timeout_seconds, available_at,
                           created_at)
SELECT gen_random_uuid(), id, 'queued', 'default', 'flood', 600, now(), now() FROM runs
"""
EMPTY_SQL = "TRUNCATE tool_runs, tool_run_jobs, tool_run_events, tenant_run_counts, workers"
WAIT_SQL = """
SELECT extract(epoch FROM r.started_at - r.requested_at) AS wait,
       (SELECT count(*) FROM tool_runs f
        WHERE f.tenant = 'flood' AND f.started_at > r.requested_at
          AND f.started_at < r.started_at) AS before
FROM tool_runs r WHERE r.id = %(id)s AND r.started_at IS NOT NULL
"""


@dataclass(frozen=True)
class Outcome:
    """One scenario's figures."""

    flood: int
    wait_seconds: float
    flood_started_first: int


def scenario(
    url: str, flood: int, slots: int, job_seconds: float, poll: float, deadline: Deadline
) -> Outcome:
    """Flood (or not), fill the slots, submit the single run, and time its wait."""
    import psycopg

    from runyard.domain.attempt import AttemptResult, AttemptSpec
    from runyard.domain.states import RunStatus
    from runyard.platform.db import make_engine
    from runyard.queue import JobQueue, NewRun
    from runyard.runner import AttemptControl
    from runyard.runners.fake import FakeRunner
    from worker.service import Worker, WorkerConfig

    def slow(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        time.sleep(job_seconds)
        return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, result=None)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EMPTY_SQL)
        if flood:
            conn.execute(FLOOD_SQL, {"n": flood})
            conn.execute("ANALYZE tool_runs, tool_run_jobs")
    engine = make_engine(url, pool_size=slots + 2, max_overflow=2)
    queue = JobQueue(engine)
    worker = Worker(
        queue,
        FakeRunner(slow),
        WorkerConfig(worker_id="bench", concurrency=slots, poll_seconds=poll),
    )
    thread = threading.Thread(target=worker.run_forever, name="bench-worker", daemon=True)
    thread.start()
    try:
        if flood:
            wait_until(lambda: worker.free_slots() == 0, deadline.left(), "slots to fill")
        run = NewRun(tenant="single", tool="echo", spec={"name": "echo"}, input={})
        run_id = queue.enqueue(run).run_id
        row: Any = None

        def started() -> bool:
            nonlocal row
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(WAIT_SQL, {"id": run_id}).fetchone()
            return row is not None

        wait_until(started, deadline.left(), "the single run to start")
        return Outcome(flood, float(row[0]), int(row[1]))
    finally:
        worker.stop()
        thread.join(timeout=30)
        worker.close()
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Run the baseline and the flood, print both."""
    parser = base_parser("fairness", __doc__)
    parser.add_argument("--flood", type=int, default=2000, help="flood runs (default 2000)")
    parser.add_argument("--slots", type=int, default=2, help="worker slots (default 2)")
    parser.add_argument(
        "--job-seconds", type=float, default=0.2, help="each attempt's length (default 0.2)"
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=0.05,
        help="an idle worker's poll interval (no NOTIFY wake-up here; default 0.05)",
    )
    args = parser.parse_args(argv)
    install_signal_cleanup()
    deadline = Deadline(args.time_limit)
    db = BenchDatabase.open(args, "fairness")
    print_machine(db.url)
    try:
        outcomes = [
            scenario(db.url, flood, args.slots, args.job_seconds, args.poll_seconds, deadline)
            for flood in (0, args.flood)
        ]
    finally:
        db.close(keep=args.keep_db)
    fifo = args.flood * args.job_seconds / args.slots
    note(f"first-in-first-out would keep the single run waiting about {fifo:.0f} s")
    out(
        table(
            ["flood runs queued", "single run's wait (s)", "flood runs started first"],
            [[o.flood, f"{o.wait_seconds:.3f}", o.flood_started_first] for o in outcomes],
        )
    )
    out(f"slots {args.slots}, each attempt {args.job_seconds} s, idle poll {args.poll_seconds} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
