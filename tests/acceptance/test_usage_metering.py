"""Usage is recorded once per attempt whatever dies when: an owner killed between its usage
and its finalize, and 200 runs with a worker killed twice while they run."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from runyard.platform.faults import AFTER_USAGE
from tests.acceptance.cluster import Cluster, Expected

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]


def usage_rows(cluster: Cluster) -> dict[uuid.UUID, list[int]]:
    """The attempts metered, by run."""
    with cluster.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT run_id, attempt FROM attempt_usage ORDER BY run_id, attempt")
        ).all()
    found: dict[uuid.UUID, list[int]] = {}
    for row in rows:
        found.setdefault(row.run_id, []).append(row.attempt)
    return found


def totals(cluster: Cluster) -> Any:
    with cluster.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT t.attempts, t.cpu_seconds,"
                " (SELECT count(*) FROM attempt_usage u WHERE u.tenant = t.tenant) AS records,"
                " (SELECT sum(cpu_seconds) FROM attempt_usage u WHERE u.tenant = t.tenant)"
                " AS cpu FROM tenant_usage_totals t WHERE t.tenant = 'acceptance'"
            )
        ).one()


def check_one_record_per_attempt(cluster: Cluster) -> dict[uuid.UUID, list[int]]:
    """Every run's last attempt metered once, no attempt it never made, totals counted once."""
    metered = usage_rows(cluster)
    for run_id in cluster.accepted:
        attempts = cluster.run_row(run_id).attempts
        got = metered.get(run_id, [])
        assert attempts in got, (run_id, attempts, got)
        assert all(1 <= attempt <= attempts for attempt in got), (run_id, attempts, got)
    assert set(metered) <= set(cluster.accepted)
    summed = totals(cluster)
    assert summed.attempts == summed.records == sum(len(a) for a in metered.values())
    assert summed.cpu_seconds == pytest.approx(summed.cpu)
    return metered


def test_owner_killed_after_its_usage__the_adopter_adds_nothing(cluster: Cluster):
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1, fault=AFTER_USAGE)
    run_id = cluster.submit("sleep", {"seconds": 0.5}, Expected("succeeded"))
    assert cluster.wait_exit("w1", timeout=60) == 137  # died after recording the usage
    assert usage_rows(cluster) == {run_id: [1]}
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    assert cluster.run_row(run_id).adoptions == 1
    assert check_one_record_per_attempt(cluster) == {run_id: [1]}


@pytest.mark.slow  # 200 containers, two workers, one of them killed twice
def test_200_runs_with_a_worker_killed_twice__one_record_per_attempt(cluster: Cluster):
    rng = random.Random(22)
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=4)
    cluster.start_worker("w2", concurrency=4)
    for _ in range(200):
        cluster.submit("sleep", {"seconds": rng.choice([0, 0.5, 1])}, Expected("succeeded"))
    for kill_after in (50, 120):

        def metered_enough(n: int = kill_after) -> bool:
            return len(usage_rows(cluster)) >= n

        cluster.wait_for(metered_enough, 240, f"{kill_after} runs metered")
        cluster.kill9("w1")
        cluster.start_worker("w1", concurrency=4)
    cluster.check_invariants(leak_timeout=60)
    metered = check_one_record_per_attempt(cluster)
    assert len(metered) == 200
    assert any(cluster.run_row(r).adoptions for r in cluster.accepted), "nothing was adopted"
