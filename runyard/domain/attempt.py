"""One attempt as data: what starts its container, and the outcome it ends with."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runyard.domain.states import RunStatus
from runyard.domain.usage import AttemptUsage


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
    # The attempt's span as W3C trace context: the container's TRACEPARENT and TRACESTATE.
    traceparent: str | None = None
    tracestate: str | None = None

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
    # What the container consumed, read from the engine before it is removed; None: no
    # container ran (or the engine could not say).
    usage: AttemptUsage | None = None


@dataclass(frozen=True)
class ManagedAttempt:
    """A container or volume the engine holds for some attempt, found by its labels."""

    run_id: uuid.UUID
    attempt: int
    running: bool
