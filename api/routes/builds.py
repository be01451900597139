"""Builds of the tools built from source: listed, one with its log, its log followed live."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Header, Query
from fastapi.concurrency import run_in_threadpool

from api.actions.events import RECONNECT_MILLISECONDS, EventStreamResponse
from api.deps import PrincipalDep, Services, ServicesDep
from api.event_schemas import BuildEventType
from api.openapi import COMMON_ERRORS, build_events_content, problem
from api.problems import Problem
from api.schemas import BuildOut
from runyard.builds.reads import TERMINAL, BuildReads

router = APIRouter(prefix="/v1/builds", tags=["builds"], responses=COMMON_ERRORS)

BuildStatus = Literal["queued", "building", "ready", "failed"]
# How often a followed build is read again.
FOLLOW_POLL_SECONDS = 0.5


@router.get("", operation_id="listBuilds")
def list_builds(
    services: ServicesDep,
    principal: PrincipalDep,
    tool: str | None = Query(None, max_length=63),
    status: BuildStatus | None = None,
    limit: int = Query(100, ge=1, le=500),
) -> list[BuildOut]:
    """The newest builds first, per digest and engine (without their logs)."""
    views = services.build_reads.list(tool=tool, status=status, limit=limit)
    return [BuildOut(**view.public()) for view in views]


NOT_FOUND: dict[int | str, dict[str, Any]] = {404: problem("No build of that id")}


@router.get("/{build_id}", operation_id="getBuild", responses=NOT_FOUND)
def get_build(build_id: uuid.UUID, services: ServicesDep, principal: PrincipalDep) -> BuildOut:
    """One build with its log's tail."""
    view = services.build_reads.get(build_id)
    if view is None:
        raise Problem(404, "build_not_found", f"no build {build_id}")
    return BuildOut(**view.public())


def _message(kind: BuildEventType, event_id: int, data: dict[str, object]) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


async def _follow(services: Services, build_id: uuid.UUID, seen: int) -> AsyncIterator[str]:
    """``status`` when it changes and ``log`` pieces (the event id counts the characters
    written so far, so ``Last-Event-ID`` resumes); ends once ready or failed."""
    reads = BuildReads(services.engine)
    settings = services.settings
    started = last_sent = time.monotonic()
    status: str | None = None
    yield f"retry: {RECONNECT_MILLISECONDS}\n\n"
    while True:
        piece = await anyio.to_thread.run_sync(
            reads.follow, build_id, seen, limiter=services.events_limiter
        )
        if piece is None:
            return
        if piece.text:
            seen = piece.size
            yield _message("log", seen, {"text": piece.text, "gap": piece.gap})
            last_sent = time.monotonic()
        if piece.status != status:
            status = piece.status
            yield _message("status", seen, {"status": status})
            last_sent = time.monotonic()
        if status in TERMINAL or time.monotonic() - started >= settings.events_max_stream_seconds:
            return
        if time.monotonic() - last_sent >= settings.events_keepalive_seconds:
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        await anyio.sleep(FOLLOW_POLL_SECONDS)


@router.get(
    "/{build_id}/events",
    operation_id="getBuildEvents",
    response_class=EventStreamResponse,
    responses={
        200: {
            "content": build_events_content(),
            "description": "The build's log pieces and status changes as SSE, until it is "
            "ready or failed",
        },
        **NOT_FOUND,
    },
)
async def build_events(
    build_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    last_event_id: Annotated[str | None, Header(max_length=20, pattern=r"^[0-9]*$")] = None,
) -> EventStreamResponse:
    """Server-sent events of a build: its log as it is written and its status changes."""
    view = await run_in_threadpool(services.build_reads.get, build_id)
    if view is None:
        raise Problem(404, "build_not_found", f"no build {build_id}")
    seen = int(last_event_id) if last_event_id else 0
    return EventStreamResponse(_follow(services, build_id, seen))
