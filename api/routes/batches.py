"""Batches: runs submitted as one graph; read, list, cancel and retry them as one."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic_core import to_json

from api.actions import batches as batch_actions
from api.actions.webhooks import check_callback_urls, require_webhook_secret
from api.batch_schemas import BatchCreate, BatchCreated, BatchListed, BatchOut, BatchPage
from api.deps import PrincipalDep, ServicesDep
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.routes import IdempotencyKey, WaitSeconds
from runyard.queue.graph import GraphResult
from runyard.reads.cursors import BadCursor, decode_cursor_parts, encode_cursor_parts
from runyard.submission.batches import BatchView
from runyard.tenancy.auth import priority_ceiling

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=COMMON_ERRORS)

NOT_FOUND = problem("No such batch, or it belongs to another tenant")
MAX_PAGE = 100


@router.post(
    "",
    operation_id="submitBatch",
    status_code=202,
    response_model=BatchCreated,
    responses={
        409: problem("The Idempotency-Key was used with a different batch"),
        429: problem("A tenant cap would be passed", retry_after=True),
        503: problem("The queue is full, or the database is unavailable", retry_after=True),
        **BODY_ERRORS,
    },
)
async def post_batch(
    body: BatchCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Admit every run or none (422 names the item and the problem); 202 with the batch."""
    batch_actions.require_queue_mode(services)
    urls = {run.callback_url for run in body.runs if run.callback_url} | (
        {body.callback_url} if body.callback_url else set()
    )
    check_callback_urls(services.settings, urls, "callback_url")  # no DNS: names at delivery
    if urls:
        await run_in_threadpool(require_webhook_secret, services, principal.tenant, "callback_url")

    def write() -> tuple[GraphResult, BatchView, bytes]:
        # In the thread pool with the write: 1,000 items and their answer are CPU work that
        # would hold the event loop, and every other request behind it, for milliseconds.
        items = body.items(principal.tenant, priority_ceiling(principal), principal.tools)
        result, view = services.batches.submit_viewed(principal.tenant, items, idempotency_key)
        run_ids = dict(zip((item.ref for item in items), result.run_ids, strict=True))
        # Serialized as the response model would be, without validating 1,000 runs again.
        return result, view, to_json({**vars(view), "run_ids": run_ids})

    try:
        result, view, answer = await run_in_threadpool(write)
    except Exception as exc:
        raise batch_actions.refused(services, exc) from exc
    headers = {"Location": f"/v1/batches/{view.id}"}
    if not result.created:
        headers["Idempotent-Replayed"] = "true"
    return Response(answer, status_code=202, headers=headers, media_type="application/json")


@router.get(
    "/{batch_id}", operation_id="getBatch", response_model=BatchOut, responses={404: NOT_FOUND}
)
async def get_batch(
    request: Request,
    batch_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    wait: WaitSeconds = 0,
) -> Response:
    """A batch: its status, counts by status and the latest run of each ref. With ``wait``
    the answer comes as soon as no run of it is queued or running, or after that many seconds
    with the batch as it is then (200 either way: its ``status`` says which)."""
    view = await batch_actions.await_batch(request, services, principal, batch_id, wait)
    # Serialized as the response model would be, in the thread pool: 1,000 runs are CPU work
    # that would hold the event loop.
    answer = await run_in_threadpool(to_json, vars(view))
    return Response(answer, media_type="application/json")


@router.get("", operation_id="listBatches")
def list_batches(
    services: ServicesDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    cursor: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_-]+$")] = None,
) -> BatchPage:
    """Your batches, newest first, keyset-paginated: each with its status and counts by
    status (its runs are on ``GET /v1/batches/{id}``)."""
    try:
        before = decode_cursor_parts(cursor) if cursor else None
    except BadCursor as exc:
        raise Problem(400, "invalid_cursor", str(exc), field="cursor") from exc
    found = services.batches.page(principal.tenant, limit=limit + 1, before=before)
    more = len(found) > limit
    found = found[:limit]
    next_cursor = encode_cursor_parts(found[-1].created_at, found[-1].id) if more else None
    return BatchPage(items=[BatchListed.of(batch) for batch in found], next_cursor=next_cursor)


@router.post(
    "/{batch_id}/cancel", operation_id="cancelBatch", status_code=202, responses={404: NOT_FOUND}
)
def cancel_batch(batch_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> BatchOut:
    """Cancel the queued runs at once and ask the running ones to stop."""
    return BatchOut.of(batch_actions.cancel_batch(services, principal, batch_id))


@router.post(
    "/{batch_id}/retry",
    operation_id="retryBatch",
    status_code=202,
    response_model=BatchCreated,
    responses={
        404: NOT_FOUND,
        409: problem("The batch still has runs queued or running, or was just retried"),
        429: problem("A tenant cap would be passed", retry_after=True),
        503: problem("The queue is full, or the database is unavailable", retry_after=True),
    },
)
def retry_batch(
    batch_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep
) -> BatchCreated:
    """New runs for every ref that did not succeed, wired to the successful ones; they are
    the batch's tenant's (an admin's retry too)."""
    view, runs = batch_actions.retry_batch(services, principal, batch_id)
    return BatchCreated(**BatchOut.of(view).model_dump(), run_ids=runs)
