"""A terminal run's artifacts for a caller: one file (with ``Range``), or a tar of all."""

from __future__ import annotations

import uuid
from urllib.parse import quote

from fastapi import Response
from fastapi.responses import StreamingResponse

from api.deps import Services, visible_tenant
from api.problems import Problem
from runyard.artifacts.ranges import Unsatisfiable, parse_range
from runyard.artifacts.reads import Found, Published
from runyard.tenancy.auth import Principal

OCTETS = "application/octet-stream"


def load_published(services: Services, principal: Principal, run_id: uuid.UUID) -> Published:
    """The run's published artifact set if the caller may see the run (404 otherwise) and it
    has ended (409 ``run_not_finished`` otherwise)."""
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


def artifacts_tar(services: Services, principal: Principal, run_id: uuid.UUID) -> StreamingResponse:
    """Every artifact in one uncompressed tar (paths as listed), streamed from the store."""
    published = load_published(services, principal, run_id)
    files = services.artifacts.files(published)
    length, body = services.artifacts.tar(published, files)
    headers = {
        "Content-Length": str(length),
        "Content-Disposition": f'attachment; filename="{run_id}-artifacts.tar"',
    }
    return StreamingResponse(body, media_type="application/x-tar", headers=headers)


def download_artifact(
    services: Services,
    principal: Principal,
    run_id: uuid.UUID,
    path: str,
    range_header: str | None,
) -> Response:
    """One artifact's bytes, or the one range of them a ``Range: bytes=…`` header asks for;
    404 ``artifact_not_found``, 416 for a range past its end."""
    published = load_published(services, principal, run_id)
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
