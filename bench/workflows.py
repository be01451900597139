"""Workflows: a 1,000-run batch over HTTP, the claim next to blocked runs, unblocking a chain.

Three parts, each with a target; the benchmark exits 1 when one is missed.

- **batch**: ``POST /v1/batches`` of 1,000 runs (a layered graph: one source, nine layers of
  111 runs, each depending on 1-4 runs of the layer before) to a real ``python -m api`` on a
  loopback port; wall time from send to the 202 in hand, p50 of ``--batches`` (5) after one
  unrecorded warm-up. Target: p50 <= 1 s.
- **blocked**: ``JobQueue.claim`` (limit 1) and ``JobQueue.finalize_and_claim`` medians with no
  blocked run in the table, then with ``--blocked`` (10,000) runs of the same tenant and queue
  waiting on a dependency that is still running; plus ``EXPLAIN (ANALYZE, BUFFERS)`` of the
  claim in both states, showing that the blocked rows are never read. Target: each median
  within +-20 % of the one with none.
- **chain**: a batch of 1,000 runs, each depending on the one before, walked from head to
  tail: claim, then finalize (the finalize's trigger makes the next run claimable), and a
  second chain walked with ``finalize_and_claim`` alone. Target: the median of the last 100
  steps within 20 % of the first 100 (the unblock cost does not grow with the position).

Quick: ``.venv/bin/python bench/workflows.py`` (about a minute on an embedded Postgres).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file (bench/workflows.py): import from the repository's root, not from bench/,
    # whose queue.py would shadow the standard library's queue.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    BenchDatabase,
    Deadline,
    Http,
    Procs,
    base_parser,
    free_port,
    install_signal_cleanup,
    load_line,
    median,
    note,
    out,
    percentile,
    print_machine,
    psycopg_sql,
    queue_statement,
    table,
    wait_for_api,
    write_tools_file,
)

NOOP: dict[str, Any] = {
    "image": "runyard/toolbox:latest",
    "command": ["true"],
    "timeout_seconds": 30,
}
TENANT = "bench"
QUEUE = "default"
BATCH_SIZE = 1000  # runyard.domain.graph.MAX_BATCH_RUNS
EMPTY_SQL = (
    "TRUNCATE tool_runs, tool_run_jobs, tool_run_events, tool_run_deps, batches, "
    "tenant_run_counts, workers CASCADE"
)
TOLERANCE = 0.20


@dataclass
class Verdict:
    """One target: what was measured against what was wanted."""

    name: str
    figure: str
    met: bool


@dataclass
class Results:
    """Every figure the report prints."""

    verdicts: list[Verdict] = field(default_factory=list)


# --- shapes of graphs --------------------------------------------------------------------------


def layered_batch(tool: str = "noop") -> dict[str, Any]:
    """1,000 runs: a source, then nine layers of 111, each run waiting on 1-4 of the layer
    before (the first layer on the source alone): 2,331 edges."""
    runs: list[dict[str, Any]] = [{"ref": "src", "tool": tool, "input": {}}]
    previous = ["src"]
    for layer in range(1, 10):
        current = [f"l{layer}-{i}" for i in range(111)]
        for i, ref in enumerate(current):
            fan_in = 1 + (i + layer) % 4
            deps = sorted(
                {previous[(i * 7 + j * 13 + layer) % len(previous)] for j in range(fan_in)}
            )
            runs.append({"ref": ref, "tool": tool, "input": {}, "depends_on": deps})
        previous = current
    assert len(runs) == BATCH_SIZE
    return {"runs": runs}


# --- a: the batch over HTTP --------------------------------------------------------------------


def part_batch(db: BenchDatabase, count: int, procs: Procs, results: Results) -> None:
    """POST /v1/batches of 1,000 runs to a real API process, ``count`` times (plus a warm-up)."""
    tools_file = write_tools_file(procs.logs, {"noop": NOOP})
    procs.base_env = {
        "RUNYARD_DATABASE_URL": db.url,
        "RUNYARD_TOOLS_FILE": str(tools_file),
        "RUNYARD_AUTH_DISABLED": "true",
    }
    port = free_port()
    procs.spawn("api", ["-m", "api", "--port", str(port)])
    wait_for_api(port, procs, "api")
    body = layered_batch()
    edges = sum(len(run.get("depends_on", [])) for run in body["runs"])
    http = Http(port)
    times: list[float] = []
    try:
        for i in range(count + 1):
            start = time.perf_counter()
            status, answer = http.request("POST", "/v1/batches", body)
            elapsed = time.perf_counter() - start
            if status != 202:
                raise RuntimeError(f"POST /v1/batches answered {status}: {answer}")
            if len(answer["run_ids"]) != BATCH_SIZE or answer["status"] != "queued":
                raise RuntimeError(
                    f"unexpected batch: {answer['status']}, {len(answer['run_ids'])}"
                )
            if i > 0:
                times.append(elapsed)
            note(f"batch {i}{' (warm-up)' if i == 0 else ''}: {elapsed * 1000:.0f} ms")
    finally:
        http.close()
        procs.stop("api")
    inside = _graph_writes(db.url, body, count)
    p50 = median(times)
    out("")
    out(f"a. POST /v1/batches, {BATCH_SIZE} runs, {edges} edges (layered), live API on loopback")
    out(
        table(
            ["what", "times", "p50 ms", "min ms", "max ms", "each ms"],
            [
                (what, len(values), median(values), min(values), max(values), each)
                for what, values in (
                    ("POST /v1/batches, send to 202 in hand", [t * 1000 for t in times]),
                    ("GraphWriter.submit of that graph, in-process", inside),
                )
                for each in [", ".join(f"{v:.0f}" for v in values)]
            ],
        )
    )
    results.verdicts.append(
        Verdict("1,000-run batch accepted, p50", f"{p50 * 1000:.0f} ms (<= 1000 ms)", p50 <= 1.0)
    )


def _graph_writes(url: str, body: dict[str, Any], count: int) -> list[float]:
    """The same graph written ``count`` times in-process by the graph writer (its one
    transaction: the batch row, admission, INSERT_GRAPH), ms."""
    engine = _engine(url)
    try:
        items = [(run["ref"], tuple(run.get("depends_on", ()))) for run in body["runs"]]
        _submit_graph(engine, items)  # warm-up
        times = []
        for _ in range(count):
            start = time.perf_counter()
            _submit_graph(engine, items)
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        engine.dispose()


# --- plumbing of parts b and c ----------------------------------------------------------------


def _engine(url: str) -> Any:
    from runyard.platform.db import make_engine

    # As a worker's engine: its statements keep their generic plans.
    return make_engine(url, pool_size=2, pre_ping=False, generic_plans=True)


def _new_run(queue: str = QUEUE) -> Any:
    from runyard.queue import NewRun
    from runyard.registry.tools import ToolSpec

    spec = ToolSpec.model_validate({"name": "noop", **NOOP}).snapshot()
    return NewRun(tenant=TENANT, tool="noop", spec=spec, input={}, queue=queue)


def _sql(url: str, statement: str) -> int:
    """Run one statement in autocommit; the first column of its first row, if any."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement)
        row = cursor.fetchone() if cursor.description else None
    return int(row[0]) if row else 0


