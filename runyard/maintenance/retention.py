"""Retention: terminal runs go, with everything that belongs to them, after the retention
period (the reaper, and the sync-mode API's chores) or when their tenant deletes one."""

from __future__ import annotations

import enum
import logging
import uuid
from datetime import datetime

import psycopg.errors
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from runyard.artifact_store import ArtifactStore
from runyard.domain.states import TERMINAL_STATUSES
from runyard.platform.db import autocommit
from runyard.queue import JobQueue

logger = logging.getLogger(__name__)

TERMINAL = frozenset(status.value for status in TERMINAL_STATUSES)

# One run, if the tenant may see it (``tenant`` NULL: any) and it is terminal; its job,
# events and webhook deliveries go by ON DELETE CASCADE. Terminal runs never change again,
# so the status read and the delete cannot disagree; the per-tenant counts only count
# queued and running runs and stay exact. ``status`` is NULL when there is no such run.
DELETE_RUN = text(
    """
    WITH target AS MATERIALIZED (
        SELECT id, CAST(status AS text) AS status FROM tool_runs
        WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
    ), deleted AS (
        DELETE FROM tool_runs r USING target t
        WHERE r.id = t.id AND t.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
        RETURNING r.id
    )
    SELECT t.status, EXISTS (SELECT 1 FROM deleted) AS deleted
    FROM (SELECT 1) one LEFT JOIN target t ON true
    """
)


class Deleted(enum.Enum):
    """What ``delete_run`` found."""

    DELETED = "deleted"
    NOT_TERMINAL = "not_terminal"
    NOT_FOUND = "not_found"


def delete_run(
    engine: Engine,
    run_id: uuid.UUID,
    tenant: str | None,
    artifacts: ArtifactStore | None = None,
) -> tuple[Deleted, str | None]:
    """Delete a terminal run the tenant may see, and its artifacts; the outcome and the
    run's status. A container the run left on an engine is the sweep's: the delete leaves
    the run's tombstone (a trigger, migration 0017), so the sweep still knows it."""
    row = autocommit(engine, DELETE_RUN, {"id": run_id, "tenant": tenant})[0]
    if row.status is None:
        return Deleted.NOT_FOUND, None
    if not row.deleted:
        if row.status in TERMINAL:
            return Deleted.NOT_FOUND, None  # deleted by someone else meanwhile
        return Deleted.NOT_TERMINAL, str(row.status)
    logger.info("run deleted", extra={"run_id": str(run_id)})
    _forget(artifacts, [run_id])
    return Deleted.DELETED, str(row.status)


def retention_seconds(days: float) -> float | None:
    """``RUNYARD_RETENTION_DAYS`` in seconds; None for 0 (keep everything)."""
    return days * 86400.0 if days > 0 else None


def prune_expired(
    queue: JobQueue,
    *,
    retention_seconds: float | None,
    batch: int,
    now: datetime | None = None,
    artifacts: ArtifactStore | None = None,
) -> int:
    """Delete expired runs batch by batch until a batch comes back short; how many went.

    A batch that runs past the statement timeout (runs with very many events) is halved for
    the rest of the pass instead of failing it. ``retention_seconds`` None keeps everything.
    """
    if retention_seconds is None:
        return 0
    total = 0
    while True:
        try:
            deleted_ids = queue.prune_runs(
                retention_seconds=retention_seconds, batch=batch, now=now
            )
        except OperationalError as exc:
            if batch == 1 or not isinstance(exc.orig, psycopg.errors.QueryCanceled):
                raise
            batch = max(1, batch // 2)
            logger.warning("prune ran past the statement timeout", extra={"batch": batch})
            continue
        _forget(artifacts, deleted_ids)
        total += len(deleted_ids)
        if len(deleted_ids) < batch:
            queue.prune_batches(retention_seconds=retention_seconds, batch=batch, now=now)
            return total


def _forget(artifacts: ArtifactStore | None, run_ids: list[uuid.UUID]) -> None:
    """Drop what a store keeps outside the database for deleted runs (their rows in Postgres
    went with the runs). After the delete's commit: a crash between leaves only files."""
    if artifacts is None or not run_ids:
        return
    try:
        artifacts.forget(run_ids)
    except OSError:
        logger.warning("could not remove the artifacts of deleted runs", exc_info=True)
