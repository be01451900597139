"""The crash matrix: real worker processes killed, paused and cut off at the worst moments."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import text

from runyard.platform.faults import AFTER_CREATE, BEFORE_FINALIZE
from tests.acceptance.cluster import Cluster, Expected, events_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

LONG = "echo start; sleep 3; echo end; exit 7"


def test_kill9_while_container_runs__adopted_not_restarted(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1)
    run_id = cluster.submit("shell", {"script": LONG}, Expected("failed", exit_code=7))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    cluster.kill9("w1")
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    row = cluster.run_row(run_id)
    assert row.attempts == 1 and row.adoptions == 1
    assert row.stdout.count("start") == 1  # the container was not restarted


def test_kill9_after_exit_before_finalize__finalized_once_from_container(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1, fault=BEFORE_FINALIZE)
    run_id = cluster.submit("echo", {"k": "v"}, Expected("succeeded", 0, {"k": "v"}, 1, True))
    assert cluster.wait_exit("w1", timeout=60) == 137  # died at the fault point
    assert cluster.container_state(run_id) == "exited"
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    assert cluster.run_row(run_id).adoptions == 1


def test_kill9_between_create_and_start__no_second_container(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1, fault=AFTER_CREATE)
    run_id = cluster.submit("sleep", {"seconds": 0}, Expected("succeeded"))
    assert cluster.wait_exit("w1", timeout=60) == 137
    assert cluster.container_state(run_id, 1) == "created"
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    row = cluster.run_row(run_id)
    # Attempt 1 never ran: its container was removed, the run went on as attempt 2.
    assert row.attempts == 2 and row.stdout.count("sleeping") == 1
    assert [t for t, _ in events_of(cluster.engine, run_id)].count("requeued") == 1


def test_sigstop_past_lease__stale_worker_changes_nothing(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1)
    run_id = cluster.submit("shell", {"script": LONG}, Expected("failed", exit_code=7))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    cluster.signal("w1", signal.SIGSTOP)
    cluster.start_worker("w2", concurrency=1)
    cluster.wait_for(lambda: cluster.status(run_id) == "failed", 60, "adopter to finish")
    cluster.signal("w1", signal.SIGCONT)
    time.sleep(1.5)  # give the stale worker a heartbeat or two to try its luck
    cluster.check_invariants()
    assert "lease" in cluster.log_of("w1")
    row = cluster.run_row(run_id)
    assert row.adoptions == 1 and row.stdout.count("start") == 1


def test_container_removed_by_hand__requeued_and_retried(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1)
    # Long enough that the removal below always meets a running container, even under load.
    run_id = cluster.submit("sleep", {"seconds": 8}, Expected("succeeded"))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    cluster.docker_client.containers.get(f"runyard-{run_id}-1").remove(force=True)
    cluster.check_invariants()
    assert cluster.run_row(run_id).attempts == 2


def test_container_removed_by_hand__fails_when_attempts_exhausted(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1)
    run_id = cluster.submit("shell", {"script": LONG}, Expected("failed"))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    cluster.docker_client.containers.get(f"runyard-{run_id}-1").remove(force=True)
    cluster.check_invariants()
    assert cluster.run_row(run_id).error_code == "container_lost"


def test_sigterm_with_three_long_tools__handed_over_none_restarted(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=3)
    runs = [
        cluster.submit("sleep", {"seconds": 4}, Expected("succeeded", 0, {"slept": True}, 3, True))
        for _ in range(3)
    ]
    cluster.wait_for(
        lambda: all(cluster.container_state(r) == "running" for r in runs), 30, "containers"
    )
    cluster.signal("w1", signal.SIGTERM)
    assert cluster.wait_exit("w1", timeout=20) == 0
    with cluster.engine.connect() as conn:
        unleased = conn.execute(
            text(
                "SELECT count(*) FROM tool_run_jobs"
                " WHERE status = 'running' AND locked_until IS NULL"
            )
        ).scalar_one()
    assert unleased == 3  # released at once, not left to expire
    assert all(cluster.container_state(r) == "running" for r in runs)  # tools kept running
    cluster.start_worker("w2", concurrency=3)
    cluster.wait_for(
        lambda: all(cluster.run_row(r).adoptions == 1 for r in runs), 30, "adoption of all three"
    )
    cluster.check_invariants()
    for r in runs:
        row = cluster.run_row(r)
        assert row.attempts == 1 and row.stdout.count("sleeping") == 1
    # Handed over, not recovered: each lease was given back, none was left to expire. The test
    # bounds no duration; timing targets live in the benchmarks.
    with cluster.engine.connect() as conn:
        kinds = conn.execute(
            text(
                "SELECT type, count(*) FROM tool_run_events"
                " WHERE run_id = ANY(:runs) AND type IN ('released', 'lease_expired')"
                " GROUP BY type"
            ),
            {"runs": runs},
        ).all()
    assert dict(kinds) == {"released": 3}


def test_database_connections_killed_mid_run__worker_reconnects(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=2)
    runs = [cluster.submit("sleep", {"seconds": 2}, Expected("succeeded")) for _ in range(2)]
    cluster.wait_for(
        lambda: all(cluster.container_state(r) == "running" for r in runs), 30, "containers"
    )
    with cluster.engine.connect() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
        conn.commit()
    assert killed >= 1
    more = [cluster.submit("echo", {"n": i}, Expected("succeeded")) for i in range(3)]
    cluster.check_invariants()
    assert cluster.procs["w1"].poll() is None  # it kept running
    assert len(more) == 3


# --- sync mode: the API process that runs a tool inline dies --------------------------------


def test_sync_kill9_while_container_runs__adopted_by_another_api_not_restarted(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_api("a1")
    run_id = cluster.submit_sync("a1", "shell", {"script": LONG}, Expected("failed", exit_code=7))
    assert run_id is not None
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    cluster.kill9("a1")
    cluster.start_api("a2")
    cluster.check_invariants()
    row = cluster.run_row(run_id)
    assert row.attempts == 1 and row.adoptions == 1 and row.claims == 1
    assert row.stdout.count("start") == 1  # the container was not restarted
    kinds = [kind for kind, _ in events_of(cluster.engine, run_id)]
    assert "requeued" not in kinds  # nothing ever waits in a queue in sync mode


def test_sync_kill9_after_exit_before_finalize__finalized_once_by_another_api(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_api("a1", fault=BEFORE_FINALIZE)
    expected = Expected("succeeded", 0, {"k": "v"}, 1, True)
    run_id = cluster.submit_sync("a1", "echo", {"k": "v"}, expected)
    assert run_id is not None
    assert cluster.wait_exit("a1", timeout=60) == 137  # died at the fault point
    assert cluster.container_state(run_id) == "exited"
    assert cluster.status(run_id) == "running"
    cluster.start_api("a2")
    cluster.check_invariants()
    assert cluster.run_row(run_id).adoptions == 1
