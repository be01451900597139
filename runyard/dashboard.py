"""Plain reads behind the dashboard's queue and workers pages (nothing here writes)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from runyard.models import RunStatus, ToolRunEvent
from runyard.runs import LOG_STREAMS

# Per tenant (NULL: every tenant). Counts come from the runs' mirror of the job status.
QUEUE_DEPTH_BY_STATUS = text(
    """
    SELECT j.queue, CAST(j.status AS text) AS status, count(*) AS runs
    FROM tool_run_jobs j JOIN tool_runs r ON r.id = j.run_id
    WHERE CAST(:tenant AS text) IS NULL OR r.tenant = CAST(:tenant AS text)
    GROUP BY j.queue, j.status
    ORDER BY j.queue, j.status
    """
)
OLDEST_READY = text(
    """
    SELECT min(j.available_at) FROM tool_run_jobs j JOIN tool_runs r ON r.id = j.run_id
    WHERE j.status = 'queued' AND j.available_at <= now()
      AND (CAST(:tenant AS text) IS NULL OR r.tenant = CAST(:tenant AS text))
    """
)
WAIT_PERCENTILES = text(
    """
    SELECT count(*) AS started,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM started_at - requested_at)) AS seconds
    FROM tool_runs
    WHERE mode = 'queue' AND started_at >= now() - make_interval(secs => :window)
      AND (CAST(:tenant AS text) IS NULL OR tenant = CAST(:tenant AS text))
    """
)
WORKERS = text(
    """
    SELECT w.id, w.engine_id, w.host, w.pid, w.concurrency, w.started_at, w.last_seen_at,
           w.stopped_at, now() AS db_now,
           (SELECT count(*) FROM tool_run_jobs j
            WHERE j.locked_by = w.id AND j.status = 'running') AS busy
    FROM workers w
    WHERE w.stopped_at IS NULL OR w.stopped_at >= now() - make_interval(secs => :keep)
    ORDER BY w.stopped_at IS NOT NULL, w.last_seen_at DESC
    LIMIT 200
    """
)


@dataclass(frozen=True)
class DepthRow:
    """How many runs of one queue are in one status."""

    queue: str
    status: RunStatus
    runs: int


@dataclass(frozen=True)
class QueueOverview:
    """Depth by queue and status, the oldest ready run, and recent wait-time percentiles."""

    depth: list[DepthRow]
    oldest_ready_at: datetime | None
    started_in_window: int
    wait_p50: float | None
    wait_p95: float | None
    wait_p99: float | None
    window_seconds: float


@dataclass(frozen=True)
class WorkerRow:
    """One worker as the dashboard shows it."""

    id: str
    engine_id: str
    host: str
    pid: int
    slots: int
    busy: int
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    state: str  # "live", "silent" (no heartbeat for a lease) or "stopped"


def queue_overview(
    engine: Engine, tenant: str | None, *, window_seconds: float = 3600.0
) -> QueueOverview:
    """The queue page's figures, for one tenant or (``None``) all of them."""
    params = {"tenant": tenant, "window": window_seconds}
    with engine.connect() as conn:
        depth = [
            DepthRow(queue=row.queue, status=RunStatus(row.status), runs=int(row.runs))
            for row in conn.execute(QUEUE_DEPTH_BY_STATUS, params)
        ]
        oldest = conn.execute(OLDEST_READY, params).scalar_one()
        waits = conn.execute(WAIT_PERCENTILES, params).one()
    p50, p95, p99 = waits.seconds if waits.seconds is not None else (None, None, None)
    return QueueOverview(
        depth=depth,
        oldest_ready_at=oldest,
        started_in_window=int(waits.started),
        wait_p50=p50,
        wait_p95=p95,
        wait_p99=p99,
        window_seconds=window_seconds,
    )


def worker_overview(
    engine: Engine, *, silent_after_seconds: float, keep_stopped_seconds: float = 86_400.0
) -> list[WorkerRow]:
    """Live workers, then those stopped in the last ``keep_stopped_seconds``."""
    with engine.connect() as conn:
        rows = conn.execute(WORKERS, {"keep": keep_stopped_seconds}).all()
    silent_after = timedelta(seconds=silent_after_seconds)
    result = []
    for row in rows:
        if row.stopped_at is not None:
            state = "stopped"
        elif row.db_now - row.last_seen_at > silent_after:
            state = "silent"
        else:
            state = "live"
        result.append(
            WorkerRow(
                id=row.id,
                engine_id=row.engine_id,
                host=row.host,
                pid=row.pid,
                slots=row.concurrency,
                busy=int(row.busy),
                started_at=row.started_at,
                last_seen_at=row.last_seen_at,
                stopped_at=row.stopped_at,
                state=state,
            )
        )
    return result


@dataclass(frozen=True)
class LogSnapshot:
    """The live log chunks of one attempt up to event ``upto``; later ones come over SSE."""

    stdout: str
    stderr: str
    upto: int


def run_timeline(engine: Engine, run_id: uuid.UUID, limit: int = 500) -> list[ToolRunEvent]:
    """A run's events other than log chunks, oldest first (the first ``limit``)."""
    query = (
        select(ToolRunEvent)
        .where(ToolRunEvent.run_id == run_id, ToolRunEvent.type.not_in(LOG_STREAMS))
        .order_by(ToolRunEvent.id)
        .limit(limit)
    )
    with Session(engine, expire_on_commit=False) as session:
        rows = list(session.scalars(query))
        for row in rows:
            session.expunge(row)
    return rows


def log_snapshot(engine: Engine, run_id: uuid.UUID, attempt: int) -> LogSnapshot:
    """Live chunks of ``attempt``, bounded by the newest event id read first (no gap, no
    repeat when the page then streams events after that id)."""
    with engine.connect() as conn:
        upto = conn.execute(
            select(func.coalesce(func.max(ToolRunEvent.id), 0)).where(ToolRunEvent.run_id == run_id)
        ).scalar_one()
        rows = conn.execute(
            select(ToolRunEvent.type, ToolRunEvent.data["text"].astext)
            .where(
                ToolRunEvent.run_id == run_id,
                ToolRunEvent.id <= upto,
                ToolRunEvent.type.in_(LOG_STREAMS),
                ToolRunEvent.data["attempt"].astext == str(attempt),
            )
            .order_by(ToolRunEvent.id)
        ).all()
    out = {stream: "" for stream in LOG_STREAMS}
    for stream, chunk in rows:
        out[stream] += chunk or ""
    return LogSnapshot(stdout=out["stdout"], stderr=out["stderr"], upto=int(upto))


@dataclass(frozen=True)
class Holder:
    """Who holds a run's current attempt: the worker (or API, for sync runs) and until when."""

    owner: str
    lease_until: datetime | None


HOLDER = text(
    """
    SELECT j.locked_by AS owner, j.locked_until AS lease_until
    FROM tool_run_jobs j WHERE j.run_id = :run_id AND j.status = 'running'
      AND j.locked_by IS NOT NULL
    UNION ALL
    SELECT r.sync_owner, r.sync_owner_until
    FROM tool_runs r WHERE r.id = :run_id AND r.status = 'running' AND r.sync_owner IS NOT NULL
    LIMIT 1
    """
)


def run_holder(engine: Engine, run_id: uuid.UUID) -> Holder | None:
    """The current lease holder of a running run (never its lease token)."""
    with engine.connect() as conn:
        row = conn.execute(HOLDER, {"run_id": run_id}).one_or_none()
    return None if row is None else Holder(owner=row.owner, lease_until=row.lease_until)
