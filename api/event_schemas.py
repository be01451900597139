"""The items of the event streams, for the OpenAPI document: a run's events (SSE and NDJSON,
one model per type of ``runyard.domain.run_events``) and a build's (SSE).

The routes write these shapes straight from the database's rows (``api.actions.events``) and
validate nothing against them; clients read them, and skip a type they do not know.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from runyard.domain.states import RunStatus

ATTEMPT = "The attempt it belongs to (1 is the first)"


class RunStatusEventData(BaseModel):
    """The run's status changed; the terminal one is the stream's last event."""

    status: RunStatus
    attempt: int | None = Field(default=None, description=ATTEMPT)
    exit_code: int | None = Field(default=None, description="The tool's exit code, once it ran")
    error_code: str | None = Field(
        default=None, description="Why the run did not succeed (as the run's error_code)"
    )
    mode: Literal["sync"] | None = Field(
        default=None, description="On the first event of a run executed inline by the API"
    )


class RunClaimedEventData(BaseModel):
    """A worker (or the API, in sync mode) took the run's lease for an attempt."""

    attempt: int = Field(description=ATTEMPT)
    worker_id: str
    engine_id: str | None = Field(default=None, description="The engine (sync mode only)")


class RunAdoptedEventData(BaseModel):
    """A worker took over a running attempt whose owner was gone, container and all."""

    attempt: int = Field(description=ATTEMPT)
    worker_id: str


class RunReleasedEventData(BaseModel):
    """The owner gave the lease back; another worker adopts the attempt."""

    attempt: int = Field(description=ATTEMPT)
    reason: str | None = Field(default=None, description="Why (engine trouble)")
    adoptable_at: datetime | None = Field(
        default=None, description="No worker adopts it before this time"
    )


class RunRequeuedEventData(BaseModel):
    """The run waits for another attempt."""

    attempt: int = Field(description=ATTEMPT)
    available_at: datetime | None = Field(default=None, description="Not claimed before")
    error_code: str | None = Field(default=None, description="Why the attempt ended")
    unstarted: bool | None = Field(
        default=None, description="true: the attempt had not started a container"
    )


class RunLeaseExpiredEventData(BaseModel):
    """The attempt's lease ran out without a renewal (its owner is gone or stuck)."""

    attempt: int = Field(description=ATTEMPT)


class RunCancelRequestedEventData(BaseModel):
    """A cancel was asked for the running run; its owner stops it."""


class RunLogChunkData(BaseModel):
    """A chunk of the running attempt's stdout or stderr (the event's type says which)."""

    attempt: int = Field(description=ATTEMPT)
    text: str
    until: str = Field(description="The engine's RFC 3339 timestamp of the chunk's last line")


class RunWaitingEventData(BaseModel):
    """A workflow run is queued behind its dependencies or its run_at."""

    dependencies: int = Field(description="Dependencies not succeeded yet")
    run_at: datetime = Field(description="Not started before this time")


class RunDependenciesMetEventData(BaseModel):
    """Every run this one depends on has succeeded: it may start."""


class RunWebhookEventData(BaseModel):
    """One delivery attempt of the run's completion webhook (after its terminal status)."""

    delivery_id: uuid.UUID
    attempt: int = Field(description="The delivery attempt (1 is the first)")
    outcome: Literal["delivered", "retrying", "gave_up", "interrupted"]
    status_code: int | None = Field(default=None, description="The receiver's HTTP status")
    error: str | None = Field(default=None, description="What went wrong")
    next_attempt_at: datetime | None = Field(default=None, description="When it tries again")


class RunStaleEventData(BaseModel):
    """The running tool has printed nothing for a while (its idle limit warns before it stops)."""

    attempt: int = Field(description=ATTEMPT)
    quiet_seconds: int = Field(description="Seconds since its last output")


