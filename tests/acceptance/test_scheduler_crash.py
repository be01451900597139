"""Three schedulers (reaper processes) killed with SIGKILL at random through two minutes of
one-second schedules: every slot has exactly one run, as the database shows."""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from runyard.domain.schedule_slots import CatchUp
from runyard.schedules.store import NewSchedule, Schedules
from tests.acceptance.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCHEDULERS = ("sched-a", "sched-b", "sched-c")
SECONDS = 120
# The reapers do little else: their scheduler passes come five times a second.
ENV = {"RUNYARD_SCHEDULER_INTERVAL_SECONDS": "0.2", "RUNYARD_REAPER_INTERVAL_SECONDS": "5"}


def test_schedulers_killed_at_random__every_slot_has_exactly_one_run(cluster: Cluster):
    with cluster.engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
    start = now + timedelta(seconds=3)
    store = Schedules(cluster.engine, cluster.registry, max_per_tenant=0)
    schedules = [
        store.create(
            NewSchedule(
                "acceptance",
                "echo",
                {"n": n},
                None,
                1,
                start_at=start,
                end_at=start + timedelta(seconds=SECONDS - 1),
                catch_up=CatchUp.ALL,
            ),
            now=now,
        )
        for n in range(3)
    ]
    for name in SCHEDULERS:
        cluster.start_reaper(name, **ENV)
    chaos = random.Random()
    kills = 0
    ends = time.monotonic() + SECONDS + 5
    while time.monotonic() < ends:
        time.sleep(chaos.uniform(0.3, 2.5))
        name = chaos.choice(SCHEDULERS)
        cluster.kill9(name)
        kills += 1
        cluster.start_reaper(name, **ENV)

    def finished() -> bool:
        with cluster.engine.connect() as conn:
            return not conn.execute(
                text("SELECT count(*) FROM schedules WHERE next_slot_at IS NOT NULL")
            ).scalar_one()

    cluster.wait_for(finished, 60, "the schedulers to fire every slot")
    with cluster.engine.connect() as conn:
        rows = conn.execute(
            text(
                """
                SELECT schedule_id, count(*) AS runs, count(DISTINCT schedule_slot) AS slots,
                       min(schedule_slot) AS first, max(schedule_slot) AS last
                FROM tool_runs WHERE schedule_id IS NOT NULL GROUP BY schedule_id
                """
            )
        ).all()
    found = {row.schedule_id: row for row in rows}
    assert kills >= 30
    for schedule in schedules:
        row = found[schedule.id]
        assert (row.runs, row.slots) == (SECONDS, SECONDS), cluster.diagnostics()
        assert (row.first, row.last) == (start, start + timedelta(seconds=SECONDS - 1))
