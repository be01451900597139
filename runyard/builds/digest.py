"""The content address of a build: what goes into it and the image tag it names."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TAG_PREFIX = "runyard-build/"
DIGEST_HEX = 12


@dataclass(frozen=True)
class ContextFile:
    """One regular file of a build context: its path (``/``-separated, relative), whether it
    is executable, and its bytes."""

    path: str
    executable: bool
    data: bytes


def context_digest(files: Iterable[ContextFile], dockerfile: str, args: Mapping[str, str]) -> str:
    """The sha256 (hex) of the context's files, the Dockerfile's path and the build args.

    Files are taken in path order, each framed by its path, mode and length, so neither a
    rename nor moving bytes from one file to the next can keep the digest.
    """
    sha = hashlib.sha256(b"runyard-build-v1\0")
    for item in sorted(files, key=lambda f: f.path):
        head = f"{item.path}\0{'x' if item.executable else '-'}\0{len(item.data)}\0"
        sha.update(head.encode())
        sha.update(item.data)
    sha.update(f"dockerfile\0{dockerfile}\0".encode())
    sha.update(json.dumps(dict(args), sort_keys=True, separators=(",", ":")).encode())
    return sha.hexdigest()


def image_tag(tool: str, digest: str) -> str:
    """``runyard-build/<tool>:<first 12 hex of the digest>``."""
    return f"{TAG_PREFIX}{tool}:{digest[:DIGEST_HEX]}"


def is_build_tag(image: str) -> bool:
    """Whether an image reference is one the platform builds (never pulled)."""
    return image.startswith(TAG_PREFIX)
