"""Runs: submit (queue or sync mode), read, list, cancel, logs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, TypeVar

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from api.deps import PrincipalDep, Services, ServicesDep, visible_tenant
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.routes.webhooks import check_callback_url
from api.schemas import RunCreate, RunOut, RunPage
from runyard.auth import Principal
from runyard.models import RunMode, RunStatus, ToolRun
from runyard.queue import AdmissionRefused, IdempotencyConflict, NewRun
from runyard.runner import AttemptControl
from runyard.runs import LOG_STREAMS, BadCursor, RunFilter, RunReader
from runyard.submit import InvalidInput, RunView, UnknownTool, prepare_run, read_run_view
from runyard.tools import TOOL_NAME_PATTERN

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=COMMON_ERRORS)

T = TypeVar("T")

MAX_PAGE = 200
MAX_WAIT_QUERY = 3600.0
NOT_FOUND = problem("No such run, or it belongs to another tenant")


def load_run(services: Services, principal: Principal, run_id: uuid.UUID) -> ToolRun:
    """The run if the caller may see it; 404 otherwise (another tenant's run included)."""
    run = RunReader(services.engine).get(run_id, visible_tenant(principal))
    if run is None:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    return run


def _retry_after(services: Services) -> dict[str, str]:
    return {"Retry-After": str(services.settings.retry_after_seconds)}


def _refused(services: Services, exc: AdmissionRefused) -> Problem:
    if exc.reason == "queue_full":
        return Problem(503, "queue_full", str(exc), headers=_retry_after(services))
    code = "tenant_queued_limit" if exc.reason == "tenant_queued" else "tenant_running_limit"
    return Problem(429, code, str(exc), headers=_retry_after(services), limit=exc.limit)


def _conflict(exc: IdempotencyConflict) -> Problem:
    return Problem(409, "idempotency_conflict", str(exc), field="Idempotency-Key")


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


def view_run(services: Services, principal: Principal, run_id: uuid.UUID) -> RunView:
    """The run's public fields if the caller may see it (one round trip); 404 otherwise."""
    run = read_run_view(services.engine, run_id, visible_tenant(principal))
    if run is None:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    return run


async def _view(services: Services, principal: Principal, run_id: uuid.UUID) -> RunView:
    return await run_in_threadpool(view_run, services, principal, run_id)


async def _wait_for_outcome(
    request: Request, services: Services, principal: Principal, run_id: uuid.UUID, wait: float
) -> RunView:
    """The run once terminal, or as it is after ``wait`` seconds (capped by the settings).

    It sleeps on the run's NOTIFY channel and re-reads at most every ``events_poll_seconds``;
    a client that goes away ends the wait.
    """
    seconds = min(wait, services.settings.max_wait_seconds)
    if seconds <= 0:
        return await _view(services, principal, run_id)
    deadline = time.monotonic() + seconds
    gone = anyio.Event()
    with services.notifier.subscribe(run_id) as subscription:
        # Subscribed first, then read: a change in between still wakes us.
        run = await _view(services, principal, run_id)
        if run.status.is_terminal:
            return run

        def on_gone() -> None:
            gone.set()
            subscription.wake()

        async def wait_terminal() -> RunView:
            current = run
            while not current.status.is_terminal and not gone.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await subscription.wait(min(remaining, services.settings.events_poll_seconds))
                current = await _view(services, principal, run_id)
            return current

        return await _watching_disconnect(request, on_gone, wait_terminal)


def _prepare(
    services: Services, principal: Principal, body: RunCreate, idempotency_key: str | None
) -> tuple[NewRun, uuid.UUID | None]:
    """Validate the request; the run an Idempotency-Key already names, if any (else None)."""
    try:
        new_run = prepare_run(
            services.registry,
            tenant=principal.tenant,
            tool_name=body.tool,
            input_value=body.input,
            priority=body.priority,
            idempotency_key=idempotency_key,
            callback_url=body.callback_url,
        )
    except UnknownTool as exc:
        raise Problem(422, "unknown_tool", str(exc), field="tool") from exc
    except InvalidInput as exc:
        raise Problem(422, "invalid_input", str(exc), field=exc.path) from exc
    if body.callback_url is not None:
        check_callback_url(services, principal.tenant, body.callback_url, field="callback_url")
    if idempotency_key is None:
        return new_run, None
    replay = RunReader(services.engine).find_idempotent(principal.tenant, idempotency_key)
    if replay is None:
        return new_run, None
    if replay.request_hash != new_run.request_hash():
        raise _conflict(
            IdempotencyConflict("this Idempotency-Key was already used with a different request")
        )
    return new_run, replay.id


def _accept(
    services: Services,
    principal: Principal,
    body: RunCreate,
    idempotency_key: str | None,
    *,
    answer_now: bool,
) -> tuple[uuid.UUID, bool, RunView | None]:
    """Queue mode in one thread hop: validate, replay or enqueue, and (``answer_now``) read
    the run back for the answer. Returns the run id, whether it was created, and the run."""
    new_run, replayed = _prepare(services, principal, body, idempotency_key)
    if replayed is not None:
        run_id, created = replayed, False
    else:
        try:
            enqueued = services.queue.submit(new_run, services.caps)
        except AdmissionRefused as exc:
            raise _refused(services, exc) from exc
        except IdempotencyConflict as exc:
            raise _conflict(exc) from exc
        run_id, created = enqueued.run_id, enqueued.created
    view = read_run_view(services.engine, run_id, visible_tenant(principal)) if answer_now else None
    return run_id, created, view


async def _run_inline(
    request: Request, services: Services, principal: Principal, new_run: NewRun
) -> tuple[RunView, bool]:
    """Sync mode: take a slot or 429 at once, record the run, run it here, return it."""
    sync = services.sync
    assert sync is not None and services.sync_limiter is not None
    if not sync.try_acquire():
        raise Problem(
            429,
            "sync_capacity_full",
            f"all {sync.max_concurrency} inline slots are busy; retry later",
            headers=_retry_after(services),
            limit=sync.max_concurrency,
        )
    try:
        try:
            recorded = await run_in_threadpool(
                lambda: services.queue.record_sync(
                    new_run,
                    services.caps,
                    owner=sync.owner_id,
                    lease_seconds=services.settings.lease_seconds,
                )
            )
        except AdmissionRefused as exc:
            raise _refused(services, exc) from exc
        except IdempotencyConflict as exc:
            raise _conflict(exc) from exc
        if recorded.created:
            control = AttemptControl()

            async def execute() -> None:
                await anyio.to_thread.run_sync(
                    sync.execute,
                    recorded.run_id,
                    new_run.spec,
                    new_run.input,
                    control,
                    limiter=services.sync_limiter,
                )

            # A client that hangs up cancels its run: the container is stopped, then finalized.
            await _watching_disconnect(request, control.cancel.set, execute)
    finally:
        sync.release()
    return await _view(services, principal, recorded.run_id), recorded.created


async def submit_run(
    request: Request,
    body: RunCreate,
    response: Response,
    services: Services,
    principal: Principal,
    wait: float = 0,
    idempotency_key: str | None = None,
) -> RunOut:
    """Validate the tool and input, then enqueue (queue mode) or run inline (sync mode).

    Sets ``response``'s status and headers; the dashboard submits through here too.
    """
    run: RunView | None
    if services.sync is None:
        answer_now = min(wait, services.settings.max_wait_seconds) <= 0
        run_id, created, run = await run_in_threadpool(
            lambda: _accept(services, principal, body, idempotency_key, answer_now=answer_now)
        )
        if run is None:
            run = await _wait_for_outcome(request, services, principal, run_id, wait)
    else:
        new_run, replayed = await run_in_threadpool(
            _prepare, services, principal, body, idempotency_key
        )
        created = False
        if replayed is not None:
            run = await _wait_for_outcome(request, services, principal, replayed, wait)
        else:
            run, created = await _run_inline(request, services, principal, new_run)
            if not created:
                run = await _wait_for_outcome(request, services, principal, run.id, wait)
    response.headers["Location"] = f"/v1/runs/{run.id}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    response.status_code = 200 if run.status.is_terminal else 202
    return RunOut.from_row(run)


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
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            pattern=r"^[\x21-\x7e]+$",
            description="Retries with the same key and body return the first run",
        ),
    ] = None,
) -> Response:
    """Validate the tool and input, then enqueue (queue mode) or run inline (sync mode)."""
    meta = Response()
    run = await submit_run(request, body, meta, services, principal, wait, idempotency_key)
    # Serialized once here rather than validated again through the response model.
    return Response(
        run.model_dump_json(),
        status_code=meta.status_code,
        headers={k: v for k, v in meta.headers.items() if k != "content-length"},
        media_type="application/json",
    )


@router.get("/{run_id}", responses={404: NOT_FOUND})
def get_run(run_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> RunOut:
    """One run; another tenant's run is 404."""
    return RunOut.from_row(load_run(services, principal, run_id))


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
    return RunPage(items=[RunOut.from_row(r) for r in rows], next_cursor=next_cursor)


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
    run = load_run(services, principal, run_id)
    if run.mode == RunMode.SYNC.value:
        result = services.queue.cancel_sync(run_id)
        if services.sync is not None:
            services.sync.cancel_local(run_id)
    else:
        result = services.queue.cancel(run_id)
    if result.status is not None and result.status.is_terminal and not result.cancelled_now:
        raise Problem(
            409,
            "run_finished",
            f"the run is already {result.status.value}",
            run_status=result.status.value,
        )
    return RunOut.from_row(load_run(services, principal, run_id))


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
