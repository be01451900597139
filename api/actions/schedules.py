"""A schedule's actions: load it for a caller, and the problem document of a refused create."""

from __future__ import annotations

import uuid

from api.actions.runs import submit_problem
from api.deps import Services
from api.problems import Problem
from runyard.domain.schedule_slots import CadenceProblem
from runyard.schedules.store import ScheduleView, TooManySchedules
from runyard.tenancy.auth import Principal


def not_found(schedule_id: uuid.UUID) -> Problem:
    """The 404 of a schedule the caller may not see (another tenant's included)."""
    return Problem(404, "schedule_not_found", f"no schedule {schedule_id}")


def load_schedule(services: Services, principal: Principal, schedule_id: uuid.UUID) -> ScheduleView:
    """The caller's schedule; 404 otherwise."""
    found = services.schedules.get(schedule_id, principal.tenant)
    if found is None:
        raise not_found(schedule_id)
    return found


def create_problem(services: Services, exc: Exception) -> Problem | None:
    """The problem document of a create the core refused; None for any other error."""
    if isinstance(exc, CadenceProblem):
        return Problem(422, "invalid_schedule", str(exc), field=exc.field)
    if isinstance(exc, TooManySchedules):
        return Problem(409, "tenant_schedules_limit", str(exc), limit=exc.cap)
    return submit_problem(services, exc)


def require_queue_mode(services: Services) -> None:
    """A 422 ``queue_mode_only`` when this API runs tools inline (sync mode)."""
    if services.sync is not None:
        raise Problem(
            422,
            "queue_mode_only",
            "schedules need queue mode; this API runs tools inline (sync mode)",
        )
