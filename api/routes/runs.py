"""Runs: submit (queue or sync mode), read, list, cancel, logs."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, TypeVar

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse
from pydantic import TypeAdapter

from api.deps import PrincipalDep, Services, ServicesDep, visible_tenant
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.routes.webhooks import check_callback_url, require_webhook_secret
from api.schemas import RunCreate, RunOut, RunPage
from runyard.domain.graph import GraphProblem
from runyard.domain.states import RunMode, RunStatus
from runyard.platform.models import ToolRun
from runyard.queue import AdmissionRefused, IdempotencyConflict
from runyard.queue.graph import UnknownDependency
from runyard.reads.runs import LOG_STREAMS, BadCursor, RunFilter, RunReader, RunView
from runyard.registry.tools import TOOL_NAME_PATTERN
from runyard.submission.batches import TooManyDependencies
from runyard.submission.request import (
    AboveMaximum,
    BuildUnavailable,
    InvalidInput,
    RunRequest,
    UnknownTool,
)
from runyard.submission.runs import Caller, QueueModeOnly, Submitted
from runyard.tenancy.auth import Principal, priority_ceiling

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=COMMON_ERRORS)

T = TypeVar("T")
# The public shape, serialized straight from the read model.
RUN_JSON = TypeAdapter(RunView)

MAX_PAGE = 200
MAX_WAIT_QUERY = 3600.0
NOT_FOUND = problem("No such run, or it belongs to another tenant")
# The header of every submit (a run, a batch): retries with the same key and body get the
# first answer's resource.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Retries with the same key and body return the first run or batch",
    ),
]


def load_run(services: Services, principal: Principal, run_id: uuid.UUID) -> ToolRun:
    """The run if the caller may see it; 404 otherwise (another tenant's run included)."""
    run = RunReader(services.engine).get(run_id, visible_tenant(principal))
    if run is None:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    return run


def view_run(services: Services, principal: Principal, run_id: uuid.UUID) -> RunView:
    """The run's public fields if the caller may see it (one round trip); 404 otherwise."""
    run = RunReader(services.engine).view(run_id, visible_tenant(principal))
    if run is None:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    return run


def submit_problem(services: Services, exc: Exception) -> Problem | None:
    """The problem document of a submit the core refused; None for any other error."""
    if isinstance(exc, AboveMaximum):
        return Problem(422, "above_maximum", str(exc), field=exc.path)
    if isinstance(exc, UnknownTool):
        return Problem(422, "unknown_tool", str(exc), field="tool")
    if isinstance(exc, InvalidInput):
        return Problem(422, "invalid_input", str(exc), field=exc.path)
    if isinstance(exc, UnknownDependency):
        return Problem(422, "unknown_dependency", str(exc), field=graph_field(exc))
    if isinstance(exc, TooManyDependencies):
        return Problem(422, "too_many_dependencies", str(exc), field=graph_field(exc))
    if isinstance(exc, GraphProblem):
        return Problem(422, "invalid_graph", str(exc), field=graph_field(exc))
    if isinstance(exc, QueueModeOnly):
        return Problem(422, "queue_mode_only", str(exc))
    if isinstance(exc, BuildUnavailable):
        return Problem(409, "build_unavailable", str(exc), field="tool")
    if isinstance(exc, IdempotencyConflict):
        return Problem(409, "idempotency_conflict", str(exc), field="Idempotency-Key")
    if not isinstance(exc, AdmissionRefused):
        return None
    seconds = exc.retry_after or services.settings.retry_after_seconds
    retry_after = {"Retry-After": str(seconds)}
    if exc.reason == "queue_full":
        return Problem(503, "queue_full", str(exc), headers=retry_after)
    code = {
        "tenant_queued": "tenant_queued_limit",
        "tenant_running": "tenant_running_limit",
        "tenant_created": "tenant_created_limit",
        "tenant_stored": "tenant_stored_limit",
    }.get(exc.reason, exc.reason)
    return Problem(429, code, str(exc), headers=retry_after, limit=exc.limit)


def graph_field(exc: GraphProblem) -> str:
    """Where a graph problem is: the field of a single run, or of a batch's item."""
    return exc.field if exc.index is None else f"runs[{exc.index}].{exc.field}"


async def _watch_disconnect(request: Request, on_gone: Callable[[], None]) -> None:
    """Call ``on_gone`` when the client closes the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_gone()
            return


async def _watching_disconnect(
    request: Request, on_gone: Callable[[], None], work: Callable[[], Awaitable[T]]
) -> T:
    """Await ``work()`` while watching for the client to leave.

    An error of ``work`` comes out as itself, not wrapped in an exception group, so the
    problem handlers still see it (a database outage stays a 503).
    """
    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_watch_disconnect, request, on_gone)
        try:
            outcome.append(await work())
        except Exception as exc:
            failure.append(exc)
        tasks.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0]


async def submit(
    request: Request, services: Services, run_request: RunRequest, wait: float = 0.0
) -> Submitted:
    """The submit use case, watching for the client to leave (which cancels its inline run
    and ends its wait); a refusal comes out as its problem document."""
    caller = Caller()
    try:
        return await _watching_disconnect(
            request,
            caller.leave,
            lambda: services.submissions.submit(run_request, wait=wait, caller=caller),
        )
    except Exception as exc:
        problem_ = submit_problem(services, exc)
        if problem_ is None:
            raise
        raise problem_ from exc


@router.post(
    "",
    name="submit_run",
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
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_QUERY,
            allow_inf_nan=False,
            description="Seconds to wait for a terminal state (capped by "
            "RUNYARD_MAX_WAIT_SECONDS); 200 if it got there, else 202",
        ),
    ] = 0,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Validate the tool and input, then enqueue (queue mode) or run inline (sync mode)."""
    if body.callback_url is not None:
        check_callback_url(services.settings, body.callback_url, "callback_url")  # no DNS
        await run_in_threadpool(require_webhook_secret, services, principal.tenant, "callback_url")
    submitted = await submit(
        request,
        services,
        body.request(principal.tenant, idempotency_key, priority_ceiling(principal)),
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


@router.get("/{run_id}", responses={404: NOT_FOUND})
def get_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> RunOut:
    """One run; another tenant's run is 404."""
    return RunOut.of(view_run(services, principal, run_id))


@router.get("")
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
    status_code=202,
    responses={
        404: NOT_FOUND,
        409: problem("The run is already terminal; `run_status` says how it ended"),
        **BODY_ERRORS,
    },
)
def cancel_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> RunOut:
    """Cancel a queued run at once, or ask whoever runs it to stop it (202 either way)."""
    view_run(services, principal, run_id)
    result = services.queue.cancel(run_id)
    if services.sync is not None:
        services.sync.cancel_local(run_id)  # here at once; elsewhere at its next renewal
    if result.status is not None and result.status.is_terminal and not result.cancelled_now:
        raise Problem(
            409,
            "run_finished",
            f"the run is already {result.status.value}",
            run_status=result.status.value,
        )
    return RunOut.of(view_run(services, principal, run_id))


@router.post(
    "/{run_id}/rerun",
    status_code=202,
    response_model=RunOut,
    responses={
        404: NOT_FOUND,
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
    old = await run_in_threadpool(load_run, services, principal, run_id)
    priority = int(await run_in_threadpool(services.queue.priority_of, run_id))
    run_request = RunRequest(
        old.tenant,
        old.tool,
        old.input,
        priority,
        callback_url=old.callback_url,
        max_priority=priority_ceiling(principal),
        rerun_of=old.id,
    )
    submitted = await submit(request, services, run_request)
    run = submitted.run
    return Response(
        RUN_JSON.dump_json(run),
        status_code=200 if run.status.is_terminal else 202,
        headers={"Location": f"/v1/runs/{run.id}"},
        media_type="application/json",
    )


@router.get(
    "/{run_id}/logs",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "The log text (live chunks until the run ends, then the stored log)",
        },
        404: NOT_FOUND,
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
    run = load_run(services, principal, run_id)
    streams = LOG_STREAMS if stream == "both" else (stream,)
    if run.status.is_terminal:
        text = "".join((run.stdout or "") if s == "stdout" else (run.stderr or "") for s in streams)
    elif run.attempts > 0:
        text = RunReader(services.engine).live_logs(run_id, run.attempts, streams)
    else:
        text = ""
    headers = {
        "X-Runyard-Run-Status": run.status.value,
        "X-Runyard-Stdout-Truncated": str(run.stdout_truncated).lower(),
        "X-Runyard-Stderr-Truncated": str(run.stderr_truncated).lower(),
    }
    return PlainTextResponse(text, headers=headers)
