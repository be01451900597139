"""Server-sent events of a run: its ``tool_run_events`` rows, live and resumable."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response

from api.actions import events as event_actions
from api.actions.events import MAX_EVENT_ID, EventStreamResponse
from api.deps import PrincipalDep, ServicesDep
from api.openapi import COMMON_ERRORS, problem, run_events_content
from api.problems import Problem
from api.routes import RUN_NOT_FOUND

router = APIRouter(prefix="/v1/runs", tags=["events"], responses=COMMON_ERRORS)


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
    operation_id="getRunEvents",
    response_class=EventStreamResponse,
    responses={
        200: {
            "content": run_events_content(),
            "description": "The run's events as SSE (the stream ends after the terminal "
            "one), or as an NDJSON download of the log so far",
        },
        204: {"description": "The run is terminal and has no event after Last-Event-ID"},
        404: RUN_NOT_FOUND,
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
    ndjson = wants_ndjson(accept, format_)
    return await event_actions.run_events(services, principal, run_id, start, ndjson=ndjson)
