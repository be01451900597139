"""Workers that can no longer renew their leases step down in time, and their runs finish
exactly once elsewhere: a black-holed database connection, a heartbeat thread that raises, a
SIGTERM between the start mark and the container's create."""

from __future__ import annotations

import functools
import signal
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime

import docker
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from runyard.platform.faults import BEFORE_CREATE, HEARTBEAT_ERROR
from tests.acceptance.cluster import FAST_TIMINGS, RUN_LABEL, TERMINAL, Cluster, Expected, events_of
from tests.tcp_proxy import BlackHoleProxy

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240), pytest.mark.solo]

LEASE = float(FAST_TIMINGS["RUNYARD_LEASE_SECONDS"])
HEARTBEAT = float(FAST_TIMINGS["RUNYARD_HEARTBEAT_SECONDS"])
LONG = "echo start; sleep 6; echo end; exit 7"


def _last_write(cluster: Cluster, run_id: uuid.UUID) -> datetime:
    """When the job row was last written (the owner's last renewal, or later)."""
    with cluster.engine.connect() as conn:
        written: datetime = conn.execute(
            text("SELECT updated_at FROM tool_run_jobs WHERE run_id = :id"), {"id": run_id}
        ).scalar_one()
    return written


def test_database_black_holed_mid_run__owner_steps_down_in_time_another_finishes_once(
    cluster: Cluster,
):
    url = make_url(cluster.database_url)
    assert url.host is not None and url.port is not None
    proxy = BlackHoleProxy(url.host, url.port)
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        cluster.start_reaper()
        cluster.start_worker("w1", concurrency=1, RUNYARD_DATABASE_URL=proxied)
        run_id = cluster.submit("shell", {"script": LONG}, Expected("failed", exit_code=7))
        cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
        proxy.black_hole()
        time.sleep(0.3)  # a statement already past the proxy lands; no later one can
        last_renewal = _last_write(cluster, run_id)
        cluster.start_worker("w2", concurrency=1)
        cluster.wait_for(
            lambda: "attempt left to its next owner" in cluster.log_of("w1"), 15, "w1 to step down"
        )
        stepped_down = datetime.now(UTC)
        # Seen within one poll of the log (0.1 s) after the fact.
        assert (stepped_down - last_renewal).total_seconds() <= LEASE + HEARTBEAT + 0.2
        cluster.check_invariants()
        row = cluster.run_row(run_id)
        assert row.adoptions == 1 and row.stdout.count("start") == 1  # never restarted
        assert "leases could not be renewed in time" in cluster.log_of("w1")

        # Whatever w1 still had on the wire reaches Postgres now, and changes nothing.
        proxy.heal()
        cluster.wait_for(
            lambda: "claims resume" in cluster.log_of("w1"), 30, "w1 to heal and claim again"
        )
        assert cluster.run_row(run_id).finals == 1
    finally:
        proxy.close()


def test_heartbeat_thread_raising__worker_hands_over_and_another_finishes_once(
    cluster: Cluster,
):
    cluster.start_reaper()
    # Lease 6 s, rounds every second, a 2 s margin: the hand-over (at 4 s) comes well before
    # the reaper could find the lease expired (at 6 s).
    cluster.start_worker(
        "w1",
        concurrency=1,
        fault=HEARTBEAT_ERROR,
        RUNYARD_LEASE_SECONDS="6",
        RUNYARD_HEARTBEAT_TIMEOUT_SECONDS="2",
    )
    run_id = cluster.submit("shell", {"script": LONG}, Expected("failed", exit_code=7))
    cluster.wait_for(lambda: cluster.container_state(run_id) == "running", 30, "container")
    cluster.start_worker("w2", concurrency=1)
    cluster.check_invariants()
    row = cluster.run_row(run_id)
    assert row.adoptions == 1 and row.stdout.count("start") == 1
    types = [kind for kind, _ in events_of(cluster.engine, run_id)]
    # Handed over with a release (not left to expire), then adopted by w2.
    assert "released" in types and types.index("released") < types.index("adopted")
    assert "lease_expired" not in types
    log = cluster.log_of("w1")
    assert "heartbeat round failed" in log and "InjectedFault" in log
    assert "handing 1 run(s) over" in log
    assert cluster.procs["w1"].poll() is None  # the worker lives on, claims paused


def _logged(cluster: Cluster, name: str, line: str) -> bool:
    return line in cluster.log_of(name)


def _finished(cluster: Cluster, run_id: uuid.UUID) -> bool:
    return cluster.status(run_id) in TERMINAL


class ContainerWatch:
    """Polls the engine for every labelled container; remembers the most any run had."""

    def __init__(self, client: docker.DockerClient) -> None:
        self._client = client
        self._stop = threading.Event()
        self.most: Counter[str] = Counter()
        self.polls = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        label = {"label": "io.runyard.managed=true"}
        while not self._stop.is_set():
            containers = self._client.api.containers(all=True, filters=label)
            now = Counter((c.get("Labels") or {}).get(RUN_LABEL, "") for c in containers)
            for run, n in now.items():
                self.most[run] = max(self.most[run], n)
            self.polls += 1
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_sigterm_between_start_mark_and_create_20_times__never_two_containers_of_a_run(
    cluster: Cluster,
):
    watch = ContainerWatch(cluster.docker_client)
    try:
        # 20 hand-overs in 4 rounds of 5 workers, each paused at its own fault point.
        for round_ in range(4):
            names = [f"paused-{round_}-{i}" for i in range(5)]
            pauses = [cluster.logs / f"pause-{name}" for name in names]
            for pause in pauses:
                pause.touch()
            run_ids = [
                cluster.submit(
                    "sleep", {"seconds": 0}, Expected("succeeded", 0, {"slept": True}, 3, True)
                )
                for _ in names
            ]
            for name, pause in zip(names, pauses, strict=True):
                cluster.start_worker(
                    name, concurrency=1, fault=BEFORE_CREATE, RUNYARD_FAULT_PAUSE_FILE=str(pause)
                )
            for name in names:
                cluster.wait_for(
                    functools.partial(_logged, cluster, name, "fault injected: pausing"),
                    30,
                    "the start mark",
                )
                cluster.signal(name, signal.SIGTERM)
            # The leases are released at once: another worker takes the runs over while the
            # stopped ones still sit between their start marks and their creates.
            finisher = f"finisher-{round_}"
            cluster.start_worker(finisher, concurrency=5)
            for run_id in run_ids:
                cluster.wait_for(
                    functools.partial(_finished, cluster, run_id), 60, "the run to finish elsewhere"
                )
            for pause in pauses:
                pause.unlink()
            for name in names:
                assert cluster.wait_exit(name, timeout=30) == 0
                assert "attempt left to its next owner" in cluster.log_of(name)
            for run_id in run_ids:
                assert cluster.container_state(run_id, 1) is None  # the stopped ones made none
            cluster.signal(finisher, signal.SIGTERM)
            assert cluster.wait_exit(finisher, timeout=30) == 0
        time.sleep(0.2)  # a last poll or two
    finally:
        watch.stop()
    assert watch.polls > 20
    runs = {str(r) for r in cluster.accepted}
    assert all(watch.most[r] <= 1 for r in runs), dict(watch.most)
    cluster.check_invariants()
