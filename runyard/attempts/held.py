"""An attempt a process holds under its job's lease (a worker's slot, a sync-mode API's), and
its live log chunks, stored in the run's events under that lease."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.queue import ClaimedJob, JobQueue
from runyard.runner import AttemptControl

logger = logging.getLogger(__name__)

_DB_ERRORS = (OperationalError, DBAPIError)


@dataclass
class Held:
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
