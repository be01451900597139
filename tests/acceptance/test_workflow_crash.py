"""A diamond-shaped batch survives ``kill -9`` of its worker and of the reaper mid-flight:
every run ends once, from one container, in the order of its dependencies."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx2
import pytest
from sqlalchemy import text

from tests.acceptance.cluster import RUN_LABEL, Cluster, Expected

# Solo: it waits for a moment with every held attempt settled, which a CPU shared with other
# clusters makes rare.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(240), pytest.mark.solo]

WIDTH = 48  # source -> 48 in parallel -> sink: 50 runs
# The middle runs become ready together when the source ends, so they run in waves of SLOTS
# that start and end close together: 4 s of sleep leaves each wave a moment in which every
# container of the worker runs, which is when it can be killed without an attempt in between
# its start mark and its container's start (losing it there rightly costs a second attempt).
SLOTS = 12
MIDDLE_SECONDS = 4


def _diamond() -> dict[str, Any]:
    middle = [f"m{i}" for i in range(WIDTH)]
    runs: list[dict[str, Any]] = [{"ref": "source", "tool": "sleep", "input": {"seconds": 0.5}}]
    runs += [
        {
            "ref": ref,
            "tool": "sleep",
            "input": {"seconds": MIDDLE_SECONDS},
            "depends_on": ["source"],
        }
        for ref in middle
    ]
    runs.append({"ref": "sink", "tool": "sleep", "input": {"seconds": 0.5}, "depends_on": middle})
    return {"runs": runs}


def _jobs(cluster: Cluster, ids: list[uuid.UUID]) -> list[Any]:
    with cluster.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT run_id, CAST(status AS text) AS status, locked_by,"
                    " container_requested_at IS NOT NULL AS requested, attempts"
                    " FROM tool_run_jobs WHERE run_id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": ids},
            ).all()
        )


def _safe_to_kill(cluster: Cluster, runs: dict[str, uuid.UUID], worker: str) -> object:
    """Mid-flight, and every attempt the (stopped) worker holds is either not yet asked for a
    container or has one that runs or ran: no attempt sits between its start mark and its
    container's start, where losing the owner rightly costs a second attempt. The state seen
    (to compare with a second look), or None when it is not safe."""
    jobs = {job.run_id: job for job in _jobs(cluster, list(runs.values()))}
    if jobs[runs["source"]].status != "succeeded" or jobs[runs["sink"]].status != "queued":
        return None
    mine = [job for job in jobs.values() if job.status == "running" and job.locked_by == worker]
    held = sorted((str(job.run_id), job.requested) for job in mine)
    states = [cluster.container_state(job.run_id) for job in mine if job.requested]
    queued = sum(1 for job in jobs.values() if job.status == "queued")
    safe = (
        "running" in states
        and all(state in ("running", "exited") for state in states)
        and queued > 1  # some middle runs still wait for a slot, the sink for them all
    )
    return (held, states, queued) if safe else None


class ContainerCreates:
    """Containers the engine creates for managed runs, counted per run as they happen, from
    its event stream (the engine keeps only its last events, so they are not read back later;
    a container removed since still counts)."""

    def __init__(self, cluster: Cluster) -> None:
        self.counts: Counter[str] = Counter()
        self._stream = cluster.docker_client.events(
            since=int(time.time()) - 1,
            filters={"type": "container", "event": "create", "label": "io.runyard.managed=true"},
            decode=True,
        )
        self._thread = threading.Thread(target=self._follow, name="creates", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends when it is closed
            for event in self._stream:
                run = (event.get("Actor", {}).get("Attributes") or {}).get(RUN_LABEL)
                if run:
                    self.counts[run] += 1

    def close(self) -> Counter[str]:
        """Stop following (again: a no-op); the counts so far."""
        with contextlib.suppress(Exception):
            self._stream.close()
        self._thread.join(timeout=10)
        return self.counts


@pytest.fixture
def creates(cluster: Cluster) -> Iterator[ContainerCreates]:
    """The engine's container creates, followed from before the test starts anything."""
    follower = ContainerCreates(cluster)
    try:
        yield follower
    finally:
        follower.close()


