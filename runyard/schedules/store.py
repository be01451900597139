"""A tenant's schedules: create (checked like a submit), read, list, pause, resume, delete."""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from sqlalchemy import Engine, TextClause

from runyard.domain.schedule_slots import Cadence, CadenceProblem, CatchUp
from runyard.platform.db import autocommit
from runyard.reads.cursors import decode_cursor_parts, encode_cursor_parts
from runyard.registry.tools import ToolRegistry
from runyard.schedules.sql import (
    DELETE_SCHEDULE,
    GET_SCHEDULE,
    INSERT_SCHEDULE,
    LOCK_SCHEDULE,
    PAUSE_SCHEDULE,
    RESUME_SCHEDULE,
    SCHEDULE_PAGE,
)
from runyard.submission.request import RunRequest


class TooManySchedules(Exception):
    """The tenant has as many schedules as it may."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"this tenant has {cap} schedules, the most it may have; delete one")
        self.cap = cap


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as the API shows it: never its tenant."""

    id: uuid.UUID
    tool: str
    input: Any
    priority: int
    cron: str | None
    every_seconds: int | None
    timezone: str
    start_at: datetime
    end_at: datetime | None
    catch_up: str
    paused: bool
    # The next slot to fire (or to skip); None once it has no slot left.
    next_slot_at: datetime | None
    created_at: datetime
    updated_at: datetime
    fired: int
    skipped: int
    last_slot_at: datetime | None
    last_run_id: uuid.UUID | None
    # Why its last slots made no run (the tool is gone, its input no longer fits, a tenant
    # cap); None after a slot that made one.
    last_error: str | None

    @classmethod
    def of(cls, row: Any) -> Self:
        """The fields of a statement's row."""
        return cls(**{field.name: getattr(row, field.name) for field in dataclasses.fields(cls)})


@dataclass(frozen=True)
class NewSchedule:
    """What a caller asks for, parsed (types and bounds), not yet checked against the registry."""

    tenant: str
    tool: str
    input: Any
    cron: str | None
    every_seconds: int | None
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    catch_up: CatchUp = CatchUp.NONE
    priority: int = 0
    # The caller's highest priority (None: any) and the tools its key may run (None: every).
    max_priority: int | None = None
    allowed_tools: frozenset[str] | None = None

    def cadence(self, now: datetime) -> Cadence:
        """Its cadence (from ``now`` without a ``start_at``); raises ``CadenceProblem``."""
        return Cadence(
            self.cron, self.every_seconds, self.timezone, self.start_at or now, self.end_at
        )


class Schedules:
    """The schedule use cases over the database and the tool registry."""

    def __init__(self, engine: Engine, registry: ToolRegistry, *, max_per_tenant: int) -> None:
        self._engine = engine
        self._registry = registry
        self._cap = max_per_tenant

    def create(self, new: NewSchedule, *, now: datetime | None = None) -> ScheduleView:
        """Check the cadence, the tool and the input as a submit would, then store it; its
        first slot is the first at or after its start and now (no slot before its creation
        fires). Raises ``CadenceProblem``, the submit's request errors, ``TooManySchedules``."""
        now = now or datetime.now(UTC)
        cadence = new.cadence(now)
        request = RunRequest(
            new.tenant,
            new.tool,
            new.input,
            new.priority,
            max_priority=new.max_priority,
            allowed_tools=new.allowed_tools,
        )
        run = request.prepare(self._registry)
        first = cadence.first_at_or_after(now)
        if first is None:
            raise CadenceProblem("end_at leaves the schedule no slot from now on", "end_at")
        params = {
            "id": uuid.uuid4(),
            "tenant": new.tenant,
            "tool": run.tool,
            "input": json.dumps(new.input),
            "priority": new.priority,
            "cron": new.cron,
            "every_seconds": new.every_seconds,
            "timezone": new.timezone,
            "start_at": cadence.start_at,
            "end_at": new.end_at,
            "catch_up": new.catch_up.value,
            "next_slot_at": first,
            "cap": self._cap,
            "now": None,
        }
        rows = autocommit(self._engine, INSERT_SCHEDULE, params)
        if not rows:
            raise TooManySchedules(self._cap)
        return ScheduleView.of(rows[0])

    def get(self, schedule_id: uuid.UUID, tenant: str) -> ScheduleView | None:
        """The tenant's schedule, or None (another tenant's included)."""
        return self._one(GET_SCHEDULE, schedule_id, tenant)

    def page(
        self, tenant: str, *, limit: int, cursor: str | None = None
    ) -> tuple[list[ScheduleView], str | None]:
        """The tenant's schedules newest first, and the cursor of the next page (raises
        ``BadCursor`` for a cursor it did not hand out)."""
        before, before_id = decode_cursor_parts(cursor) if cursor else (None, None)
        params = {"tenant": tenant, "before": before, "before_id": before_id, "limit": limit + 1}
        rows = [ScheduleView.of(row) for row in autocommit(self._engine, SCHEDULE_PAGE, params)]
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if more and rows else None
        return rows, None if last is None else encode_cursor_parts(last.created_at, last.id)

    def pause(self, schedule_id: uuid.UUID, tenant: str) -> ScheduleView | None:
        """Stop firing its slots (None: no such schedule of the tenant)."""
        return self._one(PAUSE_SCHEDULE, schedule_id, tenant)

    def resume(
        self, schedule_id: uuid.UUID, tenant: str, *, now: datetime | None = None
    ) -> ScheduleView | None:
        """Fire its slots again from the first at or after now; the slots that fell while it
        was paused are skipped. A schedule that is not paused is left as it is."""
        key = {"id": schedule_id, "tenant": tenant}
        with self._engine.begin() as conn:
            locked = conn.execute(LOCK_SCHEDULE, {**key, "now": now}).first()
            if locked is None:
                return None
            if not locked.paused:
                return self.get(schedule_id, tenant)
            cadence = Cadence(
                locked.cron, locked.every_seconds, locked.timezone, locked.start_at, locked.end_at
            )
            first = cadence.first_at_or_after(locked.now)
            row = conn.execute(RESUME_SCHEDULE, {**key, "next_slot_at": first, "now": now}).one()
        return ScheduleView.of(row)

    def delete(self, schedule_id: uuid.UUID, tenant: str) -> bool:
        """Delete it (its runs stay); whether it was there."""
        key = {"id": schedule_id, "tenant": tenant, "now": None}
        return bool(autocommit(self._engine, DELETE_SCHEDULE, key))

    def _one(
        self, statement: TextClause, schedule_id: uuid.UUID, tenant: str
    ) -> ScheduleView | None:
        key = {"id": schedule_id, "tenant": tenant, "now": None}
        rows = autocommit(self._engine, statement, key)
        return ScheduleView.of(rows[0]) if rows else None
