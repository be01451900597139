"""Readers of a run's events never pass a row that commits late (runyard.reads.events_sql).

Two connections insert events and commit them out of id order, the way a worker's log
follower, the API's cancel and the reaper do; the readers must deliver each row once, in one
order, whatever the commit order was.
"""

from __future__ import annotations

import json
import time
import uuid

from sqlalchemy import Connection, Engine, text

from runyard.queue import JobQueue
from runyard.reads.dashboard import log_snapshot, run_timeline
from runyard.reads.runs import RunReader
from tests.integration.queue.test_queue import T0, new_run

INSERT = text(
    "INSERT INTO tool_run_events (run_id, type, data) "
    "VALUES (:run_id, :type, CAST(:data AS jsonb)) RETURNING id"
)


def insert(conn: Connection, run_id: uuid.UUID, chunk: str, stream: str = "stdout") -> int:
    """A live log chunk of attempt 0, as APPEND_LOG writes it; its event id."""
    data = json.dumps({"attempt": 0, "text": chunk, "until": chunk})
    return int(conn.execute(INSERT, {"run_id": run_id, "type": stream, "data": data}).scalar_one())


def held_back(engine: Engine, run_id: uuid.UUID, after: int) -> tuple[list[int], bool]:
    """What a reader gets now, and whether committed rows wait for an older transaction."""
    page = RunReader(engine).status_and_events(run_id, after)
    return [e.id for e in page.events], page.held


def delivered(engine: Engine, run_id: uuid.UUID, after: int) -> list[int]:
    """What a reader gets once no older transaction (of any database on the server) is open."""
    page = RunReader(engine).status_and_events(run_id, after)
    deadline = time.monotonic() + 10
    while page.held and time.monotonic() < deadline:
        time.sleep(0.01)
        page = RunReader(engine).status_and_events(run_id, after)
    assert not page.held
    return [e.id for e in page.events]


def queued_run(queue: JobQueue) -> tuple[uuid.UUID, int]:
    """A queued run of attempt 0 and the id of its first event."""
    run_id = queue.enqueue(new_run(), now=T0).run_id
    (first,) = delivered(queue.engine, run_id, 0)
    return run_id, first


def test_events_after__holds_a_committed_row_until_an_older_insert_commits(
    engine: Engine, queue: JobQueue
):
    run_id, first = queued_run(queue)
    with engine.connect() as a, engine.connect() as b:
        with a.begin():
            late = insert(a, run_id, "a")
            with b.begin():
                early = insert(b, run_id, "b")
            assert late < early
            # Paging by id would hand out `early` now and never `late`.
            assert held_back(engine, run_id, first) == ([], True)
        assert delivered(engine, run_id, first) == [late, early]
    assert delivered(engine, run_id, late) == [early]
    assert delivered(engine, run_id, early) == []


def test_events_after__a_rolled_back_insert_holds_nothing_back(engine: Engine, queue: JobQueue):
    run_id, first = queued_run(queue)
    with engine.connect() as a, engine.connect() as b:
        a.begin()
        insert(a, run_id, "gone")
        with b.begin():
            kept = insert(b, run_id, "kept")
        assert held_back(engine, run_id, first) == ([], True)
        a.rollback()
    assert delivered(engine, run_id, first) == [kept]


def test_events_after__follows_transactions_where_ids_disagree_and_resumes_from_any_id(
    engine: Engine, queue: JobQueue
):
    run_id, first = queued_run(queue)
    with engine.connect() as a, engine.connect() as b:
        with a.begin():
            # A's transaction has its id before B's, but draws its event id after B's.
            a.execute(text("SELECT pg_current_xact_id()"))
            with b.begin():
                smaller = insert(b, run_id, "b")
            larger = insert(a, run_id, "a")
            assert held_back(engine, run_id, first) == ([], True)
    assert delivered(engine, run_id, first) == [larger, smaller]
    # Resuming from the last id received, not the largest, loses nothing.
    assert delivered(engine, run_id, larger) == [smaller]
    assert delivered(engine, run_id, smaller) == []
    # The other readers keep the same order.
    assert RunReader(engine).live_logs(run_id, 0, ("stdout",)) == "ab"
    assert queue.last_log_position(run_id, 0, "stdout") == "b"
    assert [e.id for e in run_timeline(engine, run_id).events] == [first]


def test_events_after__an_id_that_is_not_the_runs_resumes_after_every_smaller_id(
    engine: Engine, queue: JobQueue
):
    run_id, first = queued_run(queue)
    other, _ = queued_run(queue)
    with engine.begin() as conn:
        before = insert(conn, run_id, "1")
    with engine.begin() as conn:
        foreign = insert(conn, other, "x")
    with engine.begin() as conn:
        after = insert(conn, run_id, "2")
    assert delivered(engine, run_id, 0) == [first, before, after]
    assert delivered(engine, run_id, foreign) == [after]
    assert delivered(engine, run_id, 2**63 - 1) == []


def test_log_snapshot__stops_at_the_horizon_and_the_stream_goes_on_from_upto(
    engine: Engine, queue: JobQueue
):
    run_id, first = queued_run(queue)
    with engine.begin() as conn:
        out = insert(conn, run_id, "out-1\n")
        err = insert(conn, run_id, "err-1\n", stream="stderr")
    with engine.connect() as a, engine.connect() as b:
        with a.begin():
            late = insert(a, run_id, "out-2\n")
            with b.begin():
                early = insert(b, run_id, "out-3\n")
            # The horizon is the server's: a transaction open in another database (another
            # test's clone, say) holds it back a moment; this test's two stay open throughout.
            snapshot = log_snapshot(engine, run_id)
            deadline = time.monotonic() + 10
            while snapshot.upto != err and time.monotonic() < deadline:
                time.sleep(0.05)
                snapshot = log_snapshot(engine, run_id)
    assert (snapshot.stdout, snapshot.stderr, snapshot.attempt) == ("out-1\n", "err-1\n", 0)
    assert snapshot.upto == err
    assert delivered(engine, run_id, snapshot.upto) == [late, early]
    assert delivered(engine, run_id, 0) == [first, out, err, late, early]


def test_log_snapshot__of_a_run_with_no_chunks_starts_the_stream_after_its_events(
    engine: Engine, queue: JobQueue
):
    run_id, first = queued_run(queue)
    snapshot = log_snapshot(engine, run_id)
    assert (snapshot.stdout, snapshot.stderr, snapshot.upto, snapshot.attempt) == ("", "", first, 0)
    assert log_snapshot(engine, uuid.uuid4()).upto == 0
