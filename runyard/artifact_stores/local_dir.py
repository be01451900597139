"""The local-directory artifact store (``RUNYARD_ARTIFACTS_DIR``): for one host, or a
directory every worker and API host mounts at the same path.

Layout: ``ROOT/<run id>/<set id>/<n>`` holds the set's n-th file and ``manifest.json`` its
paths, sizes and hashes, written last. Only ids and numbers become file names here, never a
tool's path, so nothing a tool names can reach outside ``ROOT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from runyard.artifact_store import CHUNK_SIZE, ArtifactFile

MANIFEST = "manifest.json"


class LocalDirArtifactStore:
    """Artifact sets as files under ``root``."""

    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"RUNYARD_ARTIFACTS_DIR must be an absolute path, not {root}")
        self._root = root

    def _set_dir(self, run_id: uuid.UUID, set_id: uuid.UUID) -> Path:
        return self._root / str(run_id) / str(set_id)

    def writer(self, run_id: uuid.UUID) -> LocalSetWriter:
        """A writer of a new set of the run (its directory made now)."""
        set_id = uuid.uuid4()
        directory = self._set_dir(run_id, set_id)
        directory.mkdir(mode=0o700, parents=True)
        return LocalSetWriter(directory, set_id)

    def discard(self, run_id: uuid.UUID, set_id: uuid.UUID) -> None:
        """Remove the set's directory."""
        shutil.rmtree(self._set_dir(run_id, set_id), ignore_errors=True)

    def _manifest(self, run_id: uuid.UUID, set_id: uuid.UUID) -> list[dict[str, Any]]:
        try:
            text = (self._set_dir(run_id, set_id) / MANIFEST).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []  # never finished: not a set anyone reads
        entries: list[dict[str, Any]] = json.loads(text)
        return entries

    def files(self, run_id: uuid.UUID, set_id: uuid.UUID) -> list[ArtifactFile]:
        """The set's files, by path."""
        return [_file(entry) for entry in self._manifest(run_id, set_id)]

    def file(self, run_id: uuid.UUID, set_id: uuid.UUID, path: str) -> ArtifactFile | None:
        """One file of the set, or None."""
        for entry in self._manifest(run_id, set_id):
            if entry["path"] == path:
                return _file(entry)
        return None

    def read(
        self, run_id: uuid.UUID, set_id: uuid.UUID, path: str, start: int, stop: int
    ) -> Iterator[bytes]:
        """Bytes ``start`` to ``stop`` of a file, a chunk at a time."""
        entry = next((e for e in self._manifest(run_id, set_id) if e["path"] == path), None)
        if entry is None:
            raise FileNotFoundError(path)
        stop = min(stop, int(entry["size"]))
        with open(self._set_dir(run_id, set_id) / str(int(entry["n"])), "rb") as stream:
            stream.seek(max(start, 0))
            position = max(start, 0)
            while position < stop:
                piece = stream.read(min(CHUNK_SIZE, stop - position))
                if not piece:
                    raise OSError(f"artifact {path!r} is missing bytes at {position}")
                position += len(piece)
                yield piece

    def forget(self, run_ids: Sequence[uuid.UUID]) -> None:
        """Remove the directories of deleted runs."""
        for run_id in run_ids:
            shutil.rmtree(self._root / str(run_id), ignore_errors=True)


class LocalSetWriter:
    """Writes one set's files, then its manifest."""

    def __init__(self, directory: Path, set_id: uuid.UUID) -> None:
        self._directory = directory
        self._set_id = set_id
        self._entries: list[dict[str, Any]] = []

    @property
    def set_id(self) -> uuid.UUID:
        """The set being written."""
        return self._set_id

    def add(self, path: str, chunks: Iterable[bytes]) -> ArtifactFile:
        """Stream the file to disk, hashing it on the way."""
        n = len(self._entries)
        digest = hashlib.sha256()
        size = 0
        target = self._directory / str(n)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(target, flags, 0o600), "wb") as stream:
            for piece in chunks:
                digest.update(piece)
                size += len(piece)
                stream.write(piece)
        stored = ArtifactFile(path, size, digest.hexdigest())
        self._entries.append({"n": n, "path": path, "size": size, "sha256": stored.sha256})
        return stored

    def done(self) -> None:
        """Write the manifest (atomically): from now on the set can be read."""
        partial = self._directory / (MANIFEST + ".part")
        entries = sorted(self._entries, key=lambda entry: str(entry["path"]))
        partial.write_text(json.dumps(entries), encoding="utf-8")
        with open(partial, "rb") as stream:
            os.fsync(stream.fileno())
        partial.replace(self._directory / MANIFEST)


def _file(entry: dict[str, Any]) -> ArtifactFile:
    return ArtifactFile(str(entry["path"]), int(entry["size"]), str(entry["sha256"]))
