"""Sync fallback mode: the API runs a tool inline, under a global cap.

A sync run has no job row. The API process that runs it owns it through
``tool_runs.sync_owner`` and renews ``sync_owner_until`` while the tool runs, the way a worker
renews a lease. If that process dies, the run's ownership expires and a ``SyncOrphanSettler``
(in the reaper, and in every API process running in sync mode) takes it over: it finalizes
the run from its exited container, stops it at its deadline, or fails it as ``api_lost`` when
its container is gone or cannot be inspected after the deadline. No sync run stays running.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from runyard.adoption import Action, AdoptionFacts, decide
from runyard.db_errors import Failure, classify, describe
from runyard.fallbacks import crashed_outcome, unstorable_outcomes
from runyard.models import RunStatus
from runyard.queue import ApiQueue, JobQueue, SyncOrphan
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

logger = logging.getLogger(__name__)

# A pool with no connection to give within its timeout counts as a database error too.
_DB_ERRORS = (DBAPIError, PoolTimeoutError)
SYNC_ATTEMPT = 1


def new_owner_id(kind: str) -> str:
    """A process-unique owner id: kind, host, pid and a random suffix (pids are reused)."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _as_api_queue(queue: JobQueue) -> ApiQueue:
    return queue if isinstance(queue, ApiQueue) else ApiQueue(queue.engine)


class SyncLogSink:
    """Live log chunks of a sync run go to its events, fenced by its owner."""

    def __init__(self, queue: ApiQueue, run_id: uuid.UUID, owner: str) -> None:
        self._queue = queue
        self._run_id = run_id
        self._owner = owner

    def resume_point(self, stream: str) -> str | None:
        """Where a previous owner of the run stopped, if anywhere."""
        return self._queue.last_log_position(self._run_id, SYNC_ATTEMPT, stream)

    def write(self, stream: str, text: str, until: str) -> bool:
        """Append a chunk; a passing DB error drops it (the stored log keeps everything)."""
        try:
            return self._queue.append_sync_log(
                self._run_id, owner=self._owner, stream=stream, text_chunk=text, until=until
            )
        except _DB_ERRORS:
            logger.warning("dropped a live log chunk", extra={"run_id": str(self._run_id)})
            return True


