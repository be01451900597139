"""The dashboard's artifact downloads: the actions the JSON API calls too, behind the
session."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response

from api.actions import artifacts as artifact_actions
from api.deps import ServicesDep
from api.problems import Problem
from api.ui.context import SessionDep, UiError
from runyard.artifacts.reads import Found
from runyard.platform.models import ToolRun

router = APIRouter(prefix="/ui", include_in_schema=False)

# A run page lists this many artifacts; the tar link has them all.
SHOWN = 200


def _ui_error(exc: Problem, run_id: str) -> UiError:
    if exc.status == 404:
        return UiError(404, "Not found", f"No artifact of run {run_id} by that name.")
    return UiError(exc.status, "Not available", exc.detail)


def _run_uuid(run_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(run_id)
    except ValueError:
        raise UiError(404, "Not found", f"There is no run {run_id} you can see.") from None


@router.get("/runs/{run_id}/artifacts.tar")
def artifacts_tar(run_id: str, services: ServicesDep, session: SessionDep) -> Response:
    """Every artifact of the run as one tar."""
    try:
        return artifact_actions.artifacts_tar(services, session.principal, _run_uuid(run_id))
    except Problem as exc:
        raise _ui_error(exc, run_id) from None


@router.get("/runs/{run_id}/artifacts/{path:path}")
def artifact(
    run_id: str,
    path: str,
    services: ServicesDep,
    session: SessionDep,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    """One artifact (a ``Range`` is honoured as by the API)."""
    try:
        return artifact_actions.download_artifact(
            services, session.principal, _run_uuid(run_id), path, range_header
        )
    except Problem as exc:
        raise _ui_error(exc, run_id) from None


def artifact_rows(services: ServicesDep, run: ToolRun) -> dict[str, Any]:
    """What a finished run's page shows of its artifacts (the caller may see the run)."""
    published = services.artifacts.published(run.id, None)
    if published.found is not Found.READY:
        return {"artifacts": None}
    files = services.artifacts.files(published)
    return {
        "artifacts": [
            {
                "path": file.path,
                "size": _size(file.size),
                "sha256": file.sha256,
                "url": "/ui" + artifact_actions.artifact_url(run.id, file.path).removeprefix("/v1"),
            }
            for file in files[:SHOWN]
        ],
        "artifacts_more": max(len(files) - SHOWN, 0),
        "artifacts_bytes": _size(sum(file.size for file in files)),
        "artifacts_count": len(files),
    }


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1 << 20:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1 << 20):.1f} MiB"