def test_diamond_batch__kill9_worker_and_reaper_mid_flight__every_run_once(
    cluster: Cluster, creates: ContainerCreates
):
    cluster.start_api("api", RUNYARD_QUEUE_ENABLED="true")
    cluster.start_reaper("reaper")
    cluster.start_worker("w1", concurrency=SLOTS)
    base = f"http://127.0.0.1:{cluster.ports['api']}/v1/batches"
    answer = httpx2.post(base, json=_diamond(), timeout=30)
    assert answer.status_code == 202, answer.text
    batch_id = answer.json()["id"]
    runs = {ref: uuid.UUID(run_id) for ref, run_id in answer.json()["run_ids"].items()}
    assert len(runs) == WIDTH + 2
    for run_id in runs.values():
        cluster.accepted[run_id] = Expected("succeeded", exit_code=0, max_attempts=1)

    def stopped_safely() -> bool:
        cluster.signal("w1", signal.SIGSTOP)
        # A Docker request or a start mark already sent lands meanwhile; two looks that agree
        # tell the state has settled (on a loaded machine a commit can take longer).
        time.sleep(0.3)
        first = _safe_to_kill(cluster, runs, "w1")
        time.sleep(0.5)
        if first is not None and first == _safe_to_kill(cluster, runs, "w1"):
            return True
        cluster.signal("w1", signal.SIGCONT)
        time.sleep(0.2)
        return False

    cluster.wait_for(stopped_safely, 60, "the worker mid-flight, between two Docker steps")
    cluster.kill9("reaper")
    cluster.kill9("w1")
    in_flight = {job.run_id for job in _jobs(cluster, list(runs.values())) if job.locked_by}
    # A new worker first, with no reaper: it takes the waiting runs while the dead worker's
    # leases run out with nobody to clear them; then a new reaper hands those over.
    cluster.start_worker("w2", concurrency=SLOTS)
    cluster.wait_for(
        lambda: any(job.locked_by == "w2" for job in _jobs(cluster, list(runs.values()))),
        60,
        "the new worker taking waiting runs",
    )
    cluster.start_reaper("reaper2")

    figures = cluster.check_invariants()  # all succeeded, one finalize each, attempts == 1

    assert figures["runs"] == WIDTH + 2
    batch = httpx2.get(f"{base}/{batch_id}", timeout=10).json()
    assert batch["status"] == "succeeded" and batch["counts"] == {"succeeded": WIDTH + 2}
    time.sleep(0.5)  # the last create events reach the follower
    created = creates.close()
    ours = Counter({run: n for run, n in created.items() if uuid.UUID(run) in runs.values()})
    assert ours == Counter({str(r): 1 for r in runs.values()})  # one container per run, ever
    adopted = 0
    for ref, run_id in runs.items():
        row = cluster.run_row(run_id)
        context = f"{ref} {run_id}: {dict(row._mapping)}"
        assert row.attempts == 1 and row.stdout.count("sleeping") == 1, context
        adopted += int(row.adoptions)
    assert in_flight and adopted >= 1  # the dead worker's containers were adopted, not re-run
    with cluster.engine.connect() as conn:
        order = conn.execute(
            text(
                "SELECT r.ref, r.started_at, r.finished_at FROM tool_runs r"
                " WHERE r.id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": list(runs.values())},
        ).all()
    times = {row.ref: row for row in order}
    middles = [times[f"m{i}"] for i in range(WIDTH)]
    # A claim can only see a run made ready by a commit before its statement's snapshot, but
    # the time it writes is its transaction's start, taken before the statement is parsed and
    # planned: on a loaded machine a dependency's end may commit in between, so its end can
    # read a little later than the dependent's start. Runs claimed early would start before
    # the dependency even ran (0.5 s), far outside this margin.
    margin = timedelta(milliseconds=250)
    assert all(m.started_at >= times["source"].finished_at - margin for m in middles)
    assert all(m.started_at > times["source"].started_at for m in middles)
    assert times["sink"].started_at >= max(m.finished_at for m in middles) - margin
