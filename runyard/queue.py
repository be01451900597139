"""The job and run state machine: the ONLY code that writes job and run status.

Each operation is one named, written-out SQL statement (or a short fixed sequence in one
transaction). Every write after a claim is fenced by ``(job id, lease_token)`` and reports
whether it still owned the lease. Every time-based statement takes an optional ``now`` so
tests move the clock instead of sleeping; production passes ``None`` and gets ``now()``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

from sqlalchemy import Engine, TextClause, text
from sqlalchemy.engine import Connection

from runyard.models import RunMode, RunStatus
from runyard.runner import AttemptResult

logger = logging.getLogger(__name__)

JOBS_CHANNEL = "runyard_jobs"
CANCEL_CHANNEL = "runyard_cancel"
RUNS_CHANNEL = "runyard_runs"

_NOW = "coalesce(CAST(:now AS timestamptz), now())"


def _sql(statement: LiteralString) -> TextClause:
    """Compile a named statement; ``{NOW}`` stands for the injected-or-database clock."""
    return text(statement.replace("{NOW}", _NOW))


# --- statements -------------------------------------------------------------------------

ENQUEUE = _sql(
    """
    WITH run AS (
        INSERT INTO tool_runs (id, tenant, tool, spec, input, status, mode, requested_at,
                               max_attempts, idempotency_key, request_hash)
        VALUES (:run_id, :tenant, :tool, CAST(:spec AS jsonb), CAST(:input AS jsonb), 'queued',
                'queue', {NOW}, :max_attempts, :idempotency_key, :request_hash)
        ON CONFLICT (tenant, idempotency_key) DO NOTHING
        RETURNING id
    ), job AS (
        INSERT INTO tool_run_jobs (id, run_id, status, queue, priority, max_attempts,
                                   timeout_seconds, available_at, created_at, updated_at)
        SELECT :job_id, run.id, 'queued', :queue, :priority, :max_attempts, :timeout_seconds,
               {NOW}, {NOW}, {NOW}
        FROM run
        RETURNING run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'status', jsonb_build_object('status', 'queued') FROM job
    )
    SELECT id FROM run
    """
)

FIND_IDEMPOTENT = _sql(
    "SELECT id, request_hash FROM tool_runs WHERE tenant = :tenant AND idempotency_key = :key"
)

# Adoption first (same engine, lease cleared), then queued work. Both selections are
# MATERIALIZED so the planner cannot re-run them and lock more rows than the limit.
CLAIM = _sql(
    """
    WITH adoptable AS MATERIALIZED (
        SELECT id FROM tool_run_jobs
        WHERE status = 'running' AND locked_until IS NULL AND engine_id = :engine_id
        ORDER BY priority DESC, created_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), fresh AS MATERIALIZED (
        SELECT id FROM tool_run_jobs
        WHERE status = 'queued' AND available_at <= {NOW} AND attempts < max_attempts
          AND queue = ANY(CAST(:queues AS text[]))
        ORDER BY priority DESC, created_at
        LIMIT GREATEST(:limit - (SELECT count(*) FROM adoptable), 0)
        FOR UPDATE SKIP LOCKED
    ), picked AS (
        SELECT id, true AS adopted FROM adoptable
        UNION ALL
        SELECT id, false AS adopted FROM fresh
    ), claimed AS (
        UPDATE tool_run_jobs j SET
            status = 'running',
            attempts = j.attempts + CASE WHEN picked.adopted THEN 0 ELSE 1 END,
            locked_by = :worker_id,
            locked_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
            lease_token = gen_random_uuid(),
            engine_id = :engine_id,
            started_at = CASE WHEN picked.adopted THEN j.started_at ELSE {NOW} END,
            deadline_at = CASE WHEN picked.adopted THEN j.deadline_at
                          ELSE {NOW} + make_interval(secs => j.timeout_seconds) END,
            updated_at = {NOW}
        FROM picked
        WHERE j.id = picked.id
        RETURNING j.id, j.run_id, j.attempts, j.max_attempts, j.lease_token, j.locked_until,
                  j.deadline_at, j.started_at, j.cancel_requested_at, j.priority,
                  j.created_at, picked.adopted
    ), run AS (
        UPDATE tool_runs r SET status = 'running',
                               started_at = coalesce(r.started_at, c.started_at),
                               attempts = c.attempts
        FROM claimed c
        WHERE r.id = c.run_id AND NOT c.adopted
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT c.run_id, {NOW}, e.type, e.data
        FROM claimed c
        CROSS JOIN LATERAL (VALUES
            (CASE WHEN c.adopted THEN 'adopted' ELSE 'claimed' END,
             jsonb_build_object('attempt', c.attempts, 'worker_id', CAST(:worker_id AS text))),
            ('status', CASE WHEN c.adopted THEN NULL
                       ELSE jsonb_build_object('status', 'running', 'attempt', c.attempts) END)
        ) AS e(type, data)
        WHERE e.data IS NOT NULL
    )
    SELECT c.id, c.run_id, c.attempts, c.max_attempts, c.lease_token, c.locked_until,
           c.deadline_at, c.cancel_requested_at, c.adopted, r.spec, r.input
    FROM claimed c JOIN tool_runs r ON r.id = c.run_id
    ORDER BY c.adopted DESC, c.priority DESC, c.created_at
    """
)

HEARTBEAT = _sql(
    """
    UPDATE tool_run_jobs
    SET locked_until = {NOW} + make_interval(secs => CAST(:lease AS double precision)),
        updated_at = {NOW}
    WHERE id = :job_id AND lease_token = :token AND status = 'running'
    RETURNING locked_until, cancel_requested_at
    """
)

FINALIZE = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET status = CAST(:status AS run_status), locked_by = NULL, locked_until = NULL,
            lease_token = NULL, finished_at = {NOW}, updated_at = {NOW}, last_error = :error
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
        RETURNING run_id, attempts
    ), run AS (
        UPDATE tool_runs r
        SET status = CAST(:status AS run_status), finished_at = {NOW}, attempts = job.attempts,
            exit_code = :exit_code, result = CAST(:result AS jsonb),
            stdout = :stdout, stderr = :stderr,
            stdout_truncated = :stdout_truncated, stderr_truncated = :stderr_truncated,
            error_code = :error_code, error = :error,
            image_digest = coalesce(:image_digest, r.image_digest)
        FROM job WHERE r.id = job.run_id
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'status',
           jsonb_build_object('status', CAST(:status AS text), 'attempt', attempts,
                              'exit_code', CAST(:exit_code AS integer),
                              'error_code', CAST(:error_code AS text))
    FROM job
    RETURNING run_id
    """
)

