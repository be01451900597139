"""An engine that stops answering: for a minute, and for good (a second dockerd of our own)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from runyard.runners.docker.labels import LABEL_RUN_ID
from tests.acceptance.cluster import FAST_TIMINGS, Cluster, Expected, events_of
from tests.acceptance.second_engine import SecondEngine

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300), pytest.mark.solo]

NAME = "runyard-engine-h"
OUTAGE_SECONDS = 60  # the acceptance text asks for a one-minute outage
# Probes back off to 2 s at most here, so the engine's return is seen within about 2 s.
SICK_ENV = {"RUNYARD_ENGINE_BACKOFF_BASE_SECONDS": "0.5", "RUNYARD_ENGINE_BACKOFF_MAX_SECONDS": "2"}


@pytest.fixture
def engine_lr(tmp_path: Path) -> Iterator[SecondEngine]:
    """A second engine with live-restore: its containers outlive a stop of dockerd."""
    engine = SecondEngine(NAME, tmp_path, live_restore=True)
    try:
        engine.start()
        yield engine
    finally:
        engine.close()


@pytest.fixture
def engine_mortal(tmp_path: Path) -> Iterator[SecondEngine]:
    """A second engine without live-restore: stopping dockerd kills its containers."""
    engine = SecondEngine(NAME, tmp_path, live_restore=False)
    try:
        engine.start()
        yield engine
    finally:
        engine.close()


def db_now(cluster: Cluster) -> datetime:
    with cluster.engine.connect() as conn:
        found: datetime = conn.execute(text("SELECT now()")).scalar_one()
    return found


def events_between(
    cluster: Cluster, run_ids: list[uuid.UUID], since: datetime, until: datetime
) -> dict[uuid.UUID, list[str]]:
    with cluster.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, type FROM tool_run_events WHERE run_id = ANY(:ids)"
                " AND at >= :since AND at <= :until ORDER BY id"
            ),
            {"ids": run_ids, "since": since, "until": until},
        ).all()
    found: dict[uuid.UUID, list[str]] = {run_id: [] for run_id in run_ids}
    for row in rows:
        found[row.run_id].append(row.type)
    return found


def last_seen(cluster: Cluster, *worker_ids: str) -> datetime:
    with cluster.engine.connect() as conn:
        found: datetime = conn.execute(
            text("SELECT max(last_seen_at) FROM workers WHERE id = ANY(:ids)"),
            {"ids": list(worker_ids)},
        ).scalar_one()
    return found


def claimed_by(cluster: Cluster, run_id: uuid.UUID, worker_id: str) -> int:
    """How many attempts of the run ``worker_id`` started (claims, not adoptions)."""
    with cluster.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM tool_run_events WHERE run_id = :id"
                    " AND type = 'claimed' AND data->>'worker_id' = :worker"
                ),
                {"id": run_id, "worker": worker_id},
            ).scalar_one()
        )


def engine_holds_nothing_of(engine: SecondEngine, run_ids: list[uuid.UUID]) -> bool:
    ours = {str(r) for r in run_ids}
    containers = engine.client.api.containers(all=True, filters={"label": LABEL_RUN_ID})
    return not [c for c in containers if (c.get("Labels") or {}).get(LABEL_RUN_ID) in ours]


def test_engine_stopped_60s__every_run_succeeds_uncharged_with_few_events(
    cluster: Cluster, engine_lr: SecondEngine
):
    env = {"DOCKER_HOST": engine_lr.host, **SICK_ENV}
    cluster.start_reaper()
    cluster.start_worker("w1", concurrency=1, **env)
    cluster.start_worker("w2", concurrency=1, **env)
    # One tool ends while the engine is away (max_attempts 1), one runs on past its return.
    ends_inside = cluster.submit(
        "shell", {"script": "echo start; sleep 4; echo end"}, Expected("succeeded")
    )
    outlives = cluster.submit("sleep", {"seconds": OUTAGE_SECONDS + 4}, Expected("succeeded"))
    in_flight = [ends_inside, outlives]

    def started(run_id: uuid.UUID) -> bool:
        found = engine_lr.client.api.containers(filters={"name": f"runyard-{run_id}-1"})
        return bool(found) and found[0]["State"] == "running"

    cluster.wait_for(lambda: all(started(r) for r in in_flight), 60, "both tools to run")
    queued = [
        cluster.submit("echo", {"n": n}, Expected("succeeded", result={"n": n}, check_result=True))
        for n in range(10)
    ]
    everything = in_flight + queued

    down_from = db_now(cluster)
    engine_lr.stop()
    time.sleep(OUTAGE_SECONDS)
    down_until = db_now(cluster)
    # Alive all along, but not reported alive: the reaper could have moved their runs.
    assert all(cluster.procs[w].poll() is None for w in ("w1", "w2"))
    lease = float(FAST_TIMINGS["RUNYARD_LEASE_SECONDS"])
    assert (last_seen(cluster, "w1", "w2") - down_from).total_seconds() < lease
    assert all(cluster.status(r) == "queued" for r in queued)
    engine_lr.start()

    figures = cluster.check_invariants()
    assert figures["runs"] == 12
    for run_id in everything:
        row = cluster.run_row(run_id)
        assert (row.status, row.attempts, row.error_code) == ("succeeded", 1, None), run_id
        # A claim made as the engine went away may have been given back: never charged.
        requeues = [data for kind, data in events_of(cluster.engine, run_id) if kind == "requeued"]
        assert all(data.get("unstarted") for data in requeues), (run_id, requeues)
    for run_id in in_flight:
        assert (
            cluster.run_row(run_id).stdout.count("start" if run_id == ends_inside else "sleeping")
            == 1
        )
    written = events_between(cluster, everything, down_from, down_until)
    assert max(len(kinds) for kinds in written.values()) < 20, written
    # Once the engine is gone (a stopping dockerd still answers some calls for a moment),
    # nothing is written for any run: no adoption-and-release churn while it is away.
    gone = down_from + timedelta(seconds=10)
    assert not any(events_between(cluster, everything, gone, down_until).values())
    for worker in ("w1", "w2"):
        log = cluster.log_of(worker)
        assert '"action": "engine_down"' in log and '"action": "engine_up"' in log
    cluster.wait_for(lambda: engine_holds_nothing_of(engine_lr, everything), 30, "cleanup on H")


def test_engine_gone_for_good__its_runs_end_on_the_live_engine_once(
    cluster: Cluster, engine_mortal: SecondEngine
):
    dead_after = 4.0
    lease = float(FAST_TIMINGS["RUNYARD_LEASE_SECONDS"])
    cluster.start_reaper(RUNYARD_ENGINE_DEAD_AFTER_SECONDS=str(dead_after))
    cluster.start_worker("wh", concurrency=2, DOCKER_HOST=engine_mortal.host, **SICK_ENV)
    begun = [cluster.submit("sleep", {"seconds": 8}, Expected("succeeded")) for _ in range(2)]

    def started_on_h(run_id: uuid.UUID) -> bool:
        found = engine_mortal.client.api.containers(filters={"name": f"runyard-{run_id}-1"})
        return bool(found) and found[0]["State"] == "running"

    cluster.wait_for(lambda: all(started_on_h(r) for r in begun), 60, "both tools to run on H")
    cluster.start_worker("wa", concurrency=2)  # the machine's own engine: alive throughout

    gone_at = time.monotonic()
    engine_mortal.stop()  # no live-restore: its containers die with it
    queued = [cluster.submit("echo", {"n": n}, Expected("succeeded")) for n in range(4)]
    everything = begun + queued
    bound = dead_after + lease + 10
    cluster.wait_for(
        lambda: all(claimed_by(cluster, r, "wa") >= 1 for r in everything),
        bound - (time.monotonic() - gone_at),
        f"every run of the dead engine on the live one within {bound} s",
    )
    cluster.check_invariants()
    assert cluster.procs["wh"].poll() is None  # its worker lives on, probing, claiming nothing
    for run_id in everything:
        row = cluster.run_row(run_id)
        assert claimed_by(cluster, run_id, "wa") == 1, run_id  # ran once on the live engine
        # Charged only where a container had begun on the dead engine.
        assert row.attempts == (2 if run_id in begun else 1), run_id
        assert claimed_by(cluster, run_id, "wh") == (1 if run_id in begun else 0), run_id
    assert '"action": "engine_down"' in cluster.log_of("wh")