def _vacuum(url: str) -> None:
    _sql(url, "VACUUM (ANALYZE) tool_runs, tool_run_jobs, tool_run_deps, tool_run_events")


def _submit_graph(
    engine: Any, items: Sequence[tuple[str, tuple[str, ...]]], queue: str = QUEUE
) -> list[uuid.UUID]:
    """A batch through the graph writer (no caps): ``(ref, depends_on)`` per run."""
    from runyard.domain.graph import Node
    from runyard.queue import AdmissionCaps
    from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter

    run = _new_run(queue)
    runs = [GraphRun(run, Node(ref, deps)) for ref, deps in items]
    result = GraphWriter(engine).submit(GraphSubmit(TENANT, runs, batch=True), AdmissionCaps())
    return result.run_ids


def _succeeded() -> Any:
    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus

    return AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0)


def _claim_one(queue: Any, name: str = QUEUE, lease: float = 60.0) -> Any:
    """One job claimed from a queue (it must find one)."""
    (job,) = queue.claim(
        worker_id="bench", engine_id="bench", limit=1, lease_seconds=lease, queues=(name,)
    )
    return job


def _finalize_and_claim(queue: Any, job: Any) -> tuple[bool, list[Any]]:
    """Finalize ``job`` as succeeded and claim the next one, in one statement."""
    found: tuple[bool, list[Any]] = queue.finalize_and_claim(
        job.job_id,
        job.lease_token,
        _succeeded(),
        worker_id="bench",
        engine_id="bench",
        limit=1,
        lease_seconds=60.0,
        queue=QUEUE,
    )
    return found


