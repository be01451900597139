"""A batch's cancel and the finalize of one of its runs, interleaved step by step on two
connections: with one lock order for both (running jobs, then queued ones) they never
deadlock; the order the cancel had before deadlocks on the same steps."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.exc import DBAPIError

from runyard.domain.graph import Node
from runyard.queue import AdmissionCaps, JobQueue
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.queue.sql import CANCEL_BATCH, CANCEL_BATCH_QUEUED, CANCEL_BATCH_RUNNING, FINALIZE
from runyard.queue.values import outcome_params
from tests.integration.queue.test_queue import SUCCESS, T0, claim, new_run, row

DEADLOCK = "40P01"


def running_and_waiting(
    engine: Engine, queue: JobQueue
) -> tuple[uuid.UUID, list[uuid.UUID], dict[str, object]]:
    """A batch of ``up`` (claimed: running) and ``down`` (queued, waiting for ``up``): the
    batch's id, the two runs' ids and the bind parameters of ``up``'s successful finalize."""
    runs = [
        GraphRun(new_run(), Node("up")),
        GraphRun(new_run(), Node("down", ("up",))),
    ]
    written = GraphWriter(engine).submit(
        GraphSubmit("acme", runs, batch=True), AdmissionCaps(), now=T0
    )
    assert written.batch_id is not None
    (job,) = claim(queue, limit=10)
    assert job.run_id == written.run_ids[0]
    finalize = {"job_id": job.job_id, "token": job.lease_token, "now": T0}
    return written.batch_id, written.run_ids, {**finalize, **outcome_params(SUCCESS)}


def wait_for_a_lock(conn: Connection, pid: int) -> None:
    """Return once backend ``pid`` waits for a lock (a row another transaction holds)."""
    deadline = time.monotonic() + 10
    probe = text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid")
    while conn.execute(probe, {"pid": pid}).scalar_one_or_none() != "Lock":
        assert time.monotonic() < deadline, "the finalize never waited for a lock"
        time.sleep(0.02)


def sqlstate(error: BaseException | None) -> str | None:
    return getattr(getattr(error, "orig", None), "sqlstate", None) if error else None


def interleave(
    engine: Engine, batch_id: uuid.UUID, finalize: dict[str, object], order: Sequence[TextClause]
) -> tuple[BaseException | None, BaseException | None]:
    """The cancel's first statement; the finalize (another connection, a thread) until it
    waits for a lock; the cancel's second statement and commit; the finalize's end. The
    errors of the cancel and of the finalize, if any."""
    first, second = order
    params = {"batch_id": batch_id, "now": T0}
    failed: dict[str, BaseException] = {}
    with engine.connect() as cancel, engine.connect() as finisher, engine.connect() as probe:
        pid = finisher.execute(text("SELECT pg_backend_pid()")).scalar_one()
        finisher.commit()

        def finish() -> None:
            try:
                finisher.execute(FINALIZE, finalize).all()
                finisher.commit()
            except DBAPIError as exc:
                finisher.rollback()
                failed["finalize"] = exc

        cancel.execute(first, params).all()
        thread = threading.Thread(target=finish)
        thread.start()
        try:
            wait_for_a_lock(probe, pid)
            cancel.execute(second, params).all()
            cancel.commit()
        except DBAPIError as exc:
            cancel.rollback()
            failed["cancel"] = exc
        finally:
            thread.join(timeout=30)
        assert not thread.is_alive()
    return failed.get("cancel"), failed.get("finalize")


def test_batch_cancel_and_finalize__the_old_order_deadlocks_on_these_steps(
    engine: Engine, queue: JobQueue
):
    batch_id, _, finalize = running_and_waiting(engine, queue)
    old_order = (CANCEL_BATCH_QUEUED, CANCEL_BATCH_RUNNING)
    cancel_error, finalize_error = interleave(engine, batch_id, finalize, old_order)
    assert DEADLOCK in (sqlstate(cancel_error), sqlstate(finalize_error))


def test_batch_cancel_and_finalize__one_lock_order_never_deadlocks(engine: Engine, queue: JobQueue):
    assert CANCEL_BATCH == (CANCEL_BATCH_RUNNING, CANCEL_BATCH_QUEUED)
    batch_id, (up, down), finalize = running_and_waiting(engine, queue)
    assert interleave(engine, batch_id, finalize, CANCEL_BATCH) == (None, None)
    # The finalize waited for the cancel: ``up`` succeeded (its cancel came too late to
    # stop it), ``down`` was cancelled with its batch, not failed by its dependency.
    assert row(engine, up)["run_status"] == "succeeded"
    assert (row(engine, down)["run_status"], row(engine, down)["error_code"]) == (
        "cancelled",
        "cancelled",
    )


def test_batch_cancel__flags_running_runs_and_cancels_queued_ones(engine: Engine, queue: JobQueue):
    batch_id, (up, down), _ = running_and_waiting(engine, queue)
    assert GraphWriter(engine).cancel_batch(batch_id, now=T0) == 2
    with engine.connect() as conn:
        flagged = (
            conn.execute(
                text(
                    "SELECT run_id FROM tool_run_jobs WHERE cancel_requested_at IS NOT NULL"
                    " AND status = 'running'"
                )
            )
            .scalars()
            .all()
        )
    assert flagged == [up]
    assert row(engine, down)["run_status"] == "cancelled"
