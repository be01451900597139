"""The artifact storage port: sets of files per run, written once, read by byte ranges.

A collection writes a fresh *set* (``run_id``, ``set_id``); the run's finalize publishes one
set by naming it on the run, so whatever a lost owner wrote is never what readers see. A
store keeps sets and nothing else: which set is the run's, and who may read it, is the
database's business (``runyard.artifacts.reads``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

# Content is stored and read in pieces of this size (a Postgres chunk, a read of a file).
CHUNK_SIZE = 1 << 20


@dataclass(frozen=True)
class ArtifactFile:
    """One stored file of a set: its relative POSIX path, size and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str


class ArtifactWriter(Protocol):
    """Adds files to one new set; ``done`` when all are in (a set is never added to later)."""

    @property
    def set_id(self) -> uuid.UUID:
        """The set being written."""
        ...

    def add(self, path: str, chunks: Iterable[bytes]) -> ArtifactFile:
        """Store one file from its content pieces, hashing as they stream by."""
        ...

    def done(self) -> None:
        """Make the set complete and readable."""
        ...


class ArtifactStore(Protocol):
    """Where artifact sets live (Postgres by default, or a local directory)."""

    def writer(self, run_id: uuid.UUID) -> ArtifactWriter:
        """A writer of a new, empty set of the run."""
        ...

    def discard(self, run_id: uuid.UUID, set_id: uuid.UUID) -> None:
        """Remove a set (one that lost, or was refused); a missing set is no error."""
        ...

    def files(self, run_id: uuid.UUID, set_id: uuid.UUID) -> list[ArtifactFile]:
        """The set's files, by path."""
        ...

    def file(self, run_id: uuid.UUID, set_id: uuid.UUID, path: str) -> ArtifactFile | None:
        """One file of the set, or None."""
        ...

    def read(
        self, run_id: uuid.UUID, set_id: uuid.UUID, path: str, start: int, stop: int
    ) -> Iterator[bytes]:
        """Bytes ``start`` to ``stop`` (exclusive) of a file, in pieces of at most a chunk."""
        ...

    def forget(self, run_ids: Sequence[uuid.UUID]) -> None:
        """Drop every set of runs whose rows were deleted (retention)."""
        ...
