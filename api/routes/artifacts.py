"""A terminal run's artifacts: the list, one file (with ``Range``), or a tar of all."""

from __future__ import annotations

import uuid
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Response
from fastapi.responses import StreamingResponse

from api.deps import PrincipalDep, ServicesDep, visible_tenant
from api.openapi import COMMON_ERRORS, problem
from api.problems import Problem
from api.schemas import ArtifactList, ArtifactOut
from runyard.artifacts.ranges import Unsatisfiable, parse_range
from runyard.artifacts.reads import Found, Published

router = APIRouter(prefix="/v1/runs", tags=["artifacts"], responses=COMMON_ERRORS)

OCTETS = "application/octet-stream"
NOT_FOUND = problem("No such run, or it belongs to another tenant")
NOT_FINISHED = problem("The run is not terminal yet: artifacts appear when it ends")


def _published(services: ServicesDep, principal: PrincipalDep, run_id: uuid.UUID) -> Published:
    published = services.artifacts.published(run_id, visible_tenant(principal))
    if published.found is Found.NOT_FOUND:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    if published.found is Found.NOT_FINISHED:
        raise Problem(
            409,
            "run_not_finished",
            f"the run is {published.status}; its artifacts are kept when it ends",
            run_status=published.status,
        )
    return published


def artifact_url(run_id: uuid.UUID, path: str) -> str:
    """The download URL of an artifact (its path percent-encoded, slashes kept)."""
    return f"/v1/runs/{run_id}/artifacts/{quote(path, safe='/')}"


@router.get(
    "/{run_id}/artifacts",
    response_model=ArtifactList,
    responses={404: NOT_FOUND, 409: NOT_FINISHED},
)
def list_artifacts(
    run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> ArtifactList:
    """The files the run's tool left under /runyard/out (none for a run that kept none)."""
    published = _published(services, principal, run_id)
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
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/x-tar": {}}, "description": "A tar of every artifact"},
        404: NOT_FOUND,
        409: NOT_FINISHED,
    },
)
def artifacts_tar(
    run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> StreamingResponse:
    """Every artifact in one uncompressed tar (paths as listed), streamed from the store."""
    published = _published(services, principal, run_id)
    files = services.artifacts.files(published)
    length, body = services.artifacts.tar(published, files)
    headers = {
        "Content-Length": str(length),
        "Content-Disposition": f'attachment; filename="{run_id}-artifacts.tar"',
    }
    return StreamingResponse(body, media_type="application/x-tar", headers=headers)


@router.get(
    "/{run_id}/artifacts/{path:path}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {OCTETS: {}}, "description": "The file"},
        206: {"content": {OCTETS: {}}, "description": "The byte range asked for"},
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
    published = _published(services, principal, run_id)
    file = services.artifacts.file(published, path)
    if file is None:
        raise Problem(404, "artifact_not_found", f"the run has no artifact {path!r}")
    headers = {
        "Accept-Ranges": "bytes",
        "ETag": f'"{file.sha256}"',
        "Content-Disposition": "attachment; filename*=UTF-8''"
        + quote(path.rsplit("/", 1)[-1], safe=""),
    }
    try:
        wanted = parse_range(range_header, file.size)
    except Unsatisfiable:
        raise Problem(
            416,
            "range_not_satisfiable",
            f"the artifact has {file.size} bytes",
            headers={**headers, "Content-Range": f"bytes */{file.size}"},
        ) from None
    if wanted is None:
        body = services.artifacts.read(published, path, 0, file.size)
        headers["Content-Length"] = str(file.size)
        return StreamingResponse(body, media_type=OCTETS, headers=headers)
    body = services.artifacts.read(published, path, wanted.start, wanted.stop)
    headers["Content-Length"] = str(wanted.length)
    headers["Content-Range"] = wanted.content_range
    return StreamingResponse(body, status_code=206, media_type=OCTETS, headers=headers)
