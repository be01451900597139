"""A terminal run's artifacts: the list, one file (with ``Range``), or a tar of all."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Response
from fastapi.responses import StreamingResponse

from api.actions import artifacts as artifact_actions
from api.actions.artifacts import OCTETS, artifact_url
from api.deps import PrincipalDep, ServicesDep
from api.openapi import BINARY, COMMON_ERRORS, problem
from api.routes import RUN_NOT_FOUND
from api.schemas import ArtifactList, ArtifactOut

router = APIRouter(prefix="/v1/runs", tags=["artifacts"], responses=COMMON_ERRORS)

NOT_FINISHED = problem("The run is not terminal yet: artifacts appear when it ends")


@router.get(
    "/{run_id}/artifacts",
    operation_id="listArtifacts",
    response_model=ArtifactList,
    responses={404: RUN_NOT_FOUND, 409: NOT_FINISHED},
)
def list_artifacts(
    run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> ArtifactList:
    """The files the run's tool left under /runyard/out (none for a run that kept none)."""
    published = artifact_actions.load_published(services, principal, run_id)
    files = services.artifacts.files(published)
    return ArtifactList(
        run_id=str(run_id),
        count=len(files),
        total_bytes=sum(file.size for file in files),
        tar_url=f"/v1/runs/{run_id}/artifacts.tar",
        artifacts=[
            ArtifactOut(
                path=file.path,
                size=file.size,
                sha256=file.sha256,
                url=artifact_url(run_id, file.path),
            )
            for file in files
        ],
    )


@router.get(
    "/{run_id}/artifacts.tar",
    operation_id="downloadArtifactsTar",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-tar": {"schema": BINARY}},
            "description": "A tar of every artifact",
        },
        404: RUN_NOT_FOUND,
        409: NOT_FINISHED,
    },
)
def artifacts_tar(
    run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> StreamingResponse:
    """Every artifact in one uncompressed tar (paths as listed), streamed from the store."""
    return artifact_actions.artifacts_tar(services, principal, run_id)


@router.get(
    "/{run_id}/artifacts/{path:path}",
    operation_id="downloadArtifact",
    response_class=StreamingResponse,
    responses={
        200: {"content": {OCTETS: {"schema": BINARY}}, "description": "The file"},
        206: {"content": {OCTETS: {"schema": BINARY}}, "description": "The byte range asked for"},
        404: problem("No such run or artifact, or the run belongs to another tenant"),
        409: NOT_FINISHED,
        416: problem("The range lies past the end of the file"),
    },
)
def download_artifact(
    run_id: uuid.UUID,
    path: str,
    services: ServicesDep,
    principal: PrincipalDep,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    """One artifact's bytes; a ``Range: bytes=…`` header asks for one range of them."""
    return artifact_actions.download_artifact(services, principal, run_id, path, range_header)
