"""A built tool pinned to one digest of its source, as data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BuildRef:
    """A built tool pinned to one digest of its source: what a run of it is snapshotted with."""

    tool: str
    tag: str
    digest: str
    dockerfile: str
    args: dict[str, str]
    network: str
    timeout_seconds: int
    size: int

    def snapshot(self) -> dict[str, Any]:
        """The ``build`` stored on a run (next to ``image`` = the tag)."""
        return {
            "tag": self.tag,
            "digest": self.digest,
            "dockerfile": self.dockerfile,
            "args": dict(self.args),
            "network": self.network,
            "timeout_seconds": self.timeout_seconds,
        }
