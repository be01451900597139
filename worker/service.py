"""The worker: claims jobs for free slots, runs each attempt, heartbeats, finalizes once."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.adoption import Action, AdoptionFacts, Verdict, decide
from runyard.faults import BEFORE_FINALIZE, crash_point
from runyard.metrics import Metrics
from runyard.models import RunStatus
from runyard.queue import ClaimedJob, JobQueue
from runyard.runner import (
    AttemptAbandoned,
    AttemptControl,
    AttemptResult,
    AttemptSpec,
    ContainerState,
    ErrorCode,
    Runner,
    RunnerUnavailable,
)
from runyard.workers import WorkerRegistry
from worker.cleanup import Cleaner
from worker.engine_health import EngineHealth
from worker.sweep import Sweeper

logger = logging.getLogger(__name__)

_DB_ERRORS = (OperationalError, DBAPIError)


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to know; validated by ``Settings`` upstream."""

    worker_id: str
    concurrency: int = 4
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    poll_seconds: float = 1.0
    queues: tuple[str, ...] = ("default",)
    sweep_interval_seconds: float = 60.0
    # While the engine does not answer: probes (and re-adoptions) back off from base to max.
    engine_backoff_base_seconds: float = 1.0
    engine_backoff_max_seconds: float = 30.0


@dataclass
class InFlight:
    """A job this process holds, with the controls of its running attempt."""

    job: ClaimedJob
    control: AttemptControl = field(default_factory=AttemptControl)
    # Monotonic time until which our lease is known to hold; past it we are not the owner.
    lease_valid_until: float = 0.0
    # Set once the outcome is committed: the lease is gone on purpose, heartbeats stop.
    settled: bool = False
    # Set while the outcome is being committed: a heartbeat that finds the job no longer
    # running is then seeing that commit, and the finalize's own answer tells a loss.
    finalizing: bool = False
    # The job this slot's finalize claimed, to run next in the same thread.
    next_job: ClaimedJob | None = None
    # How often the runner asked before touching the engine: once before the create, again
    # before the start. At most once means the tool never started (see ``_release``).
    engine_asks: int = 0


def _counting(flight: InFlight, ask: Callable[[], bool]) -> Callable[[], bool]:
    """``ask``, counting its calls in ``flight.engine_asks``."""

    def still_owner() -> bool:
        flight.engine_asks += 1
        return ask()

    return still_owner


class QueueLogSink:
    """Live log chunks go to the run's events, fenced by the attempt's lease."""

    def __init__(self, queue: JobQueue, job: ClaimedJob) -> None:
        self._queue = queue
        self._job = job

    def resume_point(self, stream: str) -> str | None:
        """Where the previous owner of this attempt stopped, if anywhere."""
        return self._queue.last_log_position(self._job.run_id, self._job.attempt, stream)

    def write(self, stream: str, text: str, until: str) -> bool:
        """Append a chunk; a lost lease stops the stream, a passing DB error is retried."""
        for delay in (0.1, 0.5, 1.0):
            try:
                return self._queue.append_log(
                    self._job.job_id,
                    self._job.lease_token,
                    stream=stream,
                    text_chunk=text,
                    until=until,
                )
            except _DB_ERRORS:
                time.sleep(delay)
        logger.warning("dropped a live log chunk", extra={"run_id": str(self._job.run_id)})
        return True


@dataclass(frozen=True)
class ClaimRound:
    """What one ``run_once`` did."""

    claimed: int
    adopted: int
    free_slots: int


