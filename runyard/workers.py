"""The ``workers`` table: one row per worker process, its engine and its liveness."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime

from sqlalchemy import Engine, text

REGISTER = text(
    """
    INSERT INTO workers (id, engine_id, host, pid, concurrency, started_at, last_seen_at)
    VALUES (:id, :engine_id, :host, :pid, :concurrency,
            coalesce(CAST(:now AS timestamptz), now()), coalesce(CAST(:now AS timestamptz), now()))
    ON CONFLICT (id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, stopped_at = NULL
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
    """Writes a worker's row; the reaper reads it to tell live engines from dead ones."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def register(
        self, worker_id: str, engine_id: str, concurrency: int, *, now: datetime | None = None
    ) -> None:
        """Insert (or revive) this worker's row."""
        with self._engine.begin() as conn:
            conn.execute(
                REGISTER,
                {
                    "id": worker_id,
                    "engine_id": engine_id,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "concurrency": concurrency,
                    "now": now,
                },
            )

    def seen(self, worker_id: str, *, now: datetime | None = None) -> datetime | None:
        """Record that the worker is alive; the database's clock as it did (None: no row)."""
        with self._engine.begin() as conn:
            seen_at: datetime | None = conn.execute(
                SEEN, {"id": worker_id, "now": now}
            ).scalar_one_or_none()
        return seen_at

    def stopped(self, worker_id: str, *, now: datetime | None = None) -> None:
        """Record a clean exit."""
        with self._engine.begin() as conn:
            conn.execute(STOPPED, {"id": worker_id, "now": now})
