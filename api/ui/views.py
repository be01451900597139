"""The dashboard's pages: reads through ``runyard.reads.dashboard`` and ``runyard.reads.runs``;
submit, cancel and the live stream through the actions the JSON API calls too
(``api.actions``)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse

from api.actions import events as event_actions
from api.actions import runs as run_actions
from api.actions.events import MAX_EVENT_ID
from api.actions.usage import usage_report
from api.deps import ServicesDep, visible_tenant
from api.problems import Problem
from api.ui.artifact_views import artifact_rows
from api.ui.charts import QueueCharts, counts_chart, waits_chart
from api.ui.context import (
    SessionDep,
    UiContext,
    UiDep,
    UiError,
    check_csrf,
    check_same_origin,
)
from api.ui.run_logs import log_context
from api.ui.session import COOKIE_NAME, COOKIE_PATH, Session, key_prefix
from runyard.domain.states import TERMINAL_STATUSES, RunStatus
from runyard.domain.usage import GroupBy
from runyard.platform.models import ToolRun
from runyard.queue.values import SYNC_QUEUE, WORKER_LIVE_SECONDS
from runyard.reads.dashboard import (
    log_snapshot,
    queue_activity,
    queue_overview,
    run_holder,
    run_timeline,
    worker_overview,
)
from runyard.reads.dashboard_workflows import dependencies, scheduled_runs
from runyard.reads.pools import live_workers_by_queue
from runyard.reads.runs import RunReader
from runyard.reads.tool_figures import TOOL_WINDOW_SECONDS, tool_figures
from runyard.tenancy.auth import authenticate, may_run

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 25
MAX_FORM_FIELDS = 20
NOTICES = {
    "cancel_requested": "Cancel requested: the run stops within a few seconds.",
    "already_finished": "The run had already finished; nothing was cancelled.",
    "logged_out": "You are logged out.",
    "batch_cancel_requested": "Cancel requested: queued runs are cancelled, running ones stop"
    " within a few seconds.",
    "batch_retry_started": "Retry started: every ref that did not succeed runs again.",
    "batch_nothing_to_retry": "Every run of the batch succeeded; nothing was retried.",
    "batch_not_finished": "The batch still has runs queued or running; retry it once they end.",
    "batch_retried": "These runs were just retried by someone else.",
    "rerun_started": "Re-run started: this is a new run of the same tool and input.",
}


async def form_pairs(request: Request, max_fields: int = MAX_FORM_FIELDS) -> list[tuple[str, str]]:
    """A url-encoded form body from a page of this origin (the guard has checked its size
    and media type), as its name-value pairs; every dashboard POST reads its form here."""
    check_same_origin(request)
    body = (await request.body()).decode("utf-8", errors="replace")
    try:
        pairs = parse_qsl(body, keep_blank_values=True, max_num_fields=max_fields)
    except ValueError as exc:
        raise UiError(400, "Bad form", "The form has too many fields.") from exc
    if any("\x00" in name or "\x00" in value for name, value in pairs):
        raise UiError(400, "Bad form", "NUL characters are not allowed in a form.")
    return pairs


async def form_fields(request: Request) -> dict[str, str]:
    """A form's fields by name (the last value of a repeated one), login included."""
    return dict(await form_pairs(request))


def _clamp(value: str | None, longest: int) -> str | None:
    """A query value the page can use, or None (a mangled link is not an error page)."""
    return value if value is not None and len(value) <= longest else None


def page(
    ui: UiContext,
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    status_code: int = 200,
) -> HTMLResponse:
    """Render a template with what every page needs (session, nav, notice)."""
    session = getattr(request.state, "ui_session", None)
    notice = NOTICES.get(request.query_params.get("notice", ""))
    full = {"session": session, "notice": notice, "auth_disabled": ui.auth_disabled, **context}
    return ui.templates.TemplateResponse(request, name, full, status_code=status_code)


def no_run(run_id: str) -> UiError:
    """The dashboard's 404: the same answer for a missing run and another tenant's."""
    return UiError(404, "Not found", f"There is no run {run_id} you can see.")


def _safe_next(target: str | None) -> str:
    """Only redirect back inside the dashboard (no open redirect)."""
    if target and target.startswith("/ui/") and not target.startswith("//"):
        return target
    return "/ui/runs"


def _parse_run_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise no_run(value) from None


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    """The runs page is the start page."""
    return RedirectResponse("/ui/runs", status_code=303)


