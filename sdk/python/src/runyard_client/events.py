"""A run's events (``GET /v1/runs/{id}/events``) as typed models: one class per event type,
told apart by ``type``; a type this client does not know arrives as ``OtherEvent``."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter

from runyard_client.models import Model, RunStatus


class BaseEvent(Model):
    """What every event has: its id (resume after it), its type and when it happened."""

    id: int
    type: str
    at: datetime


class StatusEvent(BaseEvent):
    """The run changed status; the stream ends after the terminal one."""

    type: Literal["status"] = "status"
    status: RunStatus
    attempt: int | None = None
    exit_code: int | None = None
    error_code: str | None = None
    mode: str | None = None


class ClaimedEvent(BaseEvent):
    """A worker (or a sync-mode API process) took an attempt."""

    type: Literal["claimed"] = "claimed"
    attempt: int
    worker_id: str
    engine_id: str | None = None


class AdoptedEvent(BaseEvent):
    """Another owner took over a running attempt whose lease had lapsed."""

    type: Literal["adopted"] = "adopted"
    attempt: int
    worker_id: str


class ReleasedEvent(BaseEvent):
    """The owner gave an attempt's lease back."""

    type: Literal["released"] = "released"
    attempt: int
    reason: str | None = None
    adoptable_at: datetime | None = None


class RequeuedEvent(BaseEvent):
    """The run went back to the queue for another attempt."""

    type: Literal["requeued"] = "requeued"
    attempt: int
    available_at: datetime | None = None
    error_code: str | None = None
    unstarted: bool | None = None


class LeaseExpiredEvent(BaseEvent):
    """An attempt's lease ran out before its owner renewed it."""

    type: Literal["lease_expired"] = "lease_expired"
    attempt: int


class CancelRequestedEvent(BaseEvent):
    """Someone asked the run to stop."""

    type: Literal["cancel_requested"] = "cancel_requested"


class StdoutEvent(BaseEvent):
    """A live chunk of the attempt's standard output."""

    type: Literal["stdout"] = "stdout"
    attempt: int
    text: str
    until: str


class StderrEvent(BaseEvent):
    """A live chunk of the attempt's standard error."""

    type: Literal["stderr"] = "stderr"
    attempt: int
    text: str
    until: str


class WaitingEvent(BaseEvent):
    """The run waits for its dependencies or its ``run_at`` time."""

    type: Literal["waiting"] = "waiting"
    dependencies: int
    run_at: datetime


class DependenciesMetEvent(BaseEvent):
    """Every run it depends on has succeeded."""

    type: Literal["dependencies_met"] = "dependencies_met"


class WebhookEvent(BaseEvent):
    """One attempt to deliver the run's completion webhook."""

    type: Literal["webhook"] = "webhook"
    delivery_id: uuid.UUID
    attempt: int
    outcome: str
    status_code: int | None = None
    error: str | None = None
    next_attempt_at: datetime | None = None


class StaleEvent(BaseEvent):
    """The running tool has printed nothing for a while (its idle limit warns before it
    stops it)."""

    type: Literal["stale"] = "stale"
    attempt: int
    quiet_seconds: int


class EgressEvent(BaseEvent):
    """A connection of a tool with an egress allow-list ended: allowed or refused (with the
    reason), and the bytes it moved each way."""

    type: Literal["egress"] = "egress"
    host: str
    port: int
    address: str
    allowed: bool
    reason: str | None = None
    bytes_out: int
    bytes_in: int
    seconds: float


class OtherEvent(BaseEvent):
    """An event of a type this client does not know; ``data`` holds its fields."""

    data: dict[str, Any] = Field(default_factory=dict)


class SkippedEvent(Model):
    """A message of the stream that could not be read as an event (its data is not the JSON
    its type carries): passed over, and handed to ``events(on_skip=...)`` if given."""

    id: str
    type: str
    error: str


KNOWN_EVENTS: dict[str, type[BaseEvent]] = {
    "status": StatusEvent,
    "claimed": ClaimedEvent,
    "adopted": AdoptedEvent,
    "released": ReleasedEvent,
    "requeued": RequeuedEvent,
    "lease_expired": LeaseExpiredEvent,
    "cancel_requested": CancelRequestedEvent,
    "stdout": StdoutEvent,
    "stderr": StderrEvent,
    "waiting": WaitingEvent,
    "dependencies_met": DependenciesMetEvent,
    "webhook": WebhookEvent,
    "stale": StaleEvent,
    "egress": EgressEvent,
}


def _tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in KNOWN_EVENTS else "other"


Event = Annotated[
    Annotated[StatusEvent, Tag("status")]
    | Annotated[ClaimedEvent, Tag("claimed")]
    | Annotated[AdoptedEvent, Tag("adopted")]
    | Annotated[ReleasedEvent, Tag("released")]
    | Annotated[RequeuedEvent, Tag("requeued")]
    | Annotated[LeaseExpiredEvent, Tag("lease_expired")]
    | Annotated[CancelRequestedEvent, Tag("cancel_requested")]
    | Annotated[StdoutEvent, Tag("stdout")]
    | Annotated[StderrEvent, Tag("stderr")]
    | Annotated[WaitingEvent, Tag("waiting")]
    | Annotated[DependenciesMetEvent, Tag("dependencies_met")]
    | Annotated[WebhookEvent, Tag("webhook")]
    | Annotated[StaleEvent, Tag("stale")]
    | Annotated[EgressEvent, Tag("egress")]
    | Annotated[OtherEvent, Tag("other")],
    Discriminator(_tag),
]
"""Any event of a run, told apart by ``type``."""

EVENT: TypeAdapter[Event] = TypeAdapter(Event)


def event_of(event_id: int, kind: str, data: dict[str, Any]) -> Event:
    """The typed event for an id, a type and its data (which carries ``at``)."""
    fields = {key: value for key, value in data.items() if key not in ("id", "type")}
    if kind in KNOWN_EVENTS:
        return EVENT.validate_python({**fields, "id": event_id, "type": kind})
    at = fields.pop("at", None)
    return EVENT.validate_python({"id": event_id, "type": kind, "at": at, "data": fields})


def event_from_sse(event_id: str, kind: str, data: str) -> Event:
    """The typed event of one server-sent message (``id``, ``event``, JSON ``data``)."""
    payload = json.loads(data)
    if not isinstance(payload, dict):
        raise ValueError(f"event {event_id} carries no JSON object")
    return event_of(int(event_id), kind, payload)


def is_terminal(event: Event) -> bool:
    """Whether ``event`` is the run's final status change (the stream ends after it)."""
    return isinstance(event, StatusEvent) and event.status.is_terminal