class SyncExecutor:
    """Runs sync attempts in the caller's thread; one thread renews what this process owns
    and does nothing else (settling orphans and sweeping are ``runyard.chores``).

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
        renew_queue: ApiQueue | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._queue = queue
        # Renewals may get a small pool of their own, so busy requests never starve them.
        self._renew_queue = renew_queue or queue
        self._runner = runner
        self.max_concurrency = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._lease = lease_seconds
        self.owner_id = owner_id or new_owner_id("api")
        self._lock = threading.Lock()
        self._flights: dict[uuid.UUID, AttemptControl] = {}
        self._busy = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._engine_id: str | None = None
        self._last_renewal = time.monotonic()

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
            return list(self._flights)

    # --- lifecycle ---

    def start(self) -> None:
        """Start the renewal thread."""
        self._thread = threading.Thread(target=self._loop, name="runyard-sync-owner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Walk away from the attempts in flight (their containers keep running and are
        settled from the database by whoever takes them over) and stop renewing."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            controls = list(self._flights.values())
        for control in controls:
            control.abandon.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- cancel ---

    def cancel_local(self, run_id: uuid.UUID) -> bool:
        """Stop the attempt of ``run_id`` if this process runs it."""
        with self._lock:
            control = self._flights.get(run_id)
        if control is None:
            return False
        control.cancel.set()
        return True

    def on_notification(self, run_id: uuid.UUID) -> None:
        """A run changed somewhere; if it runs here, look for a cancel request now."""
        with self._lock:
            mine = run_id in self._flights
        if mine:
            self._wake.set()

    # --- execution ---

    def execute(
        self, run_id: uuid.UUID, tool: dict[str, Any], input_value: Any, control: AttemptControl
    ) -> None:
        """Start, run and finalize the recorded sync run ``run_id`` (blocks until done)."""
        with self._lock:
            self._flights[run_id] = control
        try:
            self._execute(run_id, tool, input_value, control)
        finally:
            with self._lock:
                self._flights.pop(run_id, None)

    def _runner_engine_id(self) -> str:
        if self._engine_id is None:
            self._engine_id = self._runner.engine_id()
        return self._engine_id

    def _execute(
        self, run_id: uuid.UUID, tool: dict[str, Any], input_value: Any, control: AttemptControl
    ) -> None:
        log = {"run_id": str(run_id), "api_id": self.owner_id}
        failure: AttemptResult | None = None
        engine_id: str | None = None
        try:
            engine_id = self._runner_engine_id()
        except RunnerUnavailable as exc:
            logger.warning("container engine unavailable", extra={**log, "error": str(exc)})
            failure = AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.INFRASTRUCTURE,
                error="the container engine is unavailable",
            )
        started = self._queue.start_sync(
            run_id, owner=self.owner_id, engine_id=engine_id, lease_seconds=self._lease
        )
        if started is None:
            logger.warning("sync run no longer ours before it started", extra=log)
            return
        if failure is None and (
            control.cancel.is_set() or self._queue.sync_cancel_requested(run_id)
        ):
            failure = AttemptResult(
                status=RunStatus.CANCELLED,
                error_code=ErrorCode.CANCELLED,
                error="cancelled before it started",
            )
        if failure is not None:
            self._finish(run_id, failure, discard=False)
            return
        spec = AttemptSpec(
            run_id=run_id,
            attempt=SYNC_ATTEMPT,
            tool=tool,
            input=input_value,
            deadline_at=started.deadline_at,
        )
        control.logs = SyncLogSink(self._queue, run_id, self.owner_id)
        logger.info("sync run started", extra={**log, "action": "sync_started"})
        try:
            outcome = self._runner.run(spec, control)
        except AttemptAbandoned:
            logger.warning("sync attempt left to whoever takes the run over", extra=log)
            return
        except RunnerUnavailable as exc:
            logger.warning("container engine failed", extra={**log, "error": str(exc)})
            outcome = AttemptResult(
                status=RunStatus.FAILED,
                error_code=ErrorCode.INFRASTRUCTURE,
                error="the container engine failed while running the tool",
            )
        except Exception as exc:
            logger.exception("sync attempt crashed in the API", extra=log)
            outcome = crashed_outcome(exc)
        self._finish(run_id, outcome, discard=True)

    def _finish(self, run_id: uuid.UUID, outcome: AttemptResult, *, discard: bool) -> None:
        log = {"run_id": str(run_id), "api_id": self.owner_id}
        delay = 0.1
        deadline = time.monotonic() + self._lease
        # The outcome, then (if the database refuses it) safer replacements, each tried once.
        current, fallbacks = outcome, None
        while True:
            try:
                owned = self._queue.finalize_sync(run_id, current, owner=self.owner_id)
                break
            except Exception as exc:
                if classify(exc) is Failure.DETERMINISTIC:
                    logger.error(
                        "the database refused the sync outcome",
                        extra={**log, "error": describe(exc)},
                    )
                    if fallbacks is None:
                        fallbacks = unstorable_outcomes(outcome, exc)
                    if not fallbacks:
                        return
                    current = fallbacks.pop(0)
                    continue
                if time.monotonic() + delay >= deadline:
                    logger.warning(
                        "sync finalize gave up; the run will be settled from its container",
                        extra={**log, "error": describe(exc)},
                    )
                    return
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        outcome = current
        if not owned:
            logger.warning("sync run taken over before finalize", extra=log)
            return
        logger.info(
            "sync run finalized",
            extra={**log, "action": "sync_finalized", "status": outcome.status.value},
        )
        if discard:
            try:
                self._runner.discard(run_id, SYNC_ATTEMPT)
            except RunnerUnavailable as exc:
                logger.warning("cleanup deferred to the sweep", extra={**log, "error": str(exc)})

    # --- ownership ---

    def renew_once(self) -> None:
        """Renew every run in flight; a lost run is abandoned, a cancel request delivered."""
        with self._lock:
            flights = dict(self._flights)
        if not flights:
            self._last_renewal = time.monotonic()
            return
        try:
            owned = self._renew_queue.renew_sync(
                list(flights), owner=self.owner_id, lease_seconds=self._lease
            )
        except _DB_ERRORS as exc:
            logger.warning("sync renewal failed", extra={"error": str(exc)})
            if time.monotonic() - self._last_renewal >= self._lease:
                for control in flights.values():
                    control.abandon.set()
            return
        self._last_renewal = time.monotonic()
        for run_id, control in flights.items():
            if run_id not in owned:
                if not control.abandon.is_set():
                    logger.warning("sync run taken over", extra={"run_id": str(run_id)})
                control.abandon.set()
            elif owned[run_id] and not control.cancel.is_set():
                logger.info("sync cancel requested", extra={"run_id": str(run_id)})
                control.cancel.set()

    def _loop(self) -> None:
        interval = self._lease / 3
        while not self._stop.is_set():
            try:
                self.renew_once()
            except Exception:
                logger.exception("sync renewal crashed")
            self._wake.wait(interval)
            self._wake.clear()


class SyncOrphanSettler:
    """Settles sync runs whose API process stopped renewing them; safe in several copies.

    With a runner on the run's engine it finalizes from the container (collecting an exited
    one, stopping a running one at its deadline); a missing container fails the run as
    ``api_lost`` at once. Without a way to look (no runner, another engine, engine down) it
    waits until ``deadline + lost_grace_seconds`` and then fails the run as ``api_lost``.
    """

    def __init__(
        self,
        queue: JobQueue,
        runner: Runner | None = None,
        *,
        owner_id: str | None = None,
        lease_seconds: float = 30.0,
        lost_grace_seconds: float = 60.0,
    ) -> None:
        self._queue = _as_api_queue(queue)
        self._runner = runner
        self.owner_id = owner_id or new_owner_id("settler")
        self._lease = lease_seconds
        self._grace = lost_grace_seconds

    def run_once(self, *, batch: int = 100, now: datetime | None = None) -> int:
        """One pass over orphaned sync runs; returns how many reached a terminal state."""
        settled = 0
        seen: set[uuid.UUID] = set()
        while True:
            orphans = [
                o
                for o in self._queue.select_sync_orphans(batch=batch, now=now)
                if o.run_id not in seen
            ]
            for orphan in orphans:
                seen.add(orphan.run_id)
                # One orphan that cannot be settled never keeps the others waiting.
                log = {"run_id": str(orphan.run_id)}
                try:
                    if self._settle(orphan, now):
                        settled += 1
                except RunnerUnavailable as exc:
                    logger.warning(
                        "engine unavailable; sync orphan left for the next pass",
                        extra={**log, "error": str(exc)},
                    )
                except _DB_ERRORS as exc:
                    logger.warning(
                        "database error; sync orphan left for the next pass",
                        extra={**log, "error": str(exc)[:300]},
                    )
                except Exception:
                    logger.exception(
                        "settling a sync orphan failed; left for the next pass", extra=log
                    )
            if len(orphans) < batch:
                return settled

    def _engine_state(self, orphan: SyncOrphan) -> ContainerState | None:
        """The container's state, or None when this settler cannot see that engine."""
        if self._runner is None:
            return None
        try:
            if orphan.engine_id is not None and orphan.engine_id != self._runner.engine_id():
                return None
            return self._runner.state(orphan.run_id, SYNC_ATTEMPT)
        except RunnerUnavailable:
            return None

    def _settle(self, orphan: SyncOrphan, now: datetime | None) -> bool:
        clock = now or datetime.now(UTC)
        deadline = orphan.deadline_at or clock
        if orphan.status is RunStatus.QUEUED:
            return self._fail_lost(orphan, "the API process stopped before the tool started", now)
        state = self._engine_state(orphan)
        verdict = decide(
            AdoptionFacts(
                container=state,
                container_requested=True,
                cancel_requested=False,
                deadline_passed=clock >= deadline,
                # Sync runs are never retried: nothing waits in a queue in this mode.
                attempts_left=False,
                # An engine out of reach past the deadline and a grace is given up on.
                engine_dead=state is None and clock >= deadline + timedelta(seconds=self._grace),
                # The settler does not wait on a container still within its time.
                can_wait=False,
            )
        )
        if verdict.action is Action.LOOK_LATER:
            return False
        if verdict.action not in (Action.FINALIZE, Action.RESUME):
            where = "its container is unknown" if state is None else "its container is gone"
            settled = self._fail_lost(
                orphan, f"the API process running the tool stopped; {where}", now
            )
            if settled and verdict.discard:
                self._discard(orphan)
            return settled
        if not self._take_over(orphan, now):
            return False
        assert self._runner is not None
        # An exited container is only collected: the runner would call any exit seen after
        # the deadline a timeout, though the tool may have finished in time.
        collect_deadline = (
            deadline
            if state is ContainerState.RUNNING
            else max(deadline, datetime.now(UTC) + timedelta(days=1))
        )
        spec = AttemptSpec(
            run_id=orphan.run_id,
            attempt=SYNC_ATTEMPT,
            tool=orphan.spec,
            input=orphan.input,
            deadline_at=collect_deadline,
        )
        try:
            outcome = self._runner.run(spec, AttemptControl())
        except AttemptAbandoned:
            return False
        owned = self._queue.finalize_sync(orphan.run_id, outcome, owner=self.owner_id, now=now)
        if owned:
            logger.info(
                "sync orphan finalized from its container",
                extra={"run_id": str(orphan.run_id), "status": outcome.status.value},
            )
            self._discard(orphan)
        return owned

    def _take_over(self, orphan: SyncOrphan, now: datetime | None) -> bool:
        return self._queue.take_over_sync(
            orphan.run_id, owner=self.owner_id, lease_seconds=self._lease, now=now
        )

    def _fail_lost(self, orphan: SyncOrphan, why: str, now: datetime | None) -> bool:
        if not self._take_over(orphan, now):
            return False
        outcome = AttemptResult(status=RunStatus.FAILED, error_code=ErrorCode.API_LOST, error=why)
        owned = self._queue.finalize_sync(orphan.run_id, outcome, owner=self.owner_id, now=now)
        if owned:
            logger.warning("sync run failed as lost", extra={"run_id": str(orphan.run_id)})
        return owned

    def _discard(self, orphan: SyncOrphan) -> None:
        if self._runner is None:
            return
        try:
            self._runner.discard(orphan.run_id, SYNC_ATTEMPT)
        except RunnerUnavailable as exc:
            logger.warning("cleanup deferred to the sweep", extra={"error": str(exc)})