class Worker:
    """Slots are threads (docker-py blocks); one claim loop, one heartbeat thread."""

    def __init__(
        self,
        queue: JobQueue,
        runner: Runner,
        config: WorkerConfig,
        registry: WorkerRegistry | None = None,
        sweeper: Sweeper | None = None,
        heartbeat_queue: JobQueue | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._queue = queue
        self._metrics = metrics or Metrics()
        self._metrics.slots_total.set(config.concurrency)
        # Heartbeats get their own connection so a busy pool never starves a lease.
        self._heartbeat_queue = heartbeat_queue or queue
        self._wake = threading.Event()
        self._sweeper = sweeper
        self._next_sweep = 0.0
        self._runner = runner
        self._cleaner = Cleaner(runner, backlog=config.concurrency, worker_id=config.worker_id)
        self._config = config
        self._registry = registry
        self._pool = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="runyard-slot"
        )
        self._lock = threading.Lock()
        self._in_flight: dict[uuid.UUID, InFlight] = {}
        self._futures: set[Future[None]] = set()
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._engine_id: str | None = None
        self._health = EngineHealth(
            runner.ping,
            worker_id=config.worker_id,
            base_seconds=config.engine_backoff_base_seconds,
            max_seconds=config.engine_backoff_max_seconds,
            metrics=self._metrics,
            on_change=self._engine_changed,
        )
        self._forever = False
        # Under ``run_forever`` a slot's finalize also claims its next job (see ``_finalize``).
        self._chain = False
        self.finalized = 0

    @property
    def worker_id(self) -> str:
        """This process's worker id."""
        return self._config.worker_id

    @property
    def engine_healthy(self) -> bool:
        """False from a failed engine probe until one succeeds: no claims, no liveness."""
        return self._health.healthy

    def _log(self, job: ClaimedJob, **more: object) -> dict[str, object]:
        return {
            "run_id": str(job.run_id),
            "attempt": job.attempt,
            "worker_id": self._config.worker_id,
            **more,
        }

    # --- lifecycle ---

    def start(self) -> None:
        """Learn the engine id, register, and start the heartbeat thread."""
        self._engine_id = self._runner.engine_id()
        if self._registry is not None:
            self._registry.register(self.worker_id, self._engine_id, self._config.concurrency)
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name="runyard-heartbeat", daemon=True
        )
        self._heartbeat_thread.start()

    def free_slots(self) -> int:
        """Slots with no attempt in them."""
        with self._lock:
            return self._config.concurrency - len(self._in_flight)

    def run_once(self) -> ClaimRound:
        """Claim jobs for the free slots and hand each to a slot thread."""
        if self._engine_id is None:
            self.start()
        assert self._engine_id is not None
        free = self.free_slots()
        if free <= 0 or self._stop.is_set():
            return ClaimRound(claimed=0, adopted=0, free_slots=max(free, 0))
        # A claim charges an attempt: make it only when the engine has just answered.
        if not self._health.check():
            return ClaimRound(claimed=0, adopted=0, free_slots=free)
        jobs = self._claim(free)
        for job in jobs:
            flight = self._take(job)
            assert flight is not None
            future = self._pool.submit(self._execute, flight)
            with self._lock:
                self._futures.add(future)
            future.add_done_callback(self._forget_future)
        adopted = sum(1 for job in jobs if job.adopted)
        return ClaimRound(claimed=len(jobs) - adopted, adopted=adopted, free_slots=free - len(jobs))

    def _claim(self, limit: int) -> list[ClaimedJob]:
        assert self._engine_id is not None
        return self._queue.claim(
            worker_id=self.worker_id,
            engine_id=self._engine_id,
            limit=limit,
            lease_seconds=self._config.lease_seconds,
            queues=self._config.queues,
        )

    def _take(self, job: ClaimedJob, *, instead_of: ClaimedJob | None = None) -> InFlight | None:
        """Put a claimed job in flight, in the slot of ``instead_of`` if given.

        None if that slot's own claim came back after ``stop()``: the caller gives it back.
        """
        flight = InFlight(job=job, lease_valid_until=time.monotonic() + self._config.lease_seconds)
        flight.control.logs = QueueLogSink(self._queue, job)
        flight.control.still_owner = _counting(flight, flight.control.still_owner)
        if job.cancel_requested:
            flight.control.cancel.set()
        with self._lock:
            if instead_of is not None:
                self._forget(instead_of)
                # Checked under the lock hand_over() snapshots the flights with: none slips by.
                if self._stop.is_set():
                    self._metrics.slots_busy.set(len(self._in_flight))
                    return None
            self._in_flight[job.job_id] = flight
            self._metrics.slots_busy.set(len(self._in_flight))
        if not job.adopted:
            self._metrics.claims.inc()
            if job.requested_at is not None and job.started_at is not None:
                wait = (job.started_at - job.requested_at).total_seconds()
                self._metrics.wait_time.observe(max(wait, 0.0))
        logger.info(
            "adopted job" if job.adopted else "claimed job",
            extra=self._log(job, action="adopted" if job.adopted else "claimed"),
        )
        return flight

    def _forget_future(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no attempt is in flight or being removed; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                idle = not self._in_flight and not self._futures
            if idle and self._cleaner.pending() == 0:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def run_forever(self) -> None:
        """Claim for free slots while the engine answers (else probe it with backoff)."""
        self.start()
        self._forever = True
        self._chain = self._health.healthy
        while not self._stop.is_set():
            if not self._health.healthy:
                # New-job wake-ups do not cut a backoff short: only stop() does.
                if self._stop.wait(self._health.next_delay()) or not self._health.check():
                    continue
            try:
                self.run_once()
                if self._health.healthy:
                    self._maybe_sweep()
            except _DB_ERRORS as exc:
                logger.warning("claim failed; retrying", extra={"error": str(exc)})
            except RunnerUnavailable as exc:
                self._health.trouble(str(exc))
            if not self._health.healthy:
                continue
            # Polling is the source of truth; a notification or a freed slot cuts it short.
            self._wake.wait(self._config.poll_seconds * random.uniform(0.8, 1.2))
            self._wake.clear()

    def _engine_changed(self, healthy: bool) -> None:
        """Chain claims and report liveness only while the engine answers."""
        answers = self._health.healthy  # the latest word, whichever thread reported last
        self._chain = self._forever and answers
        if answers and self._registry is not None:
            # At once: a reaper must not find the engine dead in the gap before a heartbeat.
            try:
                self._registry.seen(self.worker_id)
            except _DB_ERRORS:
                logger.warning("could not record worker liveness", exc_info=True)
        self._wake.set()

    def notify_job(self) -> None:
        """A job may be waiting: claim now rather than at the next poll."""
        self._wake.set()

    def notify_cancel(self, job_id: uuid.UUID) -> None:
        """A cancel was requested for ``job_id``: stop its attempt if it runs here."""
        with self._lock:
            flight = self._in_flight.get(job_id)
        if flight is not None:
            logger.info("cancel notified", extra=self._log(flight.job, action="cancel"))
            flight.control.cancel.set()

    def _maybe_sweep(self) -> None:
        if self._sweeper is None or time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + self._config.sweep_interval_seconds
        self._sweeper.run_once()

    def stop(self) -> None:
        """Stop claiming (the running attempts are not touched)."""
        self._stop.set()
        self._wake.set()

    def hand_over(self) -> int:
        """Release every lease so the runs are adoptable at once; containers keep running."""
        self._stop.set()
        with self._lock:
            flights = list(self._in_flight.values())
        released = 0
        for flight in flights:
            flight.control.abandon.set()
            try:
                if self._queue.release(flight.job.job_id, flight.job.lease_token):
                    released += 1
            except _DB_ERRORS as exc:
                logger.warning("release failed", extra=self._log(flight.job, error=str(exc)))
        self.close(stopped=True)
        return released

    def close(self, *, stopped: bool = True) -> None:
        """Shut the slot pool down and mark this worker stopped."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._cleaner.close()
        if stopped and self._registry is not None:
            try:
                self._registry.stopped(self.worker_id)
            except _DB_ERRORS:
                logger.warning("could not mark worker stopped", exc_info=True)

    # --- heartbeats ---

    def heartbeat_once(self) -> None:
        """Renew every lease in flight; a lost lease or a cancel reaches its attempt."""
        with self._lock:
            flights = list(self._in_flight.values())
        for flight in flights:
            job = flight.job
            if flight.settled:
                continue
            try:
                beat = self._heartbeat_queue.heartbeat(
                    job.job_id, job.lease_token, lease_seconds=self._config.lease_seconds
                )
            except _DB_ERRORS as exc:
                logger.warning("heartbeat failed", extra=self._log(job, error=str(exc)))
                if time.monotonic() >= flight.lease_valid_until:
                    self._lose(flight, "lease expired while the database was unreachable")
                continue
            if not beat.owned:
                if not flight.finalizing:
                    self._lose(flight, "lease taken away")
                continue
            flight.lease_valid_until = time.monotonic() + self._config.lease_seconds
            if beat.cancel_requested and not flight.control.cancel.is_set():
                logger.info("cancel requested", extra=self._log(job, action="cancel"))
                flight.control.cancel.set()
        if self._registry is not None and self.engine_healthy:
            try:
                self._registry.seen(self.worker_id)
            except _DB_ERRORS:
                logger.warning("could not record worker liveness", exc_info=True)

    def _lose(self, flight: InFlight, why: str) -> None:
        if not flight.control.abandon.is_set():
            self._metrics.leases_lost.inc()
            logger.warning("lease lost: %s", why, extra=self._log(flight.job, action="lease_lost"))
            flight.control.abandon.set()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._config.heartbeat_seconds):
            self.heartbeat_once()
        # After stop() keep renewing the leases of attempts still running (drain).
        while True:
            with self._lock:
                if not self._in_flight:
                    return
            time.sleep(self._config.heartbeat_seconds)
            self.heartbeat_once()

    # --- execution ---

    def _execute(self, flight: InFlight) -> None:
        current: InFlight | None = flight
        while current is not None:
            try:
                self._execute_attempt(current)
            except Exception:
                logger.exception("attempt crashed in the worker", extra=self._log(current.job))
            finally:
                current = self._leave(current)

    def _leave(self, flight: InFlight) -> InFlight | None:
        """Free the slot, or hand it to the job its finalize claimed (run in this thread)."""
        job, upcoming = flight.job, flight.next_job
        if upcoming is not None:
            following = self._take(upcoming, instead_of=job)
            if following is not None:
                return following
            self._give_back(upcoming)
        else:
            with self._lock:
                self._forget(job)
                self._metrics.slots_busy.set(len(self._in_flight))
        self._wake.set()
        return None

    def _forget(self, job: ClaimedJob) -> None:
        """Drop ``job``'s flight (with the lock held), unless the slot is already the next
        attempt's: a lost lease can be re-claimed here before the old attempt has left."""
        flight = self._in_flight.get(job.job_id)
        if flight is not None and flight.job is job:
            del self._in_flight[job.job_id]

    def _give_back(self, job: ClaimedJob) -> None:
        """A job claimed as the worker stopped: back at once, uncharged, for the next owner."""
        try:
            if job.adopted:
                self._queue.release(job.job_id, job.lease_token)
            else:
                self._queue.requeue_unstarted(job.job_id, job.lease_token)
        except _DB_ERRORS:
            logger.warning("give-back failed; the reaper will clear the lease", exc_info=True)

    def _execute_attempt(self, flight: InFlight) -> None:
        job = flight.job
        if job.adopted:
            try:
                state = self._runner.state(job.run_id, job.attempt)
            except RunnerUnavailable as exc:
                self._release(flight, f"engine unavailable: {exc}")
                return
            self._metrics.adoptions.labels(outcome=state.value).inc()
            verdict = decide(
                AdoptionFacts(
                    container=state,
                    container_requested=job.container_requested,
                    cancel_requested=job.cancel_requested,
                    deadline_passed=flight.control.clock() >= job.deadline_at,
                    attempts_left=job.attempt < job.max_attempts,
                )
            )
            if verdict.action not in (Action.FINALIZE, Action.RESUME):
                self._settle_adopted(flight, state, verdict)
                return
        elif job.cancel_requested:
            self._finalize(
                flight,
                AttemptResult(
                    status=RunStatus.CANCELLED,
                    error_code=ErrorCode.CANCELLED,
                    error="cancelled before it started",
                ),
            )
            return
        if not job.container_requested and not self._mark_container_requested(flight):
            return
        spec = AttemptSpec(
            run_id=job.run_id,
            attempt=job.attempt,
            tool=job.spec,
            input=job.input,
            deadline_at=job.deadline_at,
        )
        if job.cancel_requested:
            # Adopted after a cancel: a container a dead owner stopped for it ends cancelled.
            flight.control.cancel.set()
        try:
            outcome = self._runner.run(spec, flight.control)
        except AttemptAbandoned:
            logger.info("attempt left to its next owner", extra=self._log(job, action="abandon"))
            return
        except RunnerUnavailable as exc:
            self._release(flight, str(exc))
            return
        crash_point(BEFORE_FINALIZE)
        self._finalize(flight, outcome)

    def _mark_container_requested(self, flight: InFlight) -> bool:
        """Record the start under the lease, retrying DB errors while the lease holds."""
        job = flight.job
        delay = 0.1
        while not flight.control.abandon.is_set():
            try:
                if self._queue.mark_container_requested(job.job_id, job.lease_token):
                    return True
                logger.warning(
                    "lease lost before the start", extra=self._log(job, action="lease_lost")
                )
                return False
            except _DB_ERRORS as exc:
                if time.monotonic() + delay >= flight.lease_valid_until:
                    # Unmarked and unowned: adoption puts it back without charging it.
                    logger.warning(
                        "could not record the start", extra=self._log(job, error=str(exc))
                    )
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        return False

    def _settle_adopted(self, flight: InFlight, state: ContainerState, verdict: Verdict) -> None:
        """No container will finish the adopted attempt: put it back, charged or not."""
        job = flight.job
        if verdict.action is Action.LOOK_LATER:
            self._release(flight, f"nothing to decide with the container {state.value}")
            return
        reason = ErrorCode.CONTAINER_LOST.value if verdict.charged else "unstarted"
        self._metrics.requeues.labels(reason=reason).inc()
        if verdict.discard:
            self._runner.discard(job.run_id, job.attempt)
        result = self._queue.put_back(
            job.job_id,
            job.lease_token,
            charged=verdict.charged,
            error=f"the container of attempt {job.attempt} was {state.value}",
        )
        extra = self._log(job, action="requeued", status=str(result.status))
        if verdict.charged:
            logger.warning("container lost", extra=extra)
        else:
            logger.info("attempt never began; requeued without charge", extra=extra)

    def _release(self, flight: InFlight, why: str) -> None:
        """Decide nothing: give the lease back, adoptable again after a backoff step."""
        # The worker claims nothing until a probe, a backoff step later, finds the engine
        # answering; and no one adopts the run before then: a failing engine costs each run
        # one release per backoff step, not an adoption and a release per poll.
        job = flight.job
        self._health.trouble(why)
        delay = self._health.next_delay()
        extra = self._log(job, delay=round(delay, 2))
        try:
            if not job.adopted and flight.engine_asks == 1:
                # A fresh attempt whose start was never asked for: its tool never ran.
                self._metrics.requeues.labels(reason="unstarted").inc()
                result = self._queue.requeue_never_started(
                    job.job_id, job.lease_token, delay_seconds=delay
                )
                logger.warning(
                    "engine trouble before the start; requeued without charge: %s",
                    why,
                    extra={**extra, "action": "requeued", "status": str(result.status)},
                )
                return
            logger.warning(
                "engine trouble; releasing lease: %s", why, extra={**extra, "action": "released"}
            )
            self._queue.release_later(
                job.job_id, job.lease_token, delay_seconds=delay, reason="engine_trouble"
            )
        except _DB_ERRORS:
            logger.warning("release failed; the reaper will clear the lease", exc_info=True)

    def _commit_outcome(self, flight: InFlight, outcome: AttemptResult) -> bool:
        """FINALIZE; a one-queue worker that is not stopping claims the slot's next job in it."""
        job = flight.job
        if not self._chain or self._stop.is_set() or len(self._config.queues) != 1:
            return self._queue.finalize(job.job_id, job.lease_token, outcome)
        assert self._engine_id is not None
        owned, claimed = self._queue.finalize_and_claim(
            job.job_id,
            job.lease_token,
            outcome,
            worker_id=self.worker_id,
            engine_id=self._engine_id,
            limit=1,
            lease_seconds=self._config.lease_seconds,
            queue=self._config.queues[0],
        )
        flight.next_job = claimed[0] if claimed else None
        return owned

    def _finalize(self, flight: InFlight, outcome: AttemptResult) -> None:
        """Commit the outcome, retrying DB errors while the lease holds; then clean up."""
        job = flight.job
        delay = 0.1
        flight.finalizing = True
        while True:
            if flight.control.abandon.is_set():
                logger.warning("not finalizing: lease lost", extra=self._log(job))
                return
            try:
                owned = self._commit_outcome(flight, outcome)
                break
            except _DB_ERRORS as exc:
                if time.monotonic() + delay >= flight.lease_valid_until:
                    logger.warning(
                        "finalize gave up; adoption will finish the run",
                        extra=self._log(job, error=str(exc)),
                    )
                    return
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        if not owned:
            self._metrics.leases_lost.inc()
            logger.warning("lease lost before finalize", extra=self._log(job, action="lease_lost"))
            return
        flight.settled = True
        self.finalized += 1
        self._metrics.outcomes.labels(
            status=outcome.status.value, error_code=outcome.error_code or ""
        ).inc()
        self._metrics.attempts.observe(job.attempt)
        if job.started_at is not None:
            elapsed = (datetime.now(UTC) - job.started_at).total_seconds()
            self._metrics.duration.observe(max(elapsed, 0.0))
        logger.info(
            "run finalized",
            extra=self._log(job, action="finalized", status=outcome.status.value),
        )
        self._cleaner.discard(job.run_id, job.attempt)
