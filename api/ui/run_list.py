"""The dashboard's runs list: filters, search and a requested-between window kept in the
URL, and bulk cancel, delete and re-run over a selection or over every matching run (asked
first, then reported) through the actions the JSON API calls too (``api.actions.runs``)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session as OrmSession

from api.actions import runs as run_actions
from api.deps import Services, ServicesDep, visible_tenant
from api.problems import Problem
from api.ui.context import SessionDep, UiDep, UiError, check_csrf
from api.ui.session import Session
from api.ui.views import PAGE_SIZE, form_pairs, page
from runyard.domain.bulk import (
    ACTION_WORDS,
    BULK_CAP,
    BulkAction,
    BulkOutcome,
    acts_on,
    describe,
    plan,
)
from runyard.domain.run_search import SearchIn, day_bounds, parse_day, parse_search
from runyard.domain.states import RunStatus
from runyard.platform.models import ToolRun
from runyard.reads.cursors import BadCursor
from runyard.reads.dashboard_workflows import scheduled_runs
from runyard.reads.run_search import TEXT_SEARCH_WINDOW, RunSearch, search_runs

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/ui/runs", include_in_schema=False)

# The filter fields a list URL (and a bulk form over "all matching") carries.
FILTER_FIELDS = ("q", "in", "status", "tool", "batch", "from", "to")
# A bulk form: its own fields, the filters, and one field per selected run of a page.
BULK_FORM_FIELDS = PAGE_SIZE + len(FILTER_FIELDS) + 10


@dataclass(frozen=True)
class ListQuery:
    """The runs page's filters as read from a URL or a form (bad values are dropped, not
    errors: a mangled link shows the newest runs rather than an error page)."""

    search: RunSearch
    params: dict[str, str]  # the cleaned filters, for links that keep them

    @property
    def encoded(self) -> str:
        return urlencode(self.params)


def _short(value: str | None, longest: int) -> str:
    return value.strip() if value is not None and len(value) <= longest else ""


def read_filters(session: Session, raw: dict[str, str]) -> ListQuery:
    """The list's filters from raw query or form values, tenant-scoped for ``session``."""
    params: dict[str, str] = {}
    status = None
    if raw.get("status") in {s.value for s in RunStatus}:
        status = RunStatus(raw["status"])
        params["status"] = status.value
    tool = _short(raw.get("tool"), 63) or None
    if tool:
        params["tool"] = tool
    batch_id = None
    batch_text = _short(raw.get("batch"), 36)
    if batch_text:
        try:
            batch_id = uuid.UUID(batch_text)
            params["batch"] = str(batch_id)
        except ValueError:
            batch_id = None
    first, last = parse_day(raw.get("from")), parse_day(raw.get("to"))
    if first is not None:
        params["from"] = first.isoformat()
    if last is not None:
        params["to"] = last.isoformat()
    where = SearchIn(raw["in"]) if raw.get("in") in {s.value for s in SearchIn} else SearchIn.AUTO
    term = parse_search(raw.get("q"), where)
    if term is not None:
        params["q"] = raw.get("q", "").strip()
        if where is not SearchIn.AUTO:
            params["in"] = where.value
    start, end = day_bounds(first, last)
    search = RunSearch(
        tenant=visible_tenant(session.principal),
        status=status,
        tool=tool,
        batch_id=batch_id,
        requested_from=start,
        requested_before=end,
        term=term,
    )
    return ListQuery(search, params)


def _listing(services: Services, query: ListQuery, cursor: str | None) -> dict[str, Any]:
    try:
        found = search_runs(services.engine, query.search, limit=PAGE_SIZE, cursor=cursor)
    except BadCursor:
        cursor = None
        found = search_runs(services.engine, query.search, limit=PAGE_SIZE)
    rows = found.runs
    later = [run.id for run in rows if run.status == RunStatus.QUEUED and run.run_at is not None]
    older = urlencode({**query.params, "cursor": found.next_cursor}) if found.next_cursor else None
    return {
        "runs": rows,
        "scheduled": scheduled_runs(services.engine, later),
        "params": query.params,
        "query": query.encoded,
        "rows_query": urlencode({**query.params, **({"cursor": cursor} if cursor else {})}),
        "older_query": older,
        "first_page": cursor is None,
        "searched_to": found.searched_to,
        "search_window": TEXT_SEARCH_WINDOW,
    }


def runs_listing(request: Request, services: ServicesDep, session: SessionDep) -> dict[str, Any]:
    """One page of the runs the caller may see, from the page's query."""
    raw = {name: request.query_params.get(name, "") for name in FILTER_FIELDS}
    cursor = request.query_params.get("cursor") or None
    if cursor is not None and len(cursor) > 200:
        cursor = None  # a mangled link shows the newest page
    return _listing(services, read_filters(session, raw), cursor)


RunsListingDep = Annotated[dict[str, Any], Depends(runs_listing)]


def _bulk_report(request: Request) -> str | None:
    """The report line of a bulk action just done, from the redirect's query."""
    params = request.query_params
    action = params.get("bulk", "")
    if action not in {a.value for a in BulkAction}:
        return None

    def count(name: str) -> int:
        value = params.get(name, "0")
        return int(value) if value.isdigit() and len(value) <= 6 else 0

    outcome = BulkOutcome(
        done=count("done"), skipped=count("skipped"), gone=count("gone"), refused=count("refused")
    )
    return describe(BulkAction(action), outcome)


