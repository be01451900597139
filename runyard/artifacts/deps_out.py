"""A dependent's copy of its dependencies' artifacts: ``/runyard/deps/<run id>/<path>``.

Read from the store a piece at a time into a spooled tar (upload mode: memory stays at one
piece plus the spool's in-memory part, the rest goes to a temporary file) or straight into
the host work directory. Files are root-owned and read-only, like ``input.json``. They are
the platform's, not the tool's: the disk watch gives the attempt room for them on top of its
``disk_mb`` (``deps_room``).

A dependency's set whose paths cannot all be files of one tree (``layout_problem``: stored
before the rule held) is never copied: ``DepsUnusable``, the dependent run's own failure,
the same on every try, and not the engine's trouble.
"""

from __future__ import annotations

import errno
import io
import os
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from runyard.artifact_store import ArtifactFile, ArtifactStore
from runyard.artifacts.rules import layout_problem, show_path

DEPS_DIR = "deps"
# Up to this much of the archive stays in memory; the rest spills to a temporary file.
SPOOL_BYTES = 8 << 20
# The allocation unit the room is counted in (ext4's and XFS's default block).
BLOCK = 4096


# Errors of laying out a file under deps/ that say the paths clash (a file where a directory
# must be, or the other way round), not that the host is in trouble.
_CLASHES = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})


class DepsUnusable(Exception):
    """A dependency's artifacts cannot be laid out under /runyard/deps: the run fails."""


@dataclass(frozen=True)
class DepsRoom:
    """What the dependencies' artifacts take under /runyard/deps, at most: bytes allocated
    and directory entries (files and directories)."""

    bytes: int = 0
    entries: int = 0


def deps_room(files: Mapping[str, Iterable[ArtifactFile]]) -> DepsRoom:
    """The room for every dependency's files (by run id) under ``deps/<run id>/``: each file
    rounded up to whole blocks plus one for the file system's own records (none for an empty
    file, which has no block), one block per directory. An upper bound of what the disk
    watch measures for them; it measures them once too, and allows the less of the two."""
    allocated = entries = 0
    directories = {PurePosixPath(DEPS_DIR)}
    for run_id, artifacts in files.items():
        top = PurePosixPath(DEPS_DIR, run_id)
        directories.add(top)
        for artifact in artifacts:
            if artifact.size > 0:
                allocated += (-(-artifact.size // BLOCK) + 1) * BLOCK
            entries += 1
            directories.update((top / artifact.path).parents)
    directories = {d for d in directories if d != PurePosixPath(".")}
    return DepsRoom(allocated + len(directories) * BLOCK, entries + len(directories))


def deps_files(
    store: ArtifactStore, sets: Mapping[str, uuid.UUID]
) -> dict[str, list[ArtifactFile]]:
    """The files of every dependency's published set, by run id."""
    return {run_text: store.files(uuid.UUID(run_text), set_id) for run_text, set_id in sets.items()}


def laid_out(files: dict[str, list[ArtifactFile]]) -> dict[str, list[ArtifactFile]]:
    """``files`` (``deps_files``) if every set's paths can be files of one tree; else
    ``DepsUnusable`` naming the dependency and the clash."""
    for run_text, artifacts in files.items():
        problem = layout_problem(artifact.path for artifact in artifacts)
        if problem is not None:
            raise DepsUnusable(_unusable(run_text, problem))
    return files


def _unusable(run_text: str, problem: str) -> str:
    return (
        f"the artifacts of dependency {run_text} cannot be copied to /runyard/deps/{run_text}:"
        f" {problem}"
    )


class Pieces(io.RawIOBase):
    """A read-only file over an iterator of byte pieces (what ``tarfile.addfile`` reads)."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._left:
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            self._left = piece
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


def deps_archive(
    store: ArtifactStore,
    sets: Mapping[str, uuid.UUID],
    now: float,
    head: Callable[[tarfile.TarFile], None] | None = None,
) -> IO[bytes] | None:
    """A tar of every dependency's artifacts under ``deps/<run id>/``, rewound, after what
    ``head`` adds first (the attempt's own files: one upload for all); None if there is
    nothing to copy."""
    files = laid_out(deps_files(store, sets))
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    count = 0
    try:
        with tarfile.open(fileobj=spool, mode="w") as tar:
            if head is not None:
                head(tar)
            for run_text, artifacts in files.items():
                run_id, set_id = uuid.UUID(run_text), sets[run_text]
                for artifact in artifacts:
                    info = tarfile.TarInfo(f"{DEPS_DIR}/{run_id}/{artifact.path}")
                    info.size, info.mode, info.mtime = artifact.size, 0o444, now
                    pieces = store.read(run_id, set_id, artifact.path, 0, artifact.size)
                    tar.addfile(info, io.BufferedReader(Pieces(pieces)))
                    count += 1
    except BaseException:
        spool.close()  # its temporary file too
        raise
    if count == 0 and head is None:
        spool.close()
        return None
    spool.seek(0)
    return spool


def write_deps_dir(root: Path, store: ArtifactStore, sets: Mapping[str, uuid.UUID]) -> None:
    """Write every dependency's artifacts under ``root/deps/<run id>/`` (root, read-only)."""
    for run_text, artifacts in laid_out(deps_files(store, sets)).items():
        run_id, set_id = uuid.UUID(run_text), sets[run_text]
        for artifact in artifacts:
            target = root / DEPS_DIR / str(run_id) / artifact.path
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            try:
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                fd = os.open(target, flags, 0o444)
            except OSError as exc:
                if exc.errno not in _CLASHES:
                    raise  # the host's disk
                shown = show_path(artifact.path)
                raise DepsUnusable(_unusable(run_text, f"{shown}: {exc.strerror}")) from exc
            with os.fdopen(fd, "wb") as stream:
                for piece in store.read(run_id, set_id, artifact.path, 0, artifact.size):
                    stream.write(piece)
