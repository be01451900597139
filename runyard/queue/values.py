"""The values the queue takes and returns (``runyard.queue`` re-exports them)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus

if TYPE_CHECKING:
    from runyard.platform.settings import Settings


def json_digest(value: Any) -> str:
    """SHA-256 of ``value`` as canonical JSON: the hash of what a caller asked for."""
    body = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class NewRun:
    """A validated request to run a tool, with the tool definition already resolved."""

    tenant: str
    tool: str
    spec: dict[str, Any]
    input: Any
    max_attempts: int = 1
    timeout_seconds: int = 30
    queue: str = "default"
    priority: int = 0
    idempotency_key: str | None = None
    callback_url: str | None = None
    # The per-run limits the caller asked for (already in ``spec``): part of the request.
    limits: dict[str, float] = field(default_factory=dict)
    # The run this one re-runs (``POST /v1/runs/{id}/rerun``, a batch's retry).
    rerun_of: uuid.UUID | None = None
    # Flow control: the caller's key, and the limited scopes that hold the job until a gate
    # releases it (None: never held).
    concurrency_key: str | None = None
    flow_scopes: tuple[str, ...] | None = None

    def key_hash(self) -> str | None:
        """``request_hash`` when the request carries an Idempotency-Key (else nothing to tell)."""
        return self.request_hash() if self.idempotency_key else None

    def request_hash(self) -> str:
        """Hash of what the caller asked for, to tell a retry from a different request."""
        asked: dict[str, Any] = {"tool": self.tool, "input": self.input, "priority": self.priority}
        if self.callback_url is not None:  # absent: the hash of requests from before it
            asked["callback_url"] = self.callback_url
        if self.limits:  # likewise
            asked["limits"] = self.limits
        if self.concurrency_key is not None:  # likewise
            asked["concurrency_key"] = self.concurrency_key
        return json_digest(asked)


# The queue of sync jobs: no worker claims from it and nothing ever waits in it.
SYNC_QUEUE = "sync"


@dataclass(frozen=True)
class InlineClaim:
    """Who claims a sync run in its insert: the API process, its engine and the lease."""

    owner: str
    engine_id: str
    lease_seconds: float
    queue: str = SYNC_QUEUE


# A worker that has not been seen for this long serves no queue as far as runs are told.
WORKER_LIVE_SECONDS = 60.0


@dataclass(frozen=True)
class QueuedRun:
    """What the submit of a queued run wrote that a read of it would show and its caller
    does not know: when it was requested, its input as stored (jsonb's key order), and why
    it may wait (``waiting_for``)."""

    requested_at: datetime
    input: Any
    waiting_for: str | None


@dataclass(frozen=True)
class EnqueueResult:
    """The run id and whether this call created it (False: an idempotent replay); a sync
    run created with an ``InlineClaim`` comes with its claimed job, a queued run that
    ``ApiQueue.submit`` created with what it wrote."""

    run_id: uuid.UUID
    created: bool
    job: ClaimedJob | None = None
    queued: QueuedRun | None = None


class IdempotencyConflict(Exception):
    """The Idempotency-Key was already used for a different request."""


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker now holds the lease of."""

    job_id: uuid.UUID
    run_id: uuid.UUID
    attempt: int
    max_attempts: int
    lease_token: uuid.UUID
    locked_until: datetime
    deadline_at: datetime
    cancel_requested: bool
    adopted: bool
    spec: dict[str, Any]
    input: Any
    container_requested: bool = True
    requested_at: datetime | None = None
    started_at: datetime | None = None
    # What its dependencies returned, by run id (None: it depends on no run), and their
    # published artifact sets.
    deps: dict[str, Any] | None = None
    dep_artifacts: dict[str, uuid.UUID] | None = None


@dataclass(frozen=True)
class Finalize:
    """One slot's finalize in a batch (``JobQueue.finalize_many``), fenced by its own lease."""

    job_id: uuid.UUID
    token: uuid.UUID
    outcome: AttemptResult
    # Whether the slot wants its next job claimed in the same statement.
    next_job: bool = False


@dataclass(frozen=True)
class ClaimFor:
    """Where and for whom a batch of finalizes claims the slots' next jobs (one queue)."""

    worker_id: str
    engine_id: str
    queue: str
    lease_seconds: float

    def params(self, limit: int) -> dict[str, Any]:
        """The claim's bind parameters, for ``limit`` jobs."""
        return {
            "worker_id": self.worker_id,
            "engine_id": self.engine_id,
            "limit": limit,
            "lease": self.lease_seconds,
            "queue": self.queue,
        }


@dataclass(frozen=True)
class OrphanedJob:
    """An adoptable job of an engine with no live worker, with what adoption must know."""

    job_id: uuid.UUID
    run_id: uuid.UUID
    container_requested: bool
    cancel_requested: bool
    attempts_left: bool
    deadline_passed: bool


@dataclass(frozen=True)
class Heartbeat:
    """Outcome of a lease renewal."""

    owned: bool
    locked_until: datetime | None = None
    cancel_requested: bool = False
    # The database's clock when it renewed the lease (the worker's offset to it).
    db_now: datetime | None = None


@dataclass(frozen=True)
class RequeueResult:
    """Outcome of giving a lost attempt back: whether we owned it and where it went."""

    owned: bool
    status: RunStatus | None = None
    attempts: int = 0
    available_at: datetime | None = None


@dataclass(frozen=True)
class CancelResult:
    """What a cancel request did: ``status`` is the run's status after it (None: no run)."""

    found: bool
    status: RunStatus | None
    cancelled_now: bool = False
    requested: bool = False


def enqueue_params(
    run: NewRun,
    run_id: uuid.UUID,
    job_id: uuid.UUID,
    now: datetime | None,
    inline: InlineClaim | None = None,
) -> dict[str, Any]:
    """The bind parameters of ENQUEUE, shared by the plain and the admission-checked submit."""
    return {
        "owner": None if inline is None else inline.owner,
        "engine_id": None if inline is None else inline.engine_id,
        "lease": None if inline is None else inline.lease_seconds,
        "run_id": run_id,
        "job_id": job_id,
        "tenant": run.tenant,
        "tool": run.tool,
        "spec": json.dumps(run.spec),
        "input": json.dumps(run.input),
        "max_attempts": run.max_attempts,
        "timeout_seconds": run.timeout_seconds,
        "queue": run.queue if inline is None else inline.queue,
        "priority": run.priority,
        "idempotency_key": run.idempotency_key,
        "request_hash": run.key_hash(),
        "callback_url": run.callback_url,
        "rerun_of": run.rerun_of,
        "concurrency_key": run.concurrency_key,
        # A sync run runs inline at once: flow limits apply to queued work only.
        "flow_scopes": list(run.flow_scopes) if run.flow_scopes and inline is None else None,
        "now": now,
    }


def claimed_job(row: Any) -> ClaimedJob:
    """A ClaimedJob from a row of CLAIM (or of FINALIZE_AND_CLAIM)."""
    return ClaimedJob(
        job_id=row.id,
        run_id=row.run_id,
        attempt=row.attempts,
        max_attempts=row.max_attempts,
        lease_token=row.lease_token,
        locked_until=row.locked_until,
        deadline_at=row.deadline_at,
        cancel_requested=row.cancel_requested_at is not None,
        adopted=row.adopted,
        spec=row.spec,
        input=row.input,
        container_requested=row.container_requested_at is not None,
        requested_at=row.requested_at,
        started_at=row.started_at,
        deps=getattr(row, "deps", None),
        dep_artifacts=_set_ids(getattr(row, "dep_artifacts", None)),
    )


def _set_ids(value: dict[str, str] | None) -> dict[str, uuid.UUID] | None:
    return None if value is None else {run: uuid.UUID(set_id) for run, set_id in value.items()}


def outcome_params(outcome: AttemptResult) -> dict[str, Any]:
    """The bind parameters of a terminal outcome, shared by every finalize statement."""
    return {
        "status": outcome.status.value,
        "exit_code": outcome.exit_code,
        "result": None if outcome.result is None else json.dumps(outcome.result),
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "stdout_truncated": outcome.stdout_truncated,
        "stderr_truncated": outcome.stderr_truncated,
        "error_code": outcome.error_code,
        "error": outcome.error,
        "image_digest": outcome.image_digest,
        "artifact_set": outcome.artifact_set,
    }


def many_outcome_params(finalizes: Sequence[Finalize]) -> dict[str, Any]:
    """The array parameters of FINALIZE_MANY: request ``n`` is element ``n`` of each."""
    params: dict[str, list[Any]] = {"job_ids": [], "tokens": []}
    params.update({name: [] for name in _MANY_NAMES.values()})
    for one in finalizes:
        params["job_ids"].append(one.job_id)
        params["tokens"].append(one.token)
        for name, value in outcome_params(one.outcome).items():
            params[_MANY_NAMES[name]].append(value)
    return params


# FINALIZE's parameter -> FINALIZE_MANY's array of it.
_MANY_NAMES = {
    "status": "statuses",
    "exit_code": "exit_codes",
    "result": "results",
    "stdout": "stdouts",
    "stderr": "stderrs",
    "stdout_truncated": "stdouts_truncated",
    "stderr_truncated": "stderrs_truncated",
    "error_code": "error_codes",
    "error": "errors",
    "image_digest": "image_digests",
    "artifact_set": "artifact_sets",
}


@dataclass(frozen=True)
class AdmissionCaps:
    """Admission limits; 0 means no cap."""

    max_queue_depth: int = 0
    tenant_max_queued: int = 0
    tenant_max_running: int = 0
    # Runs a tenant may create per window, whatever becomes of them, and the window.
    tenant_max_created: int = 0
    created_window_seconds: float = 3600.0
    # Runs a tenant may keep in the database (terminal ones until deleted or pruned).
    tenant_max_stored: int = 0
    # Dependencies (``depends_on`` entries) one batch may hold in all.
    batch_max_dependencies: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The caps an operator set."""
        return cls(
            max_queue_depth=settings.max_queue_depth,
            tenant_max_queued=settings.tenant_max_queued,
            tenant_max_running=settings.tenant_max_running,
            tenant_max_created=settings.tenant_max_created_per_window,
            created_window_seconds=settings.tenant_created_window_seconds,
            tenant_max_stored=settings.tenant_max_stored_runs,
            batch_max_dependencies=settings.batch_max_dependencies,
        )

    def tenant_params(self) -> dict[str, Any]:
        """The bind parameters of the tenant caps (``TENANT_COUNTS_CTES``)."""
        return {
            "queued_cap": self.tenant_max_queued,
            "running_cap": self.tenant_max_running,
            "created_cap": self.tenant_max_created,
            "stored_cap": self.tenant_max_stored,
            "window_seconds": self.created_window_seconds,
        }

    def refusal(self, reason: str, window_retry_after: int | None) -> AdmissionRefused:
        """The refusal of a tenant cap named by an admission statement's ``refused``."""
        limits = {
            "tenant_queued": self.tenant_max_queued,
            "tenant_running": self.tenant_max_running,
            "tenant_created": self.tenant_max_created,
            "tenant_stored": self.tenant_max_stored,
        }
        if reason != "tenant_created":
            return AdmissionRefused(reason, limits[reason])
        return AdmissionRefused(
            reason,
            limits[reason],
            retry_after=window_retry_after,
            window_seconds=self.created_window_seconds,
        )


class AdmissionRefused(Exception):
    """The run was not admitted: the queue or the tenant is at a cap. ``retry_after``: when
    a retry may pass (seconds), if the cap knows."""

    def __init__(
        self,
        reason: str,
        limit: int,
        *,
        retry_after: int | None = None,
        window_seconds: float = 0.0,
    ) -> None:
        messages = {
            "queue_full": f"the queue holds {limit} runs, its maximum; retry later",
            "tenant_queued": f"this tenant already has {limit} queued runs, its maximum",
            "tenant_running": f"this tenant already has {limit} running runs, its maximum",
            "tenant_created": (
                f"this tenant may create {limit} runs per {window_seconds:g} s, and these would"
                " pass that (runs that failed or were cancelled count too)"
                + (f"; the window ends in {retry_after} s" if retry_after else "")
            ),
            "tenant_stored": (
                f"this tenant may keep {limit} runs, and these would pass that; delete"
                " finished runs, or wait for retention to remove them"
            ),
            "sync_capacity_full": f"all {limit} inline slots are busy; retry later",
        }
        super().__init__(messages[reason])
        self.reason = reason
        self.limit = limit
        self.retry_after = retry_after


class DepthEstimate:
    """This process's idea of the global queue depth, to skip most exact counts.

    The depth cap was never exact across tenants (only a tenant's submits are serialized).
    A count is reused for ``ttl`` seconds, plus this process's own admits since, while that
    stays under half the cap, and ten times as long while it stays under a tenth of it (a
    process then admits at most a tenth of the cap unseen, less than the half it may admit
    nearer); nearer the cap every submit counts again.
    """

    def __init__(self, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._depth = 0
        self._counted_at: float | None = None

    def far_below(self, cap: int) -> bool:
        """Whether a recent count says the queue is far from ``cap``."""
        with self._lock:
            if self._counted_at is None or self._depth * 2 >= cap:
                return False
            age = self._clock() - self._counted_at
            return age < (self._ttl * 10 if self._depth * 10 < cap else self._ttl)

    def counted(self, depth: int) -> None:
        """Remember an exact count."""
        with self._lock:
            self._depth, self._counted_at = depth, self._clock()

    def admitted(self) -> None:
        """This process queued one more run."""
        with self._lock:
            self._depth += 1
