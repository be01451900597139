"""The sweep: removes containers and volumes the database no longer needs; reports strays.

The database knows a run while its row exists and, once it is deleted (``DELETE`` or
retention), by its tombstone in ``deleted_runs`` (migration 0017) for ``DELETED_KEPT_SECONDS``:
the containers of a deleted run are removed like those of a finished one, while attempts of
runs this database never had are only reported (another stack may share the engine).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

from runyard.runner import Runner, RunnerUnavailable

logger = logging.getLogger(__name__)

# How long a deleted run's tombstone is kept: the sweep of an engine that was down for
# longer leaves that run's container alone (reported as unknown).
DELETED_KEPT_SECONDS = 7 * 86400.0
DELETED = "deleted"

# A deleted run comes back as status 'deleted', settled: it was terminal when it went.
ATTEMPT_STATES = text(
    """
    SELECT r.id, CAST(r.status AS text) AS status, j.attempts,
           r.finished_at < coalesce(CAST(:now AS timestamptz), now())
                           - make_interval(secs => CAST(:grace AS double precision)) AS settled
    FROM tool_runs r LEFT JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.id = ANY(CAST(:ids AS uuid[]))
    UNION ALL
    SELECT d.run_id, 'deleted', NULL, true
    FROM deleted_runs d
    WHERE d.run_id = ANY(CAST(:ids AS uuid[]))
      AND NOT EXISTS (SELECT 1 FROM tool_runs r WHERE r.id = d.run_id)
    """
)

# Tombstones past their time, a bounded batch per pass (several sweeps may run it at once).
PRUNE_DELETED_RUNS = text(
    """
    DELETE FROM deleted_runs
    WHERE run_id IN (
        SELECT run_id FROM deleted_runs
        WHERE deleted_at < now() - make_interval(secs => CAST(:keep AS double precision))
        ORDER BY deleted_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    """
)
PRUNE_BATCH = 10_000


@dataclass(frozen=True)
class SweepResult:
    """What one sweep removed, and how many labelled attempts the database does not know."""

    removed: int = 0
    unknown: int = 0
    kept: int = 0
    # Tombstones of deleted runs dropped after their time.
    forgotten: int = 0


class Sweeper:
    """Removes an attempt's container when its run is terminal (after a grace), deleted, or
    has moved on to a later attempt; never touches attempts the database does not know."""

    def __init__(
        self,
        engine: Engine,
        runner: Runner,
        grace_seconds: float = 60.0,
        deleted_kept_seconds: float = DELETED_KEPT_SECONDS,
    ) -> None:
        self._engine = engine
        self._runner = runner
        self._grace = grace_seconds
        self._deleted_kept = deleted_kept_seconds
        # Strays already reported (and still there): each is named once, not at every pass.
        self._reported: set[tuple[uuid.UUID, int]] = set()

    def run_once(self, *, now: datetime | None = None) -> SweepResult:
        """One pass over the engine's labelled containers and volumes."""
        forgotten = self._forget_old_tombstones()
        # Asking for the identity lets the Docker runner put back a pruned engine marker.
        self._runner.engine_id()
        attempts = self._runner.managed_attempts()
        if not attempts:
            self._reported = set()
            return SweepResult(forgotten=forgotten)
        with self._engine.connect() as conn:
            rows = conn.execute(
                ATTEMPT_STATES,
                {"ids": sorted({a.run_id for a in attempts}), "grace": self._grace, "now": now},
            ).all()
        runs: dict[uuid.UUID, tuple[str, int | None, bool]] = {
            r.id: (r.status, r.attempts, bool(r.settled)) for r in rows
        }
        removed = unknown = kept = 0
        strays: set[tuple[uuid.UUID, int]] = set()
        for attempt in attempts:
            known = runs.get(attempt.run_id)
            if known is None:
                unknown += 1
                stray = (attempt.run_id, attempt.attempt)
                strays.add(stray)
                if stray not in self._reported:
                    # Another deployment's, or a database's that is gone: never ours to remove.
                    logger.warning(
                        "labelled container of a run the database does not know",
                        extra={"run_id": str(attempt.run_id), "attempt": attempt.attempt},
                    )
                continue
            status, current_attempt, settled = known
            terminal = status in ("succeeded", "failed", "timed_out", "cancelled", DELETED)
            superseded = current_attempt is not None and attempt.attempt < current_attempt
            if (terminal and settled) or (superseded and not terminal):
                try:
                    self._runner.discard(attempt.run_id, attempt.attempt)
                except RunnerUnavailable:
                    logger.warning("sweep could not remove", exc_info=True)
                    kept += 1
                    continue
                removed += 1
            else:
                kept += 1
        if removed or strays - self._reported:
            logger.info("sweep", extra={"removed": removed, "unknown": unknown})
        self._reported = strays
        return SweepResult(removed=removed, unknown=unknown, kept=kept, forgotten=forgotten)

    def _forget_old_tombstones(self) -> int:
        """Drop tombstones of runs deleted longer ago than they are kept (one batch)."""
        with self._engine.begin() as conn:
            result = conn.execute(
                PRUNE_DELETED_RUNS, {"keep": self._deleted_kept, "batch": PRUNE_BATCH}
            )
        return int(result.rowcount or 0)
