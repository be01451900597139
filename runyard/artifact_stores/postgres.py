"""The default artifact store: metadata and ~1 MiB content chunks in Postgres.

Any worker host can write and any API process can read with nothing shared but the database.
A Range read fetches only the chunks it touches, and of each only the bytes it needs (the
chunk column is stored uncompressed, so ``substring`` reads just those TOAST pieces). Rows
reference their run ON DELETE CASCADE: retention's delete of a run takes its artifacts.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import Connection, Engine, text

from runyard.artifact_store import CHUNK_SIZE, ArtifactFile

# One content chunk; every chunk of a file but its last holds exactly ``chunk_size`` bytes.
INSERT_CHUNK = text(
    """
    INSERT INTO run_artifact_chunks (run_id, set_id, path, seq, data)
    VALUES (:run_id, :set_id, :path, :seq, :data)
    """
)

# A file's metadata, written after its last chunk, in the same transaction.
INSERT_FILE = text(
    """
    INSERT INTO run_artifacts (run_id, set_id, path, size, sha256, chunk_size)
    VALUES (:run_id, :set_id, :path, :size, :sha256, :chunk_size)
    """
)

DELETE_SET_CHUNKS = text(
    "DELETE FROM run_artifact_chunks WHERE run_id = :run_id AND set_id = :set_id"
)
DELETE_SET_FILES = text("DELETE FROM run_artifacts WHERE run_id = :run_id AND set_id = :set_id")

LIST_FILES = text(
    """
    SELECT path, size, sha256 FROM run_artifacts
    WHERE run_id = :run_id AND set_id = :set_id
    ORDER BY path COLLATE "C"
    """
)

GET_FILE = text(
    """
    SELECT path, size, sha256, chunk_size FROM run_artifacts
    WHERE run_id = :run_id AND set_id = :set_id AND path = :path
    """
)

# ``length`` bytes of one chunk from ``offset`` (0-based), and nothing else of it.
READ_PIECE = text(
    """
    SELECT substring(data FROM CAST(:offset AS integer) + 1 FOR CAST(:length AS integer))
    FROM run_artifact_chunks
    WHERE run_id = :run_id AND set_id = :set_id AND path = :path AND seq = :seq
    """
)


class PostgresArtifactStore:
    """Artifact sets in the ``run_artifacts`` and ``run_artifact_chunks`` tables."""

    def __init__(self, engine: Engine, chunk_size: int = CHUNK_SIZE) -> None:
        self._engine = engine
        self._chunk_size = chunk_size

    def writer(self, run_id: uuid.UUID) -> PostgresSetWriter:
        """A writer of a new set of the run."""
        return PostgresSetWriter(self._engine, run_id, uuid.uuid4(), self._chunk_size)

    def discard(self, run_id: uuid.UUID, set_id: uuid.UUID) -> None:
        """Delete the set's chunks and files."""
        params = {"run_id": run_id, "set_id": set_id}
        with self._engine.begin() as conn:
            conn.execute(DELETE_SET_CHUNKS, params)
            conn.execute(DELETE_SET_FILES, params)

    def files(self, run_id: uuid.UUID, set_id: uuid.UUID) -> list[ArtifactFile]:
        """The set's files, by path (bytewise order)."""
        with self._engine.connect() as conn:
            rows = conn.execute(LIST_FILES, {"run_id": run_id, "set_id": set_id}).all()
        return [ArtifactFile(row.path, int(row.size), row.sha256) for row in rows]

    def file(self, run_id: uuid.UUID, set_id: uuid.UUID, path: str) -> ArtifactFile | None:
        """One file of the set, or None."""
        with self._engine.connect() as conn:
            row = conn.execute(GET_FILE, {"run_id": run_id, "set_id": set_id, "path": path}).first()
        return None if row is None else ArtifactFile(row.path, int(row.size), row.sha256)

    def read(
        self, run_id: uuid.UUID, set_id: uuid.UUID, path: str, start: int, stop: int
    ) -> Iterator[bytes]:
        """Bytes ``start`` to ``stop`` of a file: one short statement per chunk touched, so a
        slow reader never holds a connection."""
        key = {"run_id": run_id, "set_id": set_id, "path": path}
        with self._engine.connect() as conn:
            row = conn.execute(GET_FILE, key).first()
        if row is None:
            raise FileNotFoundError(path)
        size, chunk = int(row.size), int(row.chunk_size)
        position, stop = max(start, 0), min(stop, size)
        while position < stop:
            seq, offset = divmod(position, chunk)
            length = min(chunk - offset, stop - position)
            with self._engine.connect() as conn:
                piece = conn.execute(
                    READ_PIECE, {**key, "seq": seq, "offset": offset, "length": length}
                ).scalar()
            if piece is None or len(piece) != length:
                raise OSError(f"artifact {path!r} is missing bytes at {position}")
            position += length
            yield bytes(piece)

    def forget(self, run_ids: Sequence[uuid.UUID]) -> None:
        """Nothing to do: the rows went with their runs (ON DELETE CASCADE)."""


class PostgresSetWriter:
    """Writes one set: each file in a transaction of its own, chunk by chunk."""

    def __init__(
        self, engine: Engine, run_id: uuid.UUID, set_id: uuid.UUID, chunk_size: int
    ) -> None:
        self._engine = engine
        self._run_id = run_id
        self._set_id = set_id
        self._chunk_size = chunk_size

    @property
    def set_id(self) -> uuid.UUID:
        """The set being written."""
        return self._set_id

    def add(self, path: str, chunks: Iterable[bytes]) -> ArtifactFile:
        """Store the file; at most one chunk of it is held in memory."""
        key = {"run_id": self._run_id, "set_id": self._set_id, "path": path}
        digest = hashlib.sha256()
        size = 0
        with self._engine.begin() as conn:
            seq = 0
            pending = bytearray()
            for piece in chunks:
                digest.update(piece)
                size += len(piece)
                pending += piece
                while len(pending) >= self._chunk_size:
                    self._chunk(conn, key, seq, bytes(pending[: self._chunk_size]))
                    del pending[: self._chunk_size]
                    seq += 1
            if pending:
                self._chunk(conn, key, seq, bytes(pending))
            stored = ArtifactFile(path, size, digest.hexdigest())
            conn.execute(
                INSERT_FILE,
                {**key, "size": size, "sha256": stored.sha256, "chunk_size": self._chunk_size},
            )
        return stored

    def _chunk(self, conn: Connection, key: dict[str, object], seq: int, data: bytes) -> None:
        conn.execute(INSERT_CHUNK, {**key, "seq": seq, "data": data})

    def done(self) -> None:
        """Nothing to do: each file was committed whole."""
