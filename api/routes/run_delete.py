"""``DELETE /v1/runs/{id}``: a terminal run goes now, with everything that belongs to it."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from api.deps import PrincipalDep, ServicesDep, visible_tenant
from api.openapi import COMMON_ERRORS, problem
from api.problems import Problem
from api.routes import RUN_NOT_FOUND
from runyard.maintenance.retention import Deleted, delete_run

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=COMMON_ERRORS)


@router.delete(
    "/{run_id}",
    operation_id="deleteRun",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "Deleted: the run, its job, events, artifacts and webhooks"},
        404: RUN_NOT_FOUND,
        409: problem("The run is not terminal yet (cancel it first); `run_status` says"),
    },
)
def remove_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> Response:
    """Delete a terminal run and all that belongs to it; its pending webhook goes too."""
    outcome, status = delete_run(
        services.engine, run_id, visible_tenant(principal), services.artifacts.store
    )
    if outcome is Deleted.NOT_FOUND:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    if outcome is Deleted.NOT_TERMINAL:
        raise Problem(
            409,
            "run_not_finished",
            f"the run is {status}; only a terminal run can be deleted (cancel it first)",
            run_status=status,
        )
    return Response(status_code=204)
