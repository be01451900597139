"""Sync fallback mode: the API runs a tool inline, as a job it claims itself.

A sync run is a job like any other. The submit inserts it already claimed by this API process
(one statement, a fresh ``lease_token``, queue ``sync``); this process renews the lease with
the heartbeat statement, and the one attempt owner (``runyard.attempts``) runs the attempt,
stores live logs, is cancelled and finalizes as it does for a worker, by the sync policy (the
caller waits for the answer). If the process dies, the lease runs out and an API process of the
same engine adopts the run (``adopt_once``) and decides by the one adoption rule
(``runyard.domain.adoption``). Nothing waits in a queue in this mode: a sync job is never queued.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

from runyard.artifact_store import ArtifactStore
from runyard.attempts.flight import Flight, LeaseClock, log_fields
from runyard.attempts.owner import DB_ERRORS, AttemptOwner
from runyard.attempts.policy import OwnerPolicy
from runyard.domain.errors import describe
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
from runyard.reads.metrics import Metrics, Role
from runyard.runner import Runner

logger = logging.getLogger(__name__)


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
        owner_id: str | None = None,
        heartbeat_queue: ApiQueue | None = None,
        lease_seconds: float = 30.0,
        registry: WorkerRegistry | None = None,
        max_concurrency: int,
        artifacts: ArtifactStore | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._queue = queue
        # Renewals may get a small pool of their own, so busy requests never starve them.
        self._heartbeat_queue = heartbeat_queue or queue
        self._runner = runner
        self._registry = registry
        self.max_concurrency = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="runyard-sync")
        self._lease = lease_seconds
        self.owner_id = owner_id or new_owner_id("api")
        # The API's metrics, so its /metrics counts the runs it ran inline.
        metrics = (metrics or Metrics()).export(Role.ATTEMPTS)
        self._owner = AttemptOwner(
            queue,
            runner,
            OwnerPolicy.sync(lease_seconds=lease_seconds),
            owner_id=self.owner_id,
            clock=LeaseClock(metrics),
            metrics=metrics,
            # An engine that fails under an adopted run: adoptable again a lease later.
            engine_trouble=lambda why: lease_seconds,
            heartbeat_queue=self._heartbeat_queue,
            artifacts=artifacts,
        )
        self._lock = threading.Lock()
        self._flights: dict[uuid.UUID, Flight] = {}
        self._busy = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._engine_id: str | None = None

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
        engine_id = self._runner.engine_id()
        if self._registry is not None:
            self._registry.register(
                self.owner_id, engine_id, self.max_concurrency, queues=(SYNC_QUEUE,)
            )
        self._engine_id = engine_id
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
            except DB_ERRORS:
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
        logger.info("sync run started", extra=self._log(job, action="started"))
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
            logger.info("adopted a sync run", extra=self._log(job, action="adopted"))
            self._pool.submit(self._execute, self._take(job))
            adopted += 1
        return adopted

    # --- one attempt, in its slot's thread ---

    def _take(self, job: ClaimedJob) -> Flight:
        flight = self._owner.hold(job)
        with self._lock:
            self._flights[job.job_id] = flight
        return flight

    def _log(self, job: ClaimedJob, **more: object) -> dict[str, object]:
        return log_fields(job, self.owner_id, **more)

    def _execute(self, flight: Flight) -> None:
        try:
            self._owner.run(flight)
        finally:
            with self._lock:
                self._flights.pop(flight.job.job_id, None)
            self.release()

    def _give_back(self, flight: Flight, why: str) -> None:
        """Release the lease so the run is adoptable at once."""
        job = flight.job
        try:
            self._heartbeat_queue.release(job.job_id, job.lease_token)
            logger.info("sync run released: %s", why, extra=self._log(job))
        except DB_ERRORS:
            logger.warning("release failed; the lease will run out", extra=self._log(job))

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
            if not self._owner.renew(flight) and not self._owner.owns(flight):
                self._owner.lose(flight, "not renewed in time; left to the next owner")
        if self._registry is not None:
            try:
                self._registry.seen(self.owner_id)
            except DB_ERRORS as exc:
                logger.warning("could not record liveness", extra={"error": describe(exc)})

    def _loop(self) -> None:
        interval = self._lease / 3
        while not self._stop.is_set():
            try:
                self.heartbeat_once()
            except Exception:
                logger.exception("sync renewal crashed")
            self._wake.wait(interval)
            self._wake.clear()
