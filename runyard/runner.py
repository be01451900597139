"""The runner port: what the worker needs from a container engine, and what it gets back."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from runyard.artifact_store import ArtifactStore
from runyard.domain.attempt import AttemptResult, AttemptSpec, ManagedAttempt
from runyard.domain.states import ContainerState


class LogSink(Protocol):
    """Where live log chunks of an attempt go while it runs (the run's event log)."""

    def resume_point(self, stream: str) -> str | None:
        """The engine timestamp of the last chunk already stored for ``stream``, if any."""
        ...

    def write(self, stream: str, text: str, until: str) -> bool:
        """Store a chunk that ends at engine timestamp ``until``; False: stop sending."""
        ...


def _always_owner() -> bool:
    return True


def _engine_clock() -> datetime:
    return datetime.now(UTC)


def _no_event(kind: str, data: dict[str, Any]) -> None:
    return None


@dataclass
class AttemptControl:
    """Signals from the worker to a running attempt, and the owner's hooks it calls back."""

    cancel: threading.Event = field(default_factory=threading.Event)
    # Set when the lease is lost or the worker hands over: stop waiting, touch nothing.
    abandon: threading.Event = field(default_factory=threading.Event)
    logs: LogSink | None = None
    # Where the exited attempt's files under /runyard/out go; None: they are not kept.
    artifacts: ArtifactStore | None = None
    # Asked right before the container is created and before it is started: False means
    # this process no longer holds the attempt's lease, so it must not touch the engine.
    still_owner: Callable[[], bool] = _always_owner
    # "Now" on the clock deadlines are written in (the database's, as the owner measures it).
    clock: Callable[[], datetime] = _engine_clock
    # A run event the attempt wants recorded (e.g. ``stale``), fenced by the owner's lease.
    note: Callable[[str, dict[str, Any]], None] = _no_event


class RunnerUnavailable(Exception):
    """The container engine could not be reached or answered with an error; decide nothing."""


class AttemptAbandoned(Exception):
    """The worker stopped waiting on the attempt (lease lost or handover); it was left alone."""


class Runner(Protocol):
    """A container engine that runs attempts; the Docker adapter and the fake implement it."""

    def engine_id(self) -> str:
        """A stable id unique to this engine (not ``docker info``'s ID)."""
        ...

    def ping(self) -> None:
        """A cheap call that raises ``RunnerUnavailable`` unless the engine answers."""
        ...

    def state(self, run_id: uuid.UUID, attempt: int) -> ContainerState:
        """What the engine knows of the attempt's container."""
        ...

    def run(self, spec: AttemptSpec, control: AttemptControl) -> AttemptResult:
        """Start the attempt's container, or adopt it if it exists, and wait for its outcome."""
        ...

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume; call only after the terminal commit."""
        ...

    def managed_attempts(self) -> list[ManagedAttempt]:
        """Every attempt the engine holds a labelled container or volume for."""
        ...
