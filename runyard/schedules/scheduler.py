"""The scheduler: fires the due slots of schedules, each exactly once, from any number of
processes at once.

A pass takes one due schedule at a time (``TAKE_DUE``: locked, skipping those another
scheduler holds), decides its due slots by the pure rule (``runyard.domain.schedule_slots``),
writes a run per fired slot and moves the schedule's cursor past them, all in one transaction.
A scheduler that dies before the commit leaves nothing: the cursor is where it was and the next
pass fires the same slots. Each run carries its slot, unique per schedule in the database, so a
slot cannot make two runs even if two passes ever decided it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from runyard.domain.graph import Node
from runyard.domain.schedule_slots import Cadence, CadenceProblem, CatchUp, Plan, due_slots
from runyard.queue import AdmissionCaps, AdmissionRefused
from runyard.queue.graph import GraphRun, GraphSubmit, GraphWriter
from runyard.registry.tools import ToolRegistry
from runyard.schedules.sql import ADVANCE, TAKE_DUE
from runyard.submission.request import BuildUnavailable, InvalidInput, RunRequest, UnknownTool

logger = logging.getLogger(__name__)

# Why a slot's run cannot be made as the registry is now: the slot is spent without one.
SLOT_ERRORS = (UnknownTool, InvalidInput, BuildUnavailable)


@dataclass(frozen=True)
class SchedulerConfig:
    """How often a pass runs, how late a slot may fire and still be on time, and the most a
    pass does (per schedule, and schedules in all)."""

    interval_seconds: float = 1.0
    grace_seconds: float = 60.0
    slots_per_schedule: int = 100
    schedules_per_pass: int = 1000


@dataclass(frozen=True)
class SchedulerResult:
    """What one pass did."""

    schedules: int = 0
    fired: int = 0
    skipped: int = 0
    refused: int = 0


class Scheduler:
    """Fires schedules' slots; several copies may run at once (in the reapers)."""

    def __init__(
        self,
        engine: Engine,
        registry: ToolRegistry,
        caps: AdmissionCaps,
        config: SchedulerConfig,
    ) -> None:
        self._engine = engine
        self._registry = registry
        self._caps = caps
        self._config = config
        self._writer = GraphWriter(engine)
        self._stop = threading.Event()

    def run_once(self, *, now: datetime | None = None) -> SchedulerResult:
        """Every due schedule once (up to ``schedules_per_pass``), one transaction each."""
        totals = [0, 0, 0, 0]
        for _ in range(self._config.schedules_per_pass):
            done = self._fire_one(now)
            if done is None:
                break
            for index, count in enumerate(done):
                totals[index] += count
        result = SchedulerResult(*totals)
        if result.fired or result.skipped or result.refused:
            logger.info("scheduler pass", extra={"action": "scheduled", **result.__dict__})
        return result

    def run_forever(self) -> None:
        """A pass every interval until ``stop()``; a failed pass is logged and retried."""
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                logger.exception("scheduler pass failed")
            self._stop.wait(self._config.interval_seconds)

    def stop(self) -> None:
        """End ``run_forever`` after its current pass."""
        self._stop.set()

    def _fire_one(self, now: datetime | None) -> tuple[int, int, int, int] | None:
        """Take one due schedule and fire its due slots: (1, fired, skipped, refused), or
        None when no schedule is due."""
        with self._engine.begin() as conn:
            row = conn.execute(TAKE_DUE, {"now": now}).first()
            if row is None:
                return None
            try:
                cadence = Cadence(
                    row.cron, row.every_seconds, row.timezone, row.start_at, row.end_at
                )
            except CadenceProblem as exc:  # stored before a rule changed: never fires again
                self._advance(conn, row.id, Plan((), 0, None), [], f"cadence: {exc}", now)
                return 1, 0, 0, 0
            plan = due_slots(
                cadence,
                row.next_slot_at,
                row.now,
                CatchUp(row.catch_up),
                grace=timedelta(seconds=self._config.grace_seconds),
                limit=self._config.slots_per_schedule,
            )
            run_ids, error = self._write_runs(conn, row, plan, now)
            self._advance(conn, row.id, plan, run_ids, error, now)
        refused = len(plan.fire) - len(run_ids)
        if error is not None:
            logger.warning(
                "schedule slots made no run",
                extra={"schedule_id": str(row.id), "slots": refused, "reason": error},
            )
        return 1, len(run_ids), plan.skipped, refused

    def _write_runs(
        self, conn: Connection, row: Any, plan: Plan, now: datetime | None
    ) -> tuple[list[Any], str | None]:
        """A run per fired slot, in the pass's transaction; none, and why, if the tool or its
        input no longer fits or a tenant cap refuses them (the slots are spent all the same)."""
        if not plan.fire:
            return [], None
        request = RunRequest(row.tenant, row.tool, row.input, row.priority)
        try:
            run = request.prepare(self._registry)
        except SLOT_ERRORS as exc:
            return [], str(exc)
        items = [
            GraphRun(run, Node(None, ()), schedule_id=row.id, schedule_slot=slot)
            for slot in plan.fire
        ]
        graph = GraphSubmit(row.tenant, items)
        try:
            with conn.begin_nested():
                return list(self._writer.write_in(conn, graph, self._caps, now=now)), None
        except AdmissionRefused as exc:
            return [], str(exc)
        except IntegrityError:  # the unique slot: a run of one of these slots exists already
            logger.error("schedule slot fired before", extra={"schedule_id": str(row.id)})
            return [], "a slot of this pass had made its run already"

    def _advance(
        self,
        conn: Connection,
        schedule_id: Any,
        plan: Plan,
        run_ids: list[Any],
        error: str | None,
        now: datetime | None,
    ) -> None:
        fired = len(run_ids)
        params = {
            "id": schedule_id,
            "next_slot_at": plan.next_slot_at,
            "fired": fired,
            "skipped": plan.skipped + len(plan.fire) - fired,
            "last_slot_at": plan.fire[-1] if plan.fire else None,
            "last_run_id": run_ids[-1] if run_ids else None,
            "last_error": error,
            "now": now,
        }
        conn.execute(ADVANCE, params)
