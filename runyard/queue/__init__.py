"""The queue: the only code that changes job and run state.

``jobs`` holds ``JobQueue`` (and ``ApiQueue``, the API's view of it), one method per
transition; ``sql`` holds each transition's named, literal statement (``batch_sql`` those of
the batched finalize, which ``completer`` sends for a worker's slots); ``values`` the values
they take and return. Importers use the names re-exported here.
"""

from __future__ import annotations

from runyard.queue.jobs import (
    BUILDS_CHANNEL,
    CANCEL_CHANNEL,
    EVENTS_CHANNEL,
    HELD_CHANNEL,
    JOBS_CHANNEL,
    RESERVED_EVENT_TYPES,
    RUNS_CHANNEL,
    ApiQueue,
    JobQueue,
)
from runyard.queue.values import (
    AdmissionCaps,
    AdmissionRefused,
    ClaimedJob,
    EnqueueResult,
    Heartbeat,
    IdempotencyConflict,
    InlineClaim,
    NewRun,
    OrphanedJob,
)

__all__ = [
    "BUILDS_CHANNEL",
    "CANCEL_CHANNEL",
    "EVENTS_CHANNEL",
    "HELD_CHANNEL",
    "JOBS_CHANNEL",
    "RESERVED_EVENT_TYPES",
    "RUNS_CHANNEL",
    "AdmissionCaps",
    "AdmissionRefused",
    "ApiQueue",
    "ClaimedJob",
    "EnqueueResult",
    "Heartbeat",
    "IdempotencyConflict",
    "InlineClaim",
    "JobQueue",
    "NewRun",
    "OrphanedJob",
]
