"""The dashboard's Schedules page: the caller's tenant's schedules, newest first, with each
one's cadence, state, next slot and what it fired."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from api.deps import ServicesDep
from api.ui.context import SessionDep, UiDep
from api.ui.views import page

router = APIRouter(prefix="/ui", include_in_schema=False)

SHOWN = 100


@router.get("/schedules")
async def schedules_page(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """The tenant's schedules (the first hundred)."""
    tenant = session.principal.tenant
    found, more = await run_in_threadpool(services.schedules.page, tenant, limit=SHOWN)
    context = {"title": "Schedules", "schedules": found, "more": more is not None}
    return page(ui, request, "schedules.html", context)
