"""A build context on disk: its files (capped), its digest and the tar the engine is sent."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from runyard.builds.digest import ContextFile, context_digest, image_tag
from runyard.domain.build_ref import BuildRef
from runyard.registry.tools import BuildResolver, ToolSpec


class ContextProblem(Exception):
    """The build context cannot be used: missing, holding a link or device, too large."""


# (path, size, mtime, mode) of every entry: a context that changed on disk changes this.
Signature = tuple[tuple[str, int, int, int], ...]


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``root`` as ``(relative posix path, lstat)``, in path order."""
    if not root.is_dir():
        raise ContextProblem(f"build context {root} is not a directory")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(Path(dirpath, d))]:
            full = Path(dirpath, name)
            found.append((full.relative_to(root).as_posix(), full.lstat()))
    return sorted(found)


def signature(root: Path) -> Signature:
    """What a cache of the context's digest is keyed on."""
    return tuple((path, st.st_size, st.st_mtime_ns, st.st_mode) for path, st in _walk(root))


def read_context(root: Path, dockerfile: str, max_bytes: int) -> list[ContextFile]:
    """The context's regular files; links, devices, FIFOs and more than ``max_bytes`` in all
    are refused, and the Dockerfile must be one of the files."""
    files, total = [], 0
    for path, st in _walk(root):
        if not stat.S_ISREG(st.st_mode):
            raise ContextProblem(f"build context {root}: {path} is not a regular file")
        total += st.st_size
        if total > max_bytes:
            raise ContextProblem(f"build context {root} holds more than {max_bytes} bytes")
        data = (root / path).read_bytes()
        files.append(ContextFile(path, bool(st.st_mode & 0o111), data))
    if not any(f.path == dockerfile for f in files):
        raise ContextProblem(f"build context {root} has no {dockerfile}")
    return files


def context_tar(files: Sequence[ContextFile]) -> bytes:
    """The files as a tar the engine's build API takes; owners, times and modes normalised,
    so the same files always make the same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for item in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(item.path)
            info.size = len(item.data)
            info.mode = 0o755 if item.executable else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(item.data))
    return buffer.getvalue()


# Saves a context under its tag (kept once): ``(ref, tar bytes)``.
ContextSink = Callable[[BuildRef, bytes], None]


class DiskBuildResolver(BuildResolver):
    """Reads a built tool's context from disk, with the digest cached until a file changes;
    a digest seen for the first time has its context saved before a run may name it."""

    def __init__(self, base_dir: Path, sink: ContextSink, *, max_bytes: int) -> None:
        self._base_dir = base_dir
        self._sink = sink
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        # Per tool: its build entry as last seen (a registry reload may change it), the
        # context's signature, and the build they made.
        self._cache: dict[str, tuple[tuple[object, int], Signature, BuildRef]] = {}

    def resolve(self, tool: ToolSpec) -> BuildRef:
        """The tool's build as its source is now."""
        assert tool.build is not None
        root = self._base_dir / tool.build.context
        seen = signature(root)
        entry = (tool.build, tool.build_timeout_seconds)
        with self._lock:
            cached = self._cache.get(tool.name)
        if cached is not None and cached[0] == entry and cached[1] == seen:
            return cached[2]
        files = read_context(root, tool.build.dockerfile, self._max_bytes)
        digest = context_digest(files, tool.build.dockerfile, tool.build.args)
        ref = BuildRef(
            tool=tool.name,
            tag=image_tag(tool.name, digest),
            digest=digest,
            dockerfile=tool.build.dockerfile,
            args=dict(tool.build.args),
            network=tool.build.network,
            timeout_seconds=tool.build_timeout_seconds,
            size=sum(len(f.data) for f in files),
        )
        self._sink(ref, context_tar(files))
        with self._lock:
            self._cache[tool.name] = (entry, seen, ref)
        return ref
