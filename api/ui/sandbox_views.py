"""The dashboard's Sandboxes pages: the tenant's sandboxes, and one sandbox with its newest
commands (reloaded every two seconds while it lives)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from api.actions import sandboxes as actions
from api.deps import ServicesDep
from api.problems import Problem
from api.ui.context import SessionDep, UiDep, UiError
from api.ui.views import page

router = APIRouter(prefix="/ui", include_in_schema=False)

SHOWN = 100
RELOAD_SECONDS = 2


@router.get("/sandboxes")
async def sandboxes_page(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """The session's tenant's newest sandboxes."""
    found = await run_in_threadpool(actions.list_sandboxes, services, session.principal, SHOWN)
    return page(ui, request, "sandboxes.html", {"title": "Sandboxes", "sandboxes": found})


@router.get("/sandboxes/{sandbox_id}")
async def sandbox_page(
    sandbox_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """One sandbox: its status, why it ended, and its newest commands."""
    try:
        parsed = uuid.UUID(sandbox_id)
        row = await run_in_threadpool(actions.load_sandbox, services, session.principal, parsed)
    except (ValueError, Problem):
        raise UiError(404, "No such sandbox", f"No sandbox {sandbox_id[:64]}.") from None
    execs = await run_in_threadpool(actions.store_of(services).execs, parsed, SHOWN)
    sandbox = actions.sandbox_out(row)
    context = {
        "title": f"Sandbox of {sandbox.tool}",
        "sandbox": sandbox,
        "execs": execs,
        "reload": RELOAD_SECONDS if sandbox.status != "ended" else None,
    }
    return page(ui, request, "sandbox.html", context)
