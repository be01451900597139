"""A run's events for a caller: the live, resumable SSE stream of its ``tool_run_events``
rows, or the NDJSON download of them so far."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.actions.runs import load_run
from api.deps import Services
from api.problems import Problem
from runyard.platform.models import ToolRunEvent
from runyard.reads.runs import EventPage, RunReader, is_terminal_event
from runyard.tenancy.auth import Principal

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


def refuse_past_stream_cap(services: Services) -> None:
    """503 ``too_many_streams`` once ``RUNYARD_MAX_EVENT_STREAMS`` streams are open."""
    if services.open_streams >= services.settings.max_event_streams:
        raise Problem(
            503,
            "too_many_streams",
            "too many open event streams; retry later",
            headers={"Retry-After": str(services.settings.retry_after_seconds)},
        )


async def run_events(
    services: Services, principal: Principal, run_id: uuid.UUID, after: int, *, ndjson: bool
) -> Response:
    """The run's events after ``after``: the NDJSON download of those committed so far, or
    the SSE stream (204 if the run is terminal with none left; 503 past
    ``RUNYARD_MAX_EVENT_STREAMS``); 404 unless the caller may see the run."""
    await run_in_threadpool(load_run, services, principal, run_id)
    if ndjson:
        return NdjsonResponse(_download(services, run_id, after))
    refuse_past_stream_cap(services)
    page = await anyio.to_thread.run_sync(
        RunReader(services.engine).status_and_events,
        run_id,
        after,
        BATCH,
        limiter=services.events_limiter,
    )
    if page.status is None or (page.status.is_terminal and not page.events and not page.held):
        # Tells an EventSource to stop reconnecting.
        return Response(status_code=204)
    return EventStreamResponse(
        _stream(services, run_id, after, page),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