@router.get("", response_model=None)
def runs_page(
    request: Request, services: ServicesDep, ui: UiDep, listing: RunsListingDep
) -> HTMLResponse | RedirectResponse:
    """Runs newest first, filtered and searched, refreshed in place by app.js."""
    if any(
        not value for name, value in request.query_params.multi_items() if name in FILTER_FIELDS
    ):
        # The filter form sends its empty fields too: show the short URL worth sharing.
        kept = [(n, v) for n, v in request.query_params.multi_items() if v]
        return RedirectResponse(f"/ui/runs?{urlencode(kept)}" if kept else "/ui/runs", 303)
    context = {
        **listing,
        "statuses": [s.value for s in RunStatus],
        "tools": sorted(services.registry.tools),
        "title": "Runs",
        "bulk_report": _bulk_report(request),
        "bulk_cap": BULK_CAP,
        "sync_mode": services.sync is not None,
    }
    return page(ui, request, "runs.html", context)


@router.get("/rows")
def runs_rows(request: Request, ui: UiDep, listing: RunsListingDep) -> HTMLResponse:
    """The table body of the runs page, for its live refresh."""
    return page(ui, request, "_run_rows.html", listing)


def _selected_runs(services: Services, session: Session, ids: list[str]) -> list[ToolRun]:
    """The selected runs the caller may see (another tenant's id finds nothing)."""
    parsed = set()
    for value in ids[:PAGE_SIZE]:
        try:
            parsed.add(uuid.UUID(value))
        except ValueError:
            continue
    query = select(ToolRun).where(ToolRun.id.in_(parsed))
    tenant = visible_tenant(session.principal)
    if tenant is not None:
        query = query.where(ToolRun.tenant == tenant)
    with OrmSession(services.engine, expire_on_commit=False) as orm:
        rows = list(orm.scalars(query.order_by(ToolRun.requested_at.desc(), ToolRun.id.desc())))
        orm.expunge_all()
    return rows


@dataclass(frozen=True)
class BulkTargets:
    """The runs a bulk form names, with the filters and how "all matching" was bounded."""

    runs: list[ToolRun]
    query: ListQuery
    capped: bool = False  # more runs match than BULK_CAP
    searched_to: datetime | None = None  # a text search stopped at its window here


def _bulk_targets(
    services: Services, session: Session, fields: list[tuple[str, str]]
) -> BulkTargets:
    single = dict(fields)
    query = read_filters(session, single)
    if single.get("scope") == "matching":
        found = search_runs(services.engine, query.search, limit=BULK_CAP)
        if found.searched_to is not None:
            return BulkTargets(found.runs, query, searched_to=found.searched_to)
        return BulkTargets(found.runs, query, capped=found.next_cursor is not None)
    ids = [value for name, value in fields if name == "run"]
    return BulkTargets(_selected_runs(services, session, ids), query)


async def _apply(
    request: Request, services: Services, session: Session, action: BulkAction, runs: list[ToolRun]
) -> BulkOutcome:
    done = skipped = gone = refused = 0
    for run in runs:
        if not acts_on(action, run.status):
            skipped += 1
            continue
        try:
            if action is BulkAction.CANCEL:
                await run_in_threadpool(run_actions.cancel_run, services, session.principal, run.id)
            elif action is BulkAction.DELETE:
                await run_in_threadpool(run_actions.delete_run, services, session.principal, run.id)
            else:
                await run_actions.rerun(request, services, session.principal, run.id)
            done += 1
        except Problem as exc:
            # Its status changed since it was read (finished, or started again), or it went.
            if exc.status == 404:
                gone += 1
            elif exc.code in ("run_finished", "run_not_finished"):
                skipped += 1
            else:
                refused += 1
    return BulkOutcome(done=done, skipped=skipped, gone=gone, refused=refused)


@router.post("/bulk")
async def bulk(request: Request, services: ServicesDep, ui: UiDep, session: SessionDep) -> Response:
    """Cancel, delete or re-run the selected runs or every matching one (up to
    ``BULK_CAP``): first a page that says what will happen, then the report."""
    fields = await form_pairs(request, BULK_FORM_FIELDS)
    single = dict(fields)
    check_csrf(session, single)
    if single.get("action") not in {a.value for a in BulkAction}:
        raise UiError(400, "Bad form", "Choose cancel, delete or re-run.")
    action = BulkAction(single["action"])
    if action is BulkAction.RERUN and services.sync is not None:
        raise UiError(
            422,
            "Not in sync mode",
            "In sync mode runs are re-run one at a time, from a run's page.",
        )
    targets = await run_in_threadpool(_bulk_targets, services, session, fields)
    runs, query = targets.runs, targets.query
    back = f"/ui/runs?{query.encoded}" if query.params else "/ui/runs"
    if single.get("confirmed") != "yes":
        verb, _, skip_reason = ACTION_WORDS[action]
        context = {
            "title": f"{verb.capitalize()} runs?",
            "action": action.value,
            "verb": verb,
            "planned": plan(action, [run.status for run in runs]),
            "skip_reason": skip_reason,
            "runs": runs,
            "capped": targets.capped,
            "searched_to": targets.searched_to,
            "search_window": TEXT_SEARCH_WINDOW,
            "bulk_cap": BULK_CAP,
            "scope": single.get("scope", "selected"),
            "params": query.params,
            "back": back,
        }
        return page(ui, request, "bulk_confirm.html", context)
    outcome = await _apply(request, services, session, action, runs)
    logger.info(
        "bulk action on runs",
        extra={
            "action": action.value,
            "tenant": session.principal.tenant,
            "runs": len(runs),
            "done": outcome.done,
            "skipped": outcome.skipped,
        },
    )
    report = {
        "bulk": action.value,
        "done": outcome.done,
        "skipped": outcome.skipped,
        "gone": outcome.gone,
        "refused": outcome.refused,
    }
    return RedirectResponse(f"/ui/runs?{urlencode({**query.params, **report})}", status_code=303)
