"""The worker: claims jobs for free slots while its engine answers, runs each attempt,
renews its leases (handing every run over when it cannot), finalizes once."""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.artifact_store import ArtifactStore
from runyard.artifacts.publish import drop_unpublished
from runyard.domain.adoption import Action, AdoptionFacts, Verdict, decide
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.errors import describe
from runyard.domain.fallbacks import CANCELLED_BEFORE_START, crashed_outcome, unstorable_outcomes
from runyard.domain.states import ContainerState, ErrorCode, RunStatus
from runyard.held import Held, QueueLogSink
from runyard.maintenance.sweep import Sweeper
from runyard.platform.db_errors import Failure, classify
from runyard.platform.faults import (
    BEFORE_CREATE,
    BEFORE_FINALIZE,
    HEARTBEAT_ERROR,
    crash_point,
    pause_point,
    raise_point,
)
from runyard.queue import ClaimedJob, JobQueue
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptAbandoned, LogSink, Runner, RunnerUnavailable
from worker.bounded import OneAtATime
from worker.builds import BuildAgent
from worker.cleanup import Cleaner
from worker.connection_watch import ConnectionWatch
from worker.engine_health import EngineHealth

logger = logging.getLogger(__name__)

_DB_ERRORS = (OperationalError, DBAPIError)

# A connection busy this much longer than the statement timeout has a silent peer: the server
# would have cancelled the statement and answered by then.
STUCK_SLACK_SECONDS = 5.0


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
    # Bound of one heartbeat round, and the part of the lease held in reserve: the worker
    # stops acting as owner this long before the lease it last renewed runs out.
    # None: half of the smaller of the interval and the lease left after one interval.
    heartbeat_timeout_seconds: float | None = None
    # The server-side timeout of the worker's statements (0: none).
    statement_timeout_seconds: float = 30.0

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds one heartbeat round may take; also the lease's safety margin."""
        if self.heartbeat_timeout_seconds is not None:
            return self.heartbeat_timeout_seconds
        room = min(self.heartbeat_seconds, self.lease_seconds - self.heartbeat_seconds)
        return max(room / 2, 0.1)

    # While the engine does not answer: probes (and re-adoptions) back off from base to max.
    engine_backoff_base_seconds: float = 1.0
    engine_backoff_max_seconds: float = 30.0
    # How the runner gives attempts their input ("host" or "upload"), for the start log.
    inputs: str = "upload"


@dataclass
class InFlight(Held):
    """A job a worker slot holds, with what the slot itself keeps of it."""

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


