"""Plain reads of runs and their events (the ORM is fine here: nothing is written)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, select, text, tuple_
from sqlalchemy.orm import Session

from runyard.domain.states import TERMINAL_STATUSES, RunStatus
from runyard.platform.db import autocommit
from runyard.platform.models import ToolRun, ToolRunEvent
from runyard.queue.values import WORKER_LIVE_SECONDS
from runyard.reads.cursors import decode_cursor_parts, encode_cursor_parts
from runyard.reads.events_sql import EVENTS_AFTER
from runyard.reads.run_view import RunView, read_run_view, trace_id_of

LOG_STREAMS = ("stdout", "stderr")
# A run's events in the order every reader delivers them (runyard.reads.events_sql).
EVENT_ORDER = (ToolRunEvent.xact_id, ToolRunEvent.id)


# The dependencies of a page of runs, as RUN_VIEW shows them.
DEPENDENCIES_OF = text(
    """
    SELECT d.run_id, d.depends_on, c.status = 'succeeded' AS succeeded
    FROM tool_run_deps d JOIN tool_runs c ON c.id = d.depends_on
    WHERE d.run_id = ANY(CAST(:ids AS uuid[]))
    ORDER BY d.run_id, d.depends_on
    """
)


@dataclass(frozen=True)
class RunFilter:
    """Filters of a run listing; ``tenant=None`` means every tenant (admins only)."""

    tenant: str | None
    status: RunStatus | None = None
    tool: str | None = None
    mode: str | None = None


@dataclass(frozen=True)
class EventPage:
    """A run's status (``None``: no such run) and its events after a cursor, in order."""

    status: RunStatus | None
    events: list[ToolRunEvent]
    held: bool  # later events are committed but wait for older transactions to end


def encode_cursor(run: ToolRun) -> str:
    """An opaque keyset cursor: the last row's ``requested_at`` and ``id``."""
    return encode_cursor_parts(run.requested_at, run.id)


class RunReader:
    """Reads runs for a tenant (or all tenants); another tenant's run reads as missing."""

    def __init__(self, engine: Engine, *, worker_live_seconds: float = WORKER_LIVE_SECONDS) -> None:
        self._engine = engine
        self._live = worker_live_seconds

    def view(self, run_id: uuid.UUID, tenant: str | None) -> RunView | None:
        """The run's public fields if ``tenant`` may see it (None: any tenant), else None."""
        return read_run_view(self._engine, run_id, tenant, worker_live_seconds=self._live)

    def views(self, runs: list[ToolRun]) -> list[RunView]:
        """The read model of a page of runs, their dependencies included (one query)."""
        depends: dict[uuid.UUID, list[uuid.UUID]] = {}
        waiting: dict[uuid.UUID, list[uuid.UUID]] = {}
        if runs:
            params = {"ids": [run.id for run in runs]}
            for row in autocommit(self._engine, DEPENDENCIES_OF, params):
                depends.setdefault(row.run_id, []).append(row.depends_on)
                if not row.succeeded:
                    waiting.setdefault(row.run_id, []).append(row.depends_on)
        return [
            dataclasses.replace(
                RunView.of(run),
                depends_on=tuple(depends.get(run.id, ())),
                waiting_on=tuple(waiting.get(run.id, ())),
                trace_id=trace_id_of(run.spec),
            )
            for run in runs
        ]

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
        if filters.mode is not None:
            query = query.where(ToolRun.mode == filters.mode)
        if cursor is not None:
            stamp, last_id = decode_cursor_parts(cursor)
            query = query.where(tuple_(ToolRun.requested_at, ToolRun.id) < tuple_(stamp, last_id))
        query = query.order_by(ToolRun.requested_at.desc(), ToolRun.id.desc()).limit(limit + 1)
        with Session(self._engine, expire_on_commit=False) as session:
            rows = list(session.scalars(query))
            for row in rows:
                session.expunge(row)
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, encode_cursor(rows[-1]) if more and rows else None

    def status_and_events(
        self, run_id: uuid.UUID, after_id: int = 0, limit: int = 500
    ) -> EventPage:
        """The run's status, then its events after event ``after_id`` (EVENTS_AFTER).

        Read in that order, a terminal status guarantees its final event is in the answer or
        held (both are written in one transaction), unless it was pruned or already seen.
        """
        params = {"run_id": run_id, "after": after_id, "limit": limit}
        with self._engine.connect() as conn:
            status = conn.scalar(select(ToolRun.status).where(ToolRun.id == run_id))
            rows = conn.execute(EVENTS_AFTER, params).all()
        ready = [
            ToolRunEvent(id=row.id, run_id=row.run_id, at=row.at, type=row.type, data=row.data)
            for row in rows
            if row.ready
        ]
        return EventPage(status=status, events=ready, held=len(ready) < len(rows))

    def live_logs(self, run_id: uuid.UUID, attempt: int, streams: tuple[str, ...]) -> str:
        """The live log chunks of one attempt so far, in the order they were stored."""
        texts = (
            select(ToolRunEvent.data["text"].astext)
            .where(
                ToolRunEvent.run_id == run_id,
                ToolRunEvent.type.in_(streams),
                ToolRunEvent.data["attempt"].astext == str(attempt),
            )
            .order_by(*EVENT_ORDER)
        )
        with Session(self._engine) as session:
            return "".join(text or "" for text in session.scalars(texts))


def is_terminal_event(event: ToolRunEvent) -> bool:
    """A ``status`` event that reports a terminal status: the last event of a run."""
    if event.type != "status" or not isinstance(event.data, dict):
        return False
    return event.data.get("status") in {s.value for s in TERMINAL_STATUSES}