# A lost attempt goes back to the queue with backoff while attempts remain, else fails.
# Equal jitter keeps the delay growing with the attempt number: [b/2, b] * 2^(n-1).
REQUEUE = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                          WHEN attempts < max_attempts THEN 'queued'
                          ELSE 'failed' END::run_status,
            available_at = {NOW} + make_interval(secs => LEAST(
                CAST(:backoff_max AS double precision),
                CAST(:backoff_base AS double precision) * power(2, GREATEST(attempts - 1, 0))
            ) * (0.5 + random() / 2)),
            locked_by = NULL, locked_until = NULL, lease_token = NULL, engine_id = NULL,
            deadline_at = NULL,
            finished_at = CASE WHEN cancel_requested_at IS NULL AND attempts < max_attempts
                               THEN NULL ELSE {NOW} END,
            last_error = :error, updated_at = {NOW}
        WHERE id = :job_id AND status = 'running'
          AND (lease_token = :token OR (CAST(:token AS uuid) IS NULL AND locked_until IS NULL))
        RETURNING run_id, status, attempts, max_attempts, available_at
    ), run AS (
        UPDATE tool_runs r
        SET status = job.status, attempts = job.attempts,
            finished_at = CASE WHEN job.status = 'queued' THEN NULL ELSE {NOW} END,
            error_code = CASE job.status WHEN 'queued' THEN NULL
                              WHEN 'cancelled' THEN 'cancelled' ELSE :error_code END,
            error = CASE job.status WHEN 'queued' THEN NULL
                         WHEN 'cancelled' THEN 'cancelled while its container was lost'
                         ELSE :error END
        FROM job WHERE r.id = job.run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT job.run_id, {NOW}, e.type, e.data FROM job
        CROSS JOIN LATERAL (VALUES
            ('requeued', CASE WHEN job.status = 'queued' THEN jsonb_build_object(
                'attempt', job.attempts, 'available_at', job.available_at,
                'error_code', CAST(:error_code AS text)) END),
            ('status', jsonb_build_object('status', CAST(job.status AS text),
                'error_code', CAST(:error_code AS text)))
        ) AS e(type, data)
        WHERE e.data IS NOT NULL
    )
    SELECT run_id, CAST(status AS text) AS status, attempts, available_at FROM job
    """
)

RELEASE = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET locked_by = NULL, locked_until = NULL, lease_token = NULL, updated_at = {NOW}
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
        RETURNING run_id, attempts
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'released', jsonb_build_object('attempt', attempts) FROM job
    RETURNING run_id
    """
)