class FencedLogSink:
    """A log sink that stops the stream as soon as this process is no longer the owner."""

    def __init__(self, sink: LogSink, owns: Callable[[], bool]) -> None:
        self._sink = sink
        self._owns = owns

    def resume_point(self, stream: str) -> str | None:
        """Where the previous owner of this attempt stopped, if anywhere."""
        return self._sink.resume_point(stream)

    def write(self, stream: str, text: str, until: str) -> bool:
        """Append a chunk while we own the attempt; False (stop sending) once we do not."""
        return self._owns() and self._sink.write(stream, text, until)


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
    ) -> None:
        self._queue = queue
        # Builds of the tools built from source that the runs of this engine wait for.
        self._builds = builds
        # Where attempts keep the files their tools leave under /runyard/out (None: nowhere).
        self._artifacts = artifacts
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
        # Set while leases cannot be renewed: the runs were handed over, claims are paused.
        self._sick = threading.Event()
        # Database clock minus ours (seconds), from the last heartbeat; None until measured.
        self._db_offset: float | None = None
        self._rounds = OneAtATime("runyard-heartbeat-round")
        self._releases = OneAtATime("runyard-heartbeat-release")
        # Attempts handed over for want of renewals whose release the database has not answered.
        self._to_release: dict[int, InFlight] = {}
        self._loop_failed_at = 0.0
        self._loop_backoff = config.poll_seconds
        if builds is not None:
            builds.bind(self._health.trouble, self._wake.set)
        self._watches = [ConnectionWatch(queue.engine)]
        if self._heartbeat_queue.engine is not queue.engine:
            self._watches.append(ConnectionWatch(self._heartbeat_queue.engine))

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
            self._registry.register(
                self.worker_id,
                self._engine_id,
                self._config.concurrency,
                queues=self._config.queues,
            )
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
        idle = free <= 0 and self._builds is None
        if idle or self._stop.is_set() or self._sick.is_set():
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
        flight = InFlight(job=job, lease_valid_until=time.monotonic() + self._config.lease_seconds)
        flight.control.logs = QueueLogSink(self._queue, job)
        flight.control.artifacts = self._artifacts
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
        if self._builds is not None:
            self._builds.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._cleaner.close()
        if stopped and self._registry is not None:
            try:
                self._registry.stopped(self.worker_id)
            except _DB_ERRORS:
                logger.warning("could not mark worker stopped", exc_info=True)

    # --- heartbeats ---

    def heartbeat_once(self) -> bool:
        """One round: renew every lease in flight (a lost lease or a cancel reaches its
        attempt) and the worker's liveness; True if the database answered every statement."""
        raise_point(HEARTBEAT_ERROR)
        with self._lock:
            flights = list(self._in_flight.values())
        answered = True
        for flight in flights:
            if not flight.settled and not flight.control.abandon.is_set():
                answered = self._renew(flight) and answered
        # Not seen while the engine does not answer: the reaper may then move its runs on.
        if self._registry is not None and self.engine_healthy:
            try:
                asked = datetime.now(UTC)
                seen_at = self._registry.seen(self.worker_id)
            except Exception as exc:
                answered = False
                logger.warning(
                    "could not record worker liveness",
                    extra={"worker_id": self.worker_id, "error": describe(exc)},
                )
            else:
                if seen_at is not None:
                    self._clock_sample(asked, seen_at)
        return answered

    def _renew(self, flight: InFlight) -> bool:
        """Renew one lease; False if the database did not answer."""
        job = flight.job
        sent, asked = time.monotonic(), datetime.now(UTC)
        try:
            beat = self._heartbeat_queue.heartbeat(
                job.job_id, job.lease_token, lease_seconds=self._config.lease_seconds
            )
        except Exception as exc:
            logger.warning("heartbeat failed", extra=self._log(job, error=describe(exc)))
            return False
        if not beat.owned:
            if not flight.finalizing:
                self._lose(flight, "lease taken away")
            return True
        if beat.db_now is not None:
            self._clock_sample(asked, beat.db_now)
        # The database set locked_until = its now + lease, and its now came after ``sent``.
        valid = sent + self._config.lease_seconds - self._config.heartbeat_timeout
        with self._lock:
            # An answer that comes after the lease already counts as lost revives nothing.
            if not flight.control.abandon.is_set() and time.monotonic() < flight.lease_valid_until:
                flight.lease_valid_until = max(flight.lease_valid_until, valid)
        if beat.cancel_requested and not flight.control.cancel.is_set():
            logger.info("cancel requested", extra=self._log(job, action="cancel"))
            flight.control.cancel.set()
        return True

    def _clock_sample(self, asked: datetime, db_now: datetime) -> None:
        """Learn the database clock's offset from a statement that returned its ``now()``."""
        answered = datetime.now(UTC)
        self._db_offset = (db_now - (asked + (answered - asked) / 2)).total_seconds()
        self._metrics.db_clock_offset.set(self._db_offset)

    def _db_now(self) -> datetime:
        """Now on the database's clock, as the heartbeats measure it."""
        return datetime.now(UTC) + timedelta(seconds=self._db_offset or 0.0)

    def _owns(self, flight: InFlight) -> bool:
        """Whether this process may still act as the attempt's owner (no database asked)."""
        return not flight.control.abandon.is_set() and time.monotonic() < flight.lease_valid_until

    def _lose(self, flight: InFlight, why: str) -> None:
        if not flight.control.abandon.is_set():
            self._metrics.leases_lost.inc()
            logger.warning("lease lost: %s", why, extra=self._log(flight.job, action="lease_lost"))
            flight.control.abandon.set()

    def _expire_overdue(self) -> bool:
        """A lease not renewed in time: hand every run over and pause claims until a heartbeat
        round is answered again. True if runs were handed over."""
        now = time.monotonic()
        with self._lock:
            live = [
                f
                for f in self._in_flight.values()
                if not f.settled and not f.control.abandon.is_set()
            ]
        if not any(now >= f.lease_valid_until for f in live):
            return False
        if not self._sick.is_set():
            self._sick.set()
            self._metrics.claiming.set(0)
            self._metrics.handovers.inc()
            logger.error(
                "leases could not be renewed in time: handing %d run(s) over, claims paused",
                len(live),
                extra={"worker_id": self.worker_id, "action": "hand_over"},
            )
        for flight in live:
            self._lose(flight, "not renewed in time; left to the next owner")
            with self._lock:
                self._to_release[id(flight)] = flight
        return True

    def _start_releases(self) -> None:
        """Release the leases of handed-over attempts, so they are adoptable at once.

        Their slots may still be finishing a Docker call: every owner write is fenced by the
        lease token, and a create or start by ``still_owner``, which asks the database.
        """
        with self._lock:
            ready = list(self._to_release.values())
        if ready:
            self._releases.start(functools.partial(self._release_all, ready))

    def _release_all(self, flights: list[InFlight]) -> None:
        for flight in flights:
            job = flight.job
            try:
                released = self._heartbeat_queue.release(job.job_id, job.lease_token)
            except Exception as exc:
                logger.warning(
                    "release failed; retrying", extra=self._log(job, error=describe(exc))
                )
                continue
            with self._lock:
                self._to_release.pop(id(flight), None)
            if released:
                logger.info("handed-over run released", extra=self._log(job, action="released"))

    def _start_round(self) -> None:
        """Start a heartbeat round on its own thread; one still running counts as failed."""
        if not self._rounds.start(self._round):
            self._metrics.heartbeat_failures.inc()
            logger.warning(
                "the previous heartbeat round is still waiting on the database;"
                " counted as not renewed",
                extra={"worker_id": self.worker_id},
            )

    def _round(self) -> None:
        try:
            answered = self.heartbeat_once()
        except Exception as exc:
            answered = False
            logger.error(
                "heartbeat round failed; counted as not renewed",
                exc_info=exc,
                extra={"worker_id": self.worker_id, "error": describe(exc)},
            )
        if not answered:
            self._metrics.heartbeat_failures.inc()
        elif self._sick.is_set():
            self._sick.clear()
            self._metrics.claiming.set(1)
            logger.warning(
                "heartbeats answered again: claims resume", extra={"worker_id": self.worker_id}
            )

    def _cut_overdue_calls(self) -> None:
        """A round or release that has not answered within the round timeout is waiting on a
        silent connection: cut it, so the call fails and the next one connects afresh."""
        limit = self._config.heartbeat_timeout
        for calls, what in ((self._rounds, "heartbeat round"), (self._releases, "release")):
            if calls.overdue(limit):
                cut = self._cut(calls.thread_id)
                logger.warning(
                    "%s not answered within %gs; its connection is cut",
                    what,
                    limit,
                    extra={"worker_id": self.worker_id, "connections_cut": cut},
                )

    def _cut(self, thread_id: int | None = None, older_than: float | None = None) -> int:
        """Cut the database connections held by a stuck thread, or busy for too long."""
        cut = 0
        for watch in self._watches:
            if thread_id is not None:
                cut += watch.cut(thread_id=thread_id)
            if older_than is not None:
                cut += watch.cut(older_than=older_than)
        if cut:
            self._metrics.connections_cut.inc(cut)
            logger.warning(
                "cut %d database connection(s) that stopped answering",
                cut,
                extra={"worker_id": self.worker_id},
            )
        return cut

    def _heartbeat_loop(self) -> None:
        """Supervise the leases: a round every interval on its own thread, leases not renewed
        in time handed over, calls that do not answer cut. It waits on no database call, so
        a silent connection cannot hold it; no exception ends it. It ends once stopped and
        idle (after ``stop()`` the leases of attempts still running are renewed: drain)."""
        next_round = time.monotonic()
        stuck_after = self._config.statement_timeout_seconds + STUCK_SLACK_SECONDS
        while True:
            try:
                with self._lock:
                    idle = not self._in_flight
                if self._stop.is_set() and idle:
                    return
                self._cut_overdue_calls()
                due = time.monotonic() >= next_round
                if due:
                    next_round = time.monotonic() + self._config.heartbeat_seconds
                    self._start_round()
                if self._expire_overdue() or due:
                    self._start_releases()
                if self._config.statement_timeout_seconds > 0:
                    self._cut(older_than=stuck_after)
                pause = self._until_next_check(next_round)
            except Exception:
                self._metrics.loop_errors.labels(loop="heartbeat").inc()
                logger.exception("heartbeat supervisor failed; carrying on")
                pause = min(self._config.heartbeat_seconds, 1.0)
            time.sleep(pause)

    def _until_next_check(self, next_round: float) -> float:
        """Until the next round, the first lease to run out or a call's deadline (<= 1 s)."""
        now = time.monotonic()
        wake = next_round
        with self._lock:
            for flight in self._in_flight.values():
                if not flight.settled and not flight.control.abandon.is_set():
                    wake = min(wake, flight.lease_valid_until)
        for calls in (self._rounds, self._releases):
            ran = calls.busy_for()
            if ran is not None and ran <= self._config.heartbeat_timeout:
                wake = min(wake, now + self._config.heartbeat_timeout - ran)
        return min(max(wake - now, 0.01), 1.0)

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

    # --- execution ---

    def _execute(self, flight: InFlight) -> None:
        current: InFlight | None = flight
        while current is not None:
            try:
                self._arm(current)
                self._execute_attempt(current)
            except Exception as exc:
                self._crashed(current, exc)
            finally:
                current = self._leave(current)

    def _arm(self, flight: InFlight) -> None:
        """Give the attempt its owner's hooks, and the lease the safety margin it keeps."""
        job, control = flight.job, flight.control
        margin = self._config.heartbeat_timeout
        if self._db_offset is not None:
            left = (job.locked_until - self._db_now()).total_seconds()
            valid = time.monotonic() + left - margin
        else:
            valid = flight.lease_valid_until - margin
        with self._lock:
            flight.lease_valid_until = min(flight.lease_valid_until, valid)
        # Counted: an attempt given back before its first start was asked for is not charged.
        control.still_owner = _counting(flight, functools.partial(self._still_owner, flight))
        control.clock = self._db_now
        control.note = functools.partial(self._note, flight)
        if control.logs is not None and not isinstance(control.logs, FencedLogSink):
            control.logs = FencedLogSink(control.logs, functools.partial(self._owns, flight))

    def _still_owner(self, flight: InFlight) -> bool:
        """Asked before each Docker action: is the lease ours? The database's answer when it
        gives one; when it cannot, the lease clock's (see docs/workers.md)."""
        if not self._owns(flight):
            return False
        job = flight.job
        try:
            held = self._queue.lease_held(job.job_id, job.lease_token)
        except Exception as exc:
            # Only an expired lease is ever cleared by someone else, and ours has not expired
            # on the lease clock; refusing would turn a database hiccup into a lost attempt.
            logger.warning(
                "could not confirm the lease; the lease clock says it holds",
                extra=self._log(job, error=describe(exc)),
            )
            return self._owns(flight)
        if not held:
            self._lose(flight, "not held when checked before a Docker action")
            return False
        return self._owns(flight)

    def _note(self, flight: InFlight, kind: str, data: dict[str, Any]) -> None:
        """Record a run event for the attempt under its lease; never raises into the runner."""
        if not self._owns(flight):
            return
        job = flight.job
        try:
            self._queue.record_event(job.job_id, job.lease_token, kind, data)
        except Exception as exc:
            logger.warning(
                "could not record a run event",
                extra=self._log(job, event=kind, error=describe(exc)),
            )

    def _crashed(self, flight: InFlight, exc: Exception) -> None:
        """Settle an attempt the worker's own code raised on: a passing error gives the lease
        back, anything else fails the run (it would crash the same way on every adoption)."""
        job = flight.job
        try:
            logger.error(
                "attempt crashed in the worker",
                exc_info=exc,
                extra=self._log(job, error=describe(exc)),
            )
            if flight.settled or flight.control.abandon.is_set():
                return
            if isinstance(exc, RunnerUnavailable) or classify(exc) is Failure.TRANSIENT:
                self._release(flight, describe(exc), engine=isinstance(exc, RunnerUnavailable))
            else:
                self._finalize(flight, crashed_outcome(exc))
        except Exception:
            logger.exception("could not settle a crashed attempt; its lease will run out")

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
            self._finalize(flight, CANCELLED_BEFORE_START)
            return
        if not job.container_requested and not self._mark_container_requested(flight):
            return
        spec = AttemptSpec(
            run_id=job.run_id,
            attempt=job.attempt,
            tool=job.spec,
            input=job.input,
            deadline_at=job.deadline_at,
            deps=job.deps,
            dep_artifacts=job.dep_artifacts,
        )
        if job.cancel_requested:
            # Adopted after a cancel: a container a dead owner stopped for it ends cancelled.
            flight.control.cancel.set()
        pause_point(BEFORE_CREATE)
        try:
            outcome = self._runner.run(spec, flight.control)
        except AttemptAbandoned:
            logger.info("attempt left to its next owner", extra=self._log(job, action="abandon"))
            return
        except RunnerUnavailable as exc:
            self._release(flight, str(exc))
            return
        except Exception as exc:
            if classify(exc) is Failure.TRANSIENT:
                # The database failed under the artifacts' writes: the next owner collects.
                self._release(flight, describe(exc), engine=False)
                return
            logger.error(
                "the runner crashed; failing the run",
                exc_info=exc,
                extra=self._log(job, error=describe(exc)),
            )
            outcome = crashed_outcome(exc)
        crash_point(BEFORE_FINALIZE)
        self._finalize(flight, outcome)

    def _mark_container_requested(self, flight: InFlight) -> bool:
        """Record the start under the lease, retrying passing errors for at most a lease while
        it holds; a cancel or the deadline arriving meanwhile ends the run without a start."""
        job = flight.job
        delay = 0.1
        give_up_at = time.monotonic() + self._config.lease_seconds
        while self._owns(flight):
            ended = self._ended_before_start(flight)
            if ended is not None:
                self._finalize(flight, ended)
                return False
            try:
                if self._queue.mark_container_requested(job.job_id, job.lease_token):
                    return True
                logger.warning(
                    "lease lost before the start", extra=self._log(job, action="lease_lost")
                )
                return False
            except Exception as exc:
                if classify(exc) is Failure.DETERMINISTIC:
                    raise
                if time.monotonic() + delay >= min(flight.lease_valid_until, give_up_at):
                    # Unmarked: adoption puts it back without charging it.
                    logger.warning(
                        "could not record the start", extra=self._log(job, error=describe(exc))
                    )
                    if self._owns(flight):
                        self._release(flight, "the start could not be recorded", engine=False)
                    return False
                flight.control.abandon.wait(delay)
                delay = min(delay * 2, 2.0)
        return False

    def _ended_before_start(self, flight: InFlight) -> AttemptResult | None:
        """The outcome of an attempt cancelled or past its deadline before its start."""
        if flight.control.cancel.is_set():
            return CANCELLED_BEFORE_START
        if self._db_now() >= flight.job.deadline_at:
            return AttemptResult(
                status=RunStatus.TIMED_OUT,
                error_code=ErrorCode.TIMED_OUT,
                error="the deadline passed before the container could be started",
            )
        return None

    def _settle_adopted(self, flight: InFlight, state: ContainerState, verdict: Verdict) -> None:
        """No container will finish the adopted attempt: put it back, charged or not."""
        job = flight.job
        if verdict.action is Action.LOOK_LATER:
            self._release(
                flight, f"nothing to decide with the container {state.value}", engine=False
            )
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

    def _release(self, flight: InFlight, why: str, *, engine: bool = True) -> None:
        """Decide nothing: give the lease back. For engine trouble (``engine``), adoptable
        again after a backoff step; for database trouble, at once."""
        job = flight.job
        if not engine:
            logger.warning("releasing lease: %s", why, extra=self._log(job, action="released"))
            try:
                self._queue.release(job.job_id, job.lease_token)
            except _DB_ERRORS:
                logger.warning("release failed; the reaper will clear the lease", exc_info=True)
            return
        # The worker claims nothing until a probe, a backoff step later, finds the engine
        # answering; and no one adopts the run before then: a failing engine costs each run
        # one release per backoff step, not an adoption and a release per poll.
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

    def _commit_outcome(self, flight: InFlight, outcome: AttemptResult, *, chain: bool) -> bool:
        """FINALIZE, or with ``chain`` FINALIZE_AND_CLAIM: the slot's next job comes with it."""
        job = flight.job
        if not chain:
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

    def _may_chain(self) -> bool:
        """A one-queue worker under ``run_forever`` that is neither stopping nor sick."""
        return (
            self._chain
            and not self._stop.is_set()
            and not self._sick.is_set()
            and len(self._config.queues) == 1
        )

    def _finalize(self, flight: InFlight, outcome: AttemptResult) -> None:
        """Commit the outcome (or what can be stored instead), then clean up."""
        job = flight.job
        flight.finalizing = True
        committed = self._store(flight, outcome)
        if committed is None or committed.artifact_set != outcome.artifact_set:
            # A set no committed outcome names is read by no one: it goes now.
            drop_unpublished(
                self._queue.engine,
                self._artifacts,
                job.run_id,
                outcome.artifact_set,
                self._log(job),
            )
        if committed is None:
            return
        flight.settled = True
        self.finalized += 1
        self._metrics.outcomes.labels(
            status=committed.status.value, error_code=committed.error_code or ""
        ).inc()
        self._metrics.attempts.observe(job.attempt)
        if job.started_at is not None:
            elapsed = (datetime.now(UTC) - job.started_at).total_seconds()
            self._metrics.duration.observe(max(elapsed, 0.0))
        logger.info(
            "run finalized",
            extra=self._log(job, action="finalized", status=committed.status.value),
        )
        self._cleaner.discard(job.run_id, job.attempt)

    def _store(self, flight: InFlight, outcome: AttemptResult) -> AttemptResult | None:
        """The outcome committed, or None (lease lost, or given up to adoption).

        A passing error is retried for at most a lease while we own the attempt. A
        deterministic one is never retried as is: the run is failed as ``internal_error``
        with what can be stored (the streams as they are, cleaned, then none).
        """
        job = flight.job
        plan = [(outcome, self._may_chain())]
        if plan[0][1]:
            plan.append((outcome, False))  # the refusal may be the claim's, not the outcome's
        refused = False
        give_up_at = time.monotonic() + self._config.lease_seconds
        delay = 0.1
        step = 0
        while step < len(plan):
            candidate, chain = plan[step]
            if not self._owns(flight):
                logger.warning("not finalizing: lease lost", extra=self._log(job))
                return None
            try:
                owned = self._commit_outcome(flight, candidate, chain=chain)
            except Exception as exc:
                if classify(exc) is Failure.TRANSIENT:
                    if time.monotonic() + delay >= min(flight.lease_valid_until, give_up_at):
                        logger.warning(
                            "finalize gave up; adoption will finish the run",
                            extra=self._log(job, error=describe(exc)),
                        )
                        if self._owns(flight):
                            self._release(
                                flight, "the outcome could not be committed", engine=False
                            )
                        return None
                    flight.control.abandon.wait(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                logger.error(
                    "the database refused the outcome",
                    extra=self._log(job, error=describe(exc), step=step),
                )
                if not refused:
                    refused = True
                    self._metrics.unstorable_outcomes.inc()
                    plan.extend((fallback, False) for fallback in unstorable_outcomes(outcome, exc))
                step += 1
                continue
            if not owned:
                self._metrics.leases_lost.inc()
                logger.warning(
                    "lease lost before finalize", extra=self._log(job, action="lease_lost")
                )
                return None
            return candidate
        logger.critical("no outcome could be stored; releasing the lease", extra=self._log(job))
        self._release(flight, "no outcome could be stored", engine=False)
        return None
