"""``DELETE /v1/runs/{id}``: a terminal run goes now, with everything that belongs to it."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from api.actions import runs as run_actions
from api.deps import PrincipalDep, ServicesDep
from api.openapi import COMMON_ERRORS, problem
from api.routes import RUN_NOT_FOUND

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
    run_actions.delete_run(services, principal, run_id)
    return Response(status_code=204)
