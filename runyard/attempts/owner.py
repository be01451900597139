"""The one owner of an attempt held under its job's lease.

A worker's slot and a sync-mode API process both hand it their attempts: it arms the
attempt's control (a log sink fenced by ownership, the artifact store, ``still_owner``, the
database clock, ``note``), checks and renews the lease, runs the attempt fresh or adopts it by
the adoption rule, records the start, and settles it: the finalize with its fallbacks, or the
lease given back. ``OwnerPolicy`` says where the two differ; the holder keeps its slots, its
claims and the loop that calls ``renew``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from runyard.artifact_store import ArtifactStore
from runyard.artifacts.publish import drop_unpublished
from runyard.attempts.flight import FencedLogSink, Flight, LeaseClock, counting, log_fields
from runyard.attempts.held import QueueLogSink
from runyard.attempts.metering import UsageRecorder
from runyard.attempts.policy import OwnerPolicy
from runyard.attempts.traced import trace_build_wait, trace_finalize, traced_attempt
from runyard.domain.adoption import Action, AdoptionFacts, Verdict, decide
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.errors import describe
from runyard.domain.fallbacks import CANCELLED_BEFORE_START, crashed_outcome, unstorable_outcomes
from runyard.domain.states import ContainerState, ErrorCode, RunStatus
from runyard.platform.db_errors import Failure, classify
from runyard.platform.faults import BEFORE_CREATE, BEFORE_FINALIZE, crash_point, pause_point
from runyard.platform.tracing import tracing
from runyard.queue import ClaimedJob, JobQueue
from runyard.queue.builds import BuildQueue
from runyard.queue.completer import BatchCompleter
from runyard.queue.values import ClaimFor
from runyard.reads.metrics import Metrics
from runyard.runner import AttemptAbandoned, Runner, RunnerUnavailable
from runyard.usage.ledger import UsageLedger

logger = logging.getLogger(__name__)

# A fresh attempt whose engine failed under it, when its caller waits for the answer.
ENGINE_FAILED = AttemptResult(
    status=RunStatus.FAILED,
    error_code=ErrorCode.INFRASTRUCTURE,
    error="the container engine failed while running the tool",
)

# What a give-back that fails may raise: a pool with no connection to give within its
# timeout counts as a database error too.
DB_ERRORS = (DBAPIError, PoolTimeoutError)


@dataclass(frozen=True)
class NextClaim:
    """Where a finalize that also claims its slot's next job claims it from."""

    engine_id: str
    queue: str


def _no_next_claim() -> NextClaim | None:
    return None