class RunEgressEventData(BaseModel):
    """One connection of a tool with an egress allow-list, when it ended (docs/tools.md)."""

    host: str = Field(description="The host the tool asked for, as it asked")
    port: int
    address: str = Field(description="The address it resolved to ('' if it did not resolve)")
    allowed: bool
    reason: str | None = Field(default=None, description="Why it was refused (null: allowed)")
    bytes_out: int = Field(description="Bytes the tool sent through the proxy")
    bytes_in: int = Field(description="Bytes the tool received through the proxy")
    seconds: float


class RunEventBase(BaseModel):
    """What every run event has besides its type and data."""

    id: int = Field(description="The event id: resume after it (Last-Event-ID or ?after=)")
    at: datetime = Field(description="When it was written")


class RunStatusEvent(RunEventBase):
    """A ``status`` event."""

    type: Literal["status"]
    data: RunStatusEventData


class RunClaimedEvent(RunEventBase):
    """A ``claimed`` event."""

    type: Literal["claimed"]
    data: RunClaimedEventData


class RunAdoptedEvent(RunEventBase):
    """An ``adopted`` event."""

    type: Literal["adopted"]
    data: RunAdoptedEventData


class RunReleasedEvent(RunEventBase):
    """A ``released`` event."""

    type: Literal["released"]
    data: RunReleasedEventData


class RunRequeuedEvent(RunEventBase):
    """A ``requeued`` event."""

    type: Literal["requeued"]
    data: RunRequeuedEventData


class RunLeaseExpiredEvent(RunEventBase):
    """A ``lease_expired`` event."""

    type: Literal["lease_expired"]
    data: RunLeaseExpiredEventData


class RunCancelRequestedEvent(RunEventBase):
    """A ``cancel_requested`` event."""

    type: Literal["cancel_requested"]
    data: RunCancelRequestedEventData


class RunStdoutEvent(RunEventBase):
    """A ``stdout`` event."""

    type: Literal["stdout"]
    data: RunLogChunkData


class RunStderrEvent(RunEventBase):
    """A ``stderr`` event."""

    type: Literal["stderr"]
    data: RunLogChunkData


class RunWaitingEvent(RunEventBase):
    """A ``waiting`` event."""

    type: Literal["waiting"]
    data: RunWaitingEventData


class RunDependenciesMetEvent(RunEventBase):
    """A ``dependencies_met`` event."""

    type: Literal["dependencies_met"]
    data: RunDependenciesMetEventData


class RunWebhookEvent(RunEventBase):
    """A ``webhook`` event."""

    type: Literal["webhook"]
    data: RunWebhookEventData


class RunStaleEvent(RunEventBase):
    """A ``stale`` event."""

    type: Literal["stale"]
    data: RunStaleEventData


class RunEgressEvent(RunEventBase):
    """An ``egress`` event."""

    type: Literal["egress"]
    data: RunEgressEventData


# One line of the NDJSON download; an SSE message carries the same as ``id``, ``event`` (the
# type) and ``data`` (the data with ``at``).
RunEvent = Annotated[
    RunStatusEvent
    | RunClaimedEvent
    | RunAdoptedEvent
    | RunReleasedEvent
    | RunRequeuedEvent
    | RunLeaseExpiredEvent
    | RunCancelRequestedEvent
    | RunStdoutEvent
    | RunStderrEvent
    | RunWaitingEvent
    | RunDependenciesMetEvent
    | RunWebhookEvent
    | RunStaleEvent
    | RunEgressEvent,
    Field(discriminator="type"),
]


# The ``event`` of a build's SSE messages (``api.routes.builds``), and the data of each.
BuildEventType = Literal["log", "status"]


class BuildLogEventData(BaseModel):
    """A piece of a build's log, as it is written."""

    text: str
    gap: bool = Field(description="Some output before this piece was dropped from the log")


class BuildStatusEventData(BaseModel):
    """The build's status changed; the stream ends after ready or failed."""

    status: Literal["queued", "building", "ready", "failed"]


BUILD_EVENT_DATA: dict[BuildEventType, type[BaseModel]] = {
    "log": BuildLogEventData,
    "status": BuildStatusEventData,
}
