"""Runs: submit, read, list, cancel, logs."""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import PlainTextResponse

from api.deps import PrincipalDep, ServicesDep
from api.problems import Problem
from api.schemas import RunCreate, RunOut, RunPage
from runyard.auth import Principal
from runyard.models import RunStatus, ToolRun
from runyard.queue import IdempotencyConflict
from runyard.runs import BadCursor, RunFilter, RunReader
from runyard.submit import InvalidInput, UnknownTool, prepare_run

router = APIRouter(prefix="/v1/runs", tags=["runs"])

IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
MAX_PAGE = 200


def _visible_tenant(principal: Principal) -> str | None:
    return None if principal.admin else principal.tenant


def _load(services: ServicesDep, principal: Principal, run_id: uuid.UUID) -> ToolRun:
    run = RunReader(services.engine).get(run_id, _visible_tenant(principal))
    if run is None:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    return run


@router.post("", status_code=202)
def submit_run(
    body: RunCreate,
    response: Response,
    services: ServicesDep,
    principal: PrincipalDep,
    wait: Annotated[float, Query(ge=0, description="Seconds to wait for the outcome")] = 0,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> RunOut:
    """Validate and enqueue a run; 202 with the run and its ``Location``."""
    if idempotency_key is not None and not IDEMPOTENCY_KEY_PATTERN.match(idempotency_key):
        raise Problem(
            400, "invalid_idempotency_key", "Idempotency-Key must be 1-255 printable ASCII chars"
        )
    try:
        new_run = prepare_run(
            services.registry,
            tenant=principal.tenant,
            tool_name=body.tool,
            input_value=body.input,
            priority=body.priority,
            idempotency_key=idempotency_key,
        )
    except UnknownTool as exc:
        raise Problem(422, "unknown_tool", str(exc), field="tool") from exc
    except InvalidInput as exc:
        raise Problem(422, "invalid_input", str(exc), field=exc.path) from exc
    try:
        enqueued = services.queue.enqueue(new_run)
    except IdempotencyConflict as exc:
        raise Problem(409, "idempotency_conflict", str(exc)) from exc
    response.headers["Location"] = f"/v1/runs/{enqueued.run_id}"
    run = _load(services, principal, enqueued.run_id)
    deadline = time.monotonic() + min(wait, services.settings.max_wait_seconds)
    while not run.status.is_terminal and time.monotonic() < deadline:
        time.sleep(0.1)
        run = _load(services, principal, enqueued.run_id)
    if run.status.is_terminal:
        response.status_code = 200
    return RunOut.from_row(run)


@router.get("/{run_id}")
def get_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> RunOut:
    """One run; another tenant's run is 404."""
    return RunOut.from_row(_load(services, principal, run_id))


@router.get("")
def list_runs(
    services: ServicesDep,
    principal: PrincipalDep,
    status: RunStatus | None = None,
    tool: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> RunPage:
    """Runs newest first, filtered by status and tool, keyset-paginated."""
    reader = RunReader(services.engine)
    filters = RunFilter(tenant=_visible_tenant(principal), status=status, tool=tool)
    try:
        rows, next_cursor = reader.page(filters, limit=limit, cursor=cursor)
    except BadCursor as exc:
        raise Problem(400, "invalid_cursor", str(exc), field="cursor") from exc
    return RunPage(items=[RunOut.from_row(r) for r in rows], next_cursor=next_cursor)


@router.post("/{run_id}/cancel", status_code=202)
def cancel_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> RunOut:
    """Cancel a queued run at once, or ask the worker of a running one to stop it."""
    _load(services, principal, run_id)
    result = services.queue.cancel(run_id)
    if result.status is not None and result.status.is_terminal and not result.cancelled_now:
        raise Problem(
            409,
            "run_finished",
            f"the run is already {result.status.value}",
            status_value=result.status.value,
        )
    return RunOut.from_row(_load(services, principal, run_id))


@router.get("/{run_id}/logs", response_class=PlainTextResponse)
def run_logs(
    run_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    stream: Annotated[str, Query(pattern="^(stdout|stderr|both)$")] = "both",
) -> PlainTextResponse:
    """The captured stdout and/or stderr of the run (empty until it finishes)."""
    run = _load(services, principal, run_id)
    parts = []
    if stream in ("stdout", "both"):
        parts.append(run.stdout or "")
    if stream in ("stderr", "both"):
        parts.append(run.stderr or "")
    return PlainTextResponse("".join(parts))
