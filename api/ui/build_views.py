"""The dashboard's Builds pages: each built tool's status per engine, the builds, and one
build's log (reloaded every two seconds while it is queued or building)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from api.deps import ServicesDep
from api.ui.context import SessionDep, UiDep, UiError
from api.ui.views import page
from runyard.domain.build_ref import BuildRef
from runyard.submission.request import BuildUnavailable, pinned_build_ref

router = APIRouter(prefix="/ui", include_in_schema=False)

SHOWN = 100
RELOAD_SECONDS = 2


def _tool_rows(services: ServicesDep) -> list[dict[str, object]]:
    """Per built tool: its current digest (or why its source cannot be used) and the
    status of that digest's build on each engine."""
    rows: list[dict[str, object]] = []
    refs: dict[str, BuildRef | str] = {}
    for name in sorted(services.registry.tools):
        tool = services.registry.tools[name]
        if tool.build is None:
            continue
        try:
            refs[name] = pinned_build_ref(services.registry, tool)
        except BuildUnavailable as exc:
            refs[name] = str(exc)
    tags = [ref.tag for ref in refs.values() if isinstance(ref, BuildRef)]
    status = services.build_reads.by_tags(tags)
    for name, ref in refs.items():
        if isinstance(ref, BuildRef):
            rows.append({"tool": name, "tag": ref.tag, "engines": status[ref.tag], "error": None})
        else:
            rows.append({"tool": name, "tag": "", "engines": {}, "error": ref})
    return rows


@router.get("/builds")
async def builds_page(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """Built tools with their build per engine, then the newest builds."""
    tools = await run_in_threadpool(_tool_rows, services)
    builds = await run_in_threadpool(services.build_reads.list, limit=SHOWN)
    context = {"title": "Builds", "tools": tools, "builds": builds}
    return page(ui, request, "builds.html", context)


@router.get("/builds/{build_id}")
async def build_page(
    build_id: str, request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> HTMLResponse:
    """One build and its log's tail."""
    try:
        parsed = uuid.UUID(build_id)
    except ValueError:
        raise UiError(404, "No such build", f"No build {build_id[:64]}.") from None
    build = await run_in_threadpool(services.build_reads.get, parsed)
    if build is None:
        raise UiError(404, "No such build", f"No build {parsed}.")
    live = build.status in ("queued", "building")
    context = {
        "title": f"Build of {build.tool}",
        "build": build,
        "reload": RELOAD_SECONDS if live else None,
    }
    return page(ui, request, "build.html", context)
