"""A sandbox's files: streamed in and out of its workspace through the engine's archive API,
with the path rules of run artifacts (``runyard.artifacts.rules``): no absolute path, no
``..``, no link along the way, only regular files and directories, a size cap."""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from runyard.artifacts.deps_out import Pieces
from runyard.artifacts.rules import path_problem
from runyard.domain.sandboxes import WORKSPACE
from runyard.sandbox_engine import SandboxFileEngine

BLOCK = 512
READ_BYTES = 1_048_576
# The engine's stat of a path carries Go's file mode bits: a directory, and what is neither
# a directory nor a regular file (link, device, pipe, socket, irregular).
MODE_DIR = 1 << 31
MODE_OTHER = (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)


class FileRefused(Exception):
    """A file request that cannot be served: its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Download:
    """What a download streams: one file's bytes, or a directory as a tar."""

    name: str
    is_dir: bool
    chunks: Iterator[bytes]


def _checked(path: str, *, allow_root: bool) -> str:
    """The path relative to the workspace, checked; ``FileRefused`` 422 if it is not one."""
    cleaned = path.strip("/") if allow_root else path
    if allow_root and cleaned == "":
        return ""
    problem = path_problem(cleaned)
    if problem is not None:
        raise FileRefused(422, "invalid_path", f"path: {problem}")
    return cleaned


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def _ids(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


def upload_stream(path: str, body: IO[bytes], size: int, user: str, now: float) -> Iterator[bytes]:
    """A tar stream of ``path`` (its parents as directories of the sandbox's user) holding
    ``size`` bytes read from ``body``, never held whole."""
    uid, gid = _ids(user)
    parts = path.split("/")
    for depth in range(1, len(parts)):
        info = tarfile.TarInfo("/".join(parts[:depth]))
        info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, uid, gid, now
        yield info.tobuf(tarfile.PAX_FORMAT)
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.uid, info.gid, info.mtime = size, 0o644, uid, gid, now
    yield info.tobuf(tarfile.PAX_FORMAT)
    left = size
    while left > 0:
        chunk = body.read(min(READ_BYTES, left))
        if not chunk:
            raise OSError("the upload ended early")
        left -= len(chunk)
        yield chunk
    yield _padding(size)
    yield b"\0" * (BLOCK * 2)


def _file_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    source = tar.extractfile(member)
    assert source is not None
    while chunk := source.read(READ_BYTES):
        yield chunk


def _one_file(chunks: Iterator[bytes]) -> Iterator[bytes]:
    with tarfile.open(fileobj=io.BufferedReader(Pieces(chunks)), mode="r|") as tar:
        for member in tar:
            if member.isreg():
                yield from _file_bytes(tar, member)
            return


def _directory(chunks: Iterator[bytes], top: str) -> Iterator[bytes]:
    """The directory's tar again, with only regular files and directories whose paths pass
    the rules (a link, a device or a FIFO the sandbox made is left out)."""
    with tarfile.open(fileobj=io.BufferedReader(Pieces(chunks)), mode="r|") as tar:
        for member in tar:
            inner = member.name.split("/", 1)[1] if "/" in member.name else ""
            if inner and path_problem(inner) is not None:
                continue
            if not (member.isreg() or member.isdir()):
                continue
            out = tarfile.TarInfo(posixpath.join(top, inner) if inner else top)
            out.type, out.mode, out.mtime = member.type, member.mode & 0o755, member.mtime
            out.size = member.size if member.isreg() else 0
            yield out.tobuf(tarfile.PAX_FORMAT)
            if member.isreg():
                yield from _file_bytes(tar, member)
                yield _padding(member.size)
    yield b"\0" * (BLOCK * 2)


class SandboxFiles:
    """Uploads and downloads of one engine's sandboxes."""

    def __init__(self, engine: SandboxFileEngine) -> None:
        self._engine = engine

    def engine_id(self) -> str:
        """The engine these files go through."""
        return self._engine.engine_id()

    def _no_links(self, container: str, path: str) -> None:
        if path and self._engine.has_link(container, path):
            raise FileRefused(422, "link_in_path", "path: a component is a symbolic link")

    def upload(self, container: str, path: str, body: IO[bytes], size: int, user: str) -> str:
        """Write ``size`` bytes of ``body`` to ``path`` of the workspace; the path stored."""
        path = _checked(path, allow_root=False)
        self._no_links(container, path)
        parent = posixpath.dirname(path)
        if parent:
            self._no_links(container, parent)
        self._engine.put_archive(
            container, WORKSPACE, upload_stream(path, body, size, user, time.time())
        )
        return path

    def download(self, container: str, path: str) -> Download:
        """``path`` of the workspace: a regular file's bytes, or a directory as a tar."""
        path = _checked(path, allow_root=True)
        self._no_links(container, path)
        target = posixpath.join(WORKSPACE, path) if path else WORKSPACE
        try:
            chunks, stat = self._engine.get_archive(container, target)
        except FileNotFoundError as exc:
            raise FileRefused(404, "file_not_found", f"no {path or '/'} in the workspace") from exc
        mode = int(stat.get("mode", 0))
        name = posixpath.basename(path) or "workspace"
        if mode & MODE_DIR:
            return Download(name, True, _directory(chunks, name))
        if mode & MODE_OTHER:
            raise FileRefused(422, "not_a_file", f"{path} is not a regular file or a directory")
        return Download(name, False, _one_file(chunks))
