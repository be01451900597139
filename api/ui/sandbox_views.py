"""The dashboard's Sandboxes pages: the tenant's sandboxes, and one sandbox with its newest
commands and, while it runs, a terminal (the REST terminal's pump, authenticated by the session
cookie and refused to another site's page)."""

from __future__ import annotations

import uuid
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from api.actions import sandboxes as actions
from api.actions.sandbox_terminal import serve_terminal_as, terminal_engine
from api.deps import ServicesDep
from api.problems import Problem
from api.ui.context import LoginRequired, SessionDep, UiDep, UiError, session_of
from api.ui.views import page
from runyard.tenancy.auth import Principal

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


@router.websocket("/sandboxes/{sandbox_id}/terminal")
async def sandbox_terminal(
    websocket: WebSocket,
    sandbox_id: uuid.UUID,
    rows: Annotated[int, Query(ge=1, le=1000)] = 24,
    cols: Annotated[int, Query(ge=1, le=1000)] = 80,
) -> None:
    """A shell in the sandbox for its page (frames of ``api.actions.sandbox_terminal``)."""
    engine = await terminal_engine(websocket)
    if engine is None:
        return
    services = websocket.app.state.services

    async def authenticate() -> Principal:
        # Browsers send Origin on every WebSocket and cannot forge it; the cookie alone would
        # let another site's page open a shell here (WebSockets are not bound by CORS).
        origin = websocket.headers.get("origin")
        if origin is None or urlsplit(origin).netloc != websocket.url.netloc:
            raise Problem(403, "cross_site", "A terminal opens only from the dashboard's pages.")
        try:
            session = await session_of(services, websocket.app.state.ui, websocket.cookies)
        except LoginRequired:
            raise Problem(401, "login_required", "The session ended: log in again.") from None
        return session.principal

    await serve_terminal_as(
        websocket, services, engine, authenticate, sandbox_id, ["/bin/sh"], (rows, cols)
    )
