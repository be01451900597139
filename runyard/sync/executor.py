"""Sync fallback mode: the API runs a tool inline, as a job it claims itself.

A sync run is a job like any other. The submit inserts it already claimed by this API process
(one statement, a fresh ``lease_token``, queue ``sync``); this process renews the lease with
the heartbeat statement, stores live logs, is cancelled and finalizes through the same fenced
statements as a worker. If the process dies, the lease runs out and an API process of the
same engine adopts the run (``adopt_once``) and decides by the one adoption rule
(``runyard.domain.adoption``). Nothing waits in a queue in this mode: a sync job is never queued.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from runyard.artifact_store import ArtifactStore
from runyard.artifacts.publish import drop_unpublished
from runyard.domain.adoption import Action, AdoptionFacts, decide
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.errors import describe
from runyard.domain.fallbacks import CANCELLED_BEFORE_START, crashed_outcome, unstorable_outcomes
from runyard.domain.states import ErrorCode, RunStatus
from runyard.held import Held, QueueLogSink
from runyard.platform.db_errors import Failure, classify
from runyard.platform.faults import BEFORE_FINALIZE, crash_point
from runyard.queue import ApiQueue
from runyard.queue.values import (
    SYNC_QUEUE,
    AdmissionCaps,
    AdmissionRefused,
    ClaimedJob,
    EnqueueResult,
    InlineClaim,
    NewRun,
)
from runyard.queue.workers import WorkerRegistry
from runyard.runner import AttemptAbandoned, Runner, RunnerUnavailable

logger = logging.getLogger(__name__)

# A pool with no connection to give within its timeout counts as a database error too.
_DB_ERRORS = (DBAPIError, PoolTimeoutError)


def new_owner_id(kind: str) -> str:
    """A process-unique owner id: kind, host, pid and a random suffix (pids are reused)."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class SyncExecutor:
    """Runs sync jobs in slots of its own: the ones its API process submits, and orphans of
    its engine it adopts. One thread renews their leases and nothing else.

    ``try_acquire`` is a non-blocking semaphore of ``max_concurrency`` slots: a full executor
    refuses at once instead of queueing inside the API.
    """

    def __init__(
        self,
        queue: ApiQueue,
        runner: Runner,
        *,
        max_concurrency: int,
        lease_seconds: float = 30.0,
        owner_id: str | None = None,
        heartbeat_queue: ApiQueue | None = None,
        registry: WorkerRegistry | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._queue = queue
        # Renewals may get a small pool of their own, so busy requests never starve them.
        self._heartbeat_queue = heartbeat_queue or queue
        self._runner = runner
        self._registry = registry
        self._artifacts = artifacts
        self.max_concurrency = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="runyard-sync")
        self._lease = lease_seconds
        # What a renewal may take: the lease is trusted this long less than it runs.
        self._margin = lease_seconds / 6
        self.owner_id = owner_id or new_owner_id("api")
        self._lock = threading.Lock()
        self._flights: dict[uuid.UUID, Held] = {}
        self._busy = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._engine_id: str | None = None
        # Database clock minus ours (seconds), from the last renewal.
        self._db_offset = 0.0

    # --- slots ---

    def try_acquire(self) -> bool:
        """Take a slot if one is free; never waits."""
        if not self._slots.acquire(blocking=False):
            return False
        with self._lock:
            self._busy += 1
        return True

    def release(self) -> None:
        """Give a slot back."""
        with self._lock:
            self._busy -= 1
        self._slots.release()

    @property
    def busy(self) -> int:
        """Slots in use."""
        with self._lock:
            return self._busy

    def in_flight(self) -> list[uuid.UUID]:
        """Runs this process is executing now."""
        with self._lock:
            return [flight.job.run_id for flight in self._flights.values()]

    @property
    def engine_id(self) -> str:
        """The engine this process runs its tools on (known once started)."""
        if self._engine_id is None:
            raise RuntimeError("the sync executor is not started")
        return self._engine_id

    # --- lifecycle ---

    def start(self) -> None:
        """Learn the engine (the app does not start without one), register, start renewing."""
        self._engine_id = self._runner.engine_id()
        if self._registry is not None:
            self._registry.register(
                self.owner_id, self._engine_id, self.max_concurrency, queues=(SYNC_QUEUE,)
            )
        self._thread = threading.Thread(target=self._loop, name="runyard-sync-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Hand every run over: its lease is released so another API process adopts it at
        once; the containers keep running."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            flights = list(self._flights.values())
        for flight in flights:
            flight.control.abandon.set()
            if not flight.finalizing:
                self._give_back(flight, "the API process stopped")
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._registry is not None:
            try:
                self._registry.stopped(self.owner_id)
            except _DB_ERRORS:
                logger.warning("could not mark the API's sync owner stopped", exc_info=True)

    # --- the submit path ---

    def claim_new(self, run: NewRun, caps: AdmissionCaps) -> EnqueueResult:
        """Take a slot and insert the run claimed by this process; an idempotent replay
        returns the first run (and no slot), a full executor refuses (``AdmissionRefused``)."""
        if not self.try_acquire():
            refusal = AdmissionRefused("sync_capacity_full", self.max_concurrency)
            return self._queue.replay_or_refuse(run, refusal)
        try:
            claim = InlineClaim(self.owner_id, self.engine_id, self._lease)
            result = self._queue.submit(run, caps, inline=claim)
        except BaseException:
            self.release()
            raise
        if result.job is None:
            self.release()
        else:
            self._take(result.job)
        return result

    def start_job(self, job: ClaimedJob) -> Future[None]:
        """Run a job this process claimed (``claim_new``) in its slot; done when settled."""
        with self._lock:
            flight = self._flights[job.job_id]
        return self._pool.submit(self._execute, flight)

    def cancel_local(self, run_id: uuid.UUID) -> bool:
        """Stop the attempt of ``run_id`` if this process runs it."""
        with self._lock:
            flights = [f for f in self._flights.values() if f.job.run_id == run_id]
        for flight in flights:
            flight.control.cancel.set()
        return bool(flights)

    def on_notification(self, run_id: uuid.UUID) -> None:
        """A run changed somewhere; if it runs here, renew now (a cancel request comes back)."""
        if any(flight_run == run_id for flight_run in self.in_flight()):
            self._wake.set()

    # --- adoption ---

    def adopt_once(self) -> int:
        """Adopt, for free slots, sync jobs of this engine whose owner is gone.

        No slot is held while the claim runs (a submit meanwhile would find the executor
        full); a job claimed for a slot that a submit took in between is given back at once.
        """
        free = self.max_concurrency - self.busy
        if free <= 0 or self._stop.is_set():
            return 0
        jobs = self._queue.claim(
            worker_id=self.owner_id,
            engine_id=self.engine_id,
            limit=free,
            lease_seconds=self._lease,
            queues=(SYNC_QUEUE,),
            adopt_only=True,
        )
        adopted = 0
        for job in jobs:
            if not self.try_acquire():
                logger.info("no free slot for an adopted sync run", extra=self._log(job))
                self._queue.release(job.job_id, job.lease_token)
                continue
            logger.info("adopted a sync run", extra={**self._log(job), "action": "adopted"})
            self._pool.submit(self._execute, self._take(job))
            adopted += 1
        return adopted

    # --- one attempt, in its slot's thread ---

    def _take(self, job: ClaimedJob) -> Held:
        flight = Held(job=job, lease_valid_until=time.monotonic() + self._lease - self._margin)
        if job.cancel_requested:
            flight.control.cancel.set()
        control = flight.control
        control.logs = QueueLogSink(self._queue, job)
        control.artifacts = self._artifacts
        control.still_owner = functools.partial(self._still_owner, flight)
        control.clock = self._db_now
        control.note = functools.partial(self._note, flight)
        with self._lock:
            self._flights[job.job_id] = flight
        return flight

    def _log(self, job: ClaimedJob) -> dict[str, object]:
        return {"run_id": str(job.run_id), "attempt": job.attempt, "worker_id": self.owner_id}

    def _execute(self, flight: Held) -> None:
        job = flight.job
        try:
            outcome = self._adopted(flight) if job.adopted else self._fresh(flight)
            if outcome is not None:
                crash_point(BEFORE_FINALIZE)
                self._finish(flight, outcome)
        except Exception as exc:
            logger.exception("sync attempt crashed in the API", extra=self._log(job))
            if self._owns(flight) and not flight.finalizing:
                self._finish(flight, crashed_outcome(exc))
        finally:
            with self._lock:
                self._flights.pop(job.job_id, None)
            self.release()

    def _fresh(self, flight: Held) -> AttemptResult | None:
        """The attempt this process claimed at the submit: run the tool, unless cancelled."""
        if flight.control.cancel.is_set():
            return CANCELLED_BEFORE_START
        logger.info("sync run started", extra={**self._log(flight.job), "action": "started"})
        try:
            return self._run(flight)
        except RunnerUnavailable as exc:
            # The caller is waiting for an answer: the run ends here rather than later.
            logger.warning(
                "container engine failed", extra={**self._log(flight.job), "error": str(exc)}
            )
            return AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.INFRASTRUCTURE,
                error="the container engine failed while running the tool",
            )

    def _adopted(self, flight: Held) -> AttemptResult | None:
        """A run whose owner is gone: the adoption rule says what becomes of it."""
        job = flight.job
        try:
            state = self._runner.state(job.run_id, job.attempt)
            verdict = decide(
                AdoptionFacts(
                    container=state,
                    container_requested=job.container_requested,
                    cancel_requested=job.cancel_requested,
                    deadline_passed=self._db_now() >= job.deadline_at,
                    attempts_left=job.attempt < job.max_attempts,
                )
            )
            if verdict.action in (Action.FINALIZE, Action.RESUME):
                return self._run(flight)
            if verdict.discard:
                self._runner.discard(job.run_id, job.attempt)
        except RunnerUnavailable as exc:
            logger.warning("engine unavailable; adopt later", extra={**self._log(job)})
            self._queue.release_later(
                job.job_id, job.lease_token, delay_seconds=self._lease, reason=str(exc)[:200]
            )
            return None
        result = self._queue.put_back(
            job.job_id,
            job.lease_token,
            charged=verdict.charged,
            error=f"the API process running the tool stopped; its container was {state.value}",
            error_code=ErrorCode.API_LOST,
        )
        logger.warning(
            "sync run lost with its API process",
            extra={**self._log(job), "status": str(result.status)},
        )
        return None

    def _run(self, flight: Held) -> AttemptResult | None:
        """Start or resume the container, wait for it; None if the attempt was left."""
        job = flight.job
        spec = AttemptSpec(
            run_id=job.run_id,
            attempt=job.attempt,
            tool=job.spec,
            input=job.input,
            deadline_at=job.deadline_at,
        )
        try:
            return self._runner.run(spec, flight.control)
        except AttemptAbandoned:
            logger.warning("sync attempt left to its next owner", extra=self._log(job))
            return None

    def _finish(self, flight: Held, outcome: AttemptResult) -> None:
        """FINALIZE under the lease; a refused outcome falls back to safer ones, a passing
        error is retried while the lease holds."""
        job = flight.job
        flight.finalizing = True
        delay = 0.1
        current, fallbacks = outcome, None
        while self._owns(flight):
            try:
                owned = self._queue.finalize(job.job_id, job.lease_token, current)
            except Exception as exc:
                if classify(exc) is Failure.TRANSIENT:
                    flight.control.abandon.wait(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                logger.error(
                    "the database refused the sync outcome",
                    extra={**self._log(job), "error": describe(exc)},
                )
                if fallbacks is None:
                    fallbacks = unstorable_outcomes(outcome, exc)
                if not fallbacks:
                    break
                current = fallbacks.pop(0)
                continue
            if not owned:
                logger.warning("lease lost before finalize", extra=self._log(job))
                drop_unpublished(
                    self._queue.engine,
                    self._artifacts,
                    job.run_id,
                    outcome.artifact_set,
                    self._log(job),
                )
                return
            if current.artifact_set != outcome.artifact_set:
                drop_unpublished(
                    self._queue.engine,
                    self._artifacts,
                    job.run_id,
                    outcome.artifact_set,
                    self._log(job),
                )
            flight.settled = True
            logger.info(
                "sync run finalized",
                extra={**self._log(job), "action": "finalized", "status": current.status.value},
            )
            try:
                self._runner.discard(job.run_id, job.attempt)
            except RunnerUnavailable:
                logger.warning("cleanup deferred to the sweep", extra=self._log(job))
            return
        logger.warning("sync outcome not stored; left to adoption", extra=self._log(job))
        drop_unpublished(
            self._queue.engine, self._artifacts, job.run_id, outcome.artifact_set, self._log(job)
        )
        self._give_back(flight, "the outcome could not be stored")

    def _give_back(self, flight: Held, why: str) -> None:
        """Release the lease so the run is adoptable at once."""
        job = flight.job
        try:
            self._heartbeat_queue.release(job.job_id, job.lease_token)
            logger.info("sync run released: %s", why, extra=self._log(job))
        except _DB_ERRORS:
            logger.warning("release failed; the lease will run out", extra=self._log(job))

    # --- the owner's hooks ---

    def _owns(self, flight: Held) -> bool:
        """Whether this process may still act as the attempt's owner (no database asked)."""
        return not flight.control.abandon.is_set() and time.monotonic() < flight.lease_valid_until

    def _still_owner(self, flight: Held) -> bool:
        """Asked before each Docker action: the database's word, the lease clock's if it
        cannot answer."""
        if not self._owns(flight):
            return False
        try:
            held = self._queue.lease_held(flight.job.job_id, flight.job.lease_token)
        except Exception:
            return self._owns(flight)
        if not held:
            flight.control.abandon.set()
        return held and self._owns(flight)

    def _db_now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self._db_offset)

    def _note(self, flight: Held, kind: str, data: dict[str, Any]) -> None:
        """Record a run event under the lease; never raises into the runner."""
        if not self._owns(flight):
            return
        try:
            self._queue.record_event(flight.job.job_id, flight.job.lease_token, kind, data)
        except Exception as exc:
            logger.warning(
                "could not record a run event", extra={**self._log(flight.job), "error": str(exc)}
            )

    # --- renewals ---

    def heartbeat_once(self) -> None:
        """Renew every lease in flight (HEARTBEAT): a lost lease abandons its attempt, a
        cancel request reaches it; and tell the reaper this engine has a live owner."""
        with self._lock:
            flights = [
                f
                for f in self._flights.values()
                if not f.settled and not f.control.abandon.is_set()
            ]
        for flight in flights:
            self._renew(flight)
        if self._registry is not None:
            try:
                self._registry.seen(self.owner_id)
            except _DB_ERRORS as exc:
                logger.warning("could not record liveness", extra={"error": describe(exc)})

    def _renew(self, flight: Held) -> None:
        job = flight.job
        sent, asked = time.monotonic(), datetime.now(UTC)
        try:
            beat = self._heartbeat_queue.heartbeat(
                job.job_id, job.lease_token, lease_seconds=self._lease
            )
        except _DB_ERRORS as exc:
            logger.warning("sync renewal failed", extra={**self._log(job), "error": describe(exc)})
            if not self._owns(flight):
                flight.control.abandon.set()
            return
        if not beat.owned:
            if not flight.finalizing:
                logger.warning("sync run taken over", extra=self._log(job))
                flight.control.abandon.set()
            return
        if beat.db_now is not None:
            self._db_offset = (beat.db_now - asked).total_seconds()
        flight.lease_valid_until = max(flight.lease_valid_until, sent + self._lease - self._margin)
        if beat.cancel_requested and not flight.control.cancel.is_set():
            logger.info("sync cancel requested", extra=self._log(job))
            flight.control.cancel.set()

    def _loop(self) -> None:
        interval = self._lease / 3
        while not self._stop.is_set():
            try:
                self.heartbeat_once()
            except Exception:
                logger.exception("sync renewal crashed")
            self._wake.wait(interval)
            self._wake.clear()
