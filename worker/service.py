"""The worker: claims jobs for free slots while its engine answers and runs each attempt in
a slot under the one attempt owner (``runyard.attempts``); its lease supervisor
(``worker.lease_supervisor``) renews the leases, handing every run over when it cannot."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.artifact_store import ArtifactStore
from runyard.attempts.flight import Flight, LeaseClock, log_fields
from runyard.attempts.owner import AttemptOwner, NextClaim
from runyard.attempts.policy import OwnerPolicy
from runyard.maintenance.chores import Chores
from runyard.maintenance.sweep import Sweeper
from runyard.queue import BUILDS_CHANNEL, HELD_CHANNEL, ClaimedJob, JobQueue
from runyard.queue.completer import BatchCompleter
from runyard.queue.flow import FlowGate
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics, Role
from runyard.runner import Runner, RunnerUnavailable
from worker.builds import BuildAgent
from worker.cleanup import Cleaner
from worker.config import WorkerConfig
from worker.connection_watch import ConnectionWatch
from worker.engine_health import EngineHealth
from worker.lease_supervisor import LeaseSupervisor

__all__ = ["ClaimRound", "InFlight", "Worker", "WorkerConfig"]

logger = logging.getLogger(__name__)

_DB_ERRORS = (OperationalError, DBAPIError)

# A job a worker slot holds (the attempt owner's flight).
InFlight = Flight


@dataclass(frozen=True)
class ClaimRound:
    """What one ``run_once`` did."""

    claimed: int
    adopted: int
    free_slots: int


class Worker:
    """Slots are threads (docker-py blocks); one claim loop; one heartbeat supervisor that
    starts each round on a thread of its own and never waits on the database."""

    def __init__(
        self,
        queue: JobQueue,
        runner: Runner,
        config: WorkerConfig,
        registry: WorkerRegistry | None = None,
        sweeper: Sweeper | None = None,
        heartbeat_queue: JobQueue | None = None,
        metrics: Metrics | None = None,
        artifacts: ArtifactStore | None = None,
        builds: BuildAgent | None = None,
        chores: Chores | None = None,
        flow_gate: FlowGate | None = None,
    ) -> None:
        self._queue = queue
        # The gate among the chores, woken when a held job is written (``notify_held``).
        self._flow_gate = flow_gate
        # Background chores of the process (the tools file's reload), on a thread of their own.
        self._chores = chores or Chores([])
        # Builds of the tools built from source that the runs of this engine wait for.
        self._builds = builds
        self._metrics = (metrics or Metrics()).export(Role.WORKER, Role.ATTEMPTS)
        self._metrics.slots_total.set(config.concurrency)
        # Heartbeats get their own connection so a busy pool never starves a lease.
        self._heartbeat_queue = heartbeat_queue or queue
        self._wake = threading.Event()
        self._sweeper = sweeper
        self._next_sweep = 0.0
        self._runner = runner
        # Removes finalized attempts' containers off the slot threads.
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
        # Under ``run_forever`` a slot's finalize also claims its next job (see ``_next_claim``).
        self._chain = False
        if builds is not None:
            builds.bind(self._health.trouble, self._wake.set)
        self._clock = LeaseClock(self._metrics)
        # Slots that finish together finalize (and claim their next jobs) in one statement.
        self._completer = (
            BatchCompleter(queue, busy=self._busy_slots) if config.concurrency > 1 else None
        )
        self._owner = AttemptOwner(
            queue,
            runner,
            OwnerPolicy.worker(
                lease_seconds=config.lease_seconds, margin_seconds=config.heartbeat_timeout
            ),
            owner_id=config.worker_id,
            clock=self._clock,
            metrics=self._metrics,
            engine_trouble=self._engine_trouble,
            heartbeat_queue=self._heartbeat_queue,
            artifacts=artifacts,
            cleanup=self._cleaner.discard,
            next_claim=self._next_claim,
            completer=self._completer,
        )
        watches = [ConnectionWatch(queue.engine)]
        if self._heartbeat_queue.engine is not queue.engine:
            watches.append(ConnectionWatch(self._heartbeat_queue.engine))
        self._supervisor = LeaseSupervisor(
            self._owner,
            self._flights,
            config=config,
            heartbeat_queue=self._heartbeat_queue,
            registry=registry,
            metrics=self._metrics,
            clock=self._clock,
            engine_healthy=lambda: self._health.healthy,
            watches=watches,
            stopped=self._stop,
        )
        self._loop_failed_at = 0.0
        self._loop_backoff = config.poll_seconds

    @property
    def worker_id(self) -> str:
        """This process's worker id."""
        return self._config.worker_id

    @property
    def inputs(self) -> str:
        """How attempts get their input here: ``host`` or ``upload`` (as decided at start)."""
        return self._config.inputs

    @property
    def engine_healthy(self) -> bool:
        """False from a failed engine probe until one succeeds: no claims, no liveness."""
        return self._health.healthy

    @property
    def finalized(self) -> int:
        """Attempts whose outcome this worker committed."""
        return self._owner.finalized

    def _log(self, job: ClaimedJob, **more: object) -> dict[str, object]:
        return log_fields(job, self._config.worker_id, **more)

    # --- lifecycle ---

    def start(self) -> None:
        """Learn the engine id, register, and start the heartbeat thread; once (the entry point
        starts the worker to fail early, then ``run_forever`` would start it again)."""
        if self._engine_id is not None:
            return
        engine_id = self._runner.engine_id()
        if self._registry is not None:
            self._registry.register(
                self.worker_id,
                engine_id,
                self._config.concurrency,
                queues=self._config.queues,
            )
        self._engine_id = engine_id
        self._supervisor.start()
        self._chores.start()

    def _busy_slots(self) -> int:
        with self._lock:
            return len(self._in_flight)

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
        idle = free <= 0 and self._builds is None
        if idle or self._stop.is_set() or self._supervisor.sick.is_set():
            return ClaimRound(claimed=0, adopted=0, free_slots=max(free, 0))
        # A claim charges an attempt: make it only when the engine has just answered.
        if not self._health.check():
            return ClaimRound(claimed=0, adopted=0, free_slots=free)
        if self._builds is not None:
            self._builds.run_once(self._engine_id)
            if free <= 0:
                return ClaimRound(claimed=0, adopted=0, free_slots=0)
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
        flight = self._owner.hold(job)
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
            except Exception:
                self._loop_failed()
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

    def notify_held(self) -> None:
        """A job was written held by its flow limits: the flow gate passes at its next turn."""
        if self._flow_gate is not None:
            self._flow_gate.wake()
            self._chores.poke()  # the gate's chore sleeps while it rests

    def notify_build(self) -> None:
        """A job that waits for a build was written: the build round looks at the next claim
        round, which runs now."""
        if self._builds is not None:
            self._builds.wake()
            self._wake.set()

    def notify_listening(self, channels: frozenset[str]) -> None:
        """The LISTEN link is up, hearing ``channels``, or lost (none): the flow gate and the
        build round rest longer only while they hear every job of their kind, and look now
        for one written while the link was down."""
        if self._flow_gate is not None:
            self._flow_gate.hears_held(HELD_CHANNEL in channels)
            self._chores.poke()
        if self._builds is not None:
            self._builds.hears_builds(BUILDS_CHANNEL in channels)
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
        self._chores.stop()
        if self._builds is not None:
            self._builds.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if not self._supervisor.join(self._config.heartbeat_timeout):
            logger.warning(
                "a heartbeat round was still running at close",
                extra={"worker_id": self.worker_id},
            )
        self._cleaner.close()
        if stopped and self._registry is not None:
            try:
                self._registry.stopped(self.worker_id)
            except _DB_ERRORS:
                logger.warning("could not mark worker stopped", exc_info=True)

    # --- leases ---

    def heartbeat_once(self) -> bool:
        """One round of the lease supervisor: renew every lease in flight and the worker's
        liveness; True if the database answered every statement."""
        return self._supervisor.heartbeat_once()

    def _flights(self) -> list[InFlight]:
        with self._lock:
            return list(self._in_flight.values())

    def _loop_failed(self) -> None:
        """An unexpected error in the claim loop: log it, count it, back off (capped)."""
        self._metrics.loop_errors.labels(loop="claim").inc()
        now = time.monotonic()
        again = now - self._loop_failed_at < self._loop_backoff + 2 * self._config.poll_seconds + 1
        self._loop_backoff = (
            min(self._loop_backoff * 2, 30.0) if again else self._config.poll_seconds
        )
        self._loop_failed_at = now
        logger.exception(
            "claim loop failed; backing off %.1fs",
            self._loop_backoff,
            extra={"worker_id": self.worker_id},
        )
        self._stop.wait(self._loop_backoff)

    # --- slots ---

    def _execute(self, flight: InFlight) -> None:
        """A slot's thread: the attempt owner runs each attempt; the slot then takes the job
        its finalize claimed, if any."""
        current: InFlight | None = flight
        while current is not None:
            try:
                self._owner.run(current)
            finally:
                current = self._leave(current)

    def _leave(self, flight: InFlight) -> InFlight | None:
        """Free the slot, or hand it to the job its finalize claimed (run in this thread)."""
        job, upcoming = flight.job, flight.next_job
        if upcoming is not None:
            following = self._take(upcoming, instead_of=job)
            if following is not None:
                return following
            # Claimed as the worker stopped: back at once, uncharged, for the next owner.
            self._owner.give_back(upcoming)
        else:
            with self._lock:
                self._forget(job)
                self._metrics.slots_busy.set(len(self._in_flight))
            if flight.asked_next and flight.settled:
                # The finalize's own claim found nothing: a claim round now would find nothing
                # too. A new job's notification, or the poll, wakes the loop.
                return None
        self._wake.set()
        return None

    def _forget(self, job: ClaimedJob) -> None:
        """Drop ``job``'s flight (with the lock held), unless the slot is already the next
        attempt's: a lost lease can be re-claimed here before the old attempt has left."""
        flight = self._in_flight.get(job.job_id)
        if flight is not None and flight.job is job:
            del self._in_flight[job.job_id]

    def _next_claim(self) -> NextClaim | None:
        """Where a finalize claims its slot's next job now: a one-queue worker under
        ``run_forever`` that is neither stopping nor sick; else nowhere."""
        if (
            not self._chain
            or self._stop.is_set()
            or self._supervisor.sick.is_set()
            or len(self._config.queues) != 1
        ):
            return None
        assert self._engine_id is not None
        return NextClaim(engine_id=self._engine_id, queue=self._config.queues[0])

    def _engine_trouble(self, why: str) -> float:
        """The engine failed under an attempt: claim nothing until a probe, a backoff step
        later, finds it answering; the run waits as long before anyone adopts it."""
        self._health.trouble(why)
        return self._health.next_delay()