def _drain(url: str) -> None:
    """Claim and finalize whatever the bench's queue still offers."""
    from runyard.queue import JobQueue

    engine = _engine(url)
    queue = JobQueue(engine)
    try:
        while jobs := queue.claim(
            worker_id="bench", engine_id="bench", limit=100, lease_seconds=60.0, queues=(QUEUE,)
        ):
            for job in jobs:
                queue.finalize(job.job_id, job.lease_token, _succeeded())
    finally:
        engine.dispose()


# --- b: the claim with blocked runs beside it ---------------------------------------------------


@dataclass
class ClaimFigures:
    """One state of the table, pooled over rounds: times and the claim's plan."""

    label: str
    claim_ms: list[float] = field(default_factory=list)
    finalize_claim_ms: list[float] = field(default_factory=list)
    plan: list[tuple[object, ...]] = field(default_factory=list)
    plan_buffers: int = 0
    plan_ms: float = 0.0
    chained_plan: list[tuple[object, ...]] = field(default_factory=list)
    chained_buffers: int = 0
    chained_plan_ms: float = 0.0


def _write_dependents(url: str, count: int, blocked: bool) -> None:
    """``count`` runs of the bench's tenant and queue, each depending on one run in a queue
    of its own: still running (they are blocked), or failed (they are written failed at
    once, with the same rows: run, job, edge, events)."""
    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus
    from runyard.queue import JobQueue

    engine = _engine(url)
    try:
        queue = JobQueue(engine)
        root = queue.enqueue(_new_run("bench-root")).run_id
        held = _claim_one(queue, "bench-root", lease=3600)
        assert held.run_id == root
        if not blocked:
            failed = AttemptResult(status=RunStatus.FAILED, exit_code=1)
            assert queue.finalize(held.job_id, held.lease_token, failed)
        for start in range(0, count, BATCH_SIZE):
            n = min(BATCH_SIZE, count - start)
            _submit_graph(engine, [(f"r{i}", (str(root),)) for i in range(n)])
    finally:
        engine.dispose()
    state = "queued' AND waiting_on > 0" if blocked else "failed'"
    found = _sql(
        url, f"SELECT count(*) FROM tool_run_jobs WHERE queue = '{QUEUE}' AND status = '{state}"
    )
    assert found == count, (found, count)


def _measure_claims(url: str, figures: ClaimFigures, claims: int, dl: Deadline) -> None:
    """Enqueue ready runs, time claims and finalize+claims, and explain both statements."""

    from runyard.queue import JobQueue
    from runyard.queue.values import outcome_params

    warm = 10  # the first ones warm the pool and the plans
    engine = _engine(url)
    queue = JobQueue(engine)
    try:
        for _ in range(2 * (claims + warm) + 2 + warm):
            queue.enqueue(_new_run())
        _vacuum(url)
        for i in range(claims + warm):
            dl.check(f"claims ({figures.label})")
            start = time.perf_counter()
            job = _claim_one(queue)
            elapsed = time.perf_counter() - start
            queue.finalize(job.job_id, job.lease_token, _succeeded())
            if i >= warm:
                figures.claim_ms.append(elapsed * 1000)
        job = _claim_one(queue)
        for i in range(claims + warm):
            dl.check(f"finalize+claim ({figures.label})")
            start = time.perf_counter()
            finalized, jobs = _finalize_and_claim(queue, job)
            elapsed = time.perf_counter() - start
            assert finalized and len(jobs) == 1
            job = jobs[0]
            if i >= warm:
                figures.finalize_claim_ms.append(elapsed * 1000)
        queue.finalize(job.job_id, job.lease_token, _succeeded())
    finally:
        engine.dispose()
    _vacuum(url)
    claim_sql = psycopg_sql(queue_statement("CLAIM"))
    params = {
        "worker_id": "bench",
        "engine_id": "bench",
        "limit": 1,
        "lease": 60.0,
        "queue": QUEUE,
        "now": None,
    }
    explained = _explain(url, claim_sql, params)
    figures.plan, figures.plan_buffers, figures.plan_ms = explained
    # FINALIZE_AND_CLAIM of a job claimed for the purpose (rolled back, then finalized).
    engine = _engine(url)
    try:
        queue = JobQueue(engine)
        job = _claim_one(queue)
        both = {
            **params,
            **outcome_params(_succeeded()),
            "job_id": job.job_id,
            "token": job.lease_token,
        }
        chained = _explain(url, psycopg_sql(queue_statement("FINALIZE_AND_CLAIM")), both)
        figures.chained_plan, figures.chained_buffers, figures.chained_plan_ms = chained
        queue.finalize(job.job_id, job.lease_token, _succeeded())
    finally:
        engine.dispose()
    _drain(url)


