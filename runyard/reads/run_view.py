"""A run's public shape and its one-statement read, without the ORM: the reaper's webhook
deliveries read runs this way, and importing the mapped classes would cost each of its
starts a third of a second of CPU."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

from sqlalchemy import Engine, text

from runyard.domain.states import RunStatus
from runyard.platform.db import autocommit
from runyard.queue.sql import WAITING_FOR
from runyard.queue.values import WORKER_LIVE_SECONDS


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

# A run's snapshot, for the trace context it carries.
RUN_SPEC = text("SELECT spec FROM tool_runs WHERE id = :id")


def trace_id_of(spec: Any) -> str | None:
    """The trace id a run's snapshot carries, as RUN_VIEW reads it."""
    carried = spec.get("trace_context") if isinstance(spec, dict) else None
    parent = carried.get("traceparent") if isinstance(carried, dict) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    return parts[1] if len(parts) == 4 else None


def read_run_view(
    engine: Engine,
    run_id: uuid.UUID,
    tenant: str | None,
    *,
    worker_live_seconds: float = WORKER_LIVE_SECONDS,
) -> RunView | None:
    """The run's public fields if ``tenant`` may see it (None: any tenant), else None."""
    params = {"id": run_id, "tenant": tenant, "live": worker_live_seconds}
    rows = autocommit(engine, RUN_VIEW, params)
    if not rows:
        return None
    row = rows[0]
    return dataclasses.replace(
        RunView.of(row),
        status=RunStatus(row.status),
        depends_on=tuple(row.depends_on),
        waiting_on=tuple(row.waiting_on),
    )


def read_run_spec(engine: Engine, run_id: uuid.UUID) -> Any | None:
    """The run's snapshot (``spec``), or None when there is no such run."""
    rows = autocommit(engine, RUN_SPEC, {"id": run_id})
    return rows[0].spec if rows else None