CANCEL_QUEUED = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET status = 'cancelled', cancel_requested_at = {NOW}, finished_at = {NOW},
            updated_at = {NOW}
        WHERE run_id = :run_id AND status = 'queued'
        RETURNING run_id
    ), run AS (
        UPDATE tool_runs r SET status = 'cancelled', finished_at = {NOW},
                               error_code = 'cancelled', error = 'cancelled before it started'
        FROM job WHERE r.id = job.run_id
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'status', jsonb_build_object('status', 'cancelled') FROM job
    RETURNING run_id
    """
)

CANCEL_RUNNING = _sql(
    """
    WITH job AS (
        UPDATE tool_run_jobs
        SET cancel_requested_at = coalesce(cancel_requested_at, {NOW}), updated_at = {NOW}
        WHERE run_id = :run_id AND status = 'running'
        RETURNING id, run_id
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, 'cancel_requested', '{}'::jsonb FROM job
    )
    SELECT id, pg_notify('runyard_cancel', CAST(id AS text)) FROM job
    """
)

# Fenced like every owner write: a worker that lost its lease cannot repeat log lines.
APPEND_LOG = _sql(
    """
    WITH job AS (
        SELECT run_id, attempts FROM tool_run_jobs
        WHERE id = :job_id AND lease_token = :token AND status = 'running'
    ), event AS (
        INSERT INTO tool_run_events (run_id, at, type, data)
        SELECT run_id, {NOW}, :stream,
               jsonb_build_object('attempt', attempts, 'text', CAST(:text AS text),
                                  'until', CAST(:until AS text))
        FROM job
        RETURNING run_id
    )
    SELECT run_id, pg_notify('runyard_events', CAST(run_id AS text)) FROM event
    """
)

LAST_LOG_POSITION = _sql(
    """
    SELECT data->>'until' FROM tool_run_events
    WHERE run_id = :run_id AND type = :stream AND (data->>'attempt')::int = :attempt
    ORDER BY id DESC LIMIT 1
    """
)

RUN_STATUS = _sql("SELECT CAST(status AS text) FROM tool_runs WHERE id = :run_id")

SELECT_EXPIRED = _sql(
    """
    SELECT id FROM tool_run_jobs
    WHERE status = 'running' AND locked_until < {NOW}
    ORDER BY locked_until
    LIMIT :batch
    """
)

# The condition is re-checked inside the UPDATE: a row finalized or renewed after it was
# selected is left alone, and of two reapers only one clears each lease.
CLEAR_EXPIRED = _sql(
    """
    WITH cleared AS (
        UPDATE tool_run_jobs
        SET locked_by = NULL, locked_until = NULL, lease_token = NULL, updated_at = {NOW}
        WHERE id = ANY(CAST(:job_ids AS uuid[]))
          AND status = 'running' AND locked_until < {NOW}
        RETURNING id, run_id, attempts
    )
    INSERT INTO tool_run_events (run_id, at, type, data)
    SELECT run_id, {NOW}, 'lease_expired', jsonb_build_object('attempt', attempts)
    FROM cleared
    RETURNING run_id
    """
)

# Adoptable jobs whose engine has had no live worker for :dead_after seconds.
SELECT_ORPHANED = _sql(
    """
    SELECT j.id FROM tool_run_jobs j
    WHERE j.status = 'running' AND j.locked_until IS NULL
      AND j.updated_at < {NOW} - make_interval(secs => CAST(:dead_after AS double precision))
      AND NOT EXISTS (
          SELECT 1 FROM workers w
          WHERE w.engine_id = j.engine_id AND w.stopped_at IS NULL
            AND w.last_seen_at >= {NOW} - make_interval(
                secs => CAST(:dead_after AS double precision))
      )
    ORDER BY j.updated_at
    LIMIT :batch
    """
)

PRUNE = _sql(
    """
    WITH old AS (
        SELECT run_id FROM tool_run_jobs
        WHERE status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
          AND finished_at < {NOW} - make_interval(secs => CAST(:retention AS double precision))
        LIMIT :batch
    ), events AS (
        DELETE FROM tool_run_events e USING old WHERE e.run_id = old.run_id
    )
    DELETE FROM tool_run_jobs j USING old WHERE j.run_id = old.run_id
    RETURNING j.id
    """
)


# --- values -----------------------------------------------------------------------------


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

    def request_hash(self) -> str:
        """Hash of what the caller asked for, to tell a retry from a different request."""
        body = json.dumps(
            {"tool": self.tool, "input": self.input, "priority": self.priority},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class EnqueueResult:
    """The run id and whether this call created it (False: an idempotent replay)."""

    run_id: uuid.UUID
    created: bool


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


@dataclass(frozen=True)
class Heartbeat:
    """Outcome of a lease renewal."""

    owned: bool
    locked_until: datetime | None = None
    cancel_requested: bool = False


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


# --- the queue --------------------------------------------------------------------------


class JobQueue:
    """Every job/run state transition, each a named statement fenced where it must be."""

    def __init__(
        self,
        engine: Engine,
        *,
        backoff_base_seconds: float = 2.0,
        backoff_max_seconds: float = 300.0,
    ) -> None:
        self._engine = engine
        self._backoff_base = backoff_base_seconds
        self._backoff_max = backoff_max_seconds

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine the queue writes through."""
        return self._engine

    def enqueue(self, run: NewRun, *, now: datetime | None = None) -> EnqueueResult:
        """Write the run, its job and its first event in one transaction, then NOTIFY."""
        run_id, job_id = uuid.uuid4(), uuid.uuid4()
        request_hash = run.request_hash() if run.idempotency_key else None
        with self._engine.begin() as conn:
            created = conn.execute(
                ENQUEUE,
                {
                    "run_id": run_id,
                    "job_id": job_id,
                    "tenant": run.tenant,
                    "tool": run.tool,
                    "spec": json.dumps(run.spec),
                    "input": json.dumps(run.input),
                    "max_attempts": run.max_attempts,
                    "timeout_seconds": run.timeout_seconds,
                    "queue": run.queue,
                    "priority": run.priority,
                    "idempotency_key": run.idempotency_key,
                    "request_hash": request_hash,
                    "now": now,
                },
            ).scalar_one_or_none()
            if created is None:
                existing = conn.execute(
                    FIND_IDEMPOTENT, {"tenant": run.tenant, "key": run.idempotency_key}
                ).one()
                if existing.request_hash != request_hash:
                    raise IdempotencyConflict(
                        "this Idempotency-Key was already used with a different request"
                    )
                return EnqueueResult(run_id=existing.id, created=False)
            conn.execute(
                text("SELECT pg_notify(:channel, :queue)"),
                {"channel": JOBS_CHANNEL, "queue": run.queue},
            )
        return EnqueueResult(run_id=created, created=True)

    def claim(
        self,
        *,
        worker_id: str,
        engine_id: str,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] = ("default",),
        now: datetime | None = None,
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` jobs: adoptable ones of this engine first, then queued."""
        if limit <= 0:
            return []
        with self._engine.begin() as conn:
            rows = conn.execute(
                CLAIM,
                {
                    "worker_id": worker_id,
                    "engine_id": engine_id,
                    "limit": limit,
                    "lease": lease_seconds,
                    "queues": list(queues),
                    "now": now,
                },
            ).all()
        return [
            ClaimedJob(
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
            )
            for row in rows
        ]

    def heartbeat(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        lease_seconds: float,
        now: datetime | None = None,
        conn: Connection | None = None,
    ) -> Heartbeat:
        """Extend the lease; reports a cancel request, or that the lease is gone."""
        params = {"job_id": job_id, "token": token, "lease": lease_seconds, "now": now}
        if conn is not None:
            row = conn.execute(HEARTBEAT, params).one_or_none()
        else:
            with self._engine.begin() as own:
                row = own.execute(HEARTBEAT, params).one_or_none()
        if row is None:
            return Heartbeat(owned=False)
        return Heartbeat(
            owned=True,
            locked_until=row.locked_until,
            cancel_requested=row.cancel_requested_at is not None,
        )

    def finalize(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        outcome: AttemptResult,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Write the terminal outcome of the run; False if the lease was no longer ours."""
        if not outcome.status.is_terminal:
            raise ValueError(f"finalize needs a terminal status, not {outcome.status}")
        with self._engine.begin() as conn:
            row = conn.execute(
                FINALIZE,
                {
                    "job_id": job_id,
                    "token": token,
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
                    "now": now,
                },
            ).one_or_none()
            if row is not None:
                conn.execute(
                    text("SELECT pg_notify(:channel, :run_id)"),
                    {"channel": RUNS_CHANNEL, "run_id": str(row.run_id)},
                )
        return row is not None

    def requeue(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID | None,
        *,
        error_code: str,
        error: str,
        now: datetime | None = None,
    ) -> RequeueResult:
        """Give a lost attempt back with backoff, or fail the run when attempts are spent.

        ``token=None`` is the reaper's form: it applies only to a job whose lease is cleared.
        """
        with self._engine.begin() as conn:
            row = conn.execute(
                REQUEUE,
                {
                    "job_id": job_id,
                    "token": token,
                    "error_code": error_code,
                    "error": error,
                    "backoff_base": self._backoff_base,
                    "backoff_max": self._backoff_max,
                    "now": now,
                },
            ).one_or_none()
            if row is not None:
                channel = JOBS_CHANNEL if row.status == "queued" else RUNS_CHANNEL
                conn.execute(
                    text("SELECT pg_notify(:channel, :payload)"),
                    {"channel": channel, "payload": str(row.run_id)},
                )
        if row is None:
            return RequeueResult(owned=False)
        return RequeueResult(
            owned=True,
            status=RunStatus(row.status),
            attempts=row.attempts,
            available_at=row.available_at,
        )

    def release(self, job_id: uuid.UUID, token: uuid.UUID, *, now: datetime | None = None) -> bool:
        """Give the lease back and keep the job running, so another worker adopts it at once."""
        with self._engine.begin() as conn:
            row = conn.execute(RELEASE, {"job_id": job_id, "token": token, "now": now})
            return row.one_or_none() is not None

    def append_log(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        stream: str,
        text_chunk: str,
        until: str,
        now: datetime | None = None,
    ) -> bool:
        """Append a live log chunk to the run's events; False if the lease is gone."""
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"unknown stream {stream!r}")
        with self._engine.begin() as conn:
            row = conn.execute(
                APPEND_LOG,
                {
                    "job_id": job_id,
                    "token": token,
                    "stream": stream,
                    "text": text_chunk,
                    "until": until,
                    "now": now,
                },
            ).first()
        return row is not None

    def last_log_position(self, run_id: uuid.UUID, attempt: int, stream: str) -> str | None:
        """Engine timestamp of the last stored chunk of ``stream`` for that attempt."""
        with self._engine.connect() as conn:
            value = conn.execute(
                LAST_LOG_POSITION, {"run_id": run_id, "attempt": attempt, "stream": stream}
            ).scalar_one_or_none()
        return None if value is None else str(value)

    def cancel(self, run_id: uuid.UUID, *, now: datetime | None = None) -> CancelResult:
        """Cancel a queued run at once; flag a running one so its owner stops it."""
        with self._engine.begin() as conn:
            if conn.execute(CANCEL_QUEUED, {"run_id": run_id, "now": now}).first():
                conn.execute(
                    text("SELECT pg_notify(:channel, :run_id)"),
                    {"channel": RUNS_CHANNEL, "run_id": str(run_id)},
                )
                return CancelResult(found=True, status=RunStatus.CANCELLED, cancelled_now=True)
            if conn.execute(CANCEL_RUNNING, {"run_id": run_id, "now": now}).first():
                return CancelResult(found=True, status=RunStatus.RUNNING, requested=True)
            status = conn.execute(RUN_STATUS, {"run_id": run_id}).scalar_one_or_none()
        if status is None:
            return CancelResult(found=False, status=None)
        return CancelResult(found=True, status=RunStatus(status))

    # --- reaper operations ---

    def select_expired(self, *, batch: int, now: datetime | None = None) -> list[uuid.UUID]:
        """Ids of running jobs whose lease has expired (no lock taken)."""
        with self._engine.connect() as conn:
            return list(conn.execute(SELECT_EXPIRED, {"batch": batch, "now": now}).scalars())

    def clear_expired(
        self, job_ids: Sequence[uuid.UUID], *, now: datetime | None = None
    ) -> list[uuid.UUID]:
        """Clear the leases of those jobs that are still expired; returns their run ids."""
        if not job_ids:
            return []
        with self._engine.begin() as conn:
            return list(
                conn.execute(CLEAR_EXPIRED, {"job_ids": list(job_ids), "now": now}).scalars()
            )

    def select_orphaned(
        self, *, dead_after_seconds: float, batch: int, now: datetime | None = None
    ) -> list[uuid.UUID]:
        """Adoptable jobs whose engine has had no live worker for ``dead_after_seconds``."""
        with self._engine.connect() as conn:
            return list(
                conn.execute(
                    SELECT_ORPHANED,
                    {"dead_after": dead_after_seconds, "batch": batch, "now": now},
                ).scalars()
            )

    def prune(self, *, retention_seconds: float, batch: int, now: datetime | None = None) -> int:
        """Delete the job rows and events of runs terminal for longer than the retention."""
        with self._engine.begin() as conn:
            deleted = conn.execute(
                PRUNE, {"retention": retention_seconds, "batch": batch, "now": now}
            ).all()
        return len(deleted)


def run_mode_is_queue(mode: str) -> bool:
    """True for runs that go through the queue (sync runs have no job row)."""
    return mode == RunMode.QUEUE.value
