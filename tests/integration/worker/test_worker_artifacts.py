"""The worker publishes an attempt's artifact set with its finalize, and drops a set whose
finalize lost the lease (real Postgres, the fake runner writing through the store)."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, text

from runyard.artifact_stores.postgres import PostgresArtifactStore
from runyard.artifacts.reads import ArtifactReads, Found
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from runyard.runner import AttemptControl
from runyard.runners.fake import FakeRunner
from tests.integration.worker.test_worker_loop import enqueue, status
from worker.service import Worker, WorkerConfig


def writing(engine: Engine, steal_lease: bool = False):
    """A handler that keeps one artifact, optionally losing its lease before it returns."""

    def handler(spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        assert control.artifacts is not None
        writer = control.artifacts.writer(spec.run_id)
        writer.add("report.txt", [b"made by ", str(spec.run_id).encode()])
        writer.done()
        if steal_lease:
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "UPDATE tool_run_jobs SET lease_token = gen_random_uuid()"
                        " WHERE run_id = :id"
                    ),
                    {"id": spec.run_id},
                )
        return AttemptResult(RunStatus.SUCCEEDED, exit_code=0, artifact_set=writer.set_id)

    return handler


def sets_of(engine: Engine, run_id: uuid.UUID) -> set[uuid.UUID]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT DISTINCT set_id FROM run_artifacts WHERE run_id = :id"), {"id": run_id}
        )
        return set(rows.scalars())


def run_one(queue: JobQueue, engine: Engine, *, steal_lease: bool) -> uuid.UUID:
    run_id = enqueue(queue)
    store = PostgresArtifactStore(engine)
    runner = FakeRunner(writing(engine, steal_lease))
    worker = Worker(queue, runner, WorkerConfig(worker_id="w1"), artifacts=store)
    assert worker.run_once().claimed == 1
    assert worker.wait_idle(timeout=10)
    worker.close()
    return run_id


def test_worker__publishes_the_set_with_the_outcome(queue: JobQueue, engine: Engine):
    run_id = run_one(queue, engine, steal_lease=False)
    assert status(engine, run_id) == "succeeded"
    reads = ArtifactReads(engine, PostgresArtifactStore(engine))
    published = reads.published(run_id, "acme")
    assert published.found is Found.READY and sets_of(engine, run_id) == {published.set_id}
    assert (
        b"".join(reads.read(published, "report.txt", 0, 100)) == b"made by " + str(run_id).encode()
    )


def test_worker__a_lost_lease_drops_the_set_it_wrote(queue: JobQueue, engine: Engine):
    run_id = run_one(queue, engine, steal_lease=True)
    assert status(engine, run_id) == "running"
    assert sets_of(engine, run_id) == set()
