"""Collecting /runyard/out into a new artifact set, one member at a time, never a whole file
in memory: from the engine's tar stream of the directory, or from the attempt's host work
directory. Every member passes the rules (``runyard.artifacts.rules``) before its bytes are
read; ``result.json`` at the top is the result and is skipped here. The tool's secret values
are masked in every path and in text content, and a binary file holding one is refused
(``runyard.artifacts.masking``); messages only ever show masked paths."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, cast

from runyard.artifact_store import CHUNK_SIZE, ArtifactWriter
from runyard.artifacts.masking import mask_path, masked_content
from runyard.artifacts.rules import ArtifactLimits, ArtifactRefused, Kind, Tally, is_result
from runyard.domain.states import ErrorCode
from runyard.registry.redact import Redactor

NO_SECRETS = Redactor(())

_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class CollectError(Exception):
    """The outputs could not be read (a broken stream, a vanished file): decide nothing."""


class _ChunkReader:
    """A ``read(n)`` file over an iterator of byte chunks, copying each byte once."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._piece = b""
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        while size < 0 or len(out) < size:
            if self._at >= len(self._piece):
                self._piece, self._at = next(self._chunks, b""), 0
                if not self._piece:
                    break
            take = len(self._piece) - self._at
            if size >= 0:
                take = min(take, size - len(out))
            out += self._piece[self._at : self._at + take]
            self._at += take
        return bytes(out)


def tar_kind(member: tarfile.TarInfo) -> Kind:
    """What a tar member is."""
    if member.isreg():
        return Kind.FILE
    if member.isdir():
        return Kind.DIRECTORY
    if member.issym():
        return Kind.SYMLINK
    if member.islnk():
        return Kind.HARDLINK
    if member.ischr() or member.isblk():
        return Kind.DEVICE
    if member.isfifo():
        return Kind.FIFO
    return Kind.OTHER


def stat_kind(info: os.stat_result) -> Kind:
    """What a directory entry is (a file with other names is a hard link)."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return Kind.FILE if info.st_nlink == 1 else Kind.HARDLINK
    if stat.S_ISDIR(mode):
        return Kind.DIRECTORY
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return Kind.DEVICE
    if stat.S_ISFIFO(mode):
        return Kind.FIFO
    return Kind.OTHER


def _pieces(stream: IO[bytes], size: int, path: str) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``stream``, a chunk at a time."""
    left = size
    while left > 0:
        piece = stream.read(min(CHUNK_SIZE, left))
        if not piece:
            raise CollectError(f"{path!r} ended {left} bytes early")
        left -= len(piece)
        yield piece


def collect_tar(
    chunks: Iterable[bytes],
    writer: ArtifactWriter,
    limits: ArtifactLimits,
    top: str = "out",
    redactor: Redactor = NO_SECRETS,
) -> int:
    """Store the files of the tar stream of directory ``top``; how many were stored.

    Raises ``ArtifactRefused`` for a member the rules refuse or one over a limit, and
    ``CollectError`` when the stream itself is broken.
    """
    tally = Tally(limits)
    try:
        reader = cast(IO[bytes], _ChunkReader(chunks))  # tarfile calls read() only
        with tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK_SIZE) as tar:
            for member in tar:
                if member.name == top:
                    if not member.isdir():
                        raise ArtifactRefused(
                            ErrorCode.INVALID_ARTIFACT, f"/runyard/{top} is not a directory"
                        )
                    continue
                path = member.name.removeprefix(top + "/")
                if path == member.name:
                    path = "/" + member.name  # outside ``top``: refused as absolute
                if is_result(path):
                    continue
                shown = mask_path(redactor, path)
                kind = tar_kind(member)
                tally.admit(shown, kind, member.size)
                if kind is Kind.FILE:
                    handle = tar.extractfile(member)
                    if handle is None:
                        raise CollectError(f"{shown!r} has no content in the archive")
                    pieces = _pieces(handle, member.size, shown)
                    writer.add(shown, masked_content(redactor, shown, pieces, tally))
    except tarfile.TarError as exc:
        raise CollectError(f"the archive of /runyard/{top} could not be read: {exc}") from exc
    return tally.files


def collect_dir(
    out: Path, writer: ArtifactWriter, limits: ArtifactLimits, redactor: Redactor = NO_SECRETS
) -> int:
    """Store the files under the host directory ``out``, opened without following a link at
    any step; how many were stored. Raises as ``collect_tar`` does."""
    tally = Tally(limits)
    try:
        top = os.open(out, _DIR_FLAGS)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise CollectError(f"cannot open {out}: {exc.strerror}") from exc
    try:
        _walk(top, "", writer, tally, redactor)
    finally:
        os.close(top)
    return tally.files


def _walk(
    directory: int, prefix: str, writer: ArtifactWriter, tally: Tally, redactor: Redactor
) -> None:
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        shown_dir = mask_path(redactor, prefix or ".")
        raise CollectError(f"cannot list {shown_dir!r}: {exc.strerror}") from exc
    for name in names:
        path = prefix + name
        if is_result(path):
            continue
        shown = mask_path(redactor, path)
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except OSError as exc:
            raise CollectError(f"cannot stat {shown!r}: {exc.strerror}") from exc
        kind = stat_kind(info)
        tally.admit(shown, kind, info.st_size)
        flags = _DIR_FLAGS if kind is Kind.DIRECTORY else _FILE_FLAGS
        try:
            fd = os.open(name, flags, dir_fd=directory)
        except OSError as exc:
            raise CollectError(f"cannot open {shown!r}: {exc.strerror}") from exc
        if kind is Kind.DIRECTORY:
            try:
                _walk(fd, path + "/", writer, tally, redactor)
            finally:
                os.close(fd)
            continue
        with os.fdopen(fd, "rb") as stream:
            opened = os.fstat(stream.fileno())
            if (opened.st_ino, opened.st_dev) != (info.st_ino, info.st_dev):
                raise CollectError(f"{shown!r} changed while it was read")
            pieces = _pieces(stream, info.st_size, shown)
            writer.add(shown, masked_content(redactor, shown, pieces, tally))
