"""The job and run state machine: the ONLY code that writes job and run status.

Each operation is one named, written-out SQL statement (in ``runyard.queue.sql``) run as its
own transaction in one round trip (NOTIFYs included), or a short fixed sequence of them in
one transaction. Every write after a claim is fenced by
``(job id, lease_token)`` and reports whether it still owned the lease. Every time-based
statement takes an optional ``now`` so tests move the clock instead of sleeping; production
passes ``None`` and gets ``now()``.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, TextClause

from runyard.domain.attempt import AttemptResult
from runyard.domain.run_events import TRANSITION_EVENT_TYPES
from runyard.domain.states import ErrorCode, RunStatus
from runyard.platform.db import autocommit
from runyard.queue.batch_sql import FINALIZE_MANY, FINALIZE_MANY_AND_CLAIM
from runyard.queue.flow import FlowGate
from runyard.queue.sql import (
    ADOPT,
    APPEND_LOG,
    CANCEL_QUEUED,
    CANCEL_RUNNING,
    CLAIM,
    CLAIM_ANY_QUEUE,
    CLEAR_EXPIRED,
    ENQUEUE,
    FINALIZE,
    FINALIZE_AND_CLAIM,
    FIND_IDEMPOTENT,
    HEARTBEAT,
    JOB_PRIORITY,
    LAST_LOG_POSITION,
    LEASE_HELD,
    MARK_CONTAINER_REQUESTED,
    PRUNE,
    PRUNE_BATCHES,
    QUEUE_DEPTH,
    RECORD_EVENT,
    RELEASE,
    RELEASE_LATER,
    REQUEUE,
    REQUEUE_NEVER_STARTED,
    REQUEUE_UNSTARTED,
    RUN_STATUS,
    SELECT_EXPIRED,
    SELECT_ORPHANED,
    SUBMIT,
)
from runyard.queue.values import (
    WORKER_LIVE_SECONDS,
    AdmissionCaps,
    AdmissionRefused,
    CancelResult,
    ClaimedJob,
    ClaimFor,
    DepthEstimate,
    EnqueueResult,
    Finalize,
    Heartbeat,
    IdempotencyConflict,
    InlineClaim,
    NewRun,
    OrphanedJob,
    QueuedRun,
    RequeueResult,
    claimed_job,
    enqueue_params,
    many_outcome_params,
    outcome_params,
)

logger = logging.getLogger(__name__)

# Event types the queue's own transitions write: an attempt's note may not forge them (nor
# ``lease_lost``, which nothing writes today).
RESERVED_EVENT_TYPES = TRANSITION_EVENT_TYPES | {"lease_lost"}
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_]{0,31}")

JOBS_CHANNEL = "runyard_jobs"
# A job written held by its flow limits: the flow gates pass again (``FlowGate.wake``).
HELD_CHANNEL = "runyard_held"
# A job written that waits for a build: the workers' build rounds look again (``BuildAgent.wake``).
BUILDS_CHANNEL = "runyard_builds"
CANCEL_CHANNEL = "runyard_cancel"
RUNS_CHANNEL = "runyard_runs"


# --- the queue --------------------------------------------------------------------------


class JobQueue:
    """Every job/run state transition, each a named statement fenced where it must be."""

    def __init__(
        self,
        engine: Engine,
        *,
        backoff_base_seconds: float = 2.0,
        backoff_max_seconds: float = 300.0,
        flow: FlowGate | None = None,
    ) -> None:
        self._engine = engine
        self._backoff_base = backoff_base_seconds
        self._backoff_max = backoff_max_seconds
        # Releases held jobs within their flow limits before each claim of queued work.
        self._flow = flow

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine the queue writes through."""
        return self._engine

    def _run(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        return autocommit(self._engine, statement, params)

    def _first(self, statement: TextClause, params: dict[str, Any]) -> Any | None:
        rows = autocommit(self._engine, statement, params)
        return rows[0] if rows else None

    def enqueue(self, run: NewRun, *, now: datetime | None = None) -> EnqueueResult:
        """Write the run, its job, its first event and the NOTIFY in one statement."""
        run_id, job_id = uuid.uuid4(), uuid.uuid4()
        created = self._first(ENQUEUE, enqueue_params(run, run_id, job_id, now))
        if created is not None:
            return EnqueueResult(run_id=created.id, created=True)
        # ON CONFLICT waited for the first writer of the key, so its row is committed.
        replayed = self._replay(run)
        assert replayed is not None
        return replayed

    def _replay(self, run: NewRun) -> EnqueueResult | None:
        """The run already made with this request's Idempotency-Key, if any: the one place
        that tells a replay from a conflict."""
        if run.idempotency_key is None:
            return None
        existing = self._first(FIND_IDEMPOTENT, {"tenant": run.tenant, "key": run.idempotency_key})
        if existing is None:
            return None
        if existing.request_hash != run.key_hash():
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request"
            )
        return EnqueueResult(run_id=existing.id, created=False)

    def claim(
        self,
        *,
        worker_id: str,
        engine_id: str,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] = ("default",),
        adopt_only: bool = False,
        now: datetime | None = None,
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` jobs: adoptable ones of this engine first, then queued.

        ``adopt_only`` (sync mode, one queue): only running jobs whose lease was cleared or
        ran out; nothing queued is ever claimed.
        """
        if limit <= 0:
            return []
        if self._flow is not None and not adopt_only:
            self._flow.release(now=now)
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "engine_id": engine_id,
            "limit": limit,
            "lease": lease_seconds,
            "now": now,
        }
        if len(queues) == 1:
            rows = self._run(ADOPT if adopt_only else CLAIM, {**params, "queue": queues[0]})
        else:
            rows = self._run(CLAIM_ANY_QUEUE, {**params, "queues": list(queues)})
        return [claimed_job(row) for row in rows]

    def heartbeat(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        lease_seconds: float,
        now: datetime | None = None,
    ) -> Heartbeat:
        """Extend the lease; reports a cancel request, or that the lease is gone."""
        row = self._first(
            HEARTBEAT, {"job_id": job_id, "token": token, "lease": lease_seconds, "now": now}
        )
        if row is None:
            return Heartbeat(owned=False)
        return Heartbeat(
            owned=True,
            locked_until=row.locked_until,
            cancel_requested=row.cancel_requested_at is not None,
            db_now=row.db_now,
        )

    def lease_held(
        self, job_id: uuid.UUID, token: uuid.UUID, *, now: datetime | None = None
    ) -> bool:
        """Whether the lease is still ours and unexpired (nothing is written)."""
        return self._first(LEASE_HELD, {"job_id": job_id, "token": token, "now": now}) is not None

    def record_event(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        event_type: str,
        data: dict[str, Any],
        *,
        now: datetime | None = None,
    ) -> bool:
        """Record a run event under the lease; False if the lease is gone (nothing written)."""
        if not _EVENT_TYPE.fullmatch(event_type) or event_type in RESERVED_EVENT_TYPES:
            raise ValueError(f"not an event type an attempt may record: {event_type!r}")
        params = {
            "job_id": job_id,
            "token": token,
            "type": event_type,
            "data": json.dumps(data, allow_nan=False),
            "now": now,
        }
        return self._first(RECORD_EVENT, params) is not None

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
        row = self._first(
            FINALIZE, {"job_id": job_id, "token": token, **outcome_params(outcome), "now": now}
        )
        return row is not None

    def finalize_and_claim(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        outcome: AttemptResult,
        *,
        worker_id: str,
        engine_id: str,
        limit: int,
        lease_seconds: float,
        queue: str,
        now: datetime | None = None,
    ) -> tuple[bool, list[ClaimedJob]]:
        """``finalize``, then ``claim`` from one queue, in one statement.

        Returns whether the finalize applied and the jobs claimed (adoptable ones first).
        """
        if not outcome.status.is_terminal:
            raise ValueError(f"finalize needs a terminal status, not {outcome.status}")
        first, *rows = self._run(
            FINALIZE_AND_CLAIM,
            {
                "job_id": job_id,
                "token": token,
                **outcome_params(outcome),
                "worker_id": worker_id,
                "engine_id": engine_id,
                "limit": limit,
                "lease": lease_seconds,
                "queue": queue,
                "now": now,
            },
        )
        return bool(first.finalized), [claimed_job(row) for row in rows]

    def finalize_many(
        self,
        finalizes: Sequence[Finalize],
        *,
        claim: ClaimFor | None = None,
        now: datetime | None = None,
    ) -> tuple[list[bool], list[ClaimedJob]]:
        """Several ``finalize``s in one statement, each fenced by its own lease; with
        ``claim``, one next job per request that wants one, claimed in the same statement.

        Returns whether each request applied (in order) and the jobs claimed, in claim order.
        """
        for one in finalizes:
            if not one.outcome.status.is_terminal:
                raise ValueError(f"finalize needs a terminal status, not {one.outcome.status}")
        params: dict[str, Any] = {**many_outcome_params(finalizes), "now": now}
        wanted = sum(one.next_job for one in finalizes)
        claimed: list[ClaimedJob] = []
        if not finalizes:
            applied: set[int] = set()
        elif claim is None or wanted == 0:
            applied = {row.n for row in self._run(FINALIZE_MANY, params)}
        else:
            rows = self._run(FINALIZE_MANY_AND_CLAIM, {**params, **claim.params(wanted)})
            applied = {row.finalized for row in rows if row.part == 0}
            claimed = [claimed_job(row) for row in rows if row.part == 1]
        return [n in applied for n in range(1, len(finalizes) + 1)], claimed

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
        row = self._first(
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
        )
        if row is None:
            return RequeueResult(owned=False)
        return RequeueResult(
            owned=True,
            status=RunStatus(row.status),
            attempts=row.attempts,
            available_at=row.available_at,
        )

    def mark_container_requested(
        self, job_id: uuid.UUID, token: uuid.UUID, *, now: datetime | None = None
    ) -> bool:
        """Record, under the lease (ours and unexpired), that this attempt's container is
        about to be created; False: it is not ours to create."""
        row = self._first(MARK_CONTAINER_REQUESTED, {"job_id": job_id, "token": token, "now": now})
        return row is not None

    def requeue_unstarted(
        self, job_id: uuid.UUID, token: uuid.UUID | None, *, now: datetime | None = None
    ) -> RequeueResult:
        """Put back an attempt whose container was never asked for, without charging it."""
        return self._uncharged(
            REQUEUE_UNSTARTED, {"job_id": job_id, "token": token, "delay": 0.0, "now": now}
        )

    def requeue_never_started(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        delay_seconds: float,
        now: datetime | None = None,
    ) -> RequeueResult:
        """Put back, uncharged and due after ``delay_seconds``, an attempt whose container
        may have been created but was never started (the lease holder knows)."""
        params = {"job_id": job_id, "token": token, "delay": max(delay_seconds, 0.0), "now": now}
        return self._uncharged(REQUEUE_NEVER_STARTED, params)

    def _uncharged(self, statement: TextClause, params: dict[str, Any]) -> RequeueResult:
        row = self._first(statement, params)
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
        return self._first(RELEASE, {"job_id": job_id, "token": token, "now": now}) is not None

    def release_later(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        *,
        delay_seconds: float,
        reason: str,
        now: datetime | None = None,
    ) -> bool:
        """Give the lease back; the job stays running, adoptable after ``delay_seconds``."""
        params = {
            "job_id": job_id,
            "token": token,
            "delay": max(delay_seconds, 0.0),
            "reason": reason,
            "now": now,
        }
        return self._first(RELEASE_LATER, params) is not None

    def put_back(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID | None,
        *,
        charged: bool,
        error: str,
        error_code: str = ErrorCode.CONTAINER_LOST,
        now: datetime | None = None,
    ) -> RequeueResult:
        """An attempt no container will finish goes back to the queue (or ends cancelled or
        failed): ``charged`` as a lost container (``requeue``), else uncharged
        (``requeue_unstarted``, which applies only if no container was ever requested)."""
        if not charged:
            return self.requeue_unstarted(job_id, token, now=now)
        return self.requeue(job_id, token, error_code=error_code, error=error, now=now)

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
        row = self._first(
            APPEND_LOG,
            {
                "job_id": job_id,
                "token": token,
                "stream": stream,
                "text": text_chunk,
                "until": until,
                "now": now,
            },
        )
        return row is not None

    def last_log_position(self, run_id: uuid.UUID, attempt: int, stream: str) -> str | None:
        """Engine timestamp of the last stored chunk of ``stream`` for that attempt."""
        row = self._first(
            LAST_LOG_POSITION, {"run_id": run_id, "attempt": attempt, "stream": stream}
        )
        return None if row is None or row[0] is None else str(row[0])

    def cancel(self, run_id: uuid.UUID, *, now: datetime | None = None) -> CancelResult:
        """Cancel a queued run at once; flag a running one so its owner stops it."""
        with self._engine.begin() as conn:
            if conn.execute(CANCEL_QUEUED, {"run_id": run_id, "now": now}).first():
                return CancelResult(found=True, status=RunStatus.CANCELLED, cancelled_now=True)
            if conn.execute(CANCEL_RUNNING, {"run_id": run_id, "now": now}).first():
                return CancelResult(found=True, status=RunStatus.RUNNING, requested=True)
            status = conn.execute(RUN_STATUS, {"run_id": run_id}).scalar_one_or_none()
        if status is None:
            return CancelResult(found=False, status=None)
        return CancelResult(found=True, status=RunStatus(status))

    def priority_of(self, run_id: uuid.UUID) -> int:
        """The priority the run was queued with (0 if it has no job row)."""
        row = self._first(JOB_PRIORITY, {"run_id": run_id})
        return 0 if row is None else int(row.priority)

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
    ) -> list[OrphanedJob]:
        """Adoptable jobs whose engine has had no live worker for ``dead_after_seconds``."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                SELECT_ORPHANED,
                {"dead_after": dead_after_seconds, "batch": batch, "now": now},
            ).all()
        return [
            OrphanedJob(
                job_id=row.id,
                run_id=row.run_id,
                container_requested=bool(row.container_requested),
                cancel_requested=bool(row.cancel_requested),
                attempts_left=bool(row.attempts_left),
                deadline_passed=bool(row.deadline_passed),
            )
            for row in rows
        ]

    def prune(self, *, retention_seconds: float, batch: int, now: datetime | None = None) -> int:
        """Delete up to ``batch`` runs terminal for longer than the retention (PRUNE)."""
        return len(self.prune_runs(retention_seconds=retention_seconds, batch=batch, now=now))

    def prune_runs(
        self, *, retention_seconds: float, batch: int, now: datetime | None = None
    ) -> list[uuid.UUID]:
        """``prune``, returning the ids of the runs deleted."""
        with self._engine.begin() as conn:
            deleted = conn.execute(
                PRUNE, {"retention": retention_seconds, "batch": batch, "now": now}
            ).all()
        return [row.id for row in deleted]

    def prune_batches(
        self, *, retention_seconds: float, batch: int, now: datetime | None = None
    ) -> int:
        """Delete up to ``batch`` batches past the retention that have no run left."""
        params = {"retention": retention_seconds, "batch": batch, "now": now}
        return len(self._run(PRUNE_BATCHES, params))


# --- admission ---
#
# The API's own submits: admitted under the caps in the insert's own statement. In sync mode
# the same statement also claims the new job for the API process that runs it inline.

EVENTS_CHANNEL = "runyard_events"


class ApiQueue(JobQueue):
    """The queue plus the API's operations: admitted submits, and the sync mode's claims."""

    def __init__(
        self,
        engine: Engine,
        *,
        backoff_base_seconds: float = 2.0,
        backoff_max_seconds: float = 300.0,
    ) -> None:
        super().__init__(
            engine,
            backoff_base_seconds=backoff_base_seconds,
            backoff_max_seconds=backoff_max_seconds,
        )
        self._depth = DepthEstimate()

    def queue_full(self, cap: int) -> bool:
        """Whether the queue holds ``cap`` jobs (counted only when near it; 0: no cap)."""
        if cap <= 0 or self._depth.far_below(cap):
            return False
        row = self._first(QUEUE_DEPTH, {})
        assert row is not None
        depth = int(row[0])
        self._depth.counted(depth)
        return depth >= cap

    def replay_or_refuse(self, run: NewRun, refusal: AdmissionRefused) -> EnqueueResult:
        """A run this request already made (an idempotent replay is never refused), else
        ``refusal``: for a cap checked before the insert."""
        replayed = self._replay(run)
        if replayed is None:
            raise refusal
        return replayed

    def submit(
        self,
        run: NewRun,
        caps: AdmissionCaps,
        *,
        inline: InlineClaim | None = None,
        now: datetime | None = None,
        run_id: uuid.UUID | None = None,
    ) -> EnqueueResult:
        """Enqueue if admitted, or with ``inline`` (sync mode) insert the job claimed by that
        owner; an idempotent replay returns the first run and skips the caps. ``run_id``: the
        new run's id, when the caller has chosen it (a waiter subscribed to it already).

        Exact for the tenant caps in every API process: the statement locks the tenant's row
        of counts that every submit's insert is counted in until it commits (``SUBMIT``).
        Raises ``AdmissionRefused`` or ``IdempotencyConflict``.
        """
        if inline is None and self.queue_full(caps.max_queue_depth):
            return self.replay_or_refuse(run, AdmissionRefused("queue_full", caps.max_queue_depth))
        params = enqueue_params(run, run_id or uuid.uuid4(), uuid.uuid4(), now, inline)
        row = self._first(SUBMIT, {**params, **caps.tenant_params(), "live": WORKER_LIVE_SECONDS})
        assert row is not None
        if row.run_id is not None:
            if inline is None:
                self._depth.admitted()
                queued = QueuedRun(row.run_requested_at, row.input, row.waiting_for)
                return EnqueueResult(run_id=row.run_id, created=True, queued=queued)
            return EnqueueResult(run_id=row.run_id, created=True, job=claimed_job(row))
        if row.refused is not None and not row.replayed:
            raise caps.refusal(row.refused, row.window_retry_after)
        # The key was used before, or by a concurrent submit that committed first.
        replayed = self._replay(run)
        assert replayed is not None
        return replayed
