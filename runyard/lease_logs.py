"""Live log chunks of an attempt, stored in the run's events under the attempt's lease."""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import DBAPIError, OperationalError

from runyard.queue import ClaimedJob, JobQueue

logger = logging.getLogger(__name__)

_DB_ERRORS = (OperationalError, DBAPIError)


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
