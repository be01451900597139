"""An attempt's usage recorded by its owner, under its lease, right before its finalize."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from runyard.attempts.flight import Flight, log_fields
from runyard.domain.errors import describe
from runyard.domain.usage import AttemptUsage
from runyard.platform.db_errors import Failure, classify
from runyard.platform.faults import AFTER_USAGE, crash_point
from runyard.reads.metrics import Metrics
from runyard.usage.ledger import Recorded, UsageLedger

logger = logging.getLogger(__name__)


class UsageRecorder:
    """Writes each attempt's usage once (``RECORD_USAGE``), retrying passing errors within the
    owner's retry budget while the lease holds."""

    def __init__(
        self, ledger: UsageLedger, metrics: Metrics, retry_budget_seconds: float, owner_id: str
    ) -> None:
        self._ledger = ledger
        self._metrics = metrics
        self._budget = retry_budget_seconds
        self._owner_id = owner_id

    def record(
        self,
        flight: Flight,
        usage: AttemptUsage | None,
        *,
        owns: Callable[[], bool],
        give_back: Callable[[str], None],
    ) -> bool:
        """True: recorded now or before (by an owner that died before its finalize), or
        nothing to record; the finalize goes on. False: the lease is lost or was given back
        (``give_back``), so the next owner reads the container again and records it."""
        if usage is None:
            return True
        job = flight.job
        give_up_at = time.monotonic() + self._budget
        delay = 0.1
        while owns():
            try:
                recorded = self._ledger.record(job.job_id, job.lease_token, usage)
            except Exception as exc:
                extra = log_fields(job, self._owner_id, error=describe(exc))
                if classify(exc) is Failure.DETERMINISTIC:
                    # Never retried as is; the outcome still deserves its finalize.
                    logger.error("usage refused", extra=extra)
                    return True
                if time.monotonic() + delay >= min(flight.lease_valid_until, give_up_at):
                    logger.warning("usage not recorded; adoption will record it", extra=extra)
                    give_back("the usage could not be recorded")
                    return False
                flight.control.abandon.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            if recorded is Recorded.LEASE_LOST:
                self._metrics.leases_lost.inc()
                logger.warning("lease lost before the usage", extra=log_fields(job, self._owner_id))
                return False
            crash_point(AFTER_USAGE)
            return True
        logger.warning("not recording usage: lease lost", extra=log_fields(job, self._owner_id))
        return False
