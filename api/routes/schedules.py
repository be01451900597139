"""Schedules: create, read, list, pause, resume and delete a tenant's recurring schedules."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.actions import schedules as schedule_actions
from api.deps import PrincipalDep, ServicesDep
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.schedule_schemas import ScheduleCreate, ScheduleOut, SchedulePage
from runyard.reads.cursors import BadCursor
from runyard.tenancy.auth import priority_ceiling

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], responses=COMMON_ERRORS)

NOT_FOUND = problem("No such schedule, or it belongs to another tenant")
MAX_PAGE = 100


@router.post(
    "",
    operation_id="createSchedule",
    status_code=201,
    responses={
        409: problem("The tenant has as many schedules as it may"),
        **BODY_ERRORS,
    },
)
def post_schedule(
    body: ScheduleCreate, services: ServicesDep, principal: PrincipalDep, response: Response
) -> ScheduleOut:
    """Check the cadence, tool and input (422 names the field), then store the schedule; its
    first slot is the first at or after now and its start_at."""
    schedule_actions.require_queue_mode(services)
    try:
        view = services.schedules.create(
            body.schedule(principal.tenant, priority_ceiling(principal), principal.tools)
        )
    except Exception as exc:
        found = schedule_actions.create_problem(services, exc)
        if found is None:
            raise
        raise found from exc
    response.headers["Location"] = f"/v1/schedules/{view.id}"
    return ScheduleOut(**vars(view))


@router.get("", operation_id="listSchedules")
def list_schedules(
    services: ServicesDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size")] = 50,
    cursor: Annotated[
        str | None,
        Query(max_length=200, pattern=r"^[A-Za-z0-9_-]+$", description="next_cursor of a page"),
    ] = None,
) -> SchedulePage:
    """Your schedules, newest first, keyset-paginated."""
    try:
        found, next_cursor = services.schedules.page(principal.tenant, limit=limit, cursor=cursor)
    except BadCursor as exc:
        raise Problem(400, "invalid_cursor", str(exc), field="cursor") from exc
    return SchedulePage(
        items=[ScheduleOut(**vars(view)) for view in found], next_cursor=next_cursor
    )


@router.get("/{schedule_id}", operation_id="getSchedule", responses={404: NOT_FOUND})
def get_schedule(
    schedule_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> ScheduleOut:
    """One of your schedules, with its next slot and what it fired."""
    return ScheduleOut(**vars(schedule_actions.load_schedule(services, principal, schedule_id)))


@router.post("/{schedule_id}/pause", operation_id="pauseSchedule", responses={404: NOT_FOUND})
def pause_schedule(
    schedule_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> ScheduleOut:
    """Stop firing its slots until resumed (runs it made already are not touched)."""
    view = services.schedules.pause(schedule_id, principal.tenant)
    if view is None:
        raise schedule_actions.not_found(schedule_id)
    return ScheduleOut(**vars(view))


@router.post("/{schedule_id}/resume", operation_id="resumeSchedule", responses={404: NOT_FOUND})
def resume_schedule(
    schedule_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> ScheduleOut:
    """Fire its slots again from the first at or after now; slots that fell while it was
    paused are skipped, whatever its catch_up."""
    view = services.schedules.resume(schedule_id, principal.tenant)
    if view is None:
        raise schedule_actions.not_found(schedule_id)
    return ScheduleOut(**vars(view))


@router.delete(
    "/{schedule_id}", operation_id="deleteSchedule", status_code=204, responses={404: NOT_FOUND}
)
def delete_schedule(schedule_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> None:
    """Delete the schedule; the runs it made stay, still naming it."""
    if not services.schedules.delete(schedule_id, principal.tenant):
        raise schedule_actions.not_found(schedule_id)
