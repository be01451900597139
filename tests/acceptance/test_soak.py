"""A seeded soak: 200+ runs over 3 workers, and sync runs over 2 sync-mode API processes,
while faults are injected (API processes killed mid-flight among them); the invariants hold."""

from __future__ import annotations

import random
import signal
import time
import uuid
from datetime import datetime

import pytest
from sqlalchemy import text

from tests.acceptance.cluster import Cluster, Expected

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]

SEED = 20261125
RUNS = 200
WORKERS = ("w1", "w2", "w3")
APIS = ("a1", "a2")


def longest_recovery_seconds(cluster: Cluster) -> float:
    """Longest gap from a lease being lost or given back to the run's next owner or end."""
    with cluster.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, type, at, data FROM tool_run_events "
                "WHERE type IN ('lease_expired', 'released', 'adopted', 'claimed', 'status') "
                "ORDER BY run_id, id"
            )
        ).all()
    longest = 0.0
    open_since: dict[object, datetime] = {}
    for row in rows:
        if row.type in ("lease_expired", "released"):
            open_since.setdefault(row.run_id, row.at)
        elif row.run_id in open_since and (
            row.type in ("adopted", "claimed")
            or (row.type == "status" and row.data.get("status") != "running")
        ):
            longest = max(longest, (row.at - open_since.pop(row.run_id)).total_seconds())
    return longest


def test_soak__faults_over_200_runs_keep_every_invariant(cluster: Cluster):
    rng = random.Random(SEED)
    cluster.start_reaper()
    for name in WORKERS:
        cluster.start_worker(name, concurrency=2)
    for name in APIS:
        cluster.start_api(name)
    sleepers = []
    for i in range(RUNS):
        kind = rng.choice(["echo", "echo", "sleep", "fail"])
        if kind == "echo":
            value = {"script": f"echo exec {i}; cp /runyard/input.json /runyard/out/result.json"}
            cluster.submit("shell", value, Expected("succeeded", 0, value, check_result=True))
        elif kind == "sleep":
            seconds = rng.choice([0, 0.5, 1, 2])
            sleepers.append(cluster.submit("sleep", {"seconds": seconds}, Expected("succeeded")))
        else:
            cluster.submit("fail", {}, Expected("failed", exit_code=3))

    faults = {"kill9": 0, "sigstop": 0, "sigterm": 0, "container_removed": 0, "api_kill9": 0}
    synced: list[uuid.UUID] = []
    removed: set[object] = set()
    deadline = time.monotonic() + 150
    restarts = 0
    while time.monotonic() < deadline:
        if (
            all(
                cluster.status(r) in ("succeeded", "failed", "timed_out", "cancelled")
                for r in list(cluster.accepted)[-20:]
            )
            and sum(faults.values()) >= 12
        ):
            break
        time.sleep(rng.uniform(0.5, 1.5))
        # A sync run or two each round, inline in an API process that may be killed next.
        last_api = rng.choice(APIS)
        for _ in range(rng.choice([1, 2]) if sum(faults.values()) < 12 else 0):
            last_api = rng.choice(APIS)
            seconds = rng.choice([0.5, 1, 2])
            run_id = cluster.submit_sync(
                last_api, "sleep", {"seconds": seconds}, Expected("succeeded")
            )
            if run_id is not None:
                synced.append(run_id)
        victim = rng.choice(WORKERS)
        action = rng.choice(
            ["kill9", "kill9", "sigstop", "sigterm", "container_removed", "api_kill9"] * 2
            + ["api_kill9"]
        )
        if action == "api_kill9":
            # The API that was just given a run: killed with it in flight.
            cluster.kill9(last_api)
            cluster.start_api(last_api)
        elif action == "kill9":
            cluster.kill9(victim)
            restarts += 1
            cluster.start_worker(victim, concurrency=2)
        elif action == "sigterm":
            cluster.signal(victim, signal.SIGTERM)
            cluster.wait_exit(victim, timeout=30)
            cluster.start_worker(victim, concurrency=2)
        elif action == "sigstop":
            cluster.signal(victim, signal.SIGSTOP)
            time.sleep(rng.uniform(1.0, 4.5))  # sometimes past the 3 s lease
            cluster.signal(victim, signal.SIGCONT)
        else:
            running = [
                r
                for r in sleepers
                if r not in removed
                and cluster.container_state(r, cluster.run_row(r).attempts) == "running"
            ]
            if not running:
                continue
            target = rng.choice(running)
            attempt = cluster.run_row(target).attempts
            try:
                cluster.docker_client.containers.get(f"runyard-{target}-{attempt}").remove(
                    force=True
                )
            except Exception:
                continue
            removed.add(target)
        faults[action] += 1

    # A kill -9 can land between create and start of a one-attempt tool: that run then fails
    # as container_lost, which is the right outcome, not a lost run.
    cluster.drain(timeout=120)
    for run_id, expected in cluster.accepted.items():
        row = cluster.run_row(run_id)
        if row.error_code == "container_lost" and expected.max_attempts == row.attempts:
            cluster.accepted[run_id] = Expected("failed", max_attempts=expected.max_attempts)
        # A sync run whose API process died before its container was made: never retried.
        if row.error_code == "api_lost" and run_id in synced:
            cluster.accepted[run_id] = Expected("failed")
    figures = cluster.check_invariants(leak_timeout=30)
    recovery = longest_recovery_seconds(cluster)
    lost = sum(1 for r in cluster.accepted if cluster.run_row(r).error_code == "container_lost")
    # Every tool here prints: an attempt whose output reached the event log really executed.
    with cluster.engine.connect() as conn:
        executed = conn.execute(
            text(
                "SELECT run_id, count(DISTINCT data->>'attempt') AS n FROM tool_run_events "
                "WHERE type IN ('stdout', 'stderr') GROUP BY run_id"
            )
        ).all()
    re_executed = sum(max(0, int(r.n) - 1) for r in executed)
    duplicates = re_executed - len(removed)  # a container removed by hand must run again
    print(  # noqa: T201
        f"\nsoak: runs={figures['runs']} faults={faults} worker_restarts={restarts} "
        f"extra_attempts={figures['extra_attempts']} container_lost={lost} "
        f"re_executed={re_executed} duplicates_executed={max(duplicates, 0)} "
        f"longest_recovery={recovery:.1f}s sync_runs={len(synced)}"
    )
    assert figures["runs"] == RUNS + len(synced) and synced
    if faults["api_kill9"]:
        assert any(cluster.run_row(r).adoptions for r in synced), "no sync run was adopted"
    assert sum(faults.values()) >= 12
    assert duplicates <= 0, "a tool ran again without its container being lost"
