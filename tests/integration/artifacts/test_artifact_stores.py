"""Both artifact stores against real Postgres: sets written, listed and read by ranges across
chunk boundaries; the finalize publishes one set; discards, retention and tenancy."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from runyard.artifact_store import ArtifactStore
from runyard.artifact_stores.local_dir import LocalDirArtifactStore
from runyard.artifact_stores.postgres import PostgresArtifactStore
from runyard.artifacts.publish import drop_unpublished
from runyard.artifacts.reads import ArtifactReads, Found
from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.maintenance.retention import Deleted, delete_run, prune_expired
from runyard.queue import JobQueue
from tests.integration.queue.test_queue import LEASE, T0, new_run

SMALL_CHUNK = 7


@pytest.fixture(params=["postgres", "local_dir"])
def store(request: pytest.FixtureRequest, engine: Engine, tmp_path: Path) -> ArtifactStore:
    if request.param == "postgres":
        return PostgresArtifactStore(engine, chunk_size=SMALL_CHUNK)
    return LocalDirArtifactStore(tmp_path / "artifacts")


def pieces(data: bytes, size: int = 5) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def running(queue: JobQueue, tenant: str = "acme"):
    run_id = queue.enqueue(new_run(tenant=tenant), now=T0).run_id
    [job] = queue.claim(worker_id="w1", engine_id="e", limit=1, lease_seconds=LEASE, now=T0)
    assert job.run_id == run_id
    return job


def write_set(store: ArtifactStore, run_id: uuid.UUID, files: dict[str, bytes]) -> uuid.UUID:
    writer = store.writer(run_id)
    for path, data in files.items():
        stored = writer.add(path, pieces(data))
        assert (stored.size, stored.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    writer.done()
    return writer.set_id


def read_all(store: ArtifactStore, run_id, set_id, path, start, stop) -> bytes:
    return b"".join(store.read(run_id, set_id, path, start, stop))


def test_store__reads_any_range_across_chunk_boundaries(store: ArtifactStore, queue: JobQueue):
    job = running(queue)
    data = bytes(range(256)) * 3
    set_id = write_set(store, job.run_id, {"b/data.bin": data, "a.txt": b"hi", "empty": b""})
    assert [f.path for f in store.files(job.run_id, set_id)] == ["a.txt", "b/data.bin", "empty"]
    found = store.file(job.run_id, set_id, "b/data.bin")
    assert found is not None and found.sha256 == hashlib.sha256(data).hexdigest()
    assert store.file(job.run_id, set_id, "nope") is None
    for start, stop in [(0, len(data)), (0, 7), (6, 8), (7, 14), (13, 700), (700, 900), (5, 5)]:
        assert read_all(store, job.run_id, set_id, "b/data.bin", start, stop) == data[start:stop]
    assert read_all(store, job.run_id, set_id, "empty", 0, 0) == b""


def test_postgres_store__a_range_reads_only_the_chunks_it_touches(engine: Engine, queue: JobQueue):
    store = PostgresArtifactStore(engine, chunk_size=SMALL_CHUNK)
    job = running(queue)
    data = os.urandom(50)
    set_id = write_set(store, job.run_id, {"f": data})
    with engine.begin() as conn:
        counted = conn.execute(
            text("SELECT count(*) FROM run_artifact_chunks WHERE set_id = :s"), {"s": set_id}
        ).scalar_one()
        assert counted == 8  # 7 full chunks of 7 bytes and one of 1
        conn.execute(
            text("DELETE FROM run_artifact_chunks WHERE set_id = :s AND seq IN (0, 5)"),
            {"s": set_id},
        )
    assert read_all(store, job.run_id, set_id, "f", 14, 35) == data[14:35]
    with pytest.raises(OSError, match="missing bytes"):
        read_all(store, job.run_id, set_id, "f", 0, 50)


def test_store__discard_removes_one_set_only(store: ArtifactStore, queue: JobQueue):
    job = running(queue)
    kept = write_set(store, job.run_id, {"x": b"kept"})
    gone = write_set(store, job.run_id, {"x": b"gone"})
    store.discard(job.run_id, gone)
    store.discard(job.run_id, gone)  # again: no error
    assert store.files(job.run_id, gone) == []
    assert read_all(store, job.run_id, kept, "x", 0, 4) == b"kept"


def test_finalize__publishes_the_named_set_and_reads_pick_it(
    store: ArtifactStore, queue: JobQueue, engine: Engine
):
    job = running(queue)
    reads = ArtifactReads(engine, store)
    lost = write_set(store, job.run_id, {"out.txt": b"from a lost owner"})
    won = write_set(store, job.run_id, {"out.txt": b"from the owner"})
    assert reads.published(job.run_id, "acme").found is Found.NOT_FINISHED
    outcome = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, artifact_set=won)
    assert queue.finalize(job.job_id, job.lease_token, outcome, now=T0)
    # A second finalize (a stale owner with its own set) changes nothing.
    stale = AttemptResult(status=RunStatus.SUCCEEDED, exit_code=0, artifact_set=lost)
    assert not queue.finalize(job.job_id, job.lease_token, stale, now=T0)
    published = reads.published(job.run_id, "acme")
    assert (published.found, published.set_id) == (Found.READY, won)
    assert [f.path for f in reads.files(published)] == ["out.txt"]
    assert b"".join(reads.read(published, "out.txt", 0, 14)) == b"from the owner"
    drop_unpublished(engine, store, job.run_id, won, {})  # published: kept
    drop_unpublished(engine, store, job.run_id, lost, {})
    assert store.files(job.run_id, lost) == []
    assert [f.path for f in reads.files(reads.published(job.run_id, "acme"))] == ["out.txt"]


def test_reads__another_tenant_sees_no_run_and_a_run_without_a_set_has_none(
    store: ArtifactStore, queue: JobQueue, engine: Engine
):
    job = running(queue)
    reads = ArtifactReads(engine, store)
    assert queue.finalize(job.job_id, job.lease_token, AttemptResult(RunStatus.FAILED), now=T0)
    assert reads.published(job.run_id, "globex").found is Found.NOT_FOUND
    assert reads.published(uuid.uuid4(), None).found is Found.NOT_FOUND
    published = reads.published(job.run_id, None)
    assert published.found is Found.READY and published.set_id is None
    assert reads.files(published) == [] and reads.file(published, "x") is None


def test_reads__tar_of_all_streams_every_file_with_its_exact_length(
    store: ArtifactStore, queue: JobQueue, engine: Engine
):
    job = running(queue)
    files = {"a.txt": b"a" * 513, "deep/" * 40 + "long.bin": os.urandom(1000), "zero": b""}
    set_id = write_set(store, job.run_id, files)
    outcome = AttemptResult(status=RunStatus.SUCCEEDED, artifact_set=set_id)
    assert queue.finalize(job.job_id, job.lease_token, outcome, now=T0)
    reads = ArtifactReads(engine, store)
    published = reads.published(job.run_id, "acme")
    length, body = reads.tar(published, reads.files(published))
    raw = b"".join(body)
    assert len(raw) == length
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == files


def finished_with_set(store: ArtifactStore, queue: JobQueue, now=T0) -> tuple[uuid.UUID, uuid.UUID]:
    run_id = queue.enqueue(new_run(), now=now).run_id
    [job] = queue.claim(worker_id="w1", engine_id="e", limit=1, lease_seconds=LEASE, now=now)
    set_id = write_set(store, run_id, {"f": b"data" * 10})
    outcome = AttemptResult(status=RunStatus.SUCCEEDED, artifact_set=set_id)
    assert queue.finalize(job.job_id, job.lease_token, outcome, now=now)
    return run_id, set_id


def artifact_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM run_artifacts)"
                    " + (SELECT count(*) FROM run_artifact_chunks)"
                )
            ).scalar_one()
        )


def test_retention__delete_and_prune_take_the_artifacts(
    store: ArtifactStore, queue: JobQueue, engine: Engine
):
    deleted, deleted_set = finished_with_set(store, queue)
    pruned, pruned_set = finished_with_set(store, queue)
    kept, kept_set = finished_with_set(store, queue, now=T0 + timedelta(days=20))
    assert delete_run(engine, deleted, "acme", store) == (Deleted.DELETED, "succeeded")
    assert store.files(deleted, deleted_set) == []
    assert (
        prune_expired(
            queue,
            retention_seconds=86400 * 7,
            batch=1,
            now=T0 + timedelta(days=21),
            artifacts=store,
        )
        == 1
    )
    assert store.files(pruned, pruned_set) == []
    assert [f.path for f in store.files(kept, kept_set)] == ["f"]
    if isinstance(store, PostgresArtifactStore):
        assert artifact_rows(engine) == 1 + 6  # the kept file: its row and 40 bytes in 7s
