"""Removal of finished attempts' containers off the slot threads."""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

from runyard.runner import Runner, RunnerUnavailable

logger = logging.getLogger(__name__)


class Cleaner:
    """Discards finalized attempts in the background, so a slot takes its next job at once.

    At most ``backlog`` removals wait; past that the caller removes inline, which paces the
    slots to the engine instead of piling up exited containers.
    """

    def __init__(self, runner: Runner, *, backlog: int, worker_id: str = "") -> None:
        self._runner = runner
        self._worker_id = worker_id
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runyard-cleanup")
        self._room = threading.BoundedSemaphore(max(backlog, 1))
        self._lock = threading.Lock()
        self._pending = 0

    def discard(self, run_id: uuid.UUID, attempt: int) -> None:
        """Remove the attempt's container and volume soon (now, if the backlog is full)."""
        if not self._room.acquire(blocking=False):
            self._remove(run_id, attempt)
            return
        with self._lock:
            self._pending += 1
        try:
            self._pool.submit(self._remove_queued, run_id, attempt)
        except RuntimeError:  # shut down: nobody else will do it
            self._settle()
            self._remove(run_id, attempt)

    def pending(self) -> int:
        """Removals queued or in progress."""
        with self._lock:
            return self._pending

    def close(self) -> None:
        """Finish the queued removals."""
        self._pool.shutdown(wait=True)

    def _remove_queued(self, run_id: uuid.UUID, attempt: int) -> None:
        try:
            self._remove(run_id, attempt)
        finally:
            self._settle()

    def _settle(self) -> None:
        with self._lock:
            self._pending -= 1
        self._room.release()

    def _remove(self, run_id: uuid.UUID, attempt: int) -> None:
        extra = {"run_id": str(run_id), "attempt": attempt, "worker_id": self._worker_id}
        try:
            self._runner.discard(run_id, attempt)
        except RunnerUnavailable as exc:
            logger.warning("cleanup deferred to the sweep", extra={**extra, "error": str(exc)})
        except Exception:
            # The run is final already; a container left behind is the sweep's to remove.
            logger.exception("cleanup failed; deferred to the sweep", extra=extra)
