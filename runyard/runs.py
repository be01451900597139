"""Plain reads of runs and their events (the ORM is fine here: nothing is written)."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select, tuple_
from sqlalchemy.orm import Session

from runyard.models import RunStatus, ToolRun, ToolRunEvent


@dataclass(frozen=True)
class RunFilter:
    """Filters of a run listing; ``tenant=None`` means every tenant (admins only)."""

    tenant: str | None
    status: RunStatus | None = None
    tool: str | None = None


class BadCursor(Exception):
    """The pagination cursor is not one this API handed out."""


def encode_cursor(run: ToolRun) -> str:
    """An opaque keyset cursor: the last row's ``requested_at`` and ``id``."""
    raw = f"{run.requested_at.isoformat()}|{run.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Inverse of ``encode_cursor``; raises ``BadCursor`` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, _, run_id = raw.partition("|")
        return datetime.fromisoformat(stamp), uuid.UUID(run_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadCursor("the cursor is malformed; use next_cursor from a previous page") from exc


class RunReader:
    """Reads runs for a tenant (or all tenants); another tenant's run reads as missing."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def get(self, run_id: uuid.UUID, tenant: str | None) -> ToolRun | None:
        """The run, if it exists and the tenant may see it."""
        with Session(self._engine, expire_on_commit=False) as session:
            run = session.get(ToolRun, run_id)
            if run is None or (tenant is not None and run.tenant != tenant):
                return None
            session.expunge(run)
            return run

    def page(
        self, filters: RunFilter, *, limit: int, cursor: str | None = None
    ) -> tuple[list[ToolRun], str | None]:
        """Newest first, keyset-paginated on ``(requested_at, id)``."""
        query = select(ToolRun)
        if filters.tenant is not None:
            query = query.where(ToolRun.tenant == filters.tenant)
        if filters.status is not None:
            query = query.where(ToolRun.status == filters.status)
        if filters.tool is not None:
            query = query.where(ToolRun.tool == filters.tool)
        if cursor is not None:
            stamp, last_id = decode_cursor(cursor)
            query = query.where(tuple_(ToolRun.requested_at, ToolRun.id) < tuple_(stamp, last_id))
        query = query.order_by(ToolRun.requested_at.desc(), ToolRun.id.desc()).limit(limit + 1)
        with Session(self._engine, expire_on_commit=False) as session:
            rows = list(session.scalars(query))
            for row in rows:
                session.expunge(row)
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, encode_cursor(rows[-1]) if more and rows else None

    def events(self, run_id: uuid.UUID, after_id: int = 0, limit: int = 500) -> list[ToolRunEvent]:
        """Events of a run after ``after_id``, oldest first."""
        query = (
            select(ToolRunEvent)
            .where(ToolRunEvent.run_id == run_id, ToolRunEvent.id > after_id)
            .order_by(ToolRunEvent.id)
            .limit(limit)
        )
        with Session(self._engine, expire_on_commit=False) as session:
            rows = list(session.scalars(query))
            for row in rows:
                session.expunge(row)
        return rows
