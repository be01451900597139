"""The states a run, its job and its container can be in, and why a run did not succeed."""

from __future__ import annotations

import enum


class RunStatus(enum.StrEnum):
    """Status of a run and of its job; the last four are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for the statuses that never change again."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CANCELLED}
)


class RunMode(enum.StrEnum):
    """How a run executes: through the queue and a worker, or inline in the API."""

    QUEUE = "queue"
    SYNC = "sync"


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
