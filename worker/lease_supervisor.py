"""The worker's lease supervisor: heartbeat rounds, leases not renewed in time handed over,
calls that stop answering cut. It waits on no database call itself."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from runyard.attempts.flight import Flight, LeaseClock, log_fields
from runyard.attempts.owner import AttemptOwner
from runyard.domain.errors import describe
from runyard.platform.faults import HEARTBEAT_ERROR, raise_point
from runyard.queue import JobQueue
from runyard.queue.workers import WorkerRegistry
from runyard.reads.metrics import Metrics
from worker.bounded import OneAtATime
from worker.config import WorkerConfig
from worker.connection_watch import ConnectionWatch

logger = logging.getLogger(__name__)

# A connection busy this much longer than the statement timeout has a silent peer: the server
# would have cancelled the statement and answered by then.
STUCK_SLACK_SECONDS = 5.0


class LeaseSupervisor:
    """One thread that starts each heartbeat round on a thread of its own and never waits on
    the database: a silent connection cannot hold it, and no exception ends it."""

    def __init__(
        self,
        owner: AttemptOwner,
        flights: Callable[[], list[Flight]],
        *,
        config: WorkerConfig,
        heartbeat_queue: JobQueue,
        registry: WorkerRegistry | None,
        metrics: Metrics,
        clock: LeaseClock,
        engine_healthy: Callable[[], bool],
        watches: list[ConnectionWatch],
        stopped: threading.Event,
    ) -> None:
        self._owner = owner
        # The attempts in flight now (a snapshot the worker takes under its lock).
        self._flights = flights
        self._config = config
        self._heartbeat_queue = heartbeat_queue
        self._registry = registry
        self._metrics = metrics
        self._clock = clock
        self._engine_healthy = engine_healthy
        self._watches = watches
        self._stopped = stopped
        # Set while leases cannot be renewed: the runs were handed over, claims are paused.
        self.sick = threading.Event()
        self._rounds = OneAtATime("runyard-heartbeat-round")
        self._releases = OneAtATime("runyard-heartbeat-release")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # Set to cut the loop's pause short (``join``).
        self._wake = threading.Event()
        # Attempts handed over for want of renewals whose release the database has not answered.
        self._to_release: dict[int, Flight] = {}

    def start(self) -> None:
        """Start the supervising thread (a second call does nothing: two loops would share one
        round, and the later would count the other's as a round not renewed)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="runyard-heartbeat", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> bool:
        """Once stopped with nothing in flight: wait up to ``timeout`` seconds each for the
        loop and its last round and release, so none holds a connection past its worker.
        True if all ended."""
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        ended = self._thread is None or not self._thread.is_alive()
        return all([ended, self._rounds.join(timeout), self._releases.join(timeout)])

    def _live(self) -> list[Flight]:
        """The flights whose leases are still renewed: neither settled nor abandoned."""
        return [f for f in self._flights() if not f.settled and not f.control.abandon.is_set()]

    def heartbeat_once(self) -> bool:
        """One round: renew every lease in flight (a lost lease or a cancel reaches its
        attempt) and the worker's liveness; True if the database answered every statement."""
        raise_point(HEARTBEAT_ERROR)
        answered = True
        for flight in self._live():
            answered = self._owner.renew(flight) and answered
        # Not seen while the engine does not answer: the reaper may then move its runs on.
        if self._registry is not None and self._engine_healthy():
            try:
                asked = datetime.now(UTC)
                seen_at = self._registry.seen(self._config.worker_id)
            except Exception as exc:
                answered = False
                logger.warning(
                    "could not record worker liveness",
                    extra={"worker_id": self._config.worker_id, "error": describe(exc)},
                )
            else:
                if seen_at is not None:
                    self._clock.sample(asked, seen_at)
        return answered

    def _expire_overdue(self) -> bool:
        """A lease not renewed in time: hand every run over and pause claims until a heartbeat
        round is answered again. True if runs were handed over."""
        now = time.monotonic()
        live = self._live()
        if not any(now >= f.lease_valid_until for f in live):
            return False
        if not self.sick.is_set():
            self.sick.set()
            self._metrics.claiming.set(0)
            self._metrics.handovers.inc()
            logger.error(
                "leases could not be renewed in time: handing %d run(s) over, claims paused",
                len(live),
                extra={"worker_id": self._config.worker_id, "action": "hand_over"},
            )
        for flight in live:
            self._owner.lose(flight, "not renewed in time; left to the next owner")
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

    def _release_all(self, flights: list[Flight]) -> None:
        for flight in flights:
            job = flight.job
            extra = log_fields(job, self._config.worker_id)
            try:
                released = self._heartbeat_queue.release(job.job_id, job.lease_token)
            except Exception as exc:
                logger.warning("release failed; retrying", extra={**extra, "error": describe(exc)})
                continue
            with self._lock:
                self._to_release.pop(id(flight), None)
            if released:
                logger.info("handed-over run released", extra={**extra, "action": "released"})

    def _start_round(self) -> None:
        """Start a heartbeat round on its own thread; one still running counts as failed."""
        if not self._rounds.start(self._round):
            self._metrics.heartbeat_failures.inc()
            logger.warning(
                "the previous heartbeat round is still waiting on the database;"
                " counted as not renewed",
                extra={"worker_id": self._config.worker_id},
            )

    def _round(self) -> None:
        try:
            answered = self.heartbeat_once()
        except Exception as exc:
            answered = False
            logger.error(
                "heartbeat round failed; counted as not renewed",
                exc_info=exc,
                extra={"worker_id": self._config.worker_id, "error": describe(exc)},
            )
        if not answered:
            self._metrics.heartbeat_failures.inc()
        elif self.sick.is_set():
            self.sick.clear()
            self._metrics.claiming.set(1)
            logger.warning(
                "heartbeats answered again: claims resume",
                extra={"worker_id": self._config.worker_id},
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
                    extra={"worker_id": self._config.worker_id, "connections_cut": cut},
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
                extra={"worker_id": self._config.worker_id},
            )
        return cut

    def _loop(self) -> None:
        """Supervise the leases: a round every interval on its own thread, leases not renewed
        in time handed over, calls that do not answer cut. It ends once stopped and idle
        (after ``stop()`` the leases of attempts still running are renewed: drain)."""
        next_round = time.monotonic()
        stuck_after = self._config.statement_timeout_seconds + STUCK_SLACK_SECONDS
        while True:
            try:
                if self._stopped.is_set() and not self._flights():
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
            self._wake.wait(pause)
            self._wake.clear()

    def _until_next_check(self, next_round: float) -> float:
        """Until the next round, the first lease to run out or a call's deadline (<= 1 s)."""
        now = time.monotonic()
        wake = next_round
        for flight in self._live():
            wake = min(wake, flight.lease_valid_until)
        for calls in (self._rounds, self._releases):
            ran = calls.busy_for()
            if ran is not None and ran <= self._config.heartbeat_timeout:
                wake = min(wake, now + self._config.heartbeat_timeout - ran)
        return min(max(wake - now, 0.01), 1.0)
