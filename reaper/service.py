"""The reaper: clears expired leases, settles runs on dead engines, prunes old rows."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

import psycopg.errors
from sqlalchemy.exc import OperationalError

from runyard.metrics import Metrics
from runyard.queue import JobQueue
from runyard.runner import ErrorCode
from runyard.sync_mode import SyncOrphanSettler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaperConfig:
    """Batch size and the time thresholds of the reaper."""

    batch_size: int = 500
    engine_dead_after_seconds: float = 120.0
    retention_seconds: float = 30 * 86400.0
    interval_seconds: float = 5.0


@dataclass(frozen=True)
class ReapResult:
    """What one pass changed."""

    leases_cleared: int = 0
    requeued: int = 0
    failed: int = 0
    pruned: int = 0
    sync_settled: int = 0


class Reaper:
    """Batched and idempotent; several copies may run at once."""

    def __init__(
        self,
        queue: JobQueue,
        config: ReaperConfig,
        sync_settler: SyncOrphanSettler | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._queue = queue
        self._metrics = metrics or Metrics()
        self._config = config
        # Without a runner the settler still fails orphaned sync runs after their deadline.
        self._sync_settler = sync_settler or SyncOrphanSettler(queue)
        self._stop = threading.Event()

    def run_once(self, *, now: datetime | None = None) -> ReapResult:
        """One full pass: every step loops until a batch comes back short."""
        cleared = self._clear_expired(now)
        requeued, failed = self._settle_orphans(now)
        pruned = self._prune(now)
        sync_settled = self._sync_settler.run_once(batch=self._config.batch_size, now=now)
        result = ReapResult(cleared, requeued, failed, pruned, sync_settled)
        for action, count in result.__dict__.items():
            if count:
                self._metrics.reaper_actions.labels(action=action).inc(count)
        if result != ReapResult():
            logger.info("reaper pass", extra={"action": "reaped", **result.__dict__})
        return result

    def _clear_expired(self, now: datetime | None) -> int:
        total = 0
        while True:
            ids = self._queue.select_expired(batch=self._config.batch_size, now=now)
            run_ids = self._queue.clear_expired(ids, now=now)
            for run_id in run_ids:
                logger.info("lease expired; run adoptable", extra={"run_id": str(run_id)})
            total += len(run_ids)
            if len(ids) < self._config.batch_size:
                return total

    def _settle_orphans(self, now: datetime | None) -> tuple[int, int]:
        requeued = failed = 0
        while True:
            ids = self._queue.select_orphaned(
                dead_after_seconds=self._config.engine_dead_after_seconds,
                batch=self._config.batch_size,
                now=now,
            )
            for job_id in ids:
                result = self._queue.requeue_unstarted(job_id, None, now=now)
                if not result.owned:
                    result = self._queue.requeue(
                        job_id,
                        None,
                        error_code=ErrorCode.CONTAINER_LOST,
                        error="no live worker on the engine that held the container",
                        now=now,
                    )
                if result.owned and result.status is not None:
                    if result.status.value == "queued":
                        requeued += 1
                    else:
                        failed += 1
            if len(ids) < self._config.batch_size:
                return requeued, failed

    def _prune(self, now: datetime | None) -> int:
        """Delete old runs batch by batch; a batch that runs past the statement timeout (runs
        with very many events) is halved for the rest of the pass instead of failing it."""
        total = 0
        batch = self._config.batch_size
        while True:
            try:
                deleted = self._queue.prune(
                    retention_seconds=self._config.retention_seconds, batch=batch, now=now
                )
            except OperationalError as exc:
                if batch == 1 or not isinstance(exc.orig, psycopg.errors.QueryCanceled):
                    raise
                batch = max(1, batch // 2)
                logger.warning("prune ran past the statement timeout", extra={"batch": batch})
                continue
            total += deleted
            if deleted < batch:
                return total

    def run_forever(self) -> None:
        """Pass every ``interval_seconds`` until ``stop()``; errors are logged, not fatal."""
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                logger.exception("reaper pass failed")
            self._stop.wait(self._config.interval_seconds)

    def stop(self) -> None:
        """Ask ``run_forever`` to return."""
        self._stop.set()