class AttemptOwner:
    """Owns attempts under their leases for one process; thread-safe, one call per slot."""

    def __init__(
        self,
        queue: JobQueue,
        runner: Runner,
        policy: OwnerPolicy,
        *,
        owner_id: str,
        clock: LeaseClock,
        metrics: Metrics,
        engine_trouble: Callable[[str], float],
        heartbeat_queue: JobQueue | None = None,
        artifacts: ArtifactStore | None = None,
        cleanup: Callable[[uuid.UUID, int], None] | None = None,
        next_claim: Callable[[], NextClaim | None] = _no_next_claim,
        usage: UsageLedger | None = None,
        completer: BatchCompleter | None = None,
    ) -> None:
        self.policy = policy
        self.owner_id = owner_id
        self.clock = clock
        self._queue = queue
        # Renewals may go through a pool of their own, so busy slots never starve a lease.
        self._heartbeat_queue = heartbeat_queue or queue
        self._runner = runner
        self._metrics = metrics
        # Told what failed when the engine fails under an attempt; answers how many seconds
        # the run waits before it may be adopted again.
        self._engine_trouble = engine_trouble
        self._artifacts = artifacts
        # Removes a finalized attempt's container (inline unless the holder defers it).
        self._cleanup = cleanup or self._discard_now
        # Where the finalize claims the slot's next job now, if anywhere (``policy.chains``).
        self._next_claim = next_claim
        # Sends the finalizes of several slots as one statement (a worker's); else each goes
        # through the queue on its own.
        self._completer = completer
        # Each attempt's usage is recorded under its lease, before its finalize.
        self._usage = UsageRecorder(
            usage or UsageLedger(queue.engine), metrics, policy.retry_budget_seconds, owner_id
        )
        # Read only for a traced attempt's build wait.
        self._builds = BuildQueue(queue.engine)
        self._lock = threading.Lock()
        self.finalized = 0

    def _log(self, job: ClaimedJob, **more: object) -> dict[str, object]:
        return log_fields(job, self.owner_id, **more)

    # --- holding ---

    def hold(self, job: ClaimedJob) -> Flight:
        """A claimed job as a flight: its lease from now, its logs, artifacts and cancel."""
        flight = Flight(job=job, lease_valid_until=time.monotonic() + self.policy.lease_seconds)
        flight.control.logs = QueueLogSink(self._queue, job)
        flight.control.artifacts = self._artifacts
        if job.cancel_requested:
            flight.control.cancel.set()
        return flight

    def run(self, flight: Flight) -> None:
        """Own the attempt from its arming to its settlement, in the caller's thread; a crash
        of the owner's own code is settled here too (never raised)."""
        try:
            self.arm(flight)
            with traced_attempt(flight.job, self.owner_id):
                trace_build_wait(flight.job, self._runner.engine_id, self._builds)
                self._attempt(flight)
        except Exception as exc:
            self._crashed(flight, exc)

    def arm(self, flight: Flight) -> None:
        """Give the attempt its owner's hooks, and the lease the safety margin it keeps."""
        job, control = flight.job, flight.control
        margin = self.policy.margin_seconds
        if self.clock.offset is not None:
            left = (job.locked_until - self.clock.now()).total_seconds()
            valid = time.monotonic() + left - margin
        else:
            valid = flight.lease_valid_until - margin
        with self._lock:
            flight.lease_valid_until = min(flight.lease_valid_until, valid)
        # Counted: an attempt given back before its first start was asked for is not charged.
        control.still_owner = counting(flight, functools.partial(self.still_owner, flight))
        control.clock = self.clock.now
        control.note = functools.partial(self.note, flight)
        if control.logs is not None and not isinstance(control.logs, FencedLogSink):
            control.logs = FencedLogSink(control.logs, functools.partial(self.owns, flight))

    # --- the lease ---

    def owns(self, flight: Flight) -> bool:
        """Whether this process may still act as the attempt's owner (no database asked)."""
        return not flight.control.abandon.is_set() and time.monotonic() < flight.lease_valid_until

    def still_owner(self, flight: Flight) -> bool:
        """Asked before each Docker action: is the lease ours? The database's answer when it
        gives one (the start's record, when it was just written, gives the first); when it
        cannot, the lease clock's (see docs/workers.md)."""
        if not self.owns(flight):
            return False
        if flight.lease_confirmed:
            # The start's record was written under the lease a moment ago: that is the answer.
            flight.lease_confirmed = False
            return True
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
            return self.owns(flight)
        if not held:
            self.lose(flight, "not held when checked before a Docker action")
            return False
        return self.owns(flight)

    def note(self, flight: Flight, kind: str, data: dict[str, Any]) -> None:
        """Record a run event for the attempt under its lease; never raises into the runner."""
        if not self.owns(flight):
            return
        job = flight.job
        try:
            self._queue.record_event(job.job_id, job.lease_token, kind, data)
        except Exception as exc:
            logger.warning(
                "could not record a run event",
                extra=self._log(job, event=kind, error=describe(exc)),
            )

    def lose(self, flight: Flight, why: str) -> None:
        """Stop acting as the attempt's owner: the runner stops waiting and touches nothing."""
        if not flight.control.abandon.is_set():
            self._metrics.leases_lost.inc()
            logger.warning("lease lost: %s", why, extra=self._log(flight.job, action="lease_lost"))
            flight.control.abandon.set()

    def renew(self, flight: Flight) -> bool:
        """Renew one lease (``HEARTBEAT``): a lease taken away abandons the attempt, a cancel
        request reaches it; False if the database did not answer."""
        job = flight.job
        sent, asked = time.monotonic(), datetime.now(UTC)
        try:
            beat = self._heartbeat_queue.heartbeat(
                job.job_id, job.lease_token, lease_seconds=self.policy.lease_seconds
            )
        except Exception as exc:
            logger.warning("heartbeat failed", extra=self._log(job, error=describe(exc)))
            return False
        if not beat.owned:
            if not flight.finalizing:
                self.lose(flight, "lease taken away")
            return True
        if beat.db_now is not None:
            self.clock.sample(asked, beat.db_now)
        # The database set locked_until = its now + lease, and its now came after ``sent``.
        valid = sent + self.policy.lease_seconds - self.policy.margin_seconds
        with self._lock:
            # An answer that comes after the lease already counts as lost revives nothing.
            if not flight.control.abandon.is_set() and time.monotonic() < flight.lease_valid_until:
                flight.lease_valid_until = max(flight.lease_valid_until, valid)
        if beat.cancel_requested and not flight.control.cancel.is_set():
            logger.info("cancel requested", extra=self._log(job, action="cancel"))
            flight.control.cancel.set()
        return True

    # --- one attempt ---

    def _attempt(self, flight: Flight) -> None:
        job, control = flight.job, flight.control
        if job.adopted:
            if not self._adopt(flight):
                return
        elif job.cancel_requested or control.cancel.is_set():
            self.finalize(flight, CANCELLED_BEFORE_START)
            return
        if not job.container_requested and not self._mark_container_requested(flight):
            return
        trace = tracing().current()  # the attempt's span: the tool's spans join it
        spec = AttemptSpec(
            traceparent=trace.traceparent if trace is not None else None,
            tracestate=trace.tracestate if trace is not None else None,
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
            control.cancel.set()
        pause_point(BEFORE_CREATE)
        try:
            outcome = self._runner.run(spec, control)
        except AttemptAbandoned:
            logger.info("attempt left to its next owner", extra=self._log(job, action="abandon"))
            return
        except RunnerUnavailable as exc:
            if job.adopted or not self.policy.caller_waits:
                self.release(flight, str(exc))
                return
            logger.warning("container engine failed", extra=self._log(job, error=str(exc)))
            outcome = ENGINE_FAILED
        except Exception as exc:
            if self._gives_back(exc):
                # The database failed under the artifacts' writes: the next owner collects.
                self.release(flight, describe(exc), engine=False)
                return
            logger.error(
                "the runner crashed; failing the run",
                exc_info=exc,
                extra=self._log(job, error=describe(exc)),
            )
            outcome = crashed_outcome(exc)
        crash_point(BEFORE_FINALIZE)
        self.finalize(flight, outcome)

    def _adopt(self, flight: Flight) -> bool:
        """A run whose owner is gone: True if its container is there to wait on or collect;
        otherwise the adoption rule's verdict is carried out here."""
        job = flight.job
        try:
            state = self._runner.state(job.run_id, job.attempt)
        except RunnerUnavailable as exc:
            self.release(flight, f"engine unavailable: {exc}")
            return False
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
        if verdict.action in (Action.FINALIZE, Action.RESUME):
            return True
        self._settle_adopted(flight, state, verdict)
        return False

    def _settle_adopted(self, flight: Flight, state: ContainerState, verdict: Verdict) -> None:
        """No container will finish the adopted attempt: put it back, charged or not."""
        job = flight.job
        if verdict.action is Action.LOOK_LATER:
            self.release(
                flight, f"nothing to decide with the container {state.value}", engine=False
            )
            return
        reason = self.policy.lost_error_code.value if verdict.charged else "unstarted"
        self._metrics.requeues.labels(reason=reason).inc()
        if verdict.discard:
            try:
                self._runner.discard(job.run_id, job.attempt)
            except RunnerUnavailable as exc:
                self.release(flight, f"engine unavailable: {exc}")
                return
        result = self._queue.put_back(
            job.job_id,
            job.lease_token,
            charged=verdict.charged,
            error=self.policy.lost_error.format(attempt=job.attempt, state=state.value),
            error_code=self.policy.lost_error_code,
        )
        extra = self._log(job, action="requeued", status=str(result.status))
        if verdict.charged:
            logger.warning("container lost", extra=extra)
        else:
            logger.info("attempt never began; requeued without charge", extra=extra)

    def _mark_container_requested(self, flight: Flight) -> bool:
        """Record the start under the lease, retrying passing errors within the retry budget
        while it holds; a cancel or the deadline arriving meanwhile ends the run unstarted."""
        job = flight.job
        delay = 0.1
        give_up_at = time.monotonic() + self.policy.retry_budget_seconds
        while self.owns(flight):
            ended = self._ended_before_start(flight)
            if ended is not None:
                self.finalize(flight, ended)
                return False
            try:
                if self._queue.mark_container_requested(job.job_id, job.lease_token):
                    flight.lease_confirmed = True
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
                    if self.owns(flight):
                        self.release(flight, "the start could not be recorded", engine=False)
                    return False
                flight.control.abandon.wait(delay)
                delay = min(delay * 2, 2.0)
        return False

    def _ended_before_start(self, flight: Flight) -> AttemptResult | None:
        """The outcome of an attempt cancelled or past its deadline before its start."""
        if flight.control.cancel.is_set():
            return CANCELLED_BEFORE_START
        if self.clock.now() >= flight.job.deadline_at:
            return AttemptResult(
                status=RunStatus.TIMED_OUT,
                error_code=ErrorCode.TIMED_OUT,
                error="the deadline passed before the container could be started",
            )
        return None

    def _gives_back(self, exc: Exception) -> bool:
        """Whether an error leaves the attempt to a later owner rather than failing it: engine
        trouble or a passing database error, unless the caller waits for the answer."""
        if self.policy.caller_waits:
            return False
        return isinstance(exc, RunnerUnavailable) or classify(exc) is Failure.TRANSIENT

    def _crashed(self, flight: Flight, exc: Exception) -> None:
        """Settle an attempt the owner's own code raised on: what ``_gives_back`` names gives
        the lease back, anything else fails the run (it would crash the same way on every
        adoption)."""
        job = flight.job
        try:
            logger.error(
                "%s attempt crashed",
                self.policy.label,
                exc_info=exc,
                extra=self._log(job, error=describe(exc)),
            )
            if flight.settled or flight.finalizing or flight.control.abandon.is_set():
                return
            if self._gives_back(exc):
                self.release(flight, describe(exc), engine=isinstance(exc, RunnerUnavailable))
            else:
                self.finalize(flight, crashed_outcome(exc))
        except Exception:
            logger.exception("could not settle a crashed attempt; its lease will run out")

    # --- giving the lease back ---

    def release(self, flight: Flight, why: str, *, engine: bool = True) -> None:
        """Decide nothing: give the lease back. For engine trouble (``engine``), adoptable
        again after the delay the holder names; for database trouble, at once."""
        job = flight.job
        if not engine:
            logger.warning("releasing lease: %s", why, extra=self._log(job, action="released"))
            try:
                self._queue.release(job.job_id, job.lease_token)
            except DB_ERRORS:
                logger.warning("release failed; the reaper will clear the lease", exc_info=True)
            return
        # No one adopts the run before the delay: a failing engine costs each run one release
        # per backoff step, not an adoption and a release per poll.
        delay = self._engine_trouble(why)
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
        except DB_ERRORS:
            logger.warning("release failed; the reaper will clear the lease", exc_info=True)

    def give_back(self, job: ClaimedJob) -> None:
        """A job claimed that will not be run here: back at once, uncharged."""
        try:
            if job.adopted:
                self._queue.release(job.job_id, job.lease_token)
            else:
                self._queue.requeue_unstarted(job.job_id, job.lease_token)
        except DB_ERRORS:
            logger.warning("give-back failed; the reaper will clear the lease", exc_info=True)

    # --- the finalize ---

    def finalize(self, flight: Flight, outcome: AttemptResult) -> None:
        """Commit the outcome (or what can be stored instead), then clean up."""
        trace_finalize(outcome.status.value)
        self._finalize(flight, outcome)

    def _finalize(self, flight: Flight, outcome: AttemptResult) -> None:
        job = flight.job
        flight.finalizing = True
        metered = self._usage.record(
            flight,
            outcome.usage,
            owns=functools.partial(self.owns, flight),
            give_back=functools.partial(self.release, flight, engine=False),
        )
        committed = self._store(flight, outcome) if metered else None
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
        self._cleanup(job.run_id, job.attempt)

    def _store(self, flight: Flight, outcome: AttemptResult) -> AttemptResult | None:
        """The outcome committed, or None (lease lost, or given up to adoption).

        A passing error is retried within the retry budget while we own the attempt. A
        deterministic one is never retried as is: the run is failed as ``internal_error``
        with what can be stored (the streams as they are, cleaned, then none).
        """
        job = flight.job
        first = self._next_claim() if self.policy.chains else None
        plan = [(outcome, first)]
        if first is not None:
            plan.append((outcome, None))  # the refusal may be the claim's, not the outcome's
        refused = False
        give_up_at = time.monotonic() + self.policy.retry_budget_seconds
        delay = 0.1
        step = 0
        while step < len(plan):
            candidate, target = plan[step]
            if not self.owns(flight):
                logger.warning("not finalizing: lease lost", extra=self._log(job))
                return None
            try:
                owned = self._commit(flight, candidate, target)
            except Exception as exc:
                if classify(exc) is Failure.TRANSIENT:
                    if time.monotonic() + delay >= min(flight.lease_valid_until, give_up_at):
                        logger.warning(
                            "finalize gave up; adoption will finish the run",
                            extra=self._log(job, error=describe(exc)),
                        )
                        if self.owns(flight):
                            self.release(flight, "the outcome could not be committed", engine=False)
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
                    plan.extend((fallback, None) for fallback in unstorable_outcomes(outcome, exc))
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
        self.release(flight, "no outcome could be stored", engine=False)
        return None

    def _commit(self, flight: Flight, outcome: AttemptResult, target: NextClaim | None) -> bool:
        """FINALIZE, or with a ``target`` FINALIZE_AND_CLAIM: the slot's next job comes too.

        Through the batch completer if the owner has one (a worker's slots finalize together).
        """
        job = flight.job
        flight.asked_next = target is not None
        if target is None:
            return (self._completer or self._queue).finalize(job.job_id, job.lease_token, outcome)
        if self._completer is not None:
            where = ClaimFor(
                self.owner_id, target.engine_id, target.queue, self.policy.lease_seconds
            )
            owned, claimed = self._completer.finalize_and_claim(
                job.job_id, job.lease_token, outcome, where
            )
        else:
            owned, claimed = self._queue.finalize_and_claim(
                job.job_id,
                job.lease_token,
                outcome,
                worker_id=self.owner_id,
                engine_id=target.engine_id,
                limit=1,
                lease_seconds=self.policy.lease_seconds,
                queue=target.queue,
            )
        flight.next_job = claimed[0] if claimed else None
        return owned

    def _discard_now(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove a finalized attempt's container now; the sweep does it if the engine fails."""
        try:
            self._runner.discard(run_id, attempt)
        except RunnerUnavailable:
            logger.warning(
                "cleanup deferred to the sweep",
                extra={"run_id": str(run_id), "attempt": attempt, "worker_id": self.owner_id},
            )
