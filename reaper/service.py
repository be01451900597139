"""The reaper: clears expired leases, settles runs on dead engines (sync runs too), prunes
old rows."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

from runyard.artifact_store import ArtifactStore
from runyard.domain.adoption import AdoptionFacts, decide
from runyard.domain.states import RunStatus
from runyard.maintenance.retention import prune_expired
from runyard.queue import JobQueue, OrphanedJob
from runyard.reads.metrics import Metrics, Role

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaperConfig:
    """Batch size and the time thresholds of the reaper."""

    batch_size: int = 500
    engine_dead_after_seconds: float = 120.0
    retention_seconds: float | None = 30 * 86400.0  # None: keep every run
    interval_seconds: float = 5.0


@dataclass(frozen=True)
class ReapResult:
    """What one pass changed."""

    leases_cleared: int = 0
    requeued: int = 0
    failed: int = 0
    pruned: int = 0


class Reaper:
    """Batched and idempotent; several copies may run at once."""

    def __init__(
        self,
        queue: JobQueue,
        config: ReaperConfig,
        metrics: Metrics | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self._queue = queue
        # Retention removes deleted runs' artifacts from it too (a local directory's files).
        self._artifacts = artifacts
        self._metrics = (metrics or Metrics()).export(Role.REAPER)
        self._config = config
        self._stop = threading.Event()

    def run_once(self, *, now: datetime | None = None) -> ReapResult:
        """One full pass: every step loops until a batch comes back short."""
        cleared = self._clear_expired(now)
        requeued, failed = self._settle_orphans(now)
        pruned = self._prune(now)
        result = ReapResult(cleared, requeued, failed, pruned)
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
            orphans = self._queue.select_orphaned(
                dead_after_seconds=self._config.engine_dead_after_seconds,
                batch=self._config.batch_size,
                now=now,
            )
            settled = [self._settle_orphan(orphan, now) for orphan in orphans]
            requeued += sum(1 for status in settled if status is RunStatus.QUEUED)
            failed += sum(1 for status in settled if status not in (None, RunStatus.QUEUED))
            # A full batch that settled nothing would come back the same: leave it to the next pass.
            if len(orphans) < self._config.batch_size or not any(settled):
                return requeued, failed

    def _settle_orphan(self, orphan: OrphanedJob, now: datetime | None) -> RunStatus | None:
        """The engine is given up: its container, if any, counts as lost (``decide``)."""
        verdict = decide(
            AdoptionFacts(
                container=None,
                container_requested=orphan.container_requested,
                cancel_requested=orphan.cancel_requested,
                deadline_passed=orphan.deadline_passed,
                attempts_left=orphan.attempts_left,
                engine_dead=True,
                can_wait=False,
            )
        )
        result = self._queue.put_back(
            orphan.job_id,
            None,
            charged=verdict.charged,
            error="no live worker on the engine that held the container",
            now=now,
        )
        if not result.owned:
            return None  # adopted, settled or changed since the select: the next pass looks
        logger.info(
            "run of a dead engine settled",
            extra={
                "run_id": str(orphan.run_id),
                "action": verdict.action.value,
                "charged": verdict.charged,
                "status": str(result.status),
            },
        )
        return result.status

    def _prune(self, now: datetime | None) -> int:
        return prune_expired(
            self._queue,
            retention_seconds=self._config.retention_seconds,
            batch=self._config.batch_size,
            now=now,
            artifacts=self._artifacts,
        )

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
