"""A batch's actions: load it for a caller (at once, or once it ends), cancel it, retry it;
the problem document of a refused batch write."""

from __future__ import annotations

import uuid

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from api.actions.runs import submit_problem, watching_disconnect
from api.deps import Services, visible_tenant
from api.problems import Problem
from runyard.queue.graph import BatchRetried
from runyard.submission.batches import BatchItemProblem, BatchNotFinished, BatchView
from runyard.submission.waits import Caller
from runyard.tenancy.auth import Principal, priority_ceiling


def require_queue_mode(services: Services) -> None:
    """A 422 ``queue_mode_only`` when this API runs tools inline (sync mode)."""
    if not services.batches.queue_mode:
        raise Problem(
            422,
            "queue_mode_only",
            "batches need queue mode; this API runs tools inline (sync mode)",
        )


def refused(services: Services, exc: Exception) -> Problem:
    """The problem document of a refused batch write; re-raises anything else."""
    if isinstance(exc, BatchItemProblem):
        inner = submit_problem(services, exc.cause)
        if inner is None:
            raise exc.cause
        where = inner.extra.get("field")
        field = f"runs[{exc.index}]" + (f".{where}" if where else "")
        return Problem(inner.status, inner.code, f"runs[{exc.index}]: {inner.detail}", field=field)
    found = submit_problem(services, exc)
    if found is None:
        raise exc
    return found


def load_batch(services: Services, principal: Principal, batch_id: uuid.UUID) -> BatchView:
    """The batch if the caller may see it; 404 otherwise (another tenant's batch included)."""
    view = services.batches.view(batch_id, visible_tenant(principal))
    if view is None:
        raise Problem(404, "batch_not_found", f"no batch {batch_id}")
    return view


async def await_batch(
    request: Request, services: Services, principal: Principal, batch_id: uuid.UUID, wait: float
) -> BatchView:
    """The batch once terminal (no run queued or running), or as it is after ``wait`` seconds
    (capped) or when the client leaves; 404 at once if the caller may not see it."""
    if services.waits.capped(wait) <= 0:
        return await run_in_threadpool(load_batch, services, principal, batch_id)
    caller = Caller()
    tenant = visible_tenant(principal)
    view = await watching_disconnect(
        request, caller.leave, lambda: services.waits.batch(batch_id, tenant, wait, caller)
    )
    if view is None:
        raise Problem(404, "batch_not_found", f"no batch {batch_id}")
    return view


def cancel_batch(services: Services, principal: Principal, batch_id: uuid.UUID) -> BatchView:
    """Cancel the queued runs at once and ask the running ones to stop; the batch after."""
    load_batch(services, principal, batch_id)
    services.batches.cancel(batch_id)
    return load_batch(services, principal, batch_id)


def retry_batch(
    services: Services, principal: Principal, batch_id: uuid.UUID
) -> tuple[BatchView, dict[str, uuid.UUID]]:
    """New runs for every ref that did not succeed, wired to the successful ones (the
    batch's tenant's, an admin's retry too): the batch after, and the new runs by ref. 409
    ``batch_not_finished`` or ``batch_retried``, or what a refused submit answers."""
    require_queue_mode(services)
    view = load_batch(services, principal, batch_id)
    try:
        _, runs = services.batches.retry(view.id, priority_ceiling(principal), principal.tools)
    except BatchNotFinished as exc:
        raise Problem(409, "batch_not_finished", str(exc)) from exc
    except BatchRetried as exc:
        raise Problem(409, "batch_retried", str(exc)) from exc
    except Exception as exc:
        raise refused(services, exc) from exc
    return load_batch(services, principal, batch_id), runs
