"""The runner port: what the worker needs from a container engine, and what it gets back."""

from __future__ import annotations

import enum
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from runyard.artifacts.store import ArtifactStore
from runyard.models import RunStatus


class ErrorCode(enum.StrEnum):
    """Machine-readable reasons a run did not succeed."""

    TOOL_FAILED = "tool_failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    OOM_KILLED = "oom_killed"
    INVALID_RESULT = "invalid_result"
    CONTAINER_LOST = "container_lost"
    IMAGE_NOT_FOUND = "image_not_found"
    INFRASTRUCTURE = "infrastructure_error"
    API_LOST = "api_lost"
    INTERNAL = "internal_error"
    DISK_LIMIT = "disk_limit_exceeded"
    IDLE_TIMEOUT = "idle_timeout"
    SECRET_UNAVAILABLE = "secret_unavailable"
    ENGINE_UNSUPPORTED = "engine_unsupported"
    # The engine (or runyard's own check before asking it) refused the container for the
    # run's own settings: final, never retried, and the worker keeps claiming.
    CONTAINER_REFUSED = "container_refused"
    # Written by the database when a run it depends on ends without success (migration 0011).
    DEPENDENCY_FAILED = "dependency_failed"
    INVALID_ARTIFACT = "invalid_artifact"
    ARTIFACTS_LIMIT = "artifacts_limit_exceeded"


class ContainerState(enum.StrEnum):
    """What the engine knows about an attempt's container."""

    MISSING = "missing"
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"


@dataclass(frozen=True)
class AttemptSpec:
    """Everything needed to start (or adopt) one attempt's container."""

    run_id: uuid.UUID
    attempt: int
    tool: dict[str, Any]
    input: Any
    deadline_at: datetime
    # What the runs it depends on returned, by run id (docs/runner-contract.md, deps.json).
    deps: dict[str, Any] | None = None
    # Their published artifact sets, by run id: copied to /runyard/deps/<run id>/.
    dep_artifacts: dict[str, uuid.UUID] | None = None

    def files(self) -> dict[str, bytes]:
        """The files the tool finds in /runyard: ``input.json``, and ``deps.json`` if any."""
        files = {"input.json": json.dumps(self.input).encode()}
        if self.deps is not None:
            files["deps.json"] = json.dumps(self.deps).encode()
        return files

    @property
    def container_name(self) -> str:
        """Deterministic name: a second create for the same attempt gets a 409."""
        return container_name(self.run_id, self.attempt)


def container_name(run_id: uuid.UUID, attempt: int) -> str:
    """``runyard-{run_id}-{attempt}``, unique per attempt (docs/runner-contract.md)."""
    return f"runyard-{run_id}-{attempt}"


@dataclass(frozen=True)
class AttemptResult:
    """The terminal outcome of one attempt, ready to be finalized."""

    status: RunStatus
    exit_code: int | None = None
    result: Any | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error_code: str | None = None
    error: str | None = None
    image_digest: str | None = None
    # The artifact set collected for this outcome; finalizing the outcome publishes it.
    artifact_set: uuid.UUID | None = None


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


@dataclass(frozen=True)
class ManagedAttempt:
    """A container or volume the engine holds for some attempt, found by its labels."""

    run_id: uuid.UUID
    attempt: int
    running: bool


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
