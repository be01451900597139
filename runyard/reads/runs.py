"""Plain reads of runs and their events (the ORM is fine here: nothing is written)."""

from __future__ import annotations

import base64
import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

from sqlalchemy import Engine, select, text, tuple_
from sqlalchemy.orm import Session

from runyard.domain.states import TERMINAL_STATUSES, RunStatus
from runyard.platform.db import autocommit
from runyard.platform.models import ToolRun, ToolRunEvent
from runyard.queue.sql import WAITING_FOR
from runyard.queue.values import WORKER_LIVE_SECONDS
from runyard.reads.events_sql import EVENTS_AFTER

LOG_STREAMS = ("stdout", "stderr")
# A run's events in the order every reader delivers them (runyard.reads.events_sql).
EVENT_ORDER = (ToolRunEvent.xact_id, ToolRunEvent.id)


@dataclass(frozen=True)
class RunView:
    """A run as the API shows it (the read model of its public shape): never the tenant, the
    tool definition, the streams, lease tokens or container ids."""

    id: uuid.UUID
    tool: str
    status: RunStatus
    mode: str
    input: Any
    result: Any | None
    exit_code: int | None
    attempts: int
    max_attempts: int
    error_code: str | None
    error: str | None
    stdout_truncated: bool
    stderr_truncated: bool
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # Why a queued run may wait long, e.g. "no live worker serves queue gpu"; else None.
    waiting_for: str | None = None
    # Workflows: the runs it depends on, those of them not succeeded yet, its batch and its
    # ref there, the run it re-runs, and the time before which it does not start.
    depends_on: tuple[uuid.UUID, ...] = ()
    waiting_on: tuple[uuid.UUID, ...] = ()
    batch_id: uuid.UUID | None = None
    ref: str | None = None
    rerun_of: uuid.UUID | None = None
    run_at: datetime | None = None
    # Schedules: the schedule that made it and the slot it was made for.
    schedule_id: uuid.UUID | None = None
    schedule_slot: datetime | None = None
    # Flow control: the caller's key (the per-key limits of its tool apply).
    concurrency_key: str | None = None
    # The run's trace (32 hex) when it is traced (docs/operations.md, "Traces"); else None.
    trace_id: str | None = None

    @classmethod
    def of(cls, row: Any) -> Self:
        """The public fields of anything that has them (an ORM row, a statement's row); a
        field with a default may be missing from ``row``."""
        return cls(
            **{
                field.name: getattr(row, field.name)
                if field.default is dataclasses.MISSING
                else getattr(row, field.name, field.default)
                for field in dataclasses.fields(cls)
            }
        )


# RunView's fields in one autocommit round trip (no ORM, no transaction); ``tenant`` NULL
# means any tenant (admins).
RUN_VIEW = text(
    """
    SELECT id, tool, status, mode, input, result, exit_code, attempts, max_attempts,
           error_code, error, stdout_truncated, stderr_truncated, requested_at, started_at,
           finished_at, waiting_for, depends_on, waiting_on, batch_id, ref, rerun_of, run_at,
           schedule_id, schedule_slot, concurrency_key, trace_id
    FROM tool_runs r LEFT JOIN LATERAL (
        SELECT """
    + WAITING_FOR
    + """ AS waiting_for
        FROM tool_run_jobs j
        WHERE j.run_id = r.id AND j.status = 'queued'
    ) notice ON true
    LEFT JOIN LATERAL (
        SELECT coalesce(array_agg(d.depends_on ORDER BY d.depends_on),
                        CAST('{}' AS uuid[])) AS depends_on,
               coalesce(array_agg(d.depends_on ORDER BY d.depends_on)
                            FILTER (WHERE c.status <> 'succeeded'),
                        CAST('{}' AS uuid[])) AS waiting_on
        FROM tool_run_deps d JOIN tool_runs c ON c.id = d.depends_on
        WHERE d.run_id = r.id
    ) deps ON true
    LEFT JOIN LATERAL (
        SELECT nullif(split_part(r.spec #>> '{trace_context,traceparent}', '-', 2), '')
            AS trace_id
    ) trace ON true
    WHERE r.id = :id AND (CAST(:tenant AS text) IS NULL OR r.tenant = CAST(:tenant AS text))
    """
)

# The dependencies of a page of runs, as RUN_VIEW shows them.
DEPENDENCIES_OF = text(
    """
    SELECT d.run_id, d.depends_on, c.status = 'succeeded' AS succeeded
    FROM tool_run_deps d JOIN tool_runs c ON c.id = d.depends_on
    WHERE d.run_id = ANY(CAST(:ids AS uuid[]))
    ORDER BY d.run_id, d.depends_on
    """
)


def trace_id_of(spec: Any) -> str | None:
    """The trace id a run's snapshot carries, as RUN_VIEW reads it."""
    carried = spec.get("trace_context") if isinstance(spec, dict) else None
    parent = carried.get("traceparent") if isinstance(carried, dict) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    return parts[1] if len(parts) == 4 else None


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


class BadCursor(Exception):
    """The pagination cursor is not one this API handed out."""


def encode_cursor(run: ToolRun) -> str:
    """An opaque keyset cursor: the last row's ``requested_at`` and ``id``."""
    return encode_cursor_parts(run.requested_at, run.id)


def encode_cursor_parts(stamp: datetime, row_id: uuid.UUID) -> str:
    """An opaque keyset cursor of a time and an id."""
    raw = f"{stamp.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Inverse of ``encode_cursor``; raises ``BadCursor`` for anything else."""
    return decode_cursor_parts(cursor)


def decode_cursor_parts(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Inverse of ``encode_cursor_parts``; raises ``BadCursor`` for anything else."""
    try:
        raw = base64.b64decode(
            cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True
        ).decode()
        stamp_text, _, run_id = raw.partition("|")
        stamp = datetime.fromisoformat(stamp_text)
        if stamp.tzinfo is None:
            raise ValueError("naive timestamp")
        return stamp, uuid.UUID(run_id)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise BadCursor("the cursor is malformed; use next_cursor from a previous page") from exc


class RunReader:
    """Reads runs for a tenant (or all tenants); another tenant's run reads as missing."""

    def __init__(self, engine: Engine, *, worker_live_seconds: float = WORKER_LIVE_SECONDS) -> None:
        self._engine = engine
        self._live = worker_live_seconds

    def view(self, run_id: uuid.UUID, tenant: str | None) -> RunView | None:
        """The run's public fields if ``tenant`` may see it (None: any tenant), else None."""
        params = {"id": run_id, "tenant": tenant, "live": self._live}
        rows = autocommit(self._engine, RUN_VIEW, params)
        if not rows:
            return None
        row = rows[0]
        return dataclasses.replace(
            RunView.of(row),
            status=RunStatus(row.status),
            depends_on=tuple(row.depends_on),
            waiting_on=tuple(row.waiting_on),
        )

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
