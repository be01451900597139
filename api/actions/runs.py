"""A run's actions: load or show it for a caller (at once, or once it ends), submit (watching
the client), cancel, rerun, delete, read its logs; and the problem document of a refused
submit."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from api.deps import Services, visible_tenant
from api.problems import Problem
from runyard.domain.flow_limits import rate_limit_headers
from runyard.domain.graph import GraphProblem
from runyard.maintenance.retention import Deleted
from runyard.maintenance.retention import delete_run as delete_stored_run
from runyard.platform.models import ToolRun
from runyard.queue import AdmissionRefused, IdempotencyConflict
from runyard.queue.graph import UnknownDependency
from runyard.reads.run_view import RunView
from runyard.reads.runs import LOG_STREAMS, RunReader
from runyard.submission.batches import TooManyDependencies
from runyard.submission.request import (
    AboveMaximum,
    BuildUnavailable,
    InvalidInput,
    RunRequest,
    ToolNotAllowed,
    UnknownTool,
)
from runyard.submission.runs import QueueModeOnly, Submitted
from runyard.submission.waits import Caller
from runyard.tenancy.auth import Principal, priority_ceiling

T = TypeVar("T")

logger = logging.getLogger(__name__)


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


async def await_run(
    request: Request, services: Services, principal: Principal, run_id: uuid.UUID, wait: float
) -> RunView:
    """The run once terminal, or as it is after ``wait`` seconds (capped) or when the client
    leaves; 404 at once if the caller may not see it, as without a wait."""
    if services.waits.capped(wait) <= 0:
        return await run_in_threadpool(view_run, services, principal, run_id)
    caller = Caller()
    tenant = visible_tenant(principal)
    run = await watching_disconnect(
        request, caller.leave, lambda: services.waits.run(run_id, tenant, wait, caller)
    )
    if run is None:
        raise Problem(404, "run_not_found", f"no run {run_id}")
    return run


def submit_problem(services: Services, exc: Exception) -> Problem | None:
    """The problem document of a submit the core refused; None for any other error."""
    if isinstance(exc, ToolNotAllowed):
        return Problem(403, "tool_not_allowed", str(exc), field="tool")
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
        "tenant_cpu_quota": "tenant_cpu_quota_spent",
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


async def watching_disconnect(
    request: Request, on_gone: Callable[[], None], work: Callable[[], Awaitable[T]]
) -> T:
    """Await ``work()`` while watching for the client to leave.

    An error of ``work`` comes out as itself, so the problem handlers still see it (a
    database outage stays a 503). The watch is a plain task: an anyio task group's cancel
    formats the repr of the task it runs in, about a tenth of the API's CPU per waited run.
    """
    watch = asyncio.get_running_loop().create_task(_watch_disconnect(request, on_gone))
    watch.add_done_callback(_report_watch_failure)
    try:
        return await work()
    finally:
        watch.cancel()


def _report_watch_failure(watch: asyncio.Task[None]) -> None:
    """Log a watch that failed (its work goes on: the client just cannot stop it)."""
    if not watch.cancelled() and (error := watch.exception()) is not None:
        logger.warning("watching the client failed", exc_info=error)


async def submit(
    request: Request, services: Services, run_request: RunRequest, wait: float = 0.0
) -> Submitted:
    """The submit use case, watching for the client to leave (which cancels its inline run
    and ends its wait); a refusal comes out as its problem document."""
    if services.submit_rates.limit.per_second is not None:  # else no bucket to read
        await run_in_threadpool(require_submit_rate, services, run_request.tenant)
    caller = Caller()

    def work() -> Awaitable[Submitted]:
        return services.submissions.submit(run_request, wait=wait, caller=caller)

    try:
        if services.sync is None and services.waits.capped(wait) <= 0:
            # Queued and answered at once: nothing a client that leaves would stop.
            return await work()
        return await watching_disconnect(request, caller.leave, work)
    except Exception as exc:
        problem_ = submit_problem(services, exc)
        if problem_ is None:
            raise
        raise problem_ from exc


def require_submit_rate(services: Services, tenant: str) -> None:
    """Take a token of the tenant's submit bucket; 429 ``tenant_submit_rate`` with
    ``RateLimit``, ``RateLimit-Policy`` and ``Retry-After`` when it has none."""
    rates = services.submit_rates
    verdict = rates.take(tenant)
    if verdict.allowed:
        return
    per_second = rates.limit.per_second
    raise Problem(
        429,
        "tenant_submit_rate",
        f"this tenant submits at most {per_second:g} runs a second; try again in "
        f"{verdict.retry_after_seconds} s",
        headers=rate_limit_headers(rates.limit, verdict),
        limit=per_second,
    )


def cancel_run(services: Services, principal: Principal, run_id: uuid.UUID) -> RunView:
    """Cancel a queued run at once, or ask whoever runs it to stop it; 409 ``run_finished``
    (with ``run_status``) if it had already ended."""
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
    return view_run(services, principal, run_id)


async def rerun(
    request: Request, services: Services, principal: Principal, run_id: uuid.UUID
) -> Submitted:
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
        allowed_tools=principal.tools,
        rerun_of=old.id,
    )
    return await submit(request, services, run_request)


def delete_run(services: Services, principal: Principal, run_id: uuid.UUID) -> None:
    """Delete a terminal run and all that belongs to it; 404 if the caller cannot see it,
    409 ``run_not_finished`` (with ``run_status``) while it is queued or running."""
    outcome, status = delete_stored_run(
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


def run_logs(
    services: Services, principal: Principal, run_id: uuid.UUID, streams: tuple[str, ...]
) -> tuple[ToolRun, str]:
    """The run and its log text: live chunks of the current attempt while it is not
    terminal, the stored (capped) streams once it is; 404 if the caller cannot see it."""
    run = load_run(services, principal, run_id)
    if run.status.is_terminal:
        text = "".join((run.stdout or "") if s == "stdout" else (run.stderr or "") for s in streams)
    elif run.attempts > 0:
        text = RunReader(services.engine).live_logs(run_id, run.attempts, streams)
    else:
        text = ""
    return run, text


def log_streams(stream: str) -> tuple[str, ...]:
    """The streams a ``stream`` choice names (``both``: stdout then stderr)."""
    return LOG_STREAMS if stream == "both" else (stream,)
