"""Server-sent events of a run: its ``tool_run_events`` rows, live and resumable."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Header, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.deps import PrincipalDep, Services, ServicesDep
from api.openapi import COMMON_ERRORS, problem
from api.problems import Problem
from api.routes.runs import NOT_FOUND, load_run
from runyard.platform.models import ToolRunEvent
from runyard.reads.runs import EventPage, RunReader, is_terminal_event

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/runs", tags=["events"], responses=COMMON_ERRORS)

MAX_EVENT_ID = 2**63 - 1
BATCH = 500
RECONNECT_MILLISECONDS = 2000
HELD_FIRST_WAIT_SECONDS = 0.02


class EventStreamResponse(StreamingResponse):
    """``text/event-stream``."""

    media_type = "text/event-stream"


def format_event(event: ToolRunEvent) -> str:
    """One SSE message: ``id`` is the event id, ``event`` its type, ``data`` its JSON."""
    data: dict[str, Any] = {"at": event.at.isoformat(), **(event.data or {})}
    return f"id: {event.id}\nevent: {event.type}\ndata: {json.dumps(data)}\n\n"


async def _stream(
    services: Services, run_id: uuid.UUID, after: int, page: EventPage
) -> AsyncIterator[str]:
    settings = services.settings
    reader = RunReader(services.engine)
    started = time.monotonic()
    last_sent = started
    held_wait = HELD_FIRST_WAIT_SECONDS
    services.open_streams += 1
    try:
        yield f"retry: {RECONNECT_MILLISECONDS}\n\n"
        with services.notifier.subscribe(run_id) as subscription:
            while True:
                for event in page.events:
                    yield format_event(event)
                    after = event.id
                    last_sent = time.monotonic()
                    if is_terminal_event(event):
                        return
                if len(page.events) < BATCH:
                    if time.monotonic() - started >= settings.events_max_stream_seconds:
                        return  # bounded: the client reconnects with Last-Event-ID
                    keepalive_in = settings.events_keepalive_seconds - (
                        time.monotonic() - last_sent
                    )
                    if keepalive_in <= 0:
                        yield ": keepalive\n\n"
                        last_sent = time.monotonic()
                        keepalive_in = settings.events_keepalive_seconds
                    wait = min(settings.events_poll_seconds, keepalive_in)
                    if page.held:
                        # Committed events wait for an older transaction, which no NOTIFY of
                        # this run may announce: look again soon, then less and less often.
                        wait = min(wait, held_wait)
                        held_wait = min(held_wait * 2, settings.events_poll_seconds)
                    else:
                        held_wait = HELD_FIRST_WAIT_SECONDS
                    await subscription.wait(wait)
                page = await anyio.to_thread.run_sync(
                    reader.status_and_events, run_id, after, BATCH, limiter=services.events_limiter
                )
                if page.status is None:
                    return  # the run was deleted
                if page.status.is_terminal and not page.events and not page.held:
                    return  # its final event was pruned, or is before Last-Event-ID
    finally:
        services.open_streams -= 1


class NdjsonResponse(StreamingResponse):
    """``application/x-ndjson``."""

    media_type = "application/x-ndjson"


def ndjson_event(event: ToolRunEvent) -> str:
    """One line of the download: the event's id, type, time and data."""
    line = {"id": event.id, "type": event.type, "at": event.at.isoformat(), "data": event.data}
    return json.dumps(line, separators=(",", ":")) + "\n"


async def _download(services: Services, run_id: uuid.UUID, after: int) -> AsyncIterator[str]:
    """Every event committed so far, in delivery order, a page at a time; then the end."""
    reader = RunReader(services.engine)
    while True:
        page = await anyio.to_thread.run_sync(
            reader.status_and_events, run_id, after, BATCH, limiter=services.events_limiter
        )
        for event in page.events:
            yield ndjson_event(event)
            after = event.id
        if len(page.events) < BATCH:
            return


def wants_ndjson(accept: str | None, format_: str | None) -> bool:
    """Whether the caller asked for the download (``?format=ndjson`` or the Accept header)."""
    if format_ is not None:
        return format_ == "ndjson"
    return accept is not None and "application/x-ndjson" in accept


def _start_after(last_event_id: str | None, after: int | None) -> int:
    # An EventSource opened on a URL with ?after= sends that URL again on reconnect, with the
    # id it saw last in the header: the header is the later place. Ids are not increasing in
    # a stream, so the two cannot be compared.
    if not last_event_id:
        return after or 0
    value = int(last_event_id)
    if value > MAX_EVENT_ID:
        raise Problem(422, "validation_error", "Last-Event-ID is too large", field="Last-Event-ID")
    return value


@router.get(
    "/{run_id}/events",
    response_class=EventStreamResponse,
    responses={
        200: {
            "content": {
                "text/event-stream": {"schema": {"type": "string"}},
                "application/x-ndjson": {"schema": {"type": "string"}},
            },
            "description": "The run's events as SSE (the stream ends after the terminal "
            "one), or as an NDJSON download of the log so far",
        },
        204: {"description": "The run is terminal and has no event after Last-Event-ID"},
        404: NOT_FOUND,
        503: problem(
            "Too many open event streams, or the database is unavailable", retry_after=True
        ),
    },
)
async def run_events(
    run_id: uuid.UUID,
    services: ServicesDep,
    principal: PrincipalDep,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=19,
            pattern=r"^[0-9]*$",
            description="Resume after this event id (sent by EventSource on reconnect)",
        ),
    ] = None,
    after: Annotated[
        int | None,
        Query(ge=0, le=MAX_EVENT_ID, description="Resume after this event id (for curl)"),
    ] = None,
    format_: Annotated[
        Literal["sse", "ndjson"] | None,
        Query(
            alias="format",
            description="ndjson: the whole log so far, one JSON event a line, then the end "
            "(also with Accept: application/x-ndjson)",
        ),
    ] = None,
    accept: Annotated[str | None, Header(max_length=1000)] = None,
) -> Response:
    """Every event of the run after ``Last-Event-ID`` (else ``?after=``), then live ones.

    Each message has ``id`` (the event id), ``event`` (its type: ``status``, ``claimed``,
    ``adopted``, ``stdout``, ``stderr``, ``requeued``, ...) and ``data`` (JSON with ``at``).
    Events come in commit order, so an id may be smaller than the one before it. The stream
    ends after the terminal ``status`` event; reconnecting with the last id received gives
    every later event exactly once.
    """
    start = _start_after(last_event_id, after)
    await run_in_threadpool(load_run, services, principal, run_id)
    if wants_ndjson(accept, format_):
        return NdjsonResponse(_download(services, run_id, start))
    if services.open_streams >= services.settings.max_event_streams:
        raise Problem(
            503,
            "too_many_streams",
            "too many open event streams; retry later",
            headers={"Retry-After": str(services.settings.retry_after_seconds)},
        )
    page = await anyio.to_thread.run_sync(
        RunReader(services.engine).status_and_events,
        run_id,
        start,
        BATCH,
        limiter=services.events_limiter,
    )
    if page.status is None or (page.status.is_terminal and not page.events and not page.held):
        # Tells an EventSource to stop reconnecting.
        return Response(status_code=204)
    return EventStreamResponse(
        _stream(services, run_id, start, page),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
