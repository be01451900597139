"""Reading a run's published artifacts: which set is the run's, for whom, and a tar of it.

A run's artifacts are the set its finalize named (``tool_runs.artifact_set``), readable once
the run is terminal, by its tenant (or an admin); another tenant's run reads as missing.
"""

from __future__ import annotations

import enum
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

from runyard.artifact_store import ArtifactFile, ArtifactStore
from runyard.domain.states import TERMINAL_STATUSES
from runyard.platform.db import autocommit

_TERMINAL = frozenset(status.value for status in TERMINAL_STATUSES)

# The run's status and published set, if ``tenant`` may see it (NULL: any tenant).
RUN_ARTIFACT_SET = text(
    """
    SELECT CAST(status AS text) AS status, artifact_set, finished_at FROM tool_runs
    WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
    """
)

_BLOCK = tarfile.BLOCKSIZE
_END_OF_ARCHIVE = b"\0" * (2 * _BLOCK)


class Found(enum.Enum):
    """What looking a run's artifacts up found."""

    READY = "ready"
    NOT_FINISHED = "not_finished"
    NOT_FOUND = "not_found"


@dataclass(frozen=True)
class Published:
    """A run's artifacts as readers see them; ``set_id`` None: the run kept none."""

    found: Found
    run_id: uuid.UUID
    status: str | None = None
    set_id: uuid.UUID | None = None
    finished_at: datetime | None = None


class ArtifactReads:
    """The read side of artifacts, over the database and a store."""

    def __init__(self, engine: Engine, store: ArtifactStore) -> None:
        self._engine = engine
        self.store = store

    def published(self, run_id: uuid.UUID, tenant: str | None) -> Published:
        """Whether the run exists for ``tenant`` and is terminal, and its set if so."""
        rows = autocommit(self._engine, RUN_ARTIFACT_SET, {"id": run_id, "tenant": tenant})
        if not rows:
            return Published(Found.NOT_FOUND, run_id)
        row = rows[0]
        if row.status not in _TERMINAL:
            return Published(Found.NOT_FINISHED, run_id, row.status)
        return Published(Found.READY, run_id, row.status, row.artifact_set, row.finished_at)

    def files(self, published: Published) -> list[ArtifactFile]:
        """The published set's files (none if the run kept none)."""
        if published.set_id is None:
            return []
        return self.store.files(published.run_id, published.set_id)

    def file(self, published: Published, path: str) -> ArtifactFile | None:
        """One published file, or None."""
        if published.set_id is None:
            return None
        return self.store.file(published.run_id, published.set_id, path)

    def read(self, published: Published, path: str, start: int, stop: int) -> Iterator[bytes]:
        """Bytes ``start`` to ``stop`` of a published file."""
        assert published.set_id is not None
        return self.store.read(published.run_id, published.set_id, path, start, stop)

    def tar(self, published: Published, files: list[ArtifactFile]) -> tuple[int, Iterator[bytes]]:
        """A tar of ``files`` (its exact length, and its bytes as they stream from the store)."""
        mtime = published.finished_at.timestamp() if published.finished_at else 0
        headers = [_header(file, mtime) for file in files]
        pairs = zip(headers, files, strict=True)
        length = sum(len(head) + file.size + _padding(file.size) for head, file in pairs)
        return length + len(_END_OF_ARCHIVE), self._tar_bytes(published, files, headers)

    def _tar_bytes(
        self, published: Published, files: list[ArtifactFile], headers: list[bytes]
    ) -> Iterator[bytes]:
        for header, file in zip(headers, files, strict=True):
            yield header
            yield from self.read(published, file.path, 0, file.size)
            if _padding(file.size):
                yield b"\0" * _padding(file.size)
        yield _END_OF_ARCHIVE


def _header(file: ArtifactFile, mtime: float) -> bytes:
    info = tarfile.TarInfo(file.path)
    info.size, info.mode, info.mtime = file.size, 0o644, int(mtime)
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _padding(size: int) -> int:
    return -size % _BLOCK
