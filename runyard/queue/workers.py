"""The ``workers`` table: one row per worker process, its engine and its liveness."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Engine, text

from runyard.platform.db import autocommit

REGISTER = text(
    """
    INSERT INTO workers (id, engine_id, host, pid, concurrency, queues, started_at,
                         last_seen_at)
    VALUES (:id, :engine_id, :host, :pid, :concurrency, :queues,
            coalesce(CAST(:now AS timestamptz), now()), coalesce(CAST(:now AS timestamptz), now()))
    ON CONFLICT (id) DO UPDATE SET engine_id = EXCLUDED.engine_id, host = EXCLUDED.host,
        pid = EXCLUDED.pid, concurrency = EXCLUDED.concurrency, queues = EXCLUDED.queues,
        started_at = EXCLUDED.started_at, last_seen_at = EXCLUDED.last_seen_at, stopped_at = NULL
    """
)
SEEN = text(
    "UPDATE workers SET last_seen_at = coalesce(CAST(:now AS timestamptz), now()) WHERE id = :id"
    " RETURNING last_seen_at"
)
STOPPED = text(
    "UPDATE workers SET stopped_at = coalesce(CAST(:now AS timestamptz), now()) WHERE id = :id"
)


def new_worker_id() -> str:
    """A process-unique id: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class WorkerRegistry:
    """Writes a worker's row; the reaper reads it to tell live engines from dead ones.

    Each write is one autocommit statement, so a pool with no connection to give raises
    ``OperationalError`` like any other database error.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def register(
        self,
        worker_id: str,
        engine_id: str,
        concurrency: int,
        *,
        queues: Sequence[str] = ("default",),
        now: datetime | None = None,
    ) -> None:
        """Insert this worker's row, or take over one of the same id (a restart with a fixed
        ``RUNYARD_WORKER_ID``, perhaps on another engine): every column is this process's."""
        autocommit(
            self._engine,
            REGISTER,
            {
                "id": worker_id,
                "engine_id": engine_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "concurrency": concurrency,
                "queues": list(queues),
                "now": now,
            },
        )

    def seen(self, worker_id: str, *, now: datetime | None = None) -> datetime | None:
        """Record that the worker is alive; the database's clock as it did (None: no row)."""
        rows = autocommit(self._engine, SEEN, {"id": worker_id, "now": now})
        return rows[0][0] if rows else None

    def stopped(self, worker_id: str, *, now: datetime | None = None) -> None:
        """Record a clean exit."""
        autocommit(self._engine, STOPPED, {"id": worker_id, "now": now})