@router.get("/login")
def login_form(request: Request, ui: UiDep, next: str | None = None) -> Response:
    """Ask for an API key (with auth disabled there is nothing to ask)."""
    if ui.auth_disabled:
        return RedirectResponse(_safe_next(next), status_code=303)
    return page(ui, request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login")
async def login(request: Request, services: ServicesDep, ui: UiDep) -> Response:
    """Check the key; on success set the session cookie and go where the user was headed."""
    fields = await form_fields(request)
    target = _safe_next(fields.get("next"))
    api_key = fields.get("api_key", "").strip()
    prefix = key_prefix(api_key)
    principal = None
    if prefix is not None:
        principal = await run_in_threadpool(authenticate, services.engine, api_key)
    if principal is None or prefix is None:
        message = "That API key is unknown or revoked." if api_key else "Enter an API key."
        return page(ui, request, "login.html", {"next": target, "error": message}, status_code=401)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        ui.signer.issue(prefix),
        max_age=int(ui.signer.lifetime_seconds),
        path=COOKIE_PATH,
        httponly=True,
        secure=ui.cookie_secure or request.url.scheme == "https",
        samesite="strict",
    )
    return response


THEME_COOKIE = "runyard_theme"
THEMES = ("auto", "dark", "light")


@router.post("/theme")
async def choose_theme(request: Request) -> Response:
    """Remember the colour theme in a cookie (``auto`` follows the system) and go back; a
    preference, not tenant data, so it needs no session and no CSRF token."""
    fields = await form_fields(request)
    theme = fields.get("theme", "auto")
    response = RedirectResponse(_safe_next(fields.get("back")), status_code=303)
    if theme in ("dark", "light"):
        response.set_cookie(
            THEME_COOKIE,
            theme,
            max_age=365 * 86_400,
            path=COOKIE_PATH,
            httponly=True,
            samesite="strict",
        )
    else:
        response.delete_cookie(THEME_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


@router.post("/logout")
async def logout(request: Request, session: SessionDep) -> Response:
    """Forget the session cookie."""
    check_csrf(session, await form_fields(request))
    response = RedirectResponse("/ui/login?notice=logged_out", status_code=303)
    response.delete_cookie(COOKIE_NAME, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


def load_visible_run(services: ServicesDep, session: Session, run_id: str) -> ToolRun:
    """The run if the caller may see it; the dashboard's 404 otherwise."""
    run = RunReader(services.engine).get(_parse_run_id(run_id), visible_tenant(session.principal))
    if run is None:
        raise no_run(run_id)
    return run


def _panel_context(services: ServicesDep, run: ToolRun) -> dict[str, Any]:
    terminal = run.status in TERMINAL_STATUSES
    view = RunReader(services.engine).view(run.id, None)
    queued = run.status == RunStatus.QUEUED
    return {
        "run": run,
        "terminal": terminal,
        "timeline": run_timeline(services.engine, run.id),
        "holder": run_holder(services.engine, run.id) if run.status == RunStatus.RUNNING else None,
        "waiting_for": view.waiting_for if view is not None and queued else None,
        # Workflows: its batch and ref, what it depends on and still waits for, what it re-runs.
        "view": view,
        "trace_url": services.settings.trace_url_template,
        "dependencies": dependencies(services.engine, run.id, run.tenant)
        if view is not None and view.depends_on
        else [],
        "scheduled": queued
        and run.run_at is not None
        and bool(scheduled_runs(services.engine, [run.id])),
        **(artifact_rows(services, run) if terminal else {"artifacts": None}),
    }


@router.get("/runs/{run_id}")
def run_page(
    run_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """One run: summary, logs (live while it runs), result, artifacts, timeline, input."""
    # The logs' snapshot comes first: the page's stream replays only the events after its
    # ``upto``, so a summary read before it could miss a status change committed between
    # the two reads for good. Nothing of it is shown unless the caller may see the run.
    snapshot = log_snapshot(services.engine, _parse_run_id(run_id))
    run = load_visible_run(services, session, run_id)
    context = {
        **_panel_context(services, run),
        **log_context(run, snapshot),
        "title": f"Run {run.id}",
    }
    return page(ui, request, "run.html", context)


@router.get("/runs/{run_id}/panel")
def run_panel(
    run_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """The summary of a run page, for its live refresh."""
    run = load_visible_run(services, session, run_id)
    return page(ui, request, "_run_panel.html", _panel_context(services, run))


@router.get("/runs/{run_id}/details")
def run_details(
    run_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """The result, artifacts and timeline of a run page, for its live refresh."""
    run = load_visible_run(services, session, run_id)
    return page(ui, request, "_run_details.html", _panel_context(services, run))


@router.get("/runs/{run_id}/logs")
def run_logs_fragment(
    run_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """The stored (capped) logs of a finished run, swapped in when it ends."""
    run = load_visible_run(services, session, run_id)
    logs = log_context(run, log_snapshot(services.engine, run.id))
    return page(ui, request, "_run_logs.html", {"run": run, **logs})


@router.get("/runs/{run_id}/events")
async def run_events(
    run_id: str,
    request: Request,
    services: ServicesDep,
    session: SessionDep,
    after: Annotated[int, Query(ge=0, le=MAX_EVENT_ID)] = 0,
) -> Response:
    """The run's SSE stream (the API's own), authenticated by the session cookie."""
    parsed = _parse_run_id(run_id)
    last_event_id = request.headers.get("last-event-id")
    start = after
    if last_event_id and last_event_id.isdigit() and len(last_event_id) <= 19:
        # The reconnect's place, later in the stream than the URL's ?after=.
        start = min(int(last_event_id), MAX_EVENT_ID)
    return await event_actions.run_events(services, session.principal, parsed, start, ndjson=False)


@router.post("/runs/{run_id}/cancel")
async def cancel(
    run_id: str, request: Request, services: ServicesDep, session: SessionDep
) -> Response:
    """Cancel from the run page, then show the page again."""
    check_csrf(session, await form_fields(request))
    parsed = _parse_run_id(run_id)
    notice = "cancel_requested"
    try:
        await run_in_threadpool(run_actions.cancel_run, services, session.principal, parsed)
    except Problem as exc:
        if exc.status == 404:
            raise no_run(run_id) from exc
        if exc.code != "run_finished":
            raise
        notice = "already_finished"
    return RedirectResponse(f"/ui/runs/{parsed}?notice={notice}", status_code=303)


@router.post("/runs/{run_id}/rerun")
async def rerun(
    run_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> Response:
    """Re-run from the run page (the API's own rerun), then show the new run."""
    check_csrf(session, await form_fields(request))
    parsed = _parse_run_id(run_id)
    try:
        submitted = await run_actions.rerun(request, services, session.principal, parsed)
    except Problem as exc:
        if exc.status == 404:
            raise no_run(run_id) from exc
        raise UiError(exc.status, "Not re-run", exc.detail) from exc
    return RedirectResponse(f"/ui/runs/{submitted.run.id}?notice=rerun_started", status_code=303)


@router.get("/runs/{run_id}/log.txt")
def download_log(
    run_id: str,
    services: ServicesDep,
    session: SessionDep,
    stream: Annotated[Literal["stdout", "stderr", "both"], Query()] = "both",
) -> PlainTextResponse:
    """The log as text (the API's logs action: the stored, capped log of a finished run, the
    current attempt's chunks so far of a live one), as a download."""
    parsed = _parse_run_id(run_id)
    try:
        run, text = run_actions.run_logs(
            services, session.principal, parsed, run_actions.log_streams(stream)
        )
    except Problem as exc:
        raise no_run(run_id) from exc
    name = f"run-{run.id}-{stream}.txt"
    return PlainTextResponse(
        text, headers={"Content-Disposition": f'attachment; filename="{name}"'}
    )


@router.get("/queue")
def queue_page(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """Depth by queue and status, the oldest ready run, wait-time percentiles, and each
    queue's last hour as charts."""
    tenant = visible_tenant(session.principal)
    overview = queue_overview(services.engine, tenant)
    charts = [
        QueueCharts(a.queue, counts_chart(a, f"q{i}-counts"), waits_chart(a, f"q{i}-waits"))
        for i, a in enumerate(queue_activity(services.engine, tenant))
    ]
    with services.engine.connect() as conn:
        live = live_workers_by_queue(conn, WORKER_LIVE_SECONDS)
    queues = sorted({row.queue for row in overview.depth} | set(live))
    pools = [(queue, live.get(queue, 0)) for queue in queues if queue != SYNC_QUEUE]
    context = {"title": "Queue", "overview": overview, "charts": charts, "pools": pools}
    return page(ui, request, "queue.html", context)


@router.get("/workers")
def workers_page(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """Workers: live, silent or stopped; their engine, slots and last heartbeat (admins:
    hosts, engines and other tenants' load are not a tenant's business)."""
    if not session.principal.admin:
        raise UiError(403, "Admins only", "The workers page needs an admin key.")
    workers = worker_overview(services.engine, silent_after_seconds=services.settings.lease_seconds)
    return page(ui, request, "workers.html", {"title": "Workers", "workers": workers})


@router.get("/tools")
def tools_page(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """The tools the key may run with their limits and input schemas, each one's last day and
    what its runs consumed this month."""
    registry = services.registry
    names = sorted(name for name in registry.tools if may_run(session.principal, name))
    tools = [registry.tools[name] for name in names]
    figures = tool_figures(services.engine, visible_tenant(session.principal))
    month = usage_report(services, session.principal, first=None, last=None, group_by=GroupBy.TOOL)
    context = {
        "title": "Tools",
        "tools": tools,
        "figures": figures,
        # A tool's line of its runs, and one of its image builds (charged to this tenant).
        "usage": {line.key: line for line in month.lines if line.kind == "run"},
        "builds": {line.key: line for line in month.lines if line.kind == "build"},
        "usage_since": month.first,
        "window_hours": TOOL_WINDOW_SECONDS // 3600,
    }
    return page(ui, request, "tools.html", context)
