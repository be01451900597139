"""Runs: submit (queue or sync mode), read, list, cancel, logs."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse
from pydantic import TypeAdapter

from api.actions import runs as run_actions
from api.actions.webhooks import check_callback_url, require_webhook_secret
from api.deps import PrincipalDep, ServicesDep, visible_tenant
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.routes import RUN_NOT_FOUND, IdempotencyKey, WaitSeconds
from api.schemas import RunCreate, RunOut, RunPage
from runyard.domain.states import RunMode, RunStatus
from runyard.reads.cursors import BadCursor
from runyard.reads.run_view import RunView
from runyard.reads.runs import RunFilter, RunReader
from runyard.registry.tools import TOOL_NAME_PATTERN
from runyard.tenancy.auth import priority_ceiling

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=COMMON_ERRORS)

# The public shape, serialized straight from the read model.
RUN_JSON = TypeAdapter(RunView)

MAX_PAGE = 200


@router.post(
    "",
    name="submit_run",
    operation_id="submitRun",
    status_code=202,
    response_model=RunOut,
    responses={
        200: {"model": RunOut, "description": "The run is terminal (waited for, or sync mode)"},
        202: {
            "description": "Accepted and queued (or still running after the wait)",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        409: problem("The Idempotency-Key was used with a different request"),
        429: problem("A tenant cap or the sync-mode cap is full", retry_after=True),
        503: problem("The queue is full, or the database is unavailable", retry_after=True),
        **BODY_ERRORS,
    },
)
async def post_run(
    request: Request,
    body: RunCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    wait: WaitSeconds = 0,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Validate the tool and input, then enqueue (queue mode) or run inline (sync mode)."""
    if body.callback_url is not None:
        check_callback_url(services.settings, body.callback_url, "callback_url")  # no DNS
        await run_in_threadpool(require_webhook_secret, services, principal.tenant, "callback_url")
    submitted = await run_actions.submit(
        request,
        services,
        body.request(
            principal.tenant, idempotency_key, priority_ceiling(principal), principal.tools
        ),
        wait,
    )
    run = submitted.run
    headers = {"Location": f"/v1/runs/{run.id}"}
    if not submitted.created:
        headers["Idempotent-Replayed"] = "true"
    # Serialized once here rather than validated again through the response model.
    return Response(
        RUN_JSON.dump_json(run),
        status_code=200 if run.status.is_terminal else 202,
        headers=headers,
        media_type="application/json",
    )


@router.get(
    "/{run_id}", operation_id="getRun", response_model=RunOut, responses={404: RUN_NOT_FOUND}
)
async def get_run(
    request: Request,
    run_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    wait: WaitSeconds = 0,
) -> Response:
    """One run; another tenant's run is 404 (at once, never after a wait). With ``wait`` the
    answer comes as soon as the run is terminal, or after that many seconds with the run as
    it is then (200 either way: its ``status`` says which)."""
    run = await run_actions.await_run(request, services, principal, run_id, wait)
    return Response(RUN_JSON.dump_json(run), media_type="application/json")


@router.get("", operation_id="listRuns")
def list_runs(
    services: ServicesDep,
    principal: PrincipalDep,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status")] = None,
    tool: Annotated[
        str | None, Query(max_length=63, pattern=TOOL_NAME_PATTERN, description="Only this tool")
    ] = None,
    mode: Annotated[RunMode | None, Query(description="Only queue or sync runs")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size")] = 50,
    cursor: Annotated[
        str | None,
        Query(max_length=200, pattern=r"^[A-Za-z0-9_-]+$", description="next_cursor of a page"),
    ] = None,
) -> RunPage:
    """Runs newest first (admins: every tenant's), filtered, keyset-paginated."""
    reader = RunReader(services.engine)
    filters = RunFilter(tenant=visible_tenant(principal), status=status, tool=tool, mode=mode)
    try:
        rows, next_cursor = reader.page(filters, limit=limit, cursor=cursor)
    except BadCursor as exc:
        raise Problem(400, "invalid_cursor", str(exc), field="cursor") from exc
    return RunPage(items=[RunOut.of(v) for v in reader.views(rows)], next_cursor=next_cursor)


@router.post(
    "/{run_id}/cancel",
    operation_id="cancelRun",
    status_code=202,
    responses={
        404: RUN_NOT_FOUND,
        409: problem("The run is already terminal; `run_status` says how it ended"),
        **BODY_ERRORS,
    },
)
def cancel_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> RunOut:
    """Cancel a queued run at once, or ask whoever runs it to stop it (202 either way)."""
    return RunOut.of(run_actions.cancel_run(services, principal, run_id))


@router.post(
    "/{run_id}/rerun",
    operation_id="rerunRun",
    status_code=202,
    response_model=RunOut,
    responses={
        404: RUN_NOT_FOUND,
        422: problem("The tool is gone from the registry, or its input no longer fits"),
        429: problem("A tenant cap is full", retry_after=True),
        503: problem("The queue is full, or the database is unavailable", retry_after=True),
    },
)
async def rerun(
    request: Request, run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> Response:
    """A new run of the same tool and input (``rerun_of`` names this one), with the tool's
    definition as the registry has it now; its priority and callback are kept."""
    run = (await run_actions.rerun(request, services, principal, run_id)).run
    return Response(
        RUN_JSON.dump_json(run),
        status_code=200 if run.status.is_terminal else 202,
        headers={"Location": f"/v1/runs/{run.id}"},
        media_type="application/json",
    )


@router.get(
    "/{run_id}/logs",
    operation_id="getRunLogs",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "The log text (live chunks until the run ends, then the stored log)",
        },
        404: RUN_NOT_FOUND,
    },
)
def run_logs(
    run_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    stream: Annotated[
        Literal["stdout", "stderr", "both"], Query(description="Which stream(s)")
    ] = "both",
) -> PlainTextResponse:
    """stdout and/or stderr: live chunks of the current attempt while the run is not
    terminal, the stored (capped) streams once it is."""
    run, text = run_actions.run_logs(services, principal, run_id, run_actions.log_streams(stream))
    headers = {
        "X-Runyard-Run-Status": run.status.value,
        "X-Runyard-Stdout-Truncated": str(run.stdout_truncated).lower(),
        "X-Runyard-Stderr-Truncated": str(run.stderr_truncated).lower(),
    }
    return PlainTextResponse(text, headers=headers)