def _explain(
    url: str, sql: str, params: dict[str, Any]
) -> tuple[list[tuple[object, ...]], int, float]:
    """EXPLAIN (ANALYZE, BUFFERS) of a statement, rolled back: its scans, buffers, ms."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("BEGIN")
        explained = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
        ).fetchone()
        conn.execute("ROLLBACK")
    assert explained is not None
    document = explained[0] if isinstance(explained[0], list) else json.loads(explained[0])
    top = document[0]
    buffers = int(top["Plan"].get("Shared Hit Blocks", 0)) + int(
        top["Plan"].get("Shared Read Blocks", 0)
    )
    return _scans(top["Plan"]), buffers, float(top["Execution Time"])


def _scans(plan: dict[str, Any], where: str = "") -> list[tuple[object, ...]]:
    """The plan's scans of runs and jobs: which CTE, what, how, rows returned and removed by
    a filter, loops, buffers (an InitPlan's buffers count in the node that first needs its
    value)."""
    found: list[tuple[object, ...]] = []
    here = plan.get("Subplan Name") or where
    relation = plan.get("Relation Name") or _table_of(plan.get("Index Name", ""))
    if relation in ("tool_runs", "tool_run_jobs") and "Scan" in plan["Node Type"]:
        found.append(
            (
                here.replace("CTE ", "") or "-",
                relation,
                plan["Node Type"],
                plan.get("Index Name", "-"),
                plan.get("Actual Rows", 0),
                int(plan.get("Rows Removed by Filter", 0))
                + int(plan.get("Rows Removed by Index Recheck", 0)),
                plan.get("Actual Loops", 0),
                int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)),
            )
        )
    for child in plan.get("Plans", []):
        found.extend(_scans(child, here))
    return found


def _table_of(index: str) -> str:
    """The table an index of the two belongs to (a bitmap index scan names only its index)."""
    for name in ("tool_run_jobs", "tool_runs"):
        if name in index:
            return name
    return ""


def part_blocked(
    url: str, blocked: int, claims: int, rounds: int, results: Results, dl: Deadline
) -> None:
    """Claim costs with ``blocked`` runs of the same tenant and queue waiting, and with as
    many finished ones instead (none blocked, same table size), in alternating rounds."""
    none = ClaimFigures("no blocked run")
    some = ClaimFigures(f"{blocked:,} blocked runs")
    for r in range(rounds):
        for figures, waiting in (
            ((none, False), (some, True))
            if r % 2 == 0
            else (
                (some, True),
                (none, False),
            )
        ):
            _sql(url, EMPTY_SQL)
            start = time.perf_counter()
            _write_dependents(url, blocked, waiting)
            note(f"round {r}: {blocked} runs written in {time.perf_counter() - start:.1f} s")
            _measure_claims(url, figures, claims, dl)
            note(
                f"round {r}, {figures.label}: claim p50 {median(figures.claim_ms):.2f} ms, "
                f"finalize_and_claim p50 {median(figures.finalize_claim_ms):.2f} ms"
            )
    out("")
    out(
        f"b. one claim (limit 1) of tenant {TENANT!r}, queue {QUEUE!r}: beside {blocked:,} runs "
        "of the same tenant and queue waiting on a running dependency, or beside as many "
        f"finished ones (failed: their dependency failed); {rounds} alternating rounds of "
        f"{claims} claims per state, pooled, ms"
    )
    rows: list[tuple[object, ...]] = []
    for what, without, with_blocked in (
        ("JobQueue.claim (committed)", none.claim_ms, some.claim_ms),
        ("JobQueue.finalize_and_claim (committed)", none.finalize_claim_ms, some.finalize_claim_ms),
    ):
        low, high = median(without), median(with_blocked)
        rows.append(
            (what, low, percentile(without, 90), high, percentile(with_blocked, 90), high / low)
        )
    out(table(["statement", "none p50", "none p90", "blocked p50", "blocked p90", "ratio"], rows))
    for figures in (none, some):
        for name, plan, buffers, ms in (
            ("CLAIM", figures.plan, figures.plan_buffers, figures.plan_ms),
            (
                "FINALIZE_AND_CLAIM",
                figures.chained_plan,
                figures.chained_buffers,
                figures.chained_plan_ms,
            ),
        ):
            out("")
            out(
                f"EXPLAIN (ANALYZE, BUFFERS) of {name}, {figures.label} (last round): "
                f"{buffers} buffers in all, {ms:.3f} ms; its scans of tool_runs and "
                "tool_run_jobs:"
            )
            headers = ["CTE", "table", "node", "index", "rows", "removed", "loops", "buffers"]
            out(table(headers, plan))
    for what, without, with_blocked in (
        ("claim", none.claim_ms, some.claim_ms),
        ("finalize_and_claim", none.finalize_claim_ms, some.finalize_claim_ms),
    ):
        ratio = median(with_blocked) / median(without)
        results.verdicts.append(
            Verdict(
                f"{what} with {blocked:,} blocked / none",
                f"{median(with_blocked):.2f} / {median(without):.2f} ms = {ratio:.2f} (0.80-1.20)",
                abs(ratio - 1) <= TOLERANCE,
            )
        )
    scans = some.plan + some.chained_plan
    seq_scans = sum(1 for r in scans if r[2] == "Seq Scan")
    most = max((int(str(r[4])) + int(str(r[5])) for r in scans), default=0)
    results.verdicts.append(
        Verdict(
            "the plans of CLAIM and FINALIZE_AND_CLAIM read no blocked row",
            f"at most {most} rows read by any scan, {seq_scans} sequential scans; "
            f"buffers {some.plan_buffers} (none blocked: {none.plan_buffers})",
            seq_scans == 0 and most < 100,
        )
    )


# --- c: chains ---------------------------------------------------------------------------------


def _chain(engine: Any, length: int) -> list[uuid.UUID]:
    items = [(f"c{i}", (f"c{i - 1}",) if i else ()) for i in range(length)]
    return _submit_graph(engine, items)


def part_chain(url: str, length: int, window: int, results: Results, dl: Deadline) -> None:
    """Two chains: one is walked to ``length - window`` first, then the head steps of the
    other and the tail steps of this one are timed in turns (what the machine does meanwhile
    weighs on both alike): claim + finalize, then the same with finalize_and_claim."""
    from runyard.domain.attempt import AttemptResult
    from runyard.domain.states import RunStatus
    from runyard.queue import JobQueue

    engine = _engine(url)
    queue = JobQueue(engine)
    done = _succeeded()
    walk_finalize: list[float] = []
    walk_claim: list[float] = []
    head: dict[str, list[float]] = {"finalize": [], "finalize_and_claim": []}
    tail: dict[str, list[float]] = {"finalize": [], "finalize_and_claim": []}
    tail_at = length - window

    def timed_finalize(job: Any) -> float:
        t0 = time.perf_counter()
        assert queue.finalize(job.job_id, job.lease_token, done)
        return (time.perf_counter() - t0) * 1000

    try:
        # claim + finalize. L's head is claimed (and held), R walked to its tail: only one run
        # of the queue is ever ready, so each claim takes the run it must.
        _sql(url, EMPTY_SQL)
        left, right = _chain(engine, length), _chain(engine, length)
        _vacuum(url)
        low = _claim_one(queue)
        assert low.run_id == left[0]
        for i in range(tail_at):
            dl.check("chain walk")
            t0 = time.perf_counter()
            job = _claim_one(queue)
            walk_claim.append((time.perf_counter() - t0) * 1000)
            assert job.run_id == right[i]
            walk_finalize.append(timed_finalize(job))
        high = _claim_one(queue)
        for i in range(window):
            dl.check("chain head and tail")
            head["finalize"].append(timed_finalize(low))
            low = _claim_one(queue)
            assert low.run_id == left[i + 1]
            tail["finalize"].append(timed_finalize(high))
            if tail_at + i + 1 < length:
                high = _claim_one(queue)
                assert high.run_id == right[tail_at + i + 1]
        # finalize_and_claim cannot claim the run its own finalize unblocks (its claim reads
        # the statement's snapshot), so each step finalizes a run of one chain and claims the
        # ready run of the other: L's head is held while R is walked to its tail, then the
        # two take turns.
        _sql(url, EMPTY_SQL)
        left, right = _chain(engine, length), _chain(engine, length)
        _vacuum(url)
        job = _claim_one(queue)
        assert job.run_id == left[0]
        for i in range(tail_at):
            dl.check("chain walk (finalize_and_claim)")
            step = _claim_one(queue)
            assert step.run_id == right[i]
            assert queue.finalize(step.job_id, step.lease_token, done)
        for i in range(2 * window):
            dl.check("chain head and tail (finalize_and_claim)")
            t0 = time.perf_counter()
            finalized, jobs = _finalize_and_claim(queue, job)
            elapsed = (time.perf_counter() - t0) * 1000
            # Even steps finalize a run of L (the head), odd ones of R (the tail).
            (head if i % 2 == 0 else tail)["finalize_and_claim"].append(elapsed)
            expected = right[tail_at + i // 2] if i % 2 == 0 else left[i // 2 + 1]
            assert finalized and [j.run_id for j in jobs] == [expected]
            job = jobs[0]
        # Failing a chain's head fails every run after it, in the finalize's transaction.
        _sql(url, EMPTY_SQL)
        third = _chain(engine, length)
        job = _claim_one(queue)
        assert job.run_id == third[0]
        t0 = time.perf_counter()
        assert queue.finalize(
            job.job_id, job.lease_token, AttemptResult(status=RunStatus.FAILED, exit_code=1)
        )
        fail_ms = (time.perf_counter() - t0) * 1000
        assert _open_jobs(url) == 0
    finally:
        engine.dispose()
    out("")
    out(
        f"c. chains of {length} runs: the finalize of position p (its trigger makes p+1 "
        f"claimable), for p < {window} and p >= {tail_at}, timed in turns; medians, ms"
    )
    rows: list[tuple[object, ...]] = []
    for what in ("finalize", "finalize_and_claim"):
        first, last = median(head[what]), median(tail[what])
        rows.append((what, len(head[what]), first, last, last / first))
        results.verdicts.append(
            Verdict(
                f"chain of {length}: {what} at the tail / at the head",
                f"{last:.2f} / {first:.2f} ms = {last / first:.2f} (<= 1.20)",
                last / first <= 1 + TOLERANCE,
            )
        )
    out(
        table(
            ["step", "steps each", f"head (p < {window})", f"tail (p >= {tail_at})", "ratio"], rows
        )
    )
    out("")
    out(f"the walk of one chain from its head to position {tail_at}, by position, ms:")
    deciles = [
        (
            f"{d * tail_at // 10}-{(d + 1) * tail_at // 10 - 1}",
            median(_slice(walk_finalize, d)),
            median(_slice(walk_claim, d)),
        )
        for d in range(10)
    ]
    out(table(["positions", "finalize p50", "claim p50"], deciles))
    out(f"finalize that fails a chain's head and its {length - 1} dependents: {fail_ms:.0f} ms")


def _slice(values: list[float], decile: int) -> list[float]:
    n = len(values)
    return values[n * decile // 10 : n * (decile + 1) // 10]


def _open_jobs(url: str) -> int:
    return _sql(url, "SELECT count(*) FROM tool_run_jobs WHERE status IN ('queued', 'running')")


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for; exit 1 when a target is missed."""
    parser = base_parser("workflows", __doc__)
    parser.add_argument("--parts", default="batch,blocked,chain", help="which parts (all three)")
    parser.add_argument("--batches", type=int, default=5, help="batches timed (5)")
    parser.add_argument("--blocked", type=int, default=10_000, help="blocked runs (10000)")
    parser.add_argument(
        "--claims", type=int, default=100, help="claims timed per state and round (100)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds of part b (4)")
    parser.add_argument("--chain", type=int, default=1000, help="chain length (1000)")
    parser.add_argument("--window", type=int, default=100, help="head/tail steps compared (100)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    deadline = Deadline(args.time_limit)
    install_signal_cleanup()
    db = BenchDatabase.open(args, "workflows")
    procs = Procs()
    results = Results()
    failed = True
    runners: dict[str, Callable[[], None]] = {
        "batch": lambda: part_batch(db, args.batches, procs, results),
        "blocked": lambda: part_blocked(
            db.url, args.blocked, args.claims, args.rounds, results, deadline
        ),
        "chain": lambda: part_chain(db.url, args.chain, args.window, results, deadline),
    }
    try:
        print_machine(db.url)
        for part in parts:
            deadline.check(part)
            runners[part]()
        failed = False
    finally:
        procs.close()
        db.close(keep=args.keep_db)
        procs.keep_logs_if(failed)
    out("")
    out(table(["target", "figure", "met"], [(v.name, v.figure, v.met) for v in results.verdicts]))
    out(load_line())
    missed = [v.name for v in results.verdicts if not v.met]
    out(
        "workflows: "
        + ("every target met" if not missed else "missed: " + "; ".join(missed))
        + f" ({len(results.verdicts)} targets)"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
