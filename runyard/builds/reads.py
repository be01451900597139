"""Reads of builds for the API, the CLI and the dashboard (no state changes here)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

_FIELDS = """id, tag, tool, digest, engine_id, status, attempts, max_attempts, created_at,
             started_at, finished_at, deadline_at, locked_by, error, image_id, log_size"""

_LIST = text(
    f"""
    SELECT {_FIELDS} FROM tool_builds
    WHERE (CAST(:tool AS text) IS NULL OR tool = :tool)
      AND (CAST(:status AS text) IS NULL OR status = :status)
    ORDER BY created_at DESC, id
    LIMIT :limit
    """
)
_ONE = text(f"SELECT {_FIELDS}, log FROM tool_builds WHERE id = :id")
_BY_TAGS = text(
    "SELECT tag, engine_id, status FROM tool_builds WHERE tag = ANY(CAST(:tags AS text[])) "
    "ORDER BY tag, engine_id"
)
_FOLLOW = text("SELECT status, log, log_size FROM tool_builds WHERE id = :id")

TERMINAL = frozenset({"ready", "failed"})


@dataclass(frozen=True)
class BuildView:
    """A build as callers see it; ``log`` only when one build is asked for."""

    id: uuid.UUID
    tag: str
    tool: str
    digest: str
    engine_id: str
    status: str
    attempts: int
    max_attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    deadline_at: datetime | None
    locked_by: str | None
    error: str | None
    image_id: str | None
    log_size: int
    log: str | None = None

    def public(self) -> dict[str, Any]:
        """The JSON fields (times as ISO strings)."""
        out: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, uuid.UUID):
                value = str(value)
            out[name] = value
        if self.log is None:
            out.pop("log")
        return out


@dataclass(frozen=True)
class LogPiece:
    """What a follower has not seen of a build's log, and where it now stands."""

    status: str
    text: str
    size: int
    # Some of what it had not seen is gone (the log keeps only its tail).
    gap: bool


def log_since(log: str, size: int, seen: int) -> tuple[str, bool]:
    """The part of a tail-capped log after ``seen`` characters of the ``size`` ever written,
    and whether some of it was dropped."""
    unseen = max(size - seen, 0)
    if unseen == 0:
        return "", False
    if unseen > len(log):
        return log, True
    return log[len(log) - unseen :], False


class BuildReads:
    """Builds listed, one build with its log, a tool's builds per engine, a log followed."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def list(
        self, *, tool: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[BuildView]:
        """The newest builds first."""
        with self._engine.connect() as conn:
            rows = conn.execute(_LIST, {"tool": tool, "status": status, "limit": limit}).all()
        return [BuildView(**row._mapping) for row in rows]

    def get(self, build_id: uuid.UUID) -> BuildView | None:
        """One build with its log."""
        with self._engine.connect() as conn:
            row = conn.execute(_ONE, {"id": build_id}).one_or_none()
        return None if row is None else BuildView(**row._mapping)

    def by_tags(self, tags: Sequence[str]) -> dict[str, dict[str, str]]:
        """Per tag, the status of its build on each engine that has one."""
        found: dict[str, dict[str, str]] = {tag: {} for tag in tags}
        if not tags:
            return found
        with self._engine.connect() as conn:
            for row in conn.execute(_BY_TAGS, {"tags": list(tags)}):
                found[row.tag][row.engine_id] = row.status
        return found

    def follow(self, build_id: uuid.UUID, seen: int) -> LogPiece | None:
        """The log written since ``seen`` characters, with the build's status."""
        with self._engine.connect() as conn:
            row = conn.execute(_FOLLOW, {"id": build_id}).one_or_none()
        if row is None:
            return None
        piece, gap = log_since(row.log, row.log_size, seen)
        return LogPiece(status=row.status, text=piece, size=int(row.log_size), gap=gap)
