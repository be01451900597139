"""Artifact downloads to disk: streamed through a temporary file beside the target, hashed
as the bytes pass, renamed into place only when size and SHA-256 match the listing. The async
client does the same on worker threads (``AsyncVerifiedFile``): no disk I/O and no hashing on
its event loop."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

import anyio

from runyard_client.errors import ArtifactIntegrityError, NotFoundError, RunyardError
from runyard_client.models import Artifact

# Bytes read from the network (and written) at a time: memory stays flat whatever the size.
CHUNK_BYTES = 64 * 1024
_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(\d+|\*)")


class UnsafePathError(RunyardError):
    """An artifact path that would land outside the target directory."""

    default_code = "unsafe_path"


def target_path(root: Path, path: str) -> Path:
    """Where artifact ``path`` goes under ``root``: relative, no empty, ``.`` or ``..`` part."""
    parts = path.split("/")
    if path.startswith("/") or "\0" in path or any(part in ("", ".", "..") for part in parts):
        raise UnsafePathError(f"refusing to write artifact {path!r}: not a plain relative path")
    return root.joinpath(*parts)


def pick(artifacts: list[Artifact], run_id: object, path: str) -> Artifact:
    """The artifact listed at ``path``."""
    for artifact in artifacts:
        if artifact.path == path:
            return artifact
    raise NotFoundError(f"run {run_id} has no artifact {path!r}", code="artifact_not_found")


def plan(artifacts: list[Artifact], dest: str | os.PathLike[str]) -> list[tuple[Artifact, Path]]:
    """Where each artifact goes under ``dest`` (created), every path checked before any
    byte is written."""
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    return [(artifact, target_path(root, artifact.path)) for artifact in artifacts]


def destination(dest: str | os.PathLike[str], artifact_path: str) -> Path:
    """The file ``download`` writes: ``dest``, or inside it (under the artifact's file name)
    when it is a directory."""
    target = Path(dest)
    if not target.is_dir():
        return target
    name = artifact_path.rsplit("/", 1)[-1]
    if name in ("", ".", "..") or "\0" in name:
        raise UnsafePathError(f"refusing to write artifact {artifact_path!r}: it has no file name")
    return target / name


class VerifiedFile:
    """One artifact on its way to ``target``: a ``.part`` file beside it that is renamed over
    it only once the bytes match the listing, and removed otherwise."""

    def __init__(self, target: Path, artifact: Artifact) -> None:
        self.target = target
        self.artifact = artifact
        self.partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self._file = os.fdopen(os.open(self.partial, flags, 0o644), "wb")
        self._digest = hashlib.sha256()
        self.written = 0

    def request_headers(self) -> dict[str, str]:
        """After a dropped connection, ask only for the bytes not written yet."""
        # A run's artifacts never change once listed; the hash check catches it if they did.
        return {"Range": f"bytes={self.written}-"} if self.written else {}

    def begin(self, status: int, headers: Mapping[str, str]) -> None:
        """An answer starts: a 206 must continue where the file stops; a 200 is the whole
        file again, from the first byte."""
        if status == 206:
            match = _CONTENT_RANGE.fullmatch(headers.get("content-range", ""))
            if match is None or int(match.group(1)) != self.written:
                raise ArtifactIntegrityError(
                    f"artifact {self.artifact.path!r}: the server answered a range that does "
                    f"not continue at byte {self.written}"
                )
            return
        self._file.seek(0)
        self._file.truncate()
        self._digest = hashlib.sha256()
        self.written = 0

    def write(self, chunk: bytes) -> None:
        """Hash and write one piece; refuse more bytes than listed."""
        self.written += len(chunk)
        if self.written > self.artifact.size:
            raise ArtifactIntegrityError(
                f"artifact {self.artifact.path!r} is longer than the {self.artifact.size} "
                "bytes listed"
            )
        self._digest.update(chunk)
        self._file.write(chunk)

    def finish(self) -> Path:
        """Check size and SHA-256, then rename into place; the target otherwise untouched."""
        self._file.close()
        digest = self._digest.hexdigest()
        if self.written != self.artifact.size or digest != self.artifact.sha256:
            raise ArtifactIntegrityError(
                f"artifact {self.artifact.path!r} arrived with {self.written} bytes and SHA-256 "
                f"{digest}, not the {self.artifact.size} bytes and {self.artifact.sha256} listed"
            )
        os.replace(self.partial, self.target)  # a link at the target is replaced, not followed
        return self.target

    def discard(self) -> None:
        """Remove the partial file (after a failure)."""
        self._file.close()
        self.partial.unlink(missing_ok=True)


class AsyncVerifiedFile:
    """A ``VerifiedFile`` driven from an event loop: opening it, each write with its hashing,
    the final check with the rename, and the clean-up run on a worker thread."""

    def __init__(self, file: VerifiedFile) -> None:
        self._file = file

    @classmethod
    async def open(cls, target: Path, artifact: Artifact) -> AsyncVerifiedFile:
        """Create the partial file beside ``target``."""
        return cls(await anyio.to_thread.run_sync(VerifiedFile, target, artifact))

    def request_headers(self) -> dict[str, str]:
        """After a dropped connection, ask only for the bytes not written yet."""
        return self._file.request_headers()

    async def begin(self, status: int, headers: Mapping[str, str]) -> None:
        """An answer starts (see ``VerifiedFile.begin``)."""
        await anyio.to_thread.run_sync(self._file.begin, status, headers)

    async def write(self, chunk: bytes) -> None:
        """Hash and write one piece."""
        await anyio.to_thread.run_sync(self._file.write, chunk)

    async def finish(self) -> Path:
        """Check size and SHA-256, then rename into place."""
        return await anyio.to_thread.run_sync(self._file.finish)

    async def discard(self) -> None:
        """Remove the partial file; done even while the download is being cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._file.discard)


def make_parents(root: str | os.PathLike[str], target: Path) -> None:
    """Create the directories between ``root`` and ``target``; none may be a link."""
    current = Path(root)
    for part in target.relative_to(current).parts[:-1]:
        current = current / part
        current.mkdir(exist_ok=True)
        if current.is_symlink() or not current.is_dir():
            raise UnsafePathError(f"refusing to write through {current}: not a directory")
