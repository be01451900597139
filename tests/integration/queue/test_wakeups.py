"""LISTEN/NOTIFY wake-ups: new jobs and cancels reach the worker; a dropped link heals."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text

from runyard.domain.attempt import AttemptResult
from runyard.domain.graph import Node
from runyard.domain.states import RunStatus
from runyard.platform.settings import libpq_url
from runyard.queue import (
    BUILDS_CHANNEL,
    CANCEL_CHANNEL,
    HELD_CHANNEL,
    JOBS_CHANNEL,
    AdmissionCaps,
    ApiQueue,
    ClaimedJob,
    JobQueue,
    NewRun,
)
from runyard.queue.builds import BuildQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.submission.request import prepare_run
from runyard.submission.waits import END_CHANNELS
from tests.integration.builds.support import built_tools
from worker.wakeup import Wakeups


def new_run() -> NewRun:
    return NewRun(tenant="t", tool="echo", spec={}, input={})


def test_wakeups__job_and_cancel_notifications_arrive(
    database_url: str, queue: JobQueue, engine: Engine
):
    job_seen = threading.Event()
    cancelled: list[uuid.UUID] = []
    cancel_seen = threading.Event()

    def on_cancel(job_id: uuid.UUID) -> None:
        cancelled.append(job_id)
        cancel_seen.set()

    wakeups = Wakeups(database_url, job_seen.set, on_cancel)
    wakeups.start()
    try:
        assert wakeups.connected.wait(10)
        run_id = queue.enqueue(new_run()).run_id
        assert job_seen.wait(10)
        [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
        queue.cancel(run_id)
        assert cancel_seen.wait(10)
        assert cancelled == [job.job_id]
    finally:
        wakeups.stop()


def test_wakeups__a_job_written_held_wakes_the_flow_gate_and_a_free_one_does_not(
    database_url: str, queue: JobQueue
):
    job_seen, held_seen = threading.Event(), threading.Event()
    wakeups = Wakeups(database_url, job_seen.set, lambda job_id: None, on_held=held_seen.set)
    wakeups.start()
    try:
        assert wakeups.connected.wait(10)
        queue.enqueue(new_run())
        assert job_seen.wait(10)
        queue.enqueue(dataclasses.replace(new_run(), flow_scopes=("key:t:k",)))
        assert held_seen.wait(10)
        held_seen.clear()
        job_seen.clear()
        queue.enqueue(new_run())
        assert job_seen.wait(10)  # sent after the free job's commit, as a held one would be
        assert not held_seen.is_set()
    finally:
        wakeups.stop()


def test_submit_and_graph_write__a_held_job_notifies_runyard_held(
    database_url: str, engine: Engine
):
    held = dataclasses.replace(new_run(), tenant="acme", flow_scopes=("key:acme:k",))
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute(f"LISTEN {HELD_CHANNEL}")
        ApiQueue(engine).submit(new_run(), AdmissionCaps())
        ApiQueue(engine).submit(held, AdmissionCaps())
        GraphWriter(engine).submit(
            GraphSubmit("acme", [GraphRun(held, Node(None, ()))]), AdmissionCaps()
        )
        GraphWriter(engine).submit(
            GraphSubmit("acme", [GraphRun(new_run(), Node(None, ()))]), AdmissionCaps()
        )
        seen = [note.payload for note in listener.notifies(timeout=1.0, stop_after=3)]
    assert seen == ["default", "default"]  # the two held jobs' queue, not the free ones'


def test_submit_graph_write_and_rebuild__a_job_waiting_for_a_build_notifies_runyard_builds(
    database_url: str, engine: Engine, queue: JobQueue, tmp_path: Path
):
    tools = built_tools(tmp_path, engine)
    built = prepare_run(tools, tenant="acme", tool_name="stats", input_value={})
    tag = built.spec["build"]["tag"]
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute(f"LISTEN {BUILDS_CHANNEL}")
        queue.enqueue(new_run())
        queue.enqueue(dataclasses.replace(built, queue="q-enqueue"))
        ApiQueue(engine).submit(new_run(), AdmissionCaps())
        ApiQueue(engine).submit(dataclasses.replace(built, queue="q-submit"), AdmissionCaps())
        GraphWriter(engine).submit(
            GraphSubmit("acme", [GraphRun(new_run(), Node(None, ()))]), AdmissionCaps()
        )
        GraphWriter(engine).submit(
            GraphSubmit(
                "acme", [GraphRun(dataclasses.replace(built, queue="q-graph"), Node(None, ()))]
            ),
            AdmissionCaps(),
        )
        BuildQueue(engine).rebuild(tag, queue="q-rebuild")
        seen = [note.payload for note in listener.notifies(timeout=1.0, stop_after=5)]
    # The queues of the jobs that wait for a build and the rebuild's; none of the others.
    assert seen == ["q-enqueue", "q-submit", "q-graph", "q-rebuild"]


def test_requeues__a_job_back_in_the_queue_that_waits_for_a_build_notifies_runyard_builds(
    database_url: str, engine: Engine, queue: JobQueue, tmp_path: Path
):
    tools = built_tools(tmp_path, engine)
    built = dataclasses.replace(
        prepare_run(tools, tenant="acme", tool_name="stats", input_value={}), max_attempts=3
    )
    builds = BuildQueue(engine)
    for name in ("q-requeue", "q-unstarted"):
        queue.enqueue(dataclasses.replace(built, queue=name))
    queue.enqueue(dataclasses.replace(new_run(), queue="q-plain", max_attempts=3))
    # The build is ready on engine "e": its runs may be claimed there.
    assert builds.request_builds("e", ["q-requeue"])
    held = builds.claim(worker_id="b", engine_id="e", lease_seconds=30)
    assert held is not None and builds.ready(held.build_id, held.lease_token, "sha256:x")

    def claim(name: str) -> ClaimedJob:
        [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30, queues=(name,))
        return job

    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute(f"LISTEN {BUILDS_CHANNEL}")
        job = claim("q-requeue")
        assert queue.requeue(job.job_id, job.lease_token, error_code="x", error="lost").owned
        job = claim("q-unstarted")
        queue.requeue_unstarted(job.job_id, job.lease_token)
        job = claim("q-plain")
        assert queue.requeue(job.job_id, job.lease_token, error_code="x", error="lost").owned
        seen = [note.payload for note in listener.notifies(timeout=1.0, stop_after=3)]
    # Back in the queue and waiting for a build (the engine that had it may be gone): the
    # built tool's two jobs; not the plain one.
    assert seen == ["q-requeue", "q-unstarted"]


def test_wakeups__reconnect_after_the_connection_is_killed(
    database_url: str, queue: JobQueue, engine: Engine
):
    seen = threading.Event()
    wakeups = Wakeups(database_url, seen.set, lambda job_id: None)
    wakeups.start()
    try:
        assert wakeups.connected.wait(10)
        seen.clear()  # before the kill: the listener pokes the loop as soon as it notices
        with engine.connect() as conn:
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query LIKE 'LISTEN%'"
                )
            ).scalar_one()
        assert killed == 1
        assert seen.wait(10)  # the reconnect itself pokes the claim loop
        assert wakeups.connected.wait(10)
        seen.clear()
        queue.enqueue(new_run())
        assert seen.wait(10)
    finally:
        wakeups.stop()


@pytest.mark.parametrize(
    ("held", "build", "channels"),
    [
        (True, True, {JOBS_CHANNEL, CANCEL_CHANNEL, HELD_CHANNEL, BUILDS_CHANNEL}),
        (True, False, {JOBS_CHANNEL, CANCEL_CHANNEL, HELD_CHANNEL}),
        (False, True, {JOBS_CHANNEL, CANCEL_CHANNEL, BUILDS_CHANNEL}),
    ],
    ids=["both", "held-only", "builds-only"],
)
def test_wakeups__say_which_channels_they_hear_once_up_and_none_once_lost(
    database_url: str, engine: Engine, held: bool, build: bool, channels: set[str]
):
    heard: list[frozenset[str]] = []
    changed = threading.Condition()

    def on_listening(channels: frozenset[str]) -> None:
        with changed:
            heard.append(channels)
            changed.notify_all()

    def wait_for(expected: list[frozenset[str]]) -> None:
        with changed:
            assert changed.wait_for(lambda: heard == expected, timeout=10), heard

    wakeups = Wakeups(
        database_url,
        lambda: None,
        lambda job_id: None,
        on_held=(lambda: None) if held else None,
        on_build=(lambda: None) if build else None,
        on_listening=on_listening,
    )
    up, lost = frozenset(channels), frozenset[str]()
    wakeups.start()
    try:
        wait_for([up])  # its LISTENs are in place
        with engine.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query LIKE 'LISTEN%'"
                )
            )
        wait_for([up, lost, up])  # lost, then back
    finally:
        wakeups.stop()


def test_every_event_row__notifies_runyard_events(database_url: str, queue: JobQueue):
    import psycopg

    from runyard.platform.settings import libpq_url

    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute("LISTEN runyard_events")
        run_id = queue.enqueue(new_run()).run_id
        queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
        payloads = [n.payload for n in listener.notifies(timeout=2.0, stop_after=2)]
    assert payloads == [str(run_id), str(run_id)]  # enqueue, then claim (one per transaction)


def test_events_of_many_runs_in_one_statement__notify_their_ids_200_a_payload(
    database_url: str, engine: Engine
):
    import psycopg

    from runyard.domain.graph import Node
    from runyard.platform.settings import libpq_url
    from runyard.queue import AdmissionCaps
    from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter

    runs = [GraphRun(new_run(), Node(f"r{i}")) for i in range(450)]
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute("LISTEN runyard_events")
        result = GraphWriter(engine).submit(
            GraphSubmit(tenant="t", runs=runs, batch=True), AdmissionCaps()
        )
        payloads = [n.payload for n in listener.notifies(timeout=1.0, stop_after=3)]
    assert [len(p.split(",")) for p in payloads] == [200, 200, 50]
    named = [uuid.UUID(name) for p in payloads for name in p.split(",")]
    assert named == sorted(result.run_ids)


def test_every_way_a_run_ends__names_it_on_a_channel_its_end_waiters_hear(
    database_url: str, queue: JobQueue, engine: Engine
):
    """A waiter for a run's end (``?wait``) hears only ``END_CHANNELS``, not each event: every
    statement that ends a run must name it there."""

    def claimed() -> ClaimedJob:
        [job] = queue.claim(worker_id="w", engine_id="e", limit=1, lease_seconds=30)
        return job

    failed = AttemptResult(status=RunStatus.FAILED, exit_code=1, error_code="exit_nonzero")
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        for channel in END_CHANNELS:
            listener.execute(f"LISTEN {channel}")
        finished = queue.enqueue(new_run()).run_id
        job = claimed()
        assert queue.finalize(job.job_id, job.lease_token, failed)
        cancelled_queued = queue.enqueue(new_run()).run_id
        queue.cancel(cancelled_queued)
        cancelled_on_its_way_back = queue.enqueue(new_run()).run_id
        job = claimed()
        queue.cancel(cancelled_on_its_way_back)
        assert queue.requeue_unstarted(job.job_id, job.lease_token).status == "cancelled"
        out_of_attempts = queue.enqueue(new_run()).run_id
        job = claimed()
        queue.requeue(job.job_id, job.lease_token, error_code="container_lost", error="gone")
        graph = GraphSubmit(
            "t", [GraphRun(new_run(), Node("a")), GraphRun(new_run(), Node("b", ("a",)))], True
        )
        first, dependent = GraphWriter(engine).submit(graph, AdmissionCaps()).run_ids
        job = claimed()
        assert queue.finalize(job.job_id, job.lease_token, failed)
        named = {
            name for note in listener.notifies(timeout=1.0) for name in note.payload.split(",")
        }
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT CAST(id AS text), CAST(status AS text) FROM tool_runs"))
        statuses = {run_id: status for run_id, status in rows}
    ended = [finished, cancelled_queued, cancelled_on_its_way_back, out_of_attempts]
    ended += [first, dependent]
    assert [statuses[str(run)] for run in ended] == [
        "failed",
        "cancelled",
        "cancelled",
        "failed",
        "failed",
        "failed",
    ]
    assert {str(run) for run in ended} <= named


def test_notifications__found_in_the_backlog_on_the_socket_or_none_within_the_timeout(
    database_url: str,
):
    from runyard.platform.listening import notifications

    with (
        psycopg.connect(libpq_url(database_url), autocommit=True) as listener,
        psycopg.connect(libpq_url(database_url), autocommit=True) as sender,
    ):
        listener.execute("LISTEN probe")
        assert notifications(listener, 0.05) == []
        # Read with another statement's answer: kept in psycopg's backlog, not on the socket.
        sender.execute("NOTIFY probe, 'early'")
        listener.execute("SELECT pg_sleep(0.05)")
        assert [n.payload for n in notifications(listener, 0.0)] == ["early"]
        # Sent while the listener waits.
        later = threading.Timer(0.1, lambda: sender.execute("NOTIFY probe, 'late'"))
        later.start()
        try:
            got = notifications(listener, 10.0)
        finally:
            later.join()
        assert [n.payload for n in got] == ["late"]


def test_notifications__a_connection_ended_by_the_server_raises(database_url: str, engine: Engine):
    from runyard.platform.listening import notifications

    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute("LISTEN probe")
        pid = listener.info.backend_pid
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(psycopg.OperationalError):
            notifications(listener, 10.0)
