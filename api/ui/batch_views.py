"""The dashboard's batch pages: the list, a batch's graph and runs (kept live by app.js
re-fetching a fragment, answered 304 while nothing changed), cancel and retry through the
actions the JSON API calls too (``api.actions.batches``)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from markupsafe import Markup

from api.actions import batches as batch_actions
from api.deps import ServicesDep, visible_tenant
from api.problems import Problem
from api.ui.batch_graph import batch_graph, ordered
from api.ui.context import SessionDep, UiContext, UiDep, UiError, check_csrf
from api.ui.session import Session
from api.ui.views import form_fields, page
from runyard.reads.cursors import BadCursor, decode_cursor_parts, encode_cursor_parts
from runyard.reads.dashboard_workflows import batch_summaries, scheduled_runs
from runyard.submission.batches import BatchView

T = TypeVar("T")

router = APIRouter(prefix="/ui/batches", include_in_schema=False)

PAGE_SIZE = 25
ACTIVE = ("queued", "running")
STATUS_ORDER = ("queued", "running", "succeeded", "failed", "timed_out", "cancelled")
# A big batch's page is re-fetched less often: its fragment is large when it changes.
FAST_REFRESH_MS, SLOW_REFRESH_MS, SLOW_FROM_RUNS = 2000, 5000, 200


def no_batch(batch_id: str) -> UiError:
    """The same answer for a missing batch and another tenant's."""
    return UiError(404, "Not found", f"There is no batch {batch_id} you can see.")


def _parse(batch_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(batch_id)
    except ValueError:
        raise no_batch(batch_id) from None


def _listing(services: ServicesDep, session: Session, cursor: str | None) -> dict[str, Any]:
    before = None
    if cursor is not None and len(cursor) <= 200:
        try:
            before = decode_cursor_parts(cursor)
        except BadCursor:
            before = None  # a mangled link shows the newest page, not an error
    tenant = visible_tenant(session.principal)
    found = batch_summaries(services.engine, tenant, limit=PAGE_SIZE + 1, before=before)
    more = len(found) > PAGE_SIZE
    found = found[:PAGE_SIZE]
    older = encode_cursor_parts(found[-1].created_at, found[-1].id) if more else None
    return {
        "batches": found,
        "status_order": STATUS_ORDER,
        "older_cursor": older,
        "rows_query": f"?{urlencode({'cursor': cursor})}" if before is not None else "",
        "first_page": before is None,
    }


@router.get("")
def batches_page(
    request: Request,
    services: ServicesDep,
    ui: UiDep,
    session: SessionDep,
    cursor: str | None = None,
) -> HTMLResponse:
    """Batches newest first, refreshed in place by app.js."""
    context = {**_listing(services, session, cursor), "title": "Batches"}
    return page(ui, request, "batches.html", context)


@router.get("/rows")
def batches_rows(
    request: Request,
    services: ServicesDep,
    ui: UiDep,
    session: SessionDep,
    cursor: str | None = None,
) -> HTMLResponse:
    """The table body of the batches page, for its live refresh."""
    return page(ui, request, "_batch_rows.html", _listing(services, session, cursor))


def _load(services: ServicesDep, session: Session, batch_id: str) -> BatchView:
    view = services.batches.view(_parse(batch_id), visible_tenant(session.principal))
    if view is None:
        raise no_batch(batch_id)
    return view


def _panel_context(services: ServicesDep, view: BatchView) -> dict[str, Any]:
    runs = ordered(view.runs)
    scheduled = scheduled_runs(services.engine, [run.run_id for run in runs])
    refs = {run.ref for run in runs}
    active = any(run.status in ACTIVE for run in runs)
    return {
        "batch": view,
        "runs": runs,
        "refs": refs,
        "scheduled": scheduled,
        "graph": batch_graph(runs, scheduled),
        "status_order": STATUS_ORDER,
        "can_cancel": active,
        "can_retry": not active and any(run.status != "succeeded" for run in runs),
        "terminal": view.status not in ACTIVE,
    }


def _fragment(ui: UiContext, request: Request, session: Session, context: dict[str, Any]) -> str:
    template = ui.templates.get_template("_batch_panel.html")
    return template.render({"request": request, "session": session, **context})


def _etag(html: str) -> str:
    return '"' + hashlib.sha256(html.encode()).hexdigest()[:32] + '"'


def _load_panel(
    services: ServicesDep, ui: UiContext, request: Request, session: Session, batch_id: str
) -> tuple[BatchView, str]:
    view = _load(services, session, batch_id)
    return view, _fragment(ui, request, session, _panel_context(services, view))


@router.get("/{batch_id}")
def batch_page(
    batch_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """One batch: status, counts, its graph, its runs; cancel and retry."""
    view, panel = _load_panel(services, ui, request, session, batch_id)
    interval = SLOW_REFRESH_MS if len(view.runs) > SLOW_FROM_RUNS else FAST_REFRESH_MS
    context = {
        "title": f"Batch {view.id}",
        "batch": view,
        "panel": Markup(panel),  # rendered above by the autoescaping template
        "etag": _etag(panel),
        "interval": interval,
    }
    return page(ui, request, "batch.html", context)


@router.get("/{batch_id}/panel")
def batch_panel(
    batch_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> Response:
    """The live part of a batch page; 304 when it is what the caller already shows."""
    _, panel = _load_panel(services, ui, request, session, batch_id)
    etag = _etag(panel)
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    return HTMLResponse(panel, headers={"ETag": etag})


async def _batch_action(
    action: Callable[..., T],
    batch_id: str,
    request: Request,
    services: ServicesDep,
    session: Session,
) -> tuple[uuid.UUID, T]:
    """A batch action called from a dashboard form: CSRF checked, 404 as the batch page's."""
    check_csrf(session, await form_fields(request))
    parsed = _parse(batch_id)
    try:
        result = await run_in_threadpool(
            action, services=services, principal=session.principal, batch_id=parsed
        )
    except Problem as exc:
        if exc.status == 404:
            raise no_batch(batch_id) from exc
        raise
    return parsed, result


@router.post("/{batch_id}/cancel")
async def cancel(
    batch_id: str, request: Request, services: ServicesDep, session: SessionDep
) -> Response:
    """Cancel every queued run of the batch and stop its running ones, then show it again."""
    parsed, _ = await _batch_action(
        batch_actions.cancel_batch, batch_id, request, services, session
    )
    return RedirectResponse(f"/ui/batches/{parsed}?notice=batch_cancel_requested", 303)


@router.post("/{batch_id}/retry")
async def retry(
    batch_id: str, request: Request, services: ServicesDep, session: SessionDep
) -> Response:
    """Run again every ref that did not succeed, then show the batch again."""
    try:
        parsed, (_, run_ids) = await _batch_action(
            batch_actions.retry_batch, batch_id, request, services, session
        )
    except Problem as exc:
        if exc.code in ("batch_not_finished", "batch_retried"):
            return RedirectResponse(f"/ui/batches/{_parse(batch_id)}?notice={exc.code}", 303)
        raise UiError(exc.status, "Retry refused", exc.detail) from exc
    notice = "batch_retry_started" if run_ids else "batch_nothing_to_retry"
    return RedirectResponse(f"/ui/batches/{parsed}?notice={notice}", 303)
