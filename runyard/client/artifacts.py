"""``runyard artifacts ID [--out DIR]``: list a run's artifacts, or download them all into DIR
with their subdirectories, never writing outside DIR and checking every SHA-256."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from runyard.client.http import ClientError, RunyardClient


class UnsafePath(ClientError):
    """An artifact path that would land outside the target directory."""


def target_path(out: Path, path: str) -> Path:
    """Where ``path`` goes under ``out``: relative, no empty, ``.`` or ``..`` component."""
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in path:
        raise UnsafePath(f"refusing to write artifact {path!r}: not a plain relative path")
    return out.joinpath(*parts)


def _make_dirs(out: Path, target: Path) -> None:
    """Create the directories between ``out`` and ``target``; none may be a link."""
    current = out
    for part in target.relative_to(out).parts[:-1]:
        current = current / part
        try:
            current.mkdir()
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            raise UnsafePath(f"refusing to write through {current}: not a directory")


def download_all(client: RunyardClient, run_id: str, out: Path) -> list[dict[str, Any]]:
    """Download every artifact of the run into ``out``; the list the API gave."""
    listing = client.artifacts(run_id)
    out.mkdir(parents=True, exist_ok=True)
    artifacts: list[dict[str, Any]] = listing["artifacts"]
    targets = [(artifact, target_path(out, str(artifact["path"]))) for artifact in artifacts]
    for artifact, target in targets:
        _make_dirs(out, target)
        _download_one(client, artifact, target)
    return artifacts


def _download_one(client: RunyardClient, artifact: dict[str, Any], target: Path) -> None:
    """Stream one artifact to ``target`` (through a ``.part`` file), its hash checked."""
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(partial, flags, 0o644), "wb") as stream:

        def sink(piece: bytes) -> None:
            digest.update(piece)
            stream.write(piece)

        client.download(str(artifact["url"]), sink)
    if digest.hexdigest() != artifact["sha256"]:
        partial.unlink()
        raise ClientError(f"artifact {artifact['path']!r} arrived with another SHA-256")
    partial.replace(target)  # a link at ``target`` is replaced, never followed
