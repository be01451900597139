"""The sweep: removes containers and volumes the database no longer needs; reports strays."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

from runyard.runner import Runner, RunnerUnavailable

logger = logging.getLogger(__name__)

ATTEMPT_STATES = text(
    """
    SELECT r.id, CAST(r.status AS text) AS status, j.attempts,
           r.finished_at < coalesce(CAST(:now AS timestamptz), now())
                           - make_interval(secs => CAST(:grace AS double precision)) AS settled
    FROM tool_runs r LEFT JOIN tool_run_jobs j ON j.run_id = r.id
    WHERE r.id = ANY(CAST(:ids AS uuid[]))
    """
)


@dataclass(frozen=True)
class SweepResult:
    """What one sweep removed, and how many labelled attempts the database does not know."""

    removed: int = 0
    unknown: int = 0
    kept: int = 0


class Sweeper:
    """Removes an attempt's container when its run is terminal (after a grace) or has moved
    on to a later attempt; never touches attempts the database does not know."""

    def __init__(self, engine: Engine, runner: Runner, grace_seconds: float = 60.0) -> None:
        self._engine = engine
        self._runner = runner
        self._grace = grace_seconds

    def run_once(self, *, now: datetime | None = None) -> SweepResult:
        """One pass over the engine's labelled containers and volumes."""
        # Asking for the identity lets the Docker runner put back a pruned engine marker.
        self._runner.engine_id()
        attempts = self._runner.managed_attempts()
        if not attempts:
            return SweepResult()
        with self._engine.connect() as conn:
            rows = conn.execute(
                ATTEMPT_STATES,
                {"ids": sorted({a.run_id for a in attempts}), "grace": self._grace, "now": now},
            ).all()
        runs: dict[uuid.UUID, tuple[str, int | None, bool]] = {
            r.id: (r.status, r.attempts, bool(r.settled)) for r in rows
        }
        removed = unknown = kept = 0
        for attempt in attempts:
            known = runs.get(attempt.run_id)
            if known is None:
                unknown += 1
                logger.warning(
                    "labelled container of a run the database does not know",
                    extra={"run_id": str(attempt.run_id), "attempt": attempt.attempt},
                )
                continue
            status, current_attempt, settled = known
            terminal = status in ("succeeded", "failed", "timed_out", "cancelled")
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
        if removed or unknown:
            logger.info("sweep", extra={"removed": removed, "unknown": unknown})
        return SweepResult(removed=removed, unknown=unknown, kept=kept)
